"""LightningCLI over ClassifierModule and the data: ``fit``, ``validate``, ``test``, ``predict``.

``lightning-losses fit --config configs/digits_focal.yaml`` trains; ``validate``, ``test`` and
``predict`` evaluate a trained checkpoint (``--ckpt_path`` is required). Without ``--config``
the packaged default runs (digits, gamma-CE annealed from cross-entropy towards 1 - p_t). Any
loss, schedule or callback is chosen in YAML with ``class_path`` / ``init_args``;
``--print_config`` prints a config that loads back.

The console script's dispatcher is :mod:`lightning_losses.cli.console`, which imports this module
only for these four commands; :func:`run_fit` is the one way in for code that fits from
command-line options (``lightning-losses reproduce`` among it).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.utilities import rank_zero_warn

from lightning_losses.callbacks.checkpoint import log_at_checkpoint_step, use_atomic_saves
from lightning_losses.cli.checks import checkpoint_problem, store_errors_in_one_line
from lightning_losses.cli.commands import (
    COMMANDS,
    DESCRIPTION,
    LIGHTNING_COMMANDS,
    PROG,
    lightning_epilog,
)
from lightning_losses.cli.config_files import (
    CONFIG_OPTIONS,
    ConfigNotFoundError,
    resolve_config_args,
)
from lightning_losses.cli.failures import (
    DivergenceCheck,
    failures_in_one_line,
    learning_rate_option,
    missing_requirement,
)
from lightning_losses.cli.parser import (
    LossesArgumentParser,
    constructor_errors_in_one_line,
    help_requested,
    subcommand_parser,
    usage_error,
)
from lightning_losses.cli.quiet import (
    command_output,
    progress_bar_off,
    results_line,
    take_verbose_flag,
)
from lightning_losses.lightning.classifier import ClassifierModule
from lightning_losses.tracking import (
    DEFAULT_SAVE_DIR,
    TrackingConfigCallback,
    check_reachable,
    check_store,
    checkpoint_tracking,
    has_redactions,
    redact_uri,
    resolve_tracking_uri,
    run_folder_root,
    same_store,
    sqlite_file,
    without_redacted,
)
from lightning_losses.warning import LightningLossesWarning

SUBCOMMANDS = LIGHTNING_COMMANDS
#: The subcommands that evaluate a trained checkpoint: they refuse to run without one.
CHECKPOINT_COMMANDS = ("validate", "test", "predict")
#: What each of :data:`CHECKPOINT_COMMANDS` does with the checkpoint (for the error message).
_EVALUATES = {
    "validate": "validate evaluates a trained checkpoint on the validation split",
    "test": "test evaluates a trained checkpoint on the test split",
    "predict": "predict runs a trained checkpoint",
}


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
    entries: list[Any] = logger if isinstance(logger, list) else [logger]
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
      that is not the checkpoint's gets a new run, with a warning naming both (redacted).
      The stores are compared without credentials (:func:`same_store`): the checkpoint
      records its URI redacted (``user:***@host``), and the user's URI brings the password
      again. Without a chosen URI, a redacted one is tried without its ``***`` parts
      (:func:`recorded_store`).
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
    if chosen and not same_store(chosen, recorded):
        rank_zero_warn(
            f"{checkpoint_path} belongs to MLflow run {info['run_id']} in "
            f"{redact_uri(recorded)}; the tracking URI chosen ({URI_OPTION} or "
            f"MLFLOW_TRACKING_URI) is {redact_uri(chosen)}, so a new run starts there.",
            category=LightningLossesWarning,
        )
        return False
    timeout = float(init_args.get("connect_timeout") or 5.0)
    command = "fit" if resume else None
    init_args["tracking_uri"] = chosen or recorded_store(
        recorded, checkpoint_path, timeout, command=command
    )
    if init_args.get("run_id") is None:
        init_args["run_id"] = info["run_id"]
    root = run_folder_root(checkpoint_path, info["run_id"], str(info.get("experiment_id")))
    if root is not None and init_args.get("save_dir") in (None, DEFAULT_SAVE_DIR):
        init_args["save_dir"] = str(root)
    if resume:
        init_args["resume_step"] = info["global_step"]
    return not chosen


def recorded_store(
    recorded: str, checkpoint_path: str, timeout: float = 5.0, *, command: str | None = None
) -> str:
    """The URI to continue a checkpoint's run with when the user gave none.

    A URI recorded without secrets (or by an older version, with them) is used as it is. A
    redacted one (``user:***@host``, ``token=***``) is tried without its ``***`` parts
    (:func:`without_redacted`): MLflow's ``MLFLOW_TRACKING_USERNAME`` /
    ``MLFLOW_TRACKING_PASSWORD`` / ``MLFLOW_TRACKING_TOKEN``, or a database's own password
    file, may supply the credentials. If the store does not answer that way
    (:func:`check_store`), the command stops with one line naming the checkpoint, the
    redacted URI and the ways to give the credentials again; exit status 2.

    Args:
        recorded: the checkpoint's tracking URI.
        checkpoint_path: the checkpoint (named in the message).
        timeout: seconds to wait for a server.
        command: the subcommand, for the message's ``lightning-losses COMMAND: error:``.
    """
    if not has_redactions(recorded):
        return recorded
    stripped = without_redacted(recorded)
    try:
        check_store(stripped, timeout)
    except ConnectionError as error:
        prog = f"{PROG} {command}" if command else PROG
        print(
            f"{prog}: error: {checkpoint_path} records its MLflow store as {recorded} "
            f"(credentials are never stored), and without them it does not answer ({error}). "
            f"Give the URI with its credentials again in MLFLOW_TRACKING_URI or --{URI_OPTION}, "
            "or set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (or "
            "MLFLOW_TRACKING_TOKEN).",
            file=sys.stderr,
        )
        raise SystemExit(USAGE_ERROR) from None
    return stripped


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

    A fit that diverges (its loss or logits NaN or infinite) or whose ``16-true``/``bf16-true``
    weights turn non-finite ends with one line, ``PROG COMMAND: error: CAUSE: FIX``, exit status
    1, its MLflow run FAILED and tagged ``lightning_losses.failure``; a precision the machine
    cannot run (``transformer-engine`` without the package) is one line too
    (:mod:`lightning_losses.cli.failures`). ``PROG`` is :attr:`error_prog`.
    """

    #: The program named in the error lines (a subclass may name its own command).
    error_prog = PROG

    def instantiate_trainer(self, **kwargs: Any) -> Any:
        """The trainer, with a :class:`~lightning_losses.cli.failures.DivergenceCheck` first."""
        config = self.config.get(self.subcommand) if self.subcommand else self.config
        try:
            trainer: Any = super().instantiate_trainer(**kwargs)
        except ImportError as error:  # a precision plugin's package (transformer-engine)
            precision = ((config or {}).get("trainer") or {}).get("precision")
            prog = f"{self.error_prog} {self.subcommand}" if self.subcommand else self.error_prog
            print(f"{prog}: error: {missing_requirement(precision, error)}", file=sys.stderr)
            raise SystemExit(USAGE_ERROR) from None
        check = DivergenceCheck(lr_option=learning_rate_option(config))
        trainer.callbacks.insert(0, check)  # Trainer.callbacks: the list the trainer calls
        return trainer

    def _run_subcommand(self, subcommand: str) -> None:
        """Run the command; a diverged fit ends in one line (:func:`failures_in_one_line`)."""
        trainer = getattr(self, "trainer", None)
        with failures_in_one_line(trainer, f"{self.error_prog} {subcommand}"):
            super()._run_subcommand(subcommand)

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


