"""Command-line tools of torchneuron (``python -m torchneuron.tools.<name>``)."""
