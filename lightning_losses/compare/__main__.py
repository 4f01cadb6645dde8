"""``python -m lightning_losses.compare``: the same as ``lightning-losses compare``."""

import sys

from .cli import main

sys.exit(main())
