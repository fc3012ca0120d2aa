"""Asynchronous launches (csrc/aten/launch/async_launch.h): ops run on their stream's worker.

References: the CPU's result of the same computation, and the blocking mode
(NEURON_LAUNCH_BLOCKING=1, in a subprocess) for where an error surfaces. Tests that need
every op to launch asynchronously, whatever its size, set TORCHNEURON_ASYNC_MIN_BYTES=0 in a
subprocess; in this process the default threshold (256 KiB) applies.
"""

from __future__ import annotations

import threading

import pytest
import torch
from conftest import run_python

import torchneuron

DEV = "neuron"
BIG = 1536  # a 1536³ product: tens of milliseconds of work for the worker


@pytest.fixture(autouse=True, scope="module")
def _launch_path_warmed() -> None:
    # A process's first launched elementwise ops compute their result shapes through
    # PyTorch's Python meta functions, whose first use imports modules for up to a second:
    # long enough for launched work a test expects to still be queued to have finished.
    w = torch.ones(300_000, device=DEV)
    ((w * 2 + w).sum() + 1).cpu()


def _hold_stream(ms: float = 300.0) -> None:
    """The current stream is busy for `ms` after what was launched last: what is launched
    next is still queued when the following statements run, on a fast host as on a loaded
    one (a product's own time varies with both)."""
    torchneuron._C._sleep_on_stream(-1, ms)


pytestmark = pytest.mark.skipif(
    torchneuron._C._launch_blocking(), reason="NEURON_LAUNCH_BLOCKING=1: launches are inline"
)


def _check(result: torch.Tensor, expected: torch.Tensor) -> None:
    # fp32 products of different blockings: within 1e-4 relative, and 1e-3 absolute (sums of
    # 1536 unit-variance products reach |40| or more, where float32 spacing is 4e-6 and
    # rounding differences accumulate to ~1e-4).
    torch.testing.assert_close(result.cpu(), expected, rtol=1e-4, atol=1e-3)


def test_a_large_op_returns_before_it_completes() -> None:
    a = torch.randn(BIG, BIG)
    x = a.to(DEV)
    torch.neuron.synchronize()
    y = x @ x
    assert not torch.neuron.current_stream().query()  # still running on the worker
    torch.neuron.synchronize()
    assert torch.neuron.current_stream().query()
    _check(y, a @ a)


def test_chains_of_launched_ops_match_the_cpu() -> None:
    torch.manual_seed(0)
    a, w = torch.randn(256, 512), torch.randn(512, 512) / 20
    x, wd = a.to(DEV), w.to(DEV)
    y, ref = x, a
    for _ in range(6):
        y = torch.nn.functional.gelu(y @ wd) + y.softmax(-1)
        ref = torch.nn.functional.gelu(ref @ w) + ref.softmax(-1)
    s, s_ref = y.sum(0), ref.sum(0)
    _check(s, s_ref)  # .cpu() waits
    assert y.shape == ref.shape and y.dtype == ref.dtype and y.stride() == ref.stride()


def test_out_variant_composites_keep_cpu_strides_on_strided_inputs() -> None:
    # abs allocates an empty result and calls abs.out; CPU eager's TensorIterator gives the
    # result the transposed input's layout, where the meta kernel would resize it contiguous.
    # 300x300 float32 (360 KB) launches by default; the op must then run inline.
    a = torch.randn(300, 300)
    for fn in (torch.abs, torch.sign):
        got, want = fn(a.to(DEV).t()), fn(a.t())
        assert got.stride() == want.stride() == (1, 300)
        torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)
    # A contiguous input still gets a contiguous result, as on CPU eager.
    assert torch.abs(a.to(DEV)).stride() == torch.abs(a).stride()


def test_in_place_ops_and_metadata_changes_keep_program_order() -> None:
    a = torch.randn(BIG, BIG)
    x = a.to(DEV)
    y = x @ x  # launched, reads x
    x.add_(1)  # launched after it, on the same stream
    x.t_()  # changes x's geometry on this thread only
    _check(y, a @ a)
    _check(x, (a + 1).t())


