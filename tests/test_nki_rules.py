"""The NeuronCore's rules, enforced with errors that name the rule and the limit."""

from __future__ import annotations

import numpy as np
import pytest

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl
from torchneuron.nki import NkiCapacityError, NkiError


def _run(body, *arrays):
    kernel = nki.jit(body)
    return kernel.interpret(*arrays)


def _zeros(*shape):
    return np.zeros(shape, np.float32)


def test_partition_dimension_at_most_128():
    def body(x):
        nl.load(x)

    with pytest.raises(NkiError, match="partition dimension size 129 exceeds .*128 partitions"):
        _run(body, _zeros(129, 4))


def test_moving_free_size_at_most_512():
    def body(a, b):
        nisa.nc_matmul(nl.load(a), nl.load(b))

    with pytest.raises(NkiError, match="moving free size 513 exceeds .*512"):
        _run(body, _zeros(128, 128), _zeros(128, 513))


def test_stationary_free_size_at_most_128():
    def body(a, b):
        nisa.nc_matmul(nl.load(a), nl.load(b))

    with pytest.raises(NkiError, match="stationary free size 129 exceeds .*128"):
        _run(body, _zeros(128, 129), _zeros(128, 512))


def test_contraction_sizes_must_match():
    def body(a, b):
        nisa.nc_matmul(nl.load(a), nl.load(b))

    with pytest.raises(NkiError, match="share the partition .*64 and 128"):
        _run(body, _zeros(64, 128), _zeros(128, 512))


def test_psum_tile_fits_one_2kib_bank():
    def body():
        nl.ndarray((128, 513), nl.float32, buffer=nl.psum)

    with pytest.raises(
        NkiError, match="2052 bytes per partition, more than one 2048-byte PSUM bank"
    ):
        _run(body)


def test_psum_has_eight_banks():
    def body():
        tiles = [nl.zeros((128, 512), nl.float32, buffer=nl.psum) for _ in range(8)]
        ninth = nl.zeros((128, 512), nl.float32, buffer=nl.psum)
        for tile in tiles:  # read after the ninth was allocated: all nine live at once
            nisa.tensor_copy(tile)
        nisa.tensor_copy(ninth)

    with pytest.raises(
        NkiCapacityError, match="PSUM is full: 9 tiles live at once need 9 banks.*8 banks of 2048"
    ):
        _run(body)


def test_tiles_named_but_never_used_again_hold_no_space():
    # What the NKI compiler does: a tile's space lasts from its allocation to its last access.
    # Sixteen (128, 512) float32 PSUM tiles, held in a list but each dead once written.
    def body():
        tiles = [nl.zeros((128, 512), nl.float32, buffer=nl.psum) for _ in range(16)]
        assert len(tiles) == 16  # all sixteen still named when the kernel ends

    _run(body)


def test_one_tile_larger_than_psum_is_refused_at_once():
    def body():
        nl.ndarray((9, nl.par_dim(128), 512), nl.float32, buffer=nl.psum)

    with pytest.raises(NkiCapacityError, match="one tile of shape .* needs 9 banks"):
        _run(body)


def test_psum_banks_are_released_when_tiles_die():
    def body():
        for _ in range(20):  # each iteration's tile dies before the next is allocated
            nl.zeros((128, 512), nl.float32, buffer=nl.psum)

    _run(body)


def test_matmul_result_accumulates_in_float32():
    def body(a, b):
        dst = nl.ndarray((128, 512), nl.float16, buffer=nl.psum)
        nisa.nc_matmul(dst, nl.load(a), nl.load(b))

    with pytest.raises(NkiError, match="accumulates in float32 in PSUM"):
        _run(body, _zeros(128, 128), _zeros(128, 512))


def test_matmul_reads_sbuf_and_floats():
    def from_hbm(a, b):
        nisa.nc_matmul(a, nl.load(b))

    with pytest.raises(NkiError, match="stationary operand must be an SBUF tile, got hbm"):
        _run(from_hbm, _zeros(128, 128), _zeros(128, 512))

    def ints(a, b):
        nisa.nc_matmul(nl.load(a), nl.load(b))

    with pytest.raises(
        NkiError, match="Tensor Engine takes float8/bfloat16/float16/tfloat32/float32"
    ):
        _run(ints, np.zeros((128, 128), np.int32), np.zeros((128, 512), np.int32))


