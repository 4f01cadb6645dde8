"""The ``lightning-losses`` console script: LightningCLI over ClassifierModule and the data.

``lightning-losses fit --config configs/digits_focal.yaml`` trains; ``validate``, ``test`` and
``predict`` work the same way. Without ``--config`` the packaged default runs (digits, gamma-CE
annealed from cross-entropy towards 1 - p_t). Any loss, schedule or callback is chosen in YAML
with ``class_path`` / ``init_args``; ``--print_config`` prints a config that loads back.
"""

from __future__ import annotations

import os
import sys
from importlib import resources
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.utilities import rank_zero_warn

from .models import ClassifierModule
from .tracking import (
    DEFAULT_SAVE_DIR,
    TrackingConfigCallback,
    check_reachable,
    checkpoint_tracking,
    resolve_tracking_uri,
    run_folder_root,
)

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


#: The option that chooses a TrackingLogger's store (named in messages).
URI_OPTION = "trainer.logger.init_args.tracking_uri"
#: Exit status of a command stopped before it ran (as for argparse's errors).
USAGE_ERROR = 2


def tracking_logger_args(config: Any) -> list[Any]:
    """The ``init_args`` of every TrackingLogger in a subcommand's ``trainer.logger``."""
    logger = (config.get("trainer") or {}).get("logger")
    entries = logger if isinstance(logger, list) else [logger]
    return [
        entry["init_args"]
        for entry in entries
        if hasattr(entry, "get")
        and str(entry.get("class_path", "")).endswith("TrackingLogger")
        and entry.get("init_args") is not None
    ]


def continue_checkpoint_run(init_args: Any, checkpoint_path: str, resume: bool) -> bool:
    """Point a TrackingLogger's ``init_args`` at the run a checkpoint was saved under.

    - Store: the checkpoint's tracking URI, unless the user chose one
      (``trainer.logger.init_args.tracking_uri`` or ``MLFLOW_TRACKING_URI``). A chosen store
      that is not the checkpoint's gets a new run, with a warning naming both.
    - Run: the checkpoint's run id (unless ``run_id`` is given).
    - Files: the checkpoint's run folder (``save_dir`` = the folder above
      ``<experiment id>/<run id>/``), unless ``save_dir`` differs from the default
      ``mlflow_runs``: new checkpoints, diagrams and the spool go beside the old ones
      whatever the working directory.
    - ``resume`` (``fit``): ``resume_step`` = the checkpoint's global step, so that the
      logger records the resume marker.

    Returns:
        Whether the tracking URI was taken from the checkpoint.
    """
    info = checkpoint_tracking(checkpoint_path)
    if not info.get("run_id"):
        return False
    chosen = init_args.get("tracking_uri") or os.environ.get("MLFLOW_TRACKING_URI")
    recorded = info["tracking_uri"]
    if chosen and resolve_tracking_uri(chosen) != resolve_tracking_uri(recorded):
        rank_zero_warn(
            f"{checkpoint_path} belongs to MLflow run {info['run_id']} in {recorded}; the "
            f"tracking URI chosen ({URI_OPTION} or MLFLOW_TRACKING_URI) is {chosen}, so a new "
            "run starts there."
        )
        return False
    init_args["tracking_uri"] = chosen or recorded
    if init_args.get("run_id") is None:
        init_args["run_id"] = info["run_id"]
    root = run_folder_root(checkpoint_path, info["run_id"], str(info.get("experiment_id")))
    if root is not None and init_args.get("save_dir") in (None, DEFAULT_SAVE_DIR):
        init_args["save_dir"] = str(root)
    if resume:
        init_args["resume_step"] = info["global_step"]
    return not chosen


def require_reachable(init_args: Any, source: str, command: str) -> None:
    """Stop the command with one short message if the logger's HTTP server does not answer.

    The message names the option, variable or checkpoint the URI came from (``source``), the
    URI, and how to choose another store; the exit status is 2. Without this check the error
    would surface deep inside jsonargparse's instantiation of ``trainer.logger``.
    """
    uri = resolve_tracking_uri(init_args.get("tracking_uri"))
    try:
        check_reachable(uri, float(init_args.get("connect_timeout") or 5.0))
    except ConnectionError as error:
        prog = f"lightning-losses {command}" if command else "lightning-losses"
        print(f"{prog}: error: {source}: {error}", file=sys.stderr)
        raise SystemExit(USAGE_ERROR) from None


def _uri_source(init_args: Any) -> str:
    """Where a logger's tracking URI comes from: the option, the variable or the default."""
    if init_args.get("tracking_uri"):
        return URI_OPTION
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return "MLFLOW_TRACKING_URI"
    return "the default"


class TrackingCLI(LightningCLI):
    """LightningCLI that continues a checkpoint's MLflow run and checks the tracking server.

    ``fit --ckpt_path`` continues the run the checkpoint was saved under, in its store and
    run folder, from any working directory (:func:`continue_checkpoint_run`); ``validate``,
    ``test`` and ``predict`` with a checkpoint log into that run too.
    """

    def before_instantiate_classes(self) -> None:
        """Fill in each TrackingLogger's run from the checkpoint; stop early on a dead server."""
        config = self.config.get(self.subcommand) if self.subcommand else self.config
        if config is None:
            return
        checkpoint = config.get("ckpt_path")
        for init_args in tracking_logger_args(config):
            source = _uri_source(init_args)
            if checkpoint and Path(checkpoint).is_file():
                resume = self.subcommand == "fit"
                if continue_checkpoint_run(init_args, checkpoint, resume):
                    source = f"the checkpoint {checkpoint}"
            require_reachable(init_args, source, self.subcommand or "")


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
        # No abbreviations: --trainer.max_epoch is an error, not --trainer.max_epochs.
        "parser_kwargs": {"description": DESCRIPTION, "allow_abbrev": False},
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
