"""``python -m demo``: the main job (demo/finetune.py)."""

import sys

from .finetune import main

sys.exit(main())