@pytest.mark.parametrize("chip,fits", [("trn1", False), ("trn2", True)])
def test_sbuf_capacity_per_partition_follows_the_target_chip(monkeypatch, chip, fits):
    # 200 KiB per partition: over trn1's 192 KiB, under trn2's 224 KiB.
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", chip)

    def body():
        nl.ndarray((128, 200 * 1024 // 4), nl.float32, buffer=nl.sbuf)

    if fits:
        _run(body)
    else:
        with pytest.raises(
            NkiCapacityError, match="SBUF is full on trn1.*196608 bytes per partition"
        ):
            _run(body)


def test_reductions_run_along_free_axes_only():
    def body(x):
        nl.sum(nl.load(x), axis=0)

    with pytest.raises(NkiError, match="reducing over the partition dimension"):
        _run(body, _zeros(128, 4))


def test_compute_engines_read_on_chip_tiles_only():
    def body(x):
        nl.exp(x)

    with pytest.raises(NkiError, match="operand is in hbm; compute engines read SBUF/PSUM"):
        _run(body, _zeros(128, 4))


def test_tile_values_cannot_steer_control_flow():
    def body(x):
        if nl.load(x):
            pass

    with pytest.raises(NkiError, match="control flow cannot depend on them"):
        _run(body, _zeros(128, 4))


def test_out_of_bounds_access_needs_a_mask():
    def body(x):
        i_p = nl.arange(128)[:, None]
        nl.load(x[i_p, nl.arange(4)[None, :]])

    with pytest.raises(IndexError, match="guard the access with mask="):
        _run(body, _zeros(100, 4))


def test_language_calls_need_a_kernel():
    with pytest.raises(NkiError, match="only inside a kernel"):
        nl.zeros((128, 4), nl.float32)


def test_store_writes_hbm():
    def body(x):
        tile = nl.load(x)
        nl.store(tile, tile)

    with pytest.raises(NkiError, match="nl.store writes HBM; the destination is sbuf"):
        _run(body, _zeros(128, 4))


# -- a refused kernel has done nothing ------------------------------------------------------


def _in_place_doubling_then(refusal):  # noqa: ANN001, ANN202
    @nki.jit
    def kernel(a):
        nl.store(a, value=nl.multiply(nl.load(a), 2.0))  # the caller's tensor, written first
        refusal(a)

    return kernel


def _reduce_over_partitions(a) -> None:  # noqa: ANN001 - refused at the instruction
    nl.sum(nl.load(a), axis=0)


def _sbuf_overfull_by_liveness(a) -> None:  # noqa: ANN001 - refused once the kernel has run
    tiles = [nl.zeros((128, 8192), nl.float32) for _ in range(7)]  # 7 x 32 KiB live at once
    total = tiles[0]
    for tile in tiles[1:]:
        total = nl.add(total, tile)


def _arguments() -> dict[str, object]:
    import torch

    base = torch.arange(128 * 16, dtype=torch.float32).reshape(128, 16)
    return {
        "numpy": base.numpy().copy(),
        "cpu": base.clone(),
        "neuron": base.to("neuron"),
        "neuron strided view": base.repeat(1, 3).to("neuron")[:, ::3],
        "neuron bfloat16": base.to(torch.bfloat16).to("neuron"),
    }


def _snapshot(value) -> np.ndarray:  # noqa: ANN001
    if isinstance(value, np.ndarray):
        return value.astype(np.float32)
    return value.cpu().float().clone().numpy()


@pytest.mark.parametrize("path", ["interpret", "compiled"])
@pytest.mark.parametrize(
    "refusal,error,message",
    [
        (_reduce_over_partitions, NkiError, "reducing over the partition dimension"),
        (_sbuf_overfull_by_liveness, NkiCapacityError, "SBUF is full on trn1"),
    ],
    ids=["instruction", "capacity"],
)
def test_a_refused_kernel_leaves_its_arguments_as_they_were(
    monkeypatch, path, refusal, error, message
):
    """The kernel writes its argument in place, then breaks a rule: the error comes before
    any of its work reaches the caller (the interpreter ran on copies of the arguments)."""
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn1")
    kernel = _in_place_doubling_then(refusal)
    for name, value in _arguments().items():
        before = _snapshot(value)
        with pytest.raises(error, match=message):
            kernel.interpret(value) if path == "interpret" else kernel(value)
        np.testing.assert_array_equal(_snapshot(value), before, err_msg=name)


@pytest.mark.parametrize("path", ["interpret", "compiled"])
def test_a_completed_kernel_writes_its_arguments_in_place(path):
    kernel = _in_place_doubling_then(lambda a: None)
    for name, value in _arguments().items():
        before = _snapshot(value)
        for call in range(2):  # compiled: the trace, then the compiled program
            kernel.interpret(value) if path == "interpret" else kernel(value)
            np.testing.assert_array_equal(_snapshot(value), before * 2 ** (call + 1), err_msg=name)