def test_a_freed_argument_is_reused_in_stream_order() -> None:
    # As with a stream-ordered device allocator: the caller's free is immediate, and the
    # next allocation on the stream may take the block while the product still reads it,
    # because the work that writes it is queued after the product.
    a = torch.randn(BIG, BIG)
    x = a.to(DEV)
    torch.neuron.synchronize()
    y = x @ x
    pointer = x.data_ptr()
    del x
    z = torch.full((BIG, BIG), 7.0, device=DEV)  # same size: takes x's block
    reused = z.data_ptr() == pointer
    _check(y, a @ a)
    assert bool((z == 7).all())
    assert reused


def test_results_are_written_in_place_without_copies() -> None:
    torchneuron._C._clear_op_tracking()
    x = torch.randn(512, 1024, device=DEV)
    values, indices = x.topk(5, dim=-1)
    m = x.amax(-1) + x.sum(-1)
    ref = x.cpu()
    torch.testing.assert_close(values.cpu(), ref.topk(5, dim=-1).values)
    assert torch.equal(indices.cpu(), ref.topk(5, dim=-1).indices)
    torch.testing.assert_close(m.cpu(), ref.amax(-1) + ref.sum(-1), rtol=1e-5, atol=1e-4)
    assert not torchneuron._C._fallback_ops()


def test_data_dependent_ops_wait_for_launched_work() -> None:
    torch.manual_seed(0)
    a = torch.randn(BIG, BIG)
    x = a.to(DEV)
    y = (x @ x) > 0  # launched
    found = y.nonzero().cpu()  # nonzero runs inline: it must read the finished product
    assert torch.equal(found, y.cpu().nonzero())
    # The product is the CPU's up to rounding (another GEMM): signs of entries within
    # rounding of zero may differ, so the CPU reference is compared on a share of entries.
    assert (y.cpu() == ((a @ a) > 0)).float().mean().item() > 0.999
    assert (x @ x).sum().item() == pytest.approx((a @ a).sum().item(), rel=1e-3)


def _launch_long_work() -> torch.Tensor:
    x = torch.randn(BIG, BIG, device=DEV)
    torch.neuron.synchronize()
    torch.neuron.clear_op_tracking()
    y = x @ x
    _hold_stream()  # the stream stays busy after it: later launches are queued behind
    return y


def test_synchronizing_ops_name_the_ops_that_waited() -> None:
    # (Reading the counters waits for launched work too, so each check ends a sequence.)
    y = _launch_long_work()
    z = (y * 2).sum()  # launched behind it: no wait
    value = z.item()  # reads device data on the host: waits
    assert torch.neuron.get_synchronizing_ops() == {"aten::_local_scalar_dense": 1}
    assert value == pytest.approx(2 * y.sum().item(), rel=1e-4)
    y = _launch_long_work()
    z = (y * 2).sum()
    assert torch.neuron.get_synchronizing_ops() == {}
    y = _launch_long_work()
    (y > 0).nonzero()  # a data-dependent shape: runs inline after the product
    assert torch.neuron.get_synchronizing_ops() == {"aten::nonzero": 1}
    torch.neuron.clear_op_tracking()
    assert torch.neuron.get_synchronizing_ops() == {}


