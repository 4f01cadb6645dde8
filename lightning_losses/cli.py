"""The ``lightning-losses`` console script: LightningCLI over ClassifierModule and the data.

``lightning-losses fit --config configs/digits_focal.yaml`` trains; ``validate``, ``test`` and
``predict`` work the same way. Without ``--config`` the packaged default runs (digits, gamma-CE
annealed from cross-entropy towards 1 - p_t). Any loss, schedule or callback is chosen in YAML
with ``class_path`` / ``init_args``; ``--print_config`` prints a config that loads back.
"""

from __future__ import annotations

import sys
from importlib import resources
from typing import Any

import lightning as L
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from .models import ClassifierModule

SUBCOMMANDS = ("fit", "validate", "test", "predict")


def default_config_path() -> str:
    """Path of the packaged default config (digits, gamma-CE with GammaAnnealing)."""
    return str(resources.files("lightning_losses") / "default_config.yaml")


class LossesCLI(LightningCLI):
    """LightningCLI that links the DataModule's shape of the task into the model."""

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        for source, target in (
            ("num_features", "input_dim"),
            ("num_classes", "num_classes"),
            ("num_tasks", "num_tasks"),
            ("task", "task"),
        ):
            parser.link_arguments(f"data.{source}", f"model.{target}", apply_on="instantiate")


def _with_default_config(args: list[str]) -> list[str]:
    """Insert the packaged default config after the subcommand when no config is given."""
    if not args or args[0] not in SUBCOMMANDS:
        return args
    if any(a in ("-c", "--config") or a.startswith("--config=") for a in args[1:]):
        return args
    if any(a in ("-h", "--help") for a in args[1:]):
        return args
    return [args[0], "--config", default_config_path(), *args[1:]]


def main(args: list[str] | None = None, run: bool = True, **cli_kwargs: Any) -> LossesCLI:
    """Run the CLI (``args`` defaults to the command line) and return it.

    Example (in Python, e.g. a notebook or a test)::

        cli = main(["fit", "--config", "configs/digits_focal.yaml", "--trainer.max_epochs=2"])
        cli.trainer.callback_metrics["val/acc"]
    """
    kwargs: dict[str, Any] = {
        "subclass_mode_data": True,
        "seed_everything_default": 0,
        "save_config_kwargs": {"overwrite": True},
        "auto_configure_optimizers": False,
    }
    kwargs.update(cli_kwargs)
    if args is None:  # the command line: LightningCLI reads sys.argv itself
        sys.argv[1:] = _with_default_config(sys.argv[1:])
    else:
        args = _with_default_config(list(args))
    return LossesCLI(ClassifierModule, L.LightningDataModule, args=args, run=run, **kwargs)


def console_main() -> int:
    """Entry point of the ``lightning-losses`` console script."""
    main()
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(console_main())
