"""``python -m lightning_losses.lm fit --config lm_ce``: as ``lightning-losses lm fit ...``."""

import sys

from lightning_losses.lm.cli import console_main

if __name__ == "__main__":  # pragma: no cover
    sys.exit(console_main())
