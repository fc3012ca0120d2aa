"""``neuron`` as a device of Dynamo and Inductor, for the default ``torch.compile(model)``.

With ``backend="neuron"`` (torchneuron/compile.py) graphs are re-targeted to the host and
compiled as CPU graphs; this module is for the other entry point, plain Inductor on neuron
tensors. It registers the device the supported way (a Dynamo ``DeviceInterface``,
Inductor's ``register_backend_for_device`` with its C++ scheduling, and device op
overrides): the generated C++ kernels read and write neuron tensors' memory directly, which
is sound because device memory is host-addressable, and the wrapper allocates buffers with
``device='neuron'``.

Inductor decides "C++ or Triton" by ``device.type == "cpu"`` in a few places that have no
registration hook, so two of its functions are adjusted to count ``neuron`` as the CPU:
``BaseSchedulerNode.is_cpu`` (the scheduler's GPU-only loop re-indexing) and
``get_current_backend`` (which backend's dtype rules the kernels follow). They are private
API: the adjustments are made only when the functions look as expected, and otherwise the
registration is skipped with a warning (``backend="neuron"`` does not depend on it).
Inductor's other CPU-keyed heuristics (Welford layer norm, cat lowering, fusion thresholds)
then take their GPU defaults on neuron: same results, possibly other speed. AOTInductor
has its own C++ wrapper (inductor_aot.py); JIT ``cpp_wrapper=True`` is refused.

Registration happens when Inductor's ``compile_fx`` module is first imported (an import
hook), because importing Dynamo and Inductor at ``import torch`` would cost about a second;
the Dynamo device interface alone is registered as soon as ``torch._dynamo.device_interface``
is imported, since loading an AOTInductor package asks for it without importing Inductor's
compiler.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import inspect
import logging
import os
import sys
import types
from textwrap import dedent
from typing import Any

import torch

log = logging.getLogger("torchneuron.inductor")

_registered = False
_interface_registered = False


def _device_properties(device: Any = None) -> types.SimpleNamespace:
    index = torch.device("neuron", torch.neuron.current_device()) if device is None else device
    props = torch.neuron.get_device_properties(index)
    # Inductor sizes reductions and thread blocks from these; the host kernels run on the
    # intra-op thread pool, so that is the "processor count".
    return types.SimpleNamespace(
        name=props.name,
        total_memory=props.total_memory,
        multi_processor_count=torch.get_num_threads(),
        warp_size=1,
        max_threads_per_multi_processor=1,
    )


def _build_interface() -> type:
    from torch._dynamo.device_interface import DeviceInterface

    class NeuronDeviceInterface(DeviceInterface):
        device = torch.neuron.device
        Event = torch.neuron.Event
        Stream = torch.neuron.Stream

        class Worker:
            @staticmethod
            def set_device(device: int) -> None:
                torch.neuron.set_device(device)

            @staticmethod
            def current_device() -> int:
                return torch.neuron.current_device()

            @staticmethod
            def get_device_properties(device: Any = None) -> types.SimpleNamespace:
                return _device_properties(device)

        current_device = staticmethod(torch.neuron.current_device)
        set_device = staticmethod(torch.neuron.set_device)
        device_count = staticmethod(torch.neuron.device_count)
        is_available = staticmethod(torch.neuron.is_available)
        synchronize = staticmethod(torch.neuron.synchronize)
        current_stream = staticmethod(torch.neuron.current_stream)
        set_stream = staticmethod(torch.neuron.set_stream)
        get_device_properties = staticmethod(_device_properties)

        @staticmethod
        def get_raw_stream(device_idx: int) -> int:
            return 0  # host kernels run on the calling thread; streams are synchronous

        @staticmethod
        def is_bf16_supported(including_emulation: bool = False) -> bool:
            return True

        @staticmethod
        def get_compute_capability(device: Any = None) -> str:
            return ""

        @staticmethod
        def is_triton_capable(device: Any = None) -> bool:
            return False

    return NeuronDeviceInterface


def _build_codegen_classes() -> tuple[type, type]:
    from torch._inductor.codegen.common import DeviceOpOverrides
    from torch._inductor.codegen.wrapper import PythonWrapperCodegen

    class NeuronDeviceOpOverrides(DeviceOpOverrides):
        def import_get_raw_stream_as(self, name: str) -> str:
            return dedent(
                f"""
                def {name}(_):
                    return 0
                """
            )

        def cpp_kernel_type(self) -> str:
            return "void*"

        def set_device(self, device_idx: int) -> str:
            return f"torch.neuron.set_device({device_idx})"

        def synchronize(self) -> str:
            return "torch.neuron.synchronize()"

        def device_guard(self, device_idx: int) -> str:
            return f"torch.neuron.device({device_idx})"

    class NeuronWrapperCodegen(PythonWrapperCodegen):
        """The Python wrapper, calling C++ kernels directly as it does for the CPU."""

        @classmethod
        def create(
            cls,
            is_subgraph: bool,
            subgraph_name: str | None,
            parent_wrapper: Any,
            partition_signatures: Any = None,
        ) -> Any:
            if is_subgraph:
                return PythonWrapperCodegen.create(
                    is_subgraph, subgraph_name, parent_wrapper, partition_signatures
                )
            return cls()

        def _generate_kernel_call_helper(
            self,
            kernel_name: str,
            call_args: Any,
            *,
            device: Any = None,
            triton: bool = True,
            **kwargs: Any,
        ) -> Any:
            if not triton:
                self.writeline(self.wrap_kernel_call(kernel_name, call_args))
                return None
            return super()._generate_kernel_call_helper(
                kernel_name, call_args, device=device, triton=triton, **kwargs
            )

    return NeuronDeviceOpOverrides, NeuronWrapperCodegen


def _cpu_like_adjustments() -> list[tuple[Any, str, Any]]:
    """(owner, attribute, replacement) for the two CPU-keyed Inductor functions, checked."""
    from torch._inductor import scheduler, utils
    from torch._inductor.codegen import common

    node_is_cpu = scheduler.BaseSchedulerNode.is_cpu
    current_backend = utils.get_current_backend
    if "device_type" not in inspect.signature(current_backend).parameters:
        raise RuntimeError("torch._inductor.utils.get_current_backend has a new signature")
    if len(inspect.signature(node_is_cpu).parameters) != 1:
        raise RuntimeError("BaseSchedulerNode.is_cpu has a new signature")

    def is_cpu(self: Any) -> bool:
        device = self.get_device()
        return device is not None and device.type in ("cpu", "neuron")

    def get_current_backend(device_type: str | None = None) -> str:
        if device_type is None:
            from torch._inductor.virtualized import V

            device_type = V.graph.get_current_device_or_throw().type
        return current_backend("cpu" if device_type == "neuron" else device_type)

    # get_current_backend is imported by name into these modules: each copy is replaced.
    owners = [m for m in (utils, common, scheduler) if hasattr(m, "get_current_backend")]
    return [(scheduler.BaseSchedulerNode, "is_cpu", is_cpu)] + [
        (m, "get_current_backend", get_current_backend) for m in owners
    ]


def register_device_interface() -> bool:
    """Registers neuron's Dynamo DeviceInterface (also what AOTInductor's package loader
    asks for); False (with a warning) if Dynamo lacks the interface this expects."""
    global _interface_registered
    if _interface_registered:
        return True
    try:
        from torch._dynamo.device_interface import register_interface_for_device

        interface = _build_interface()
    except (ImportError, AttributeError, TypeError) as error:
        log.warning("torchneuron: no Dynamo device interface for neuron (%s)", error)
        return False
    register_interface_for_device("neuron", interface)
    _interface_registered = True
    return True


def register() -> bool:
    """Registers neuron with Dynamo and Inductor; False (with a warning) if not possible."""
    global _registered
    if _registered:
        return True
    try:
        from torch._inductor.codegen.common import (
            register_backend_for_device,
            register_device_op_overrides,
        )
        from torch._inductor.codegen.cpp import CppScheduling
        from torch._inductor.codegen.cpp_wrapper_cpu import CppWrapperCpu

        op_overrides, wrapper = _build_codegen_classes()
        adjustments = _cpu_like_adjustments()
    except (ImportError, AttributeError, RuntimeError, TypeError) as error:
        log.warning(
            "torchneuron: Inductor %s does not have the interfaces this registration expects "
            "(%s); torch.compile on neuron tensors needs backend='neuron'",
            torch.__version__,
            error,
        )
        return False
    if not register_device_interface():
        return False
    for owner, name, replacement in adjustments:
        setattr(owner, name, replacement)
    register_device_op_overrides("neuron", op_overrides())
    register_backend_for_device("neuron", CppScheduling, wrapper, _aot_wrapper(CppWrapperCpu))
    _registered = True
    return True


def _aot_wrapper(fallback: type) -> type:
    """The C++ wrapper for AOTInductor on neuron, or `fallback` (with a warning) if this
    Inductor lacks what it builds on; the default torch.compile does not depend on it."""
    from . import inductor_aot

    try:
        cpp_wrapper = inductor_aot.build_cpp_wrapper_class()
        owner, name, replacement = inductor_aot.host_header_adjustment()
    except (ImportError, AttributeError, RuntimeError, TypeError) as error:
        log.warning(
            "torchneuron: AOTInductor for neuron is unavailable with Inductor %s (%s)",
            torch.__version__,
            error,
        )
        return fallback
    setattr(owner, name, replacement)
    inductor_aot.spell_neuron_as_cpu()
    return cpp_wrapper


# Module whose first import runs the registration, and which registration.
_TRIGGERS = {
    "torch._dynamo.device_interface": register_device_interface,
    "torch._inductor.compile_fx": register,
}


class _RegisterAfterImport(importlib.abc.MetaPathFinder):
    """Runs a trigger's registration right after the trigger module has been executed."""

    def __init__(self) -> None:
        self.pending = {name for name in _TRIGGERS if name not in sys.modules}

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in self.pending:
            return None
        self.pending.discard(name)
        if not self.pending:
            sys.meta_path.remove(self)
        spec = None
        for finder in sys.meta_path:
            if finder is not self and hasattr(finder, "find_spec"):
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    break
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module
        action = _TRIGGERS[name]

        def exec_module(module: types.ModuleType) -> None:
            execute(module)
            action()

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def install() -> None:
    """Registers now what is already loaded, the rest when its module is first imported."""
    if os.environ.get("TORCHNEURON_INDUCTOR_DEVICE", "1") == "0":
        return
    for name, action in _TRIGGERS.items():
        if name in sys.modules:
            action()
    if any(isinstance(f, _RegisterAfterImport) for f in sys.meta_path):
        return
    finder = _RegisterAfterImport()
    if finder.pending:
        sys.meta_path.insert(0, finder)