def test_composite_ops_filling_an_empty_out_argument_launch_without_waiting() -> None:
    # arange (and any op given an empty out=) resizes its output: the caller resizes it and
    # the kernel runs on the worker. Before, each such call waited for all launched work,
    # several times per decode step of a Transformers model.
    a = torch.randn(64, 64)
    x = a.to(DEV)
    y = _launch_long_work()
    r1 = torch.arange(3, 40, 2, device=DEV)
    r2 = torch.arange(16, dtype=torch.bfloat16, device=DEV)
    out = torch.empty(0, device=DEV)
    r3 = torch.add(x, 1.5, out=out)
    r4 = torch.cumsum(x, 1, out=torch.empty(0, device=DEV))
    assert torch.neuron.get_synchronizing_ops() == {}
    assert r3 is out and r3.shape == (64, 64) and r3.is_contiguous()
    assert torch.equal(r1.cpu(), torch.arange(3, 40, 2))
    assert torch.equal(r2.cpu(), torch.arange(16, dtype=torch.bfloat16))
    assert torch.equal(r3.cpu(), a + 1.5)
    torch.testing.assert_close(r4.cpu(), torch.cumsum(a, 1), rtol=1e-6, atol=1e-5)
    del y


def test_host_to_device_copies_launch_behind_pending_work() -> None:
    # The source is snapshotted at launch: changing it afterwards does not change the copy.
    host = [torch.randn(4, 3, 32), torch.randn(3, 40).bfloat16(), torch.rand(3, 40) > 0.3]
    host.append(torch.randn(7, 5).t())  # strided
    kept = [t.clone() for t in host]
    y = _launch_long_work()
    on_device = [t.to(DEV) for t in host]
    for t in host:
        t.zero_()
    assert torch.neuron.get_synchronizing_ops() == {}
    for got, want in zip(on_device, kept, strict=True):
        assert torch.equal(got.cpu(), want)
    del y


def test_an_out_argument_with_bytes_is_resized_inline() -> None:
    # Launched work may still read an out= tensor that has bytes: growing it waits (counted),
    # and the values and storage are the CPU's.
    a = torch.randn(32, 32)
    x = a.to(DEV)
    out, cpu_out = torch.zeros(5, device=DEV), torch.zeros(5)
    y = _launch_long_work()
    late = y[0, :5] + out  # launched: reads out's present bytes
    with pytest.warns(UserWarning, match="resized"):
        torch.mul(x, 2, out=out)
    with pytest.warns(UserWarning, match="resized"):
        torch.mul(a, 2, out=cpu_out)
    assert torch.neuron.get_synchronizing_ops() == {"aten::mul.out": 1}
    assert torch.equal(out.cpu(), cpu_out) and out.stride() == cpu_out.stride()
    assert torch.equal(late.cpu(), y[0, :5].cpu())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_without_dropout_launches_without_waiting(dtype: torch.dtype) -> None:
    # The CPU flash kernel is tagged as seeded for its dropout alone. 16 query rows: the CPU
    # kernel runs (the native decode kernel takes up to 8).
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 4, n, 32, generator=g).to(dtype) for n in (16, 40, 40))
    masks = {"float": torch.randn(16, 40, generator=g).to(dtype), "bool": torch.rand(16, 40) > 0.3}
    y = _launch_long_work()
    results = {
        name: torch.nn.functional.scaled_dot_product_attention(
            q.to(DEV), k.to(DEV), v.to(DEV), attn_mask=mask.to(DEV)
        )
        for name, mask in masks.items()
    }
    assert torch.neuron.get_synchronizing_ops() == {}
    for name, mask in masks.items():
        want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        assert torch.equal(results[name].cpu(), want), name  # the same CPU kernel: bit for bit
    del y


def test_side_stream_waits_for_an_event_of_the_default_stream() -> None:
    a = torch.randn(BIG, BIG)
    x = a.to(DEV)
    side = torch.neuron.Stream()
    y = x @ x  # default stream
    done = torch.neuron.Event()
    done.record()
    with torch.neuron.stream(side):
        side.wait_event(done)
        z = y * 2  # on the side stream, after the product
    side.synchronize()
    _check(z, (a @ a) * 2)