def require_checkpoint(config: Any, command: str | None, prog: str = PROG) -> None:
    """Stop ``validate``/``test``/``predict`` without ``--ckpt_path``, before anything is built.

    These commands evaluate a trained model; without a checkpoint they would evaluate freshly
    initialised weights (and log that into a new MLflow run). The message names
    ``--ckpt_path``; the exit status is 2, as for argparse's errors. Other commands pass.

    Example:
        >>> require_checkpoint({"ckpt_path": "last.ckpt"}, "test")
        >>> require_checkpoint({"ckpt_path": None}, "fit")
    """
    if command not in CHECKPOINT_COMMANDS or (config or {}).get("ckpt_path"):
        return
    print(
        f"{prog} {command}: error: --ckpt_path is required: {_EVALUATES[command]}, e.g. "
        "--ckpt_path mlflow_runs/<experiment id>/<run id>/checkpoints/last.ckpt",
        file=sys.stderr,
    )
    raise SystemExit(USAGE_ERROR)


#: Values of ``--ckpt_path`` that Lightning resolves itself (not file paths).
CHECKPOINT_KEYWORDS = ("best", "last", "hpc", "registry")


def require_checkpoint_file(config: Any, command: str | None, prog: str = PROG) -> None:
    """Stop a command whose ``--ckpt_path`` names no readable checkpoint, before any run.

    The message is one line naming ``--ckpt_path`` and the path; the exit status is 2. A
    file that ``torch.load`` could not read (empty, truncated, not a checkpoint:
    :func:`~lightning_losses.cli.checks.checkpoint_problem`) is refused with its cause too,
    before Lightning loads it. Lightning's keywords (``best``, ``last``, ``hpc``,
    ``registry...``) and URLs (``s3://...``) pass, as does a command without a checkpoint.

    Example:
        >>> require_checkpoint_file({"ckpt_path": "last"}, "fit")
        >>> require_checkpoint_file({"ckpt_path": None}, "test")
    """
    path = str((config or {}).get("ckpt_path") or "")
    if not path or path.startswith(CHECKPOINT_KEYWORDS) or "://" in path:
        return
    if Path(path).is_file():
        problem = checkpoint_problem(path)
        if problem is None:
            return
        print(
            f"{prog} {command}: error: {path} is not a readable checkpoint ({problem}): give "
            "--ckpt_path another one (a run's checkpoints/ folder keeps last.ckpt and the best "
            "epoch's), or fit without --ckpt_path to start afresh",
            file=sys.stderr,
        )
        raise SystemExit(USAGE_ERROR)
    problem = "is a folder, not a checkpoint file" if Path(path).is_dir() else "no such file"
    print(
        f"{prog} {command}: error: --ckpt_path {path}: {problem} (checkpoints are saved under "
        "mlflow_runs/<experiment id>/<run id>/checkpoints/)",
        file=sys.stderr,
    )
    raise SystemExit(USAGE_ERROR)


