"""AOTInductor (``torch._inductor.aoti_compile_and_package``) for programs on neuron tensors.

A packaged model is a shared library with C++ entry points that PyTorch's runtime calls
with tensors; it has no Python to run ``torch.neuron`` code in. The design follows
``backend="neuron"``: the program is emitted as a *CPU* program (CPU kernels, CPU C-shim
calls, CPU allocations, constants in host memory), and the ``neuron`` model runner
registered by the C++ extension (csrc/aten/compile/aoti_runner.cpp) runs it over CPU aliases of
the neuron inputs with every allocation served from device memory, then hands the outputs
back as neuron tensors without a copy. Device memory is host-addressable, so this is the
device's own execution model, not a detour through the CPU.

Inductor keeps ``neuron`` as the graph's device (its scheduling and kernels are the CPU
ones already, see inductor_device.py), so the package's device key is ``neuron`` and
``aoti_load_package`` picks our runner. Only the C++ wrapper's spelling of devices changes:
``NeuronCppWrapper`` writes ``cpu`` where Inductor would write the graph's device (C-shim
names, headers, and the ATen device of allocations and constants). The
methods it overrides are private Inductor API, so they are checked before registration.

JIT ``cpp_wrapper=True`` is refused: its wrapper is called from Python without the
runner, so it would neither alias inputs nor allocate in device memory.
"""

from __future__ import annotations

import inspect
from typing import Any

NEURON = "neuron"

# C function every neuron package exports: one character per output, '1' where the output
# is a host scalar (a size returned by the program, which AOTInductor returns as a CPU
# tensor on every device), '0' where it is a tensor for the neuron device. The runner in
# csrc/aten/compile/aoti_runner.cpp reads it; keep the two in step.
HOST_OUTPUTS_SYMBOL = "torchneuron_aoti_host_outputs"

# The CppWrapperCpu methods overridden below and their parameters (self excluded).
_OVERRIDDEN = {
    "get_c_shim_func_name": ("kernel", "device"),
    "add_device_include": ("device",),
    "generate": ("is_inference",),
    "generate_end": ("result",),
}


def _host_type(device_type: str) -> str:
    return "cpu" if device_type == NEURON else device_type


def build_cpp_wrapper_class() -> type:
    """The C++ wrapper codegen for neuron graphs; raises RuntimeError if Inductor changed."""
    from torch._inductor.codegen.cpp_wrapper_cpu import CppWrapperCpu

    for name, params in _OVERRIDDEN.items():
        method = inspect.getattr_static(CppWrapperCpu, name, None)
        if method is None:
            raise RuntimeError(f"CppWrapperCpu.{name} is missing")
        signature = inspect.signature(getattr(CppWrapperCpu, name))
        names = tuple(p for p in signature.parameters if p != "self")
        if names != params:
            raise RuntimeError(f"CppWrapperCpu.{name}{signature} has a new signature")

    class NeuronCppWrapper(CppWrapperCpu):
        """CppWrapperCpu that spells the neuron device as the CPU (the runner maps back)."""

        def __init__(self) -> None:
            from torch._inductor.virtualized import V

            if not V.graph.aot_mode:
                raise NotImplementedError(
                    "torch.compile(..., options={'cpp_wrapper': True}) is not supported for "
                    "neuron tensors: drop the option (the default Python wrapper runs the "
                    "same C++ kernels), use backend='neuron', or compile ahead of time with "
                    "torch._inductor.aoti_compile_and_package"
                )
            self.device = NEURON
            super().__init__()
            self.needs_vec_isa = True  # the kernels are CPU kernels

        @staticmethod
        def create(
            is_subgraph: bool,
            subgraph_name: str | None,
            parent_wrapper: Any,
            partition_signatures: Any = None,
        ) -> Any:
            return NeuronCppWrapper()

        @staticmethod
        def get_c_shim_func_name(kernel: str, device: str) -> str:
            return CppWrapperCpu.get_c_shim_func_name(kernel, _host_type(device))

        def add_device_include(self, device: str) -> None:
            super().add_device_include(_host_type(device))

        def generate_end(self, result: Any) -> None:
            super().generate_end(result)
            _write_host_outputs_symbol(result)

        def generate(self, is_inference: bool) -> Any:
            _check_outputs_on_device()
            result = super().generate(is_inference)
            _check_host_only(result)
            return result

    return NeuronCppWrapper