def test_python_threads_launch_concurrently() -> None:
    a = torch.randn(384, 384)
    results: dict[int, torch.Tensor] = {}

    def work(k: int) -> None:
        x = (a + k).to(DEV)
        for _ in range(3):
            x = x @ x / 384
        results[k] = x.cpu()

    threads = [threading.Thread(target=work, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for k in range(3):
        ref = a + k
        for _ in range(3):
            ref = ref @ ref / 384
        torch.testing.assert_close(results[k], ref, rtol=1e-4, atol=1e-4)


_ONE_TEAM_PROGRAM = """
import os
# libgomp reads the affinity mask when it loads (with torch): two CPUs on every host.
os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:2])
import threading
import torch, torchneuron

torch.set_num_threads(2)
def names():
    # a thread takes its creator's name: the worker's OpenMP team would be "neuron-stream"
    return [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
a = torch.randn(1024, 1024)
(a @ a).sum()  # the caller's OpenMP team
before = names().count("python")
x = torch.randn(1 << 20).to("neuron")
y = torch.sort(x * 2 + x.exp())[0].cumsum(0)
w = (x.reshape(1024, 1024) @ x.reshape(1024, 1024).T).softmax(-1)
expected = torch.sort(x.cpu() * 2 + x.cpu().exp())[0].cumsum(0)
torch.testing.assert_close(y.cpu(), expected)
torch.testing.assert_close(w.cpu(), (a := x.cpu().reshape(1024, 1024)).matmul(a.T).softmax(-1))
after = names()
print("caller threads", before, after.count("python"))
print("device threads", after.count("neuron-stream"))
seen = []
thread = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
thread.start()
thread.join()
print("a new thread's default", seen[0])
"""


def test_the_worker_opens_no_openmp_team_beside_the_callers_on_two_cpus() -> None:
    # With two teams on two CPUs libgomp stops every idle team thread from spinning, and each
    # parallel region of the caller's CPU work then waits for a wake-up (aten_parallel.h).
    result = run_python(_ONE_TEAM_PROGRAM)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    before, after = lines[0].split()[-2:]
    assert before == after, result.stdout
    assert lines[1] == "device threads 1", result.stdout  # the worker alone, no team of its own
    # the worker sets its own threads only: threads started later keep the caller's default
    assert lines[2] == "a new thread's default 2", result.stdout


_ERROR_PROGRAM = """
import torch, torchneuron
table = torch.randn(100_000, 4, device="neuron")  # 1.6 MB: launched asynchronously
bad = torch.tensor([0, 100_000], device="neuron")
try:
    rows = table.index_select(0, bad)
    print("returned")
    torch.neuron.synchronize()
    print("no error")
except IndexError as error:
    print("IndexError:", str(error).splitlines()[0])
    print("blocking hint" if "NEURON_LAUNCH_BLOCKING=1" in str(error) else "no hint")
ok = torch.ones(3, device="neuron") * 2  # the device works on after the error
print("after", ok.sum().item())
"""


def test_an_error_in_launched_work_surfaces_at_the_next_synchronization() -> None:
    result = run_python(_ERROR_PROGRAM)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert lines[0] == "returned"
    assert "index out of range" in lines[1] and "aten::index_select" in lines[1]
    assert lines[2] == "blocking hint"
    assert lines[3] == "after 6.0"


def test_blocking_launches_raise_where_the_op_is_called() -> None:
    result = run_python(_ERROR_PROGRAM, env={"NEURON_LAUNCH_BLOCKING": "1"})
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert lines[0].startswith("IndexError:") and "index out of range" in lines[0]
    assert "asynchronously" not in lines[0]
    assert lines[1:] == ["no hint", "after 6.0"]


def test_blocking_mode_runs_every_op_before_returning() -> None:
    code = f"""
    import torch, torchneuron
    assert torchneuron._C._launch_blocking()
    x = torch.randn({BIG}, {BIG}, device="neuron")
    y = x @ x
    print(torch.neuron.current_stream().query())
    """
    result = run_python(code, env={"NEURON_LAUNCH_BLOCKING": "1"})
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["True"]


def test_every_op_launched_asynchronously_matches_the_cpu() -> None:
    # TORCHNEURON_ASYNC_MIN_BYTES=0: even the smallest eligible op goes to the worker.
    code = """
    import torch, torchneuron
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32), torch.nn.Linear(32, 4)
    )
    import copy
    cpu = copy.deepcopy(model)
    dev = model.to("neuron")
    opt_c = torch.optim.AdamW(cpu.parameters(), lr=1e-2, foreach=True)
    opt_d = torch.optim.AdamW(dev.parameters(), lr=1e-2, foreach=True)
    x = torch.randn(8, 16)
    t = torch.randint(0, 4, (8,))
    for _ in range(3):
        for net, opt, xs, ts in ((cpu, opt_c, x, t), (dev, opt_d, x.to("neuron"), t.to("neuron"))):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(net(xs), ts)
            loss.backward()
            opt.step()
    for p, q in zip(cpu.parameters(), dev.parameters()):
        torch.testing.assert_close(q.detach().cpu(), p.detach(), rtol=1e-4, atol=1e-5)
    print("ok")
    """
    result = run_python(code, env={"TORCHNEURON_ASYNC_MIN_BYTES": "0"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["ok"]


def test_inference_mode_generation_launched_asynchronously_matches_the_cpu() -> None:
    # Under torch.inference_mode() the caller's results are inference tensors: the worker runs
    # in the caller's mode, or writing them (and the static cache's in-place updates) is
    # refused. Greedy static-cache generation, eager, every op on the worker; tokens equal.
    code = """
    import torch, torchneuron, transformers
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    cpu = transformers.LlamaForCausalLM(config).eval()
    dev = transformers.LlamaForCausalLM(config).eval()
    dev.load_state_dict(cpu.state_dict())
    dev.to("neuron")
    prompt = torch.randint(0, 97, (1, 6))
    kwargs = dict(max_new_tokens=8, do_sample=False, cache_implementation="static",
                  disable_compile=True, pad_token_id=0)
    with torch.inference_mode():
        want = cpu.generate(prompt, **kwargs)
        on_device = prompt.to("neuron")
        torch.neuron.synchronize()
        torch.neuron.clear_op_tracking()
        got = dev.generate(on_device, **kwargs)
        waited = torch.neuron.get_synchronizing_ops()
        x = torch.arange(5, device="neuron") + 3  # a wrapped number, settled into its result
    assert torch.equal(got.cpu(), want), (got, want)
    # Python runs ahead of the device through each step: only generate's reads of values on
    # the host (its stopping checks, a few per new token) wait.
    assert set(waited) <= {"aten::_local_scalar_dense"}, waited
    assert waited.get("aten::_local_scalar_dense", 0) <= 2 * 8, waited
    assert x.cpu().tolist() == [3, 4, 5, 6, 7]
    print("ok")
    """
    result = run_python(code, env={"TORCHNEURON_ASYNC_MIN_BYTES": "0"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["ok"]


@pytest.mark.launch_mode_independent
def test_a_bad_threshold_is_refused_with_its_name() -> None:
    result = run_python(
        "import torch, torchneuron\ntorch.ones(3, device='neuron') + 1",
        env={"TORCHNEURON_ASYNC_MIN_BYTES": "lots"},
    )
    assert result.returncode != 0
    assert "TORCHNEURON_ASYNC_MIN_BYTES" in result.stderr and "'lots'" in result.stderr


def test_the_interpreter_exits_cleanly_with_work_still_launched() -> None:
    # The last products are still queued when the script ends: exit waits for them, and an
    # error they hit is reported as a warning rather than lost or crashing the exit.
    code = f"""
    import torch, torchneuron
    x = torch.randn({BIG}, {BIG}, device="neuron")
    for _ in range(4):
        y = x @ x
    table = torch.randn(100_000, 4, device="neuron")
    table.index_select(0, torch.tensor([100_000], device="neuron"))
    print("end of script")
    """
    result = run_python(code)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split("\n")[0] == "end of script"
    assert "launched work failed before exit" in result.stderr
    assert "index out of range" in result.stderr