class LossesCLI(TrackingCLI):
    """The ``lightning-losses`` CLI: links the DataModule's shape of the task into the model.

    ``validate``, ``test`` and ``predict`` without ``--ckpt_path``, and any command whose
    ``--ckpt_path`` names no file, stop with a usage error before any class is instantiated
    (:func:`require_checkpoint`, :func:`require_checkpoint_file`).

    Args:
        verbose: False: Lightning's progress bar (but for ``fit`` in a terminal) and results
            table off, the results of ``validate``/``test`` in one line of ours
            (:mod:`lightning_losses.cli.quiet`); :func:`main` passes False unless ``--verbose``.
    """

    def __init__(self, *args: Any, verbose: bool = True, **kwargs: Any) -> None:
        self.verbose = verbose  # set first: LightningCLI runs the command in __init__
        super().__init__(*args, **kwargs)

    def before_instantiate_classes(self) -> None:
        """Refuse an evaluation without a checkpoint, then :class:`TrackingCLI`'s checks."""
        if self.subcommand is not None:
            config = self.config.get(self.subcommand)
            require_checkpoint(config, self.subcommand, self.error_prog)
            require_checkpoint_file(config, self.subcommand, self.error_prog)
        super().before_instantiate_classes()

    def instantiate_trainer(self, **kwargs: Any) -> Any:
        """Without ``--verbose``: the progress bar (:func:`progress_bar_off`) and summary off."""
        config = self.config.get(self.subcommand) if self.subcommand else self.config
        if not self.verbose and progress_bar_off(config, self.subcommand):
            kwargs.setdefault("enable_progress_bar", False)  # the saved config keeps its value
        self._plain_model_summary(config, kwargs)
        trainer = super().instantiate_trainer(**kwargs)
        use_atomic_saves(trainer)  # a failed save leaves no partial .ckpt
        return trainer

    def _plain_model_summary(self, config: Any, kwargs: dict[str, Any]) -> None:
        """Lightning's plain model summary (an info line), never its ``rich`` table.

        With ``rich`` installed (``transformers`` brings it) Lightning prints the summary as a
        table on the console, past the quiet logging levels. Quiet: no summary (it was an info
        line, kept out); ``--verbose``: a plain ``ModelSummary`` callback unless one is
        configured, so the summary is the logged lines it always was.
        """
        if ((config or {}).get("trainer") or {}).get("enable_model_summary") is not None:
            return
        if not self.verbose:
            kwargs.setdefault("enable_model_summary", False)
            return
        from lightning.pytorch.callbacks import ModelSummary

        given = self._get(self.config_init, "trainer", default={}).get("callbacks") or []
        given = given if isinstance(given, list) else [given]
        if not any(isinstance(callback, ModelSummary) for callback in given):
            kwargs.setdefault("callbacks", [*given, ModelSummary()])

    def _results_table_off(self) -> None:
        config = self.config_init[self.subcommand]  # not the saved one: it keeps its value
        if not self.verbose and "verbose" in config:
            config["verbose"] = False

    def _print_results(self, command: str) -> None:
        if self.verbose or not self.trainer.is_global_zero:
            return
        run_id = next((getattr(lg, "run_id", None) for lg in self.trainer.loggers), None)
        print(results_line(command, self.trainer.callback_metrics, run_id), flush=True)

    def before_validate(self) -> None:
        """No results table without ``--verbose``; metrics logged at the checkpoint's step."""
        self._results_table_off()
        log_at_checkpoint_step(self.trainer, self.config_init[self.subcommand].get("ckpt_path"))

    def before_test(self) -> None:
        """No results table without ``--verbose``; metrics logged at the checkpoint's step."""
        self._results_table_off()
        log_at_checkpoint_step(self.trainer, self.config_init[self.subcommand].get("ckpt_path"))

    def after_validate(self) -> None:
        """Without ``--verbose``: the validation metrics in one line (not Lightning's table)."""
        self._print_results("validate")

    def after_test(self) -> None:
        """Without ``--verbose``: the test metrics in one line (not Lightning's table)."""
        self._print_results("test")

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        """Link the data module's shape (features, classes, tasks, task) into the model's."""
        for source, target in (
            ("num_features", "input_dim"),
            ("num_classes", "num_classes"),
            ("num_tasks", "num_tasks"),
            ("task", "task"),
        ):
            parser.link_arguments(f"data.{source}", f"model.{target}", apply_on="instantiate")

    def setup_parser(
        self, add_subcommands: bool, main_kwargs: dict[str, Any], subparser_kwargs: dict[str, Any]
    ) -> None:
        """A one-line usage and an epilog (configs, losses, where to look) for each command."""
        for command in SUBCOMMANDS:
            options = subparser_kwargs.setdefault(command, {})
            options.setdefault(
                "usage", f"{PROG} {command} [-h] [-c CONFIG] [--print_config] [--KEY VALUE ...]"
            )
            options.setdefault("description", COMMANDS[command])
            options.setdefault("epilog", lightning_epilog())
        super().setup_parser(add_subcommands, main_kwargs, subparser_kwargs)

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        """Parse; for ``COMMAND --help`` first make the config's values the defaults shown.

        The config is the one ``--config`` names, else the packaged default (what the command
        runs without ``--config``). A ``--ckpt_path`` that is not a readable checkpoint stops
        the command here (:func:`require_checkpoint_file`), before LightningCLI loads it.
        """
        argv = sys.argv[1:] if args is None else args
        if isinstance(argv, (list, tuple)) and argv and help_requested(argv):
            command = subcommand_parser(parser, str(argv[0]))
            if command is not None:
                configs = [
                    argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg in CONFIG_OPTIONS
                ] + [arg.removeprefix("--config=") for arg in argv if arg.startswith("--config=")]
                command.default_config_files = configs or [default_config_path()]
        super().parse_arguments(parser, args)
        subcommand = self.config.get("subcommand")
        if subcommand:  # before LightningCLI reads the checkpoint's hyper-parameters
            require_checkpoint_file(self.config.get(subcommand), subcommand, self.error_prog)

    def instantiate_classes(self) -> None:
        """Instantiate; a class that rejects its arguments is a one-line usage error.

        A ``ValueError`` or ``TypeError`` of a constructor (``gamma`` out of range, an unknown
        loss name, ...) ends the command with ``lightning-losses COMMAND: error: KEY:
        CLASS: MESSAGE`` and exit status 2 instead of jsonargparse's traceback, whose last
        line names every type it tried. A SQLite store that another process holds locked (or
        that is otherwise unusable) ends it with one line naming the store file, the cause and
        the fix (:func:`~lightning_losses.cli.checks.store_errors_in_one_line`).
        ``JSONARGPARSE_DEBUG=1`` keeps the traceback.
        """
        config = self.config.get(self.subcommand) if self.subcommand else self.config
        # The words after `lightning-losses` in the error lines: `fit`, or `lm fit`.
        command = " ".join([*self.error_prog.split()[1:], self.subcommand or ""]).strip() or None
        stores = [
            sqlite_file(resolve_tracking_uri(args.get("tracking_uri")))
            for args in tracking_logger_args(config)
        ]
        with (
            constructor_errors_in_one_line(config, command),
            store_errors_in_one_line([s for s in stores if s is not None], command),
        ):
            super().instantiate_classes()


