"""``lightning-losses lm fit --config lm_ce``: the language model's LightningCLI.

The same path as ``lightning-losses fit`` (:func:`lightning_losses.cli.fit.main`): configs by
name, Lightning's and MLflow's output hidden unless ``--verbose``, one-line errors, a
checkpoint's MLflow run continued on ``fit --ckpt_path``. A fit ends with the language
model's numbers: validation perplexity, token NLL, accuracy and ECE (with its 95% interval),
the token reliability diagram of the last validation epoch, the checkpoint folder and the
MLflow run. ``python -m lightning_losses.lm ...`` runs the same command.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

from lightning.pytorch.cli import LightningArgumentParser

from lightning_losses.cli.commands import (
    LM_COMMANDS,
    LM_DESCRIPTION,
    PROG,
    language_model_epilog,
    language_model_usage,
)
from lightning_losses.cli.config_files import ConfigNotFoundError, language_model_args
from lightning_losses.cli.fit import LossesCLI
from lightning_losses.cli.fit import main as cli_main
from lightning_losses.cli.parser import LossesArgumentParser, usage_error
from lightning_losses.lm.data import PydocTopicsDataModule
from lightning_losses.lm.model import TokenLanguageModel
from lightning_losses.tracking import TrackingConfigCallback

__all__ = [
    "LanguageModelArgumentParser",
    "LanguageModelCLI",
    "LanguageModelConfigCallback",
    "console_main",
    "main",
    "token_values",
]

#: The command's name in usages, errors and the printed lines.
LM_PROG = f"{PROG} lm"


def token_values(metrics: Mapping[str, Any], prefix: str = "val") -> str:
    """The language model's final values in words: perplexity, then the token metrics.

    Perplexity with 2 decimals, the others with 4; the ECE's 95% interval when logged.

    Example:
        >>> token_values({"val/ppl": 110.234, "val/nll": 4.70258, "val/acc": 0.2,
        ...               "val/ece": 0.1103, "val/ece_low": 0.1, "val/ece_high": 0.12})
        'perplexity 110.23 (val/ppl), token NLL 4.7026, accuracy 0.2000, token ECE 0.1103 \
(95% interval 0.1000 to 0.1200)'
        >>> token_values({})
        ''
    """
    parts = []
    if f"{prefix}/ppl" in metrics:
        parts.append(f"perplexity {float(metrics[f'{prefix}/ppl']):.2f} ({prefix}/ppl)")
    for key, label in (("nll", "token NLL"), ("acc", "accuracy"), ("ece", "token ECE")):
        if f"{prefix}/{key}" in metrics:
            parts.append(f"{label} {float(metrics[f'{prefix}/{key}']):.4f}")
    low, high = metrics.get(f"{prefix}/ece_low"), metrics.get(f"{prefix}/ece_high")
    if parts and low is not None and high is not None:
        parts[-1] += f" (95% interval {float(low):.4f} to {float(high):.4f})"
    return ", ".join(parts)


class LanguageModelConfigCallback(TrackingConfigCallback):
    """:class:`TrackingConfigCallback` for the language model: its own closing lines.

    When a fit ends (rank 0) it draws the token reliability diagram of the last validation
    epoch (the model's ``last_val_bins``) into the run's ``calibration/`` folder, logs it as an
    artifact, and prints, after the run line, the validation perplexity and token metrics
    (:func:`token_values`), the diagram and the checkpoint folder.
    """

    command = f"{LM_PROG} fit"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.last_diagram: Any = None

    def final_values(self, metrics: Any) -> str:
        """Perplexity, token NLL, accuracy and token ECE of the last validation epoch."""
        return token_values(metrics)

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        """Draw the token reliability diagram, then print the closing lines (rank 0)."""
        if trainer.is_global_zero:
            self._draw_diagram(trainer, pl_module)
        super().on_fit_end(trainer, pl_module)

    def _draw_diagram(self, trainer: Any, pl_module: Any) -> None:
        from lightning_losses.callbacks.artifacts import (
            artifact_loggers,
            diagram_title,
            figure_folder,
        )

        last = getattr(pl_module, "last_val_bins", None)
        if last is None:
            return  # no validation epoch ran
        from lightning_losses.calibration.diagram import reliability_diagram

        epoch, bins = last
        path = figure_folder(trainer) / f"val_tokens_epoch={epoch:03d}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        title = diagram_title(trainer, f"val tokens, epoch {epoch}", pl_module)
        figure = reliability_diagram(*(b.detach().cpu() for b in bins), path=path, title=title)
        import matplotlib.pyplot as plt

        plt.close(figure)
        for log_file in artifact_loggers(trainer):
            log_file(str(path), artifact_path="calibration")
        self.last_diagram = path


class LanguageModelArgumentParser(LossesArgumentParser):
    """:class:`~lightning_losses.cli.parser.LossesArgumentParser` whose errors name ``lm``.

    An error reads ``lightning-losses lm fit: error: ...`` (one line, exit status 2).
    """

    def _command(self) -> str | None:
        command = super()._command()
        return f"lm {command}" if command else "lm"

    def _suggestion(self, message: str, cause: BaseException | None, command: str | None) -> str:
        own = (command or "").removeprefix("lm").strip() or None
        return super()._suggestion(message, cause, own)


class LanguageModelCLI(LossesCLI):
    """The CLI of ``lightning-losses lm``: a ``TokenLanguageModel`` over its DataModule.

    :class:`~lightning_losses.cli.fit.LossesCLI` (quiet output, checks of ``--ckpt_path``,
    one-line errors, the MLflow run of a checkpoint continued) with the commands ``fit``,
    ``validate`` and ``test``, each with its usage ``lightning-losses lm COMMAND ...`` and the
    language model's configs in its ``--help``; the DataModule's vocabulary and context length
    are linked into the model's arguments.
    """

    error_prog = LM_PROG

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        """``fit``, ``validate`` and ``test`` (no ``predict``)."""
        every = LossesCLI.subcommands()
        return {name: every[name] for name in LM_COMMANDS}

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        """Link ``data.vocab_size`` and ``data.context_length`` into the model's arguments."""
        for name in ("vocab_size", "context_length"):
            parser.link_arguments(f"data.{name}", f"model.init_args.{name}", apply_on="instantiate")

    def setup_parser(
        self, add_subcommands: bool, main_kwargs: dict[str, Any], subparser_kwargs: dict[str, Any]
    ) -> None:
        """A one-line usage naming ``lightning-losses lm COMMAND``, and the LM's configs."""
        for command, summary in LM_COMMANDS.items():
            options = subparser_kwargs.setdefault(command, {})
            options.setdefault(
                "usage", f"{LM_PROG} {command} [-h] [-c CONFIG] [--print_config] [--KEY VALUE ...]"
            )
            options.setdefault("description", summary)
            options.setdefault("epilog", language_model_epilog())
        super().setup_parser(add_subcommands, main_kwargs, subparser_kwargs)

    def before_instantiate_classes(self) -> None:
        """Refuse ``test`` without a test split, then :class:`LossesCLI`'s checks."""
        if self.subcommand == "test":
            data = (self.config.get("test") or {}).get("data") or {}
            init_args = data.get("init_args") or {}
            if not float(init_args.get("test_fraction") or 0.0):
                usage_error(
                    "lm test",
                    "the data has no test split (--data.init_args.test_fraction is 0): test a "
                    "checkpoint fitted with --data.init_args.test_fraction=F, giving the same F "
                    "(the topics held out, and so the vocabulary, follow it)",
                )
        super().before_instantiate_classes()

    def _print_results(self, command: str) -> None:
        super()._print_results(f"lm {command}")


def main(args: Sequence[str] | None = None, run: bool = True, **cli_kwargs: Any) -> LossesCLI:
    """``lightning-losses lm fit --config lm_ce`` (or ``validate``/``test``); returns the CLI.

    ``args`` defaults to the command line. A ``--config`` is a language-model config by
    name (``lm_ce``, ``lm/lm_ce``, ``lm_ce.yaml``, ``configs/lm/lm_ce.yaml``) or a file;
    without one, ``lm_ce``. The rest is :func:`lightning_losses.cli.fit.main`'s, with
    :class:`LanguageModelCLI` over a :class:`~lightning_losses.lm.model.TokenLanguageModel`
    (:class:`~lightning_losses.lm.model.TinyLanguageModel`, or the Hugging Face integration's
    ``HFCausalLM``) and :class:`PydocTopicsDataModule` (or subclasses of them).

    Example (in Python)::

        cli = main(["fit", "--config", "lm_ce", "--trainer.max_epochs=1"])
        cli.trainer.callback_metrics["val/ppl"]
    """
    if isinstance(args, str):
        raise TypeError(f"args must be a sequence of strings, not the string {args!r}")
    words = list(sys.argv[1:] if args is None else args)
    command = words[0] if words and words[0] in LM_COMMANDS else None
    try:
        words = language_model_args(words) if command else _resolved(words)
    except ConfigNotFoundError as error:
        usage_error(f"lm {command}" if command else "lm", str(error))
    kwargs: dict[str, Any] = {
        "subclass_mode_model": True,
        "subclass_mode_data": True,
        "save_config_callback": LanguageModelConfigCallback,
        "parser_class": LanguageModelArgumentParser,
        "parser_kwargs": {"prog": LM_PROG, "description": LM_DESCRIPTION, "allow_abbrev": False},
    }
    kwargs.update(cli_kwargs)
    return cli_main(
        words,
        run,
        cli_class=LanguageModelCLI,
        model_class=TokenLanguageModel,
        datamodule_class=PydocTopicsDataModule,
        **kwargs,
    )


def _resolved(words: list[str]) -> list[str]:
    """Options without a subcommand (``run=False``): configs by name, ``lm_ce`` by default."""
    return language_model_args(["fit", *words])[1:]


def console_main(args: Sequence[str] | None = None) -> int:
    """``python -m lightning_losses.lm ...``: as ``lightning-losses lm ...``; the exit status.

    ``--help`` alone, or no subcommand, is answered by the light parser of ``lightning-losses
    lm`` (:func:`~lightning_losses.cli.commands.language_model_usage`).
    """
    words = list(sys.argv[1:] if args is None else args)
    answered = language_model_usage(words)
    if answered is not None:
        return answered
    main(words)
    return 0
