"""nki-vit: RMSNorm and fused ViT self-attention written in NKI, as a Hugging Face `kernels`
repository for the ``neuron`` device (build variant ``torch-neuron``).

The kernels (``nki_kernels.py``) import NKI the way kernels written for Trainium do
(``import nki``); on TorchNeuron ``install_aliases()`` points that name at
``torchneuron.nki`` unless a real Neuron SDK provides it."""

import torchneuron.nki

torchneuron.nki.install_aliases()

from . import layers  # noqa: E402
from .nki_kernels import rmsnorm_kernel, vit_attention_kernel  # noqa: E402

__all__ = ["layers", "rmsnorm_kernel", "vit_attention_kernel"]
