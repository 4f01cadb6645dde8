"""``python -m lightning_losses.compare``: the same as ``lightning-losses compare``."""

import sys

from lightning_losses.compare.cli import main

sys.exit(main())
