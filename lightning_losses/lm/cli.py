"""``python -m lightning_losses.lm fit --config configs/lm/lm_ce.yaml``: the LM's LightningCLI."""

from __future__ import annotations

from typing import Any

from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from lightning_losses.cli.fit import TrackingCLI
from lightning_losses.lm.data import PydocTopicsDataModule
from lightning_losses.lm.model import TinyLanguageModel
from lightning_losses.tracking import TrackingConfigCallback

# ----------------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------------


class LanguageModelCLI(TrackingCLI):
    """LightningCLI that links the DataModule's vocabulary and context length into the model.

    Like ``lightning-losses fit``, it records the config in MLflow (``TrackingConfigCallback``)
    and continues a checkpoint's MLflow run on ``fit --ckpt_path``.
    """

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        """Link ``data.vocab_size`` and ``data.context_length`` into the model's arguments."""
        for name in ("vocab_size", "context_length"):
            parser.link_arguments(f"data.{name}", f"model.init_args.{name}", apply_on="instantiate")


def main(args: list[str] | None = None, run: bool = True, **cli_kwargs: Any) -> LightningCLI:
    """``python -m lightning_losses.lm fit --config configs/lm/lm_ce.yaml`` (or ``validate``).

    A LightningCLI with ``subclass_mode_model=True`` and ``subclass_mode_data=True`` over
    :class:`TinyLanguageModel` and :class:`PydocTopicsDataModule` (or subclasses); returns it.
    """
    kwargs: dict[str, Any] = {
        "subclass_mode_model": True,
        "subclass_mode_data": True,
        "seed_everything_default": 0,
        "save_config_kwargs": {"overwrite": True},
        "save_config_callback": TrackingConfigCallback,
        "auto_configure_optimizers": False,
    }
    kwargs.update(cli_kwargs)
    return LanguageModelCLI(TinyLanguageModel, PydocTopicsDataModule, args=args, run=run, **kwargs)


def console_main() -> int:
    """Console-script entry point: :func:`main` on the command line, exit status 0."""
    main()
    return 0