def _with_default_config(args: list[str]) -> list[str]:
    """Insert the packaged default config after the subcommand when no config is given.

    A ``--config`` that names a shipped config (``digits_focal``) gets its file
    (:func:`_with_config_files`).
    """
    if not args or args[0] not in SUBCOMMANDS:
        return args
    args = _with_config_files(args)
    if any(a in ("-c", "--config") or a.startswith("--config=") for a in args[1:]):
        return args
    if any(a in ("-h", "--help") for a in args[1:]):
        return args
    return [args[0], "--config", default_config_path(), *args[1:]]


def _with_config_files(args: list[str]) -> list[str]:
    """``args`` with each ``--config NAME`` of a shipped config replaced by its file.

    An unknown name ends the command with one line naming the closest names (exit status 2).
    """
    if not args or args[0] not in SUBCOMMANDS:
        return args
    try:
        return resolve_config_args(args)
    except ConfigNotFoundError as error:
        usage_error(args[0], str(error))


@contextmanager
def _command_line_aside() -> Iterator[None]:
    """Hide the process's command line while a CLI runs on explicit ``args``.

    LightningCLI warns when it is given ``args`` and the process has command-line arguments
    of its own (e.g. a test runner's, or ``lightning-losses reproduce``'s); they are put back
    when the CLI returns or raises.
    """
    kept, sys.argv[1:] = sys.argv[1:], []
    try:
        yield
    finally:
        sys.argv[1:] = kept


