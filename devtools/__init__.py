"""Developer tools of torchneuron, run from a checkout (``python -m devtools.<name>``):
conformance sweeps over PyTorch's op and module databases, fuzzing, soak.

They live beside the installable package, not in it: users of the device need none of them.
"""
