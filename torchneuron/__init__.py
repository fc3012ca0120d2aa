"""torchneuron: the ``neuron`` device for PyTorch.

Importing this package (PyTorch does it through the ``torch.backends`` entry point, so
``import torch`` is enough) registers the device: ``torch.device("neuron")``,
``torch.neuron``, ``Tensor.neuron()``, ``Module.neuron()`` and ``torch.accelerator``.
"""

from __future__ import annotations

__version__ = "0.1.0"

_registered = False


def check_torch_release(running: str, built_for: str) -> None:
    """Refuses to load the C++ backend into a torch release other than the one it was compiled
    against (a C++ extension built for another one fails with undefined symbols, or worse).
    `running` is ``torch.__version__``; local build tags (+cpu, +cu130) do not matter."""
    release = running.split("+")[0]
    if release != built_for:
        raise ImportError(
            f"torchneuron was built for torch {built_for} and cannot load into torch {running}: "
            "rebuild it in this environment (pip install --no-build-isolation --no-deps . from "
            "its source, or ./scripts/bootstrap.sh in its repository)"
        )


def _register() -> None:
    global _registered
    if _registered:
        return
    # Importing torch may itself autoload this package (torch.backends entry point) and
    # register the device before we get here.
    import torch

    if _registered:
        return
    from ._torch_release import BUILT_FOR  # written by the build (CMakeLists.txt)

    check_torch_release(torch.__version__, BUILT_FOR)
    from . import _C  # noqa: F401  (loads the C++ backend: hooks, guard, allocator, kernels)
    from . import device as device_module

    torch.utils.rename_privateuse1_backend("neuron")
    torch._register_device_module("neuron", device_module)
    torch.utils.generate_methods_for_privateuse1_backend(for_storage=True)
    from .compile import inductor_device

    inductor_device.install()  # neuron for the default torch.compile, once Inductor loads
    from .distributed import process_group

    process_group.register()  # init_process_group("neuron")
    from .device import tensor_sharing

    tensor_sharing.install()  # neuron tensors through torch.multiprocessing, share_memory_()
    from .device import autograd_exit

    autograd_exit.install()  # no abort at exit right after a backward on neuron
    _registered = True


def _autoload() -> None:
    """Entry point PyTorch calls at ``import torch`` (``torch.backends`` group)."""
    _register()


_register()
