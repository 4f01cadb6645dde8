"""``python -m lightning_losses.lm``: the language model's command line."""

from lightning_losses.lm.cli import main

if __name__ == "__main__":  # pragma: no cover
    main()