def host_header_adjustment() -> tuple[Any, str, Any]:
    """(owner, attribute, replacement) so that the header AOTInductor precompiles for a
    neuron graph is the CPU's: it names it by the graph's device, with no hook to extend."""
    from torch._inductor import codecache

    original = codecache._get_cpp_wrapper_header
    if tuple(inspect.signature(original).parameters) != ("device", "aot_mode"):
        raise RuntimeError("torch._inductor.codecache._get_cpp_wrapper_header has a new signature")

    def get_cpp_wrapper_header(device: str, aot_mode: bool = False) -> str:
        if device.split(":", maxsplit=1)[0] == NEURON:
            device = "cpu"
        return original(device, aot_mode)

    return codecache, "_get_cpp_wrapper_header", get_cpp_wrapper_header


# The ATen device C++ wrappers write for a neuron graph's devices (allocations, constants,
# device arguments): only NeuronCppWrapper ever sees neuron devices, and it means the CPU.
HOST_ATEN_DEVICE = "at::kCPU"


def spell_neuron_as_cpu() -> None:
    """Makes C++ wrappers write HOST_ATEN_DEVICE for neuron. torch 2.13 and 2.14 read it from
    the table cpp_utils.DEVICE_TO_ATEN; torch 2.15 replaced the table with device_to_aten(),
    which asks the device's op overrides (NeuronDeviceOpOverrides.aten_device_type in
    inductor_device.py returns HOST_ATEN_DEVICE), so there is nothing to write here."""
    from torch._inductor.codegen import cpp_utils

    table = getattr(cpp_utils, "DEVICE_TO_ATEN", None)  # absent from torch 2.15
    if table is not None:
        table[NEURON] = HOST_ATEN_DEVICE


def _write_host_outputs_symbol(result: Any) -> None:
    from torch._inductor import ir
    from torch._inductor.virtualized import V

    if not V.graph.aot_mode or V.graph.is_const_graph:
        return
    flags = "".join(
        "1" if isinstance(output, ir.ShapeAsConstantBuffer) else "0"
        for output in V.graph.graph_outputs
    )
    result.splice(
        f'''
        extern "C" AOTI_API const char* {HOST_OUTPUTS_SYMBOL}() {{
          return "{flags}";
        }}
        '''
    )


def _check_outputs_on_device() -> None:
    """The runner returns every output on the neuron device, so a program that returns a
    CPU tensor is refused rather than silently changed."""
    from torch._inductor import ir
    from torch._inductor.virtualized import V

    if V.graph.is_const_graph:
        return
    for index, output in enumerate(V.graph.graph_outputs):
        if isinstance(output, ir.ShapeAsConstantBuffer):
            continue  # a size: returned as a CPU scalar tensor, as on every device
        get_device = getattr(output, "get_device", None)
        device = get_device() if get_device is not None else None
        if device is not None and device.type != NEURON:
            raise NotImplementedError(
                f"AOTInductor for neuron: output {index} of the program is on {device}; a "
                "neuron package returns its outputs on the neuron device. Return it on "
                "neuron and move it after the call."
            )


def _check_host_only(result: Any) -> None:
    """Fails at compile time, not in the C++ compiler, if a device spelling slipped through."""
    parts = result if isinstance(result, tuple) else (result,)
    text = "".join(getattr(part, "value", "") for part in parts)
    for marker in ("aoti_torch_neuron_", "device_type_privateuse1", "kPrivateUse1"):
        if marker in text:
            raise NotImplementedError(
                f"AOTInductor for neuron: the generated C++ wrapper uses '{marker}', which "
                "the neuron runner cannot serve (a construct this torch version emits "
                "for the graph's device). torch.compile (default or backend='neuron') runs "
                "this program; please report it with the model."
            )