def main(
    args: Sequence[str] | None = None,
    run: bool = True,
    *,
    cli_class: type[LossesCLI] = LossesCLI,
    model_class: type[L.LightningModule] = ClassifierModule,
    datamodule_class: type[L.LightningDataModule] = L.LightningDataModule,
    **cli_kwargs: Any,
) -> LossesCLI:
    """Run the CLI (``args`` defaults to the command line) and return it.

    ``cli_class``, ``model_class`` and ``datamodule_class`` (default :class:`LossesCLI` over
    ``ClassifierModule``) let another command run through the same path: ``lightning-losses
    lm`` (:func:`lightning_losses.lm.cli.main`).

    With ``args`` given, the process's own command line is set aside while the CLI runs (it
    is not the CLI's). A string for ``args`` is a TypeError. ``--verbose`` anywhere in the
    arguments (or ``LIGHTNING_LOSSES_VERBOSE=1``) shows Lightning's and MLflow's output, which
    is otherwise kept out while the CLI runs (:mod:`lightning_losses.cli.quiet`). A fit stopped by
    SIGTERM or SIGUSR1 writes a checkpoint, ends its run KILLED and raises ``SystemExit(143)``
    (:mod:`lightning_losses.callbacks.preemption`).

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
        # One-line errors with "did you mean", a short --help (lightning_losses.cli.parser).
        "parser_class": LossesArgumentParser,
        # No abbreviations: --trainer.max_epoch is an error, not --trainer.max_epochs.
        "parser_kwargs": {"description": DESCRIPTION, "allow_abbrev": False},
    }
    kwargs.update(cli_kwargs)
    # SIGTERM / SIGUSR1: a checkpoint, the run KILLED, exit status 143 (callbacks.preemption).
    from lightning_losses.callbacks.preemption import preempted_exit, with_preemption

    if args is None:  # the command line: LightningCLI reads sys.argv itself
        sys.argv[1:], verbose = take_verbose_flag(sys.argv[1:])
        kwargs["trainer_defaults"] = with_preemption(kwargs.get("trainer_defaults"), sys.argv[1:])
        sys.argv[1:] = _with_default_config(sys.argv[1:])
        with command_output(verbose), preempted_exit():
            return cli_class(model_class, datamodule_class, run=run, verbose=verbose, **kwargs)
    if isinstance(args, str):
        raise TypeError(
            f"args must be a sequence of strings such as ['fit', '--config', 'x.yaml'], "
            f"not the string {args!r}"
        )
    args, verbose = take_verbose_flag(args)
    kwargs["trainer_defaults"] = with_preemption(kwargs.get("trainer_defaults"), args)
    with _command_line_aside(), command_output(verbose), preempted_exit():
        return cli_class(
            model_class,
            datamodule_class,
            args=_with_default_config(args),
            run=run,
            verbose=verbose,
            **kwargs,
        )


def run_fit(args: Sequence[str], **cli_kwargs: Any) -> LossesCLI:
    """Fit as ``lightning-losses fit ARGS`` would, from Python; returns the finished CLI.

    The one way in for code that trains from command-line options (``lightning-losses
    reproduce`` uses it): the process's own command line is set aside while the CLI runs, and
    the packaged default config applies when ``args`` names none.

    Args:
        args: the options of ``fit`` (without the word ``fit``), e.g.
            ``["--config", "configs/digits_focal.yaml", "--trainer.max_epochs=2"]``.
        **cli_kwargs: passed on to :class:`LossesCLI` (as by :func:`main`).

    Raises:
        TypeError: when ``args`` is a string rather than a sequence of strings.
    """
    if isinstance(args, str):
        raise TypeError(
            f"args must be a sequence of strings such as ['--config', 'x.yaml'], "
            f"not the string {args!r}"
        )
    return main(["fit", *args], **cli_kwargs)
