"""The ``lightning-losses`` console script: LightningCLI over ClassifierModule and the data.

``lightning-losses fit --config configs/digits_focal.yaml`` trains; ``validate``, ``test`` and
``predict`` work the same way. Without ``--config`` the packaged default runs (digits, gamma-CE
annealed from cross-entropy towards 1 - p_t). Any loss, schedule or callback is chosen in YAML
with ``class_path`` / ``init_args``; ``--print_config`` prints a config that loads back.
"""

from __future__ import annotations

import sys
from importlib import resources
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from .models import ClassifierModule
from .tracking import TrackingConfigCallback, run_id_from_checkpoint

SUBCOMMANDS = ("fit", "validate", "test", "predict")
DESCRIPTION = (
    "Classification losses against overconfidence and imbalance, with calibration and MLflow "
    "tracking. fit/validate/test/predict: LightningCLI over ClassifierModule (default config: "
    "digits, gamma-CE annealed 0 -> 1). Also: `lightning-losses compare` (runs of an MLflow "
    "experiment side by side), `lightning-losses sync-tracking SPOOL` (replay what a dead "
    "tracking server missed), `lightning-losses reproduce` (test the source documents' "
    "claims, write reports/REPORT.md); each takes --help."
)


def default_config_path() -> str:
    """Path of the packaged default config (digits, gamma-CE with GammaAnnealing)."""
    return str(resources.files("lightning_losses") / "default_config.yaml")


class TrackingCLI(LightningCLI):
    """LightningCLI whose ``fit --ckpt_path`` continues the MLflow run of the checkpoint."""

    def before_instantiate_classes(self) -> None:
        """On ``fit --ckpt_path``, continue the MLflow run the checkpoint was saved under."""
        config = self.config.get(self.subcommand) if self.subcommand else self.config
        if config is None or not config.get("ckpt_path"):
            return
        logger = config.get("trainer", {}).get("logger")
        if not logger or isinstance(logger, (bool, list)):
            return
        class_path = logger.get("class_path", "")
        init_args = logger.get("init_args")
        if not class_path.endswith("TrackingLogger") or init_args is None:
            return
        if init_args.get("run_id") is None and Path(config["ckpt_path"]).is_file():
            init_args["run_id"] = run_id_from_checkpoint(config["ckpt_path"])


class LossesCLI(TrackingCLI):
    """The ``lightning-losses`` CLI: links the DataModule's shape of the task into the model."""

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
        "save_config_callback": TrackingConfigCallback,
        "auto_configure_optimizers": False,
        "parser_kwargs": {"description": DESCRIPTION},
    }
    kwargs.update(cli_kwargs)
    if args is None:  # the command line: LightningCLI reads sys.argv itself
        sys.argv[1:] = _with_default_config(sys.argv[1:])
    else:
        args = _with_default_config(list(args))
    return LossesCLI(ClassifierModule, L.LightningDataModule, args=args, run=run, **kwargs)


def console_main() -> int:
    """Entry point of the ``lightning-losses`` console script.

    ``fit``, ``validate``, ``test``, ``predict``: LightningCLI. ``compare``: the runs of an
    MLflow experiment side by side. ``sync-tracking PATH``: replay a tracking spool.
    """
    command = sys.argv[1] if len(sys.argv) > 1 else ""
    if command == "compare":
        from .compare import main as compare_main

        return compare_main(sys.argv[2:])
    if command == "reproduce":
        from .reproduce import main as reproduce_main

        return reproduce_main(sys.argv[2:])
    if command == "sync-tracking":
        from .tracking import sync_main

        return sync_main(sys.argv[2:])
    main()
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(console_main())
