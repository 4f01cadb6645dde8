"""``HFCausalLM``: a Hugging Face causal LM as a LightningModule with a swappable criterion."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import lightning as L
from torch import Tensor, nn

from lightning_losses.integrations.huggingface._imports import require
from lightning_losses.integrations.huggingface.loss import (
    causal_lm_hidden_states,
    causal_lm_labels,
    check_plain_head,
    output_head,
    shift_for_next_token,
)
from lightning_losses.lightning.backbone_spec import is_plain
from lightning_losses.lightning.class_path import instantiate
from lightning_losses.lightning.classifier import OptimizerFactory
from lightning_losses.lm.model import TokenLanguageModel
from lightning_losses.losses import LinearTargetLoss

__all__ = ["HFCausalLM", "SavePretrained", "build_causal_lm"]


def _config_object(config: Any) -> Any:
    """A ``transformers`` config from a config object or a ``class_path`` mapping."""
    transformers = require("transformers")
    if isinstance(config, Mapping):
        config = instantiate(config, argument="config", base=transformers.PretrainedConfig)
    if not isinstance(config, transformers.PretrainedConfig):
        raise ValueError(
            "config must be a transformers config (e.g. {'class_path': 'transformers.LlamaConfig',"
            f" 'init_args': {{...}}}}); got {type(config).__name__}"
        )
    return config


def build_causal_lm(
    config: Any = None,
    *,
    pretrained: str | Path | None = None,
    vocab_size: int | None = None,
    context_length: int | None = None,
) -> nn.Module:
    """A ``*ForCausalLM``: random init from ``config``, or read from a local ``pretrained`` folder.

    From a config (a ``transformers`` config object or a ``class_path`` / ``init_args``
    mapping), ``vocab_size`` (the tokenizer's) replaces the config's and the positions are
    raised to ``context_length`` if fewer; the weights are drawn by the model's own
    initialisation (seed first for a reproducible model). From ``pretrained`` (a folder
    ``save_pretrained`` wrote; nothing is downloaded) the sizes must match.

    Raises:
        ValueError: neither or both of ``config`` and ``pretrained``, or a pretrained model
            whose vocabulary or positions do not fit the data.
    """
    transformers = require("transformers")
    if (config is None) == (pretrained is None):
        raise ValueError(
            "config / pretrained: give exactly one, a transformers config (random init) or a "
            "local from_pretrained folder"
        )
    if pretrained is not None:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(pretrained), local_files_only=True
        )
        size = model.config.vocab_size
        if vocab_size is not None and vocab_size != size:
            raise ValueError(
                f"pretrained: the model at {pretrained} has a vocabulary of {size} tokens, the "
                f"data {vocab_size}; train with the tokenizer saved beside the model"
            )
        positions = getattr(model.config, "max_position_embeddings", None)
        if context_length is not None and positions is not None and positions < context_length:
            raise ValueError(
                f"pretrained: the model at {pretrained} reads at most {positions} positions, "
                f"fewer than context_length={context_length}"
            )
        return model
    config = _config_object(config)
    if vocab_size is not None:
        config.vocab_size = int(vocab_size)
    positions = getattr(config, "max_position_embeddings", None)
    if context_length is not None and positions is not None and positions < context_length:
        config.max_position_embeddings = int(context_length)
    return transformers.AutoModelForCausalLM.from_config(config)


def _plain_config(config: Any) -> Any:
    """A config as plain data for the checkpoint's hyper-parameters (``weights_only`` loads)."""
    if config is None or is_plain(config):
        return config
    cls = type(config)
    return {"class_path": f"{cls.__module__}.{cls.__qualname__}", "init_args": config.to_dict()}


class HFCausalLM(TokenLanguageModel):
    """A Hugging Face causal LM trained with a :class:`~lightning_losses.LinearTargetLoss`.

    ``self.model`` is the ``*ForCausalLM`` itself (``LlamaForCausalLM``, ``GPT2LMHeadModel``,
    ...), built by :func:`build_causal_lm`; its code is not changed. Training computes
    ``self.criterion(hidden, weight, target, bias)`` on the decoder's final hidden states and
    the model's output layer, so the ``[tokens, vocabulary]`` logits are never built and the
    criterion can be swapped in YAML and scheduled (``GammaAnnealing`` sets
    ``criterion.gamma``). Validation and test log ``<stage>/loss`` and the token metrics of
    :class:`~lightning_losses.lm.model.TokenCalibration` (``nll``, ``ppl``, ``acc``, ``ece``,
    ``ece_debiased``, ``ece_low``, ``ece_high``), as
    :class:`~lightning_losses.lm.model.TinyLanguageModel` does; with :meth:`logits` and
    :attr:`context_length` it is a next-token model of :mod:`lightning_losses.lm.evaluation`
    (held-out token metrics, generation). :meth:`save_pretrained` (or
    the :class:`SavePretrained` callback) exports the weights for ``from_pretrained``.

    Batches are ``(tokens, target)`` windows (:class:`~lightning_losses.lm.PydocTopicsDataModule`
    and its BPE variant) or Hugging Face mappings ``{"input_ids", "attention_mask", "labels"}``
    (labels shifted as Hugging Face does, padding ignored without labels).

    Args:
        config: a ``transformers`` config, in YAML ``{class_path: transformers.LlamaConfig,
            init_args: {...}}``: random init; or ``None`` with ``pretrained``.
        criterion: a :class:`~lightning_losses.LinearTargetLoss` (or a ``class_path`` mapping),
            or a loss name of its family; ``None``: ``"ce"``.
        vocab_size: the tokenizer's vocabulary (linked from the DataModule by ``lm fit``).
        context_length: the longest sequence (linked from the DataModule).
        pretrained: a local folder ``save_pretrained`` wrote (instead of ``config``).
        n_bins: bins of the validation ECE.
        optimizer: a factory ``params -> Optimizer`` (default Adam, lr 3e-3).

    Example:
        >>> import torch
        >>> config = {"class_path": "transformers.LlamaConfig", "init_args": {
        ...     "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
        ...     "num_attention_heads": 2}}
        >>> module = HFCausalLM(config, "gamma_ce", vocab_size=50, context_length=8)
        >>> type(module.model).__name__, module.model.config.vocab_size
        ('LlamaForCausalLM', 50)
        >>> tokens = torch.randint(0, 50, (2, 8))
        >>> module(tokens).shape, module.logits(tokens).shape
        (torch.Size([2, 8, 16]), torch.Size([2, 8, 50]))
    """

    def __init__(
        self,
        # A mapping for jsonargparse to keep as written (HFCausalLM builds the config itself);
        # a transformers config object works as well.
        config: Mapping[str, Any] | None = None,
        criterion: LinearTargetLoss | str | None = None,
        vocab_size: int | None = None,
        context_length: int | None = None,
        pretrained: str | None = None,
        n_bins: int = 15,
        optimizer: OptimizerFactory | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["criterion"])
        self.hparams["config"] = _plain_config(config)
        #: The ``*ForCausalLM`` (a ``transformers.PreTrainedModel``).
        self.model: Any = build_causal_lm(
            config, pretrained=pretrained, vocab_size=vocab_size, context_length=context_length
        )
        check_plain_head(self.model)
        self.setup_language_model(criterion, n_bins, optimizer)

    @property
    def context_length(self) -> int:
        """The longest sequence the model is trained to read: ``context_length``, else the
        config's ``max_position_embeddings`` (what :mod:`lightning_losses.lm.evaluation`'s
        generation crops prompts to)."""  # noqa: D205, D209
        given = self.hparams.get("context_length")
        return int(given if given is not None else self.model.config.max_position_embeddings)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        """Final hidden states ``[B, L, H]`` of token ids ``[B, L]``."""
        return causal_lm_hidden_states(self.model, input_ids, attention_mask=attention_mask)

    def logits(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        """The model's own full ``[B, L, V]`` logits (for generation and small inputs)."""
        return self.model(input_ids=input_ids, attention_mask=attention_mask).logits

    def output_head(self) -> tuple[Tensor, Tensor | None]:
        """The model's output layer: ``get_output_embeddings()``'s weight and bias."""
        return output_head(self.model)

    def next_token_hidden(self, batch: Any) -> tuple[Tensor, Tensor]:
        """Hidden states and next-token targets of windows or of a Hugging Face mapping."""
        if not isinstance(batch, Mapping):
            return super().next_token_hidden(batch)
        input_ids, attention_mask = batch["input_ids"], batch.get("attention_mask")
        ignore_index = getattr(self.criterion, "ignore_index", -100)
        labels = causal_lm_labels(
            input_ids,
            batch.get("labels"),
            attention_mask=attention_mask,
            ignore_index=ignore_index,
        )
        return shift_for_next_token(self(input_ids, attention_mask), labels)

    def save_pretrained(self, folder: str | Path, tokenizer: Any = None) -> Path:
        """Write the model (and a tokenizer's ``to_transformers()`` if given) for ``from_pretrained``.

        ``transformers.AutoModelForCausalLM.from_pretrained(folder)`` gives back the same model
        (the same logits); ``HFCausalLM(pretrained=folder)`` trains on from it.
        """  # noqa: E501
        path = Path(folder)
        hf_logging = require("transformers").utils.logging
        bar = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()  # no "Writing model shards" bar on stderr
        try:
            self.model.save_pretrained(str(path))
        finally:
            if bar:
                hf_logging.enable_progress_bar()
        if tokenizer is not None:
            convert = getattr(tokenizer, "to_transformers", None)
            (convert() if callable(convert) else tokenizer).save_pretrained(str(path))
        return path


class SavePretrained(L.Callback):
    """At the end of a fit, export the model with ``save_pretrained`` (rank 0).

    Writes :meth:`HFCausalLM.save_pretrained` into ``dirpath``, by default the folder
    ``pretrained/`` beside the checkpoint folder (of a tracked fit:
    ``mlflow_runs/<experiment>/<run>/pretrained``), with the DataModule's tokenizer
    when it has one (``datamodule.tokenizer``). A checkpoint exports later the same way:
    ``HFCausalLM.load_from_checkpoint(path).save_pretrained(folder)``.

    Args:
        dirpath: the folder; ``None``: ``<checkpoint folder>/../pretrained``.
    """

    def __init__(self, dirpath: str | None = None) -> None:
        self.dirpath = dirpath
        #: Where the last fit's model was written.
        self.last_folder: Path | None = None

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Export the model (and tokenizer) on rank 0."""
        if not trainer.is_global_zero or not isinstance(pl_module, HFCausalLM):
            return
        folder = Path(self.dirpath) if self.dirpath else self._default_folder(trainer)
        datamodule = getattr(trainer, "datamodule", None)
        tokenizer = getattr(datamodule, "tokenizer", None)
        self.last_folder = pl_module.save_pretrained(folder, tokenizer)

    @staticmethod
    def _default_folder(trainer: L.Trainer) -> Path:
        checkpoint = trainer.checkpoint_callback
        dirpath = getattr(checkpoint, "dirpath", None)
        if dirpath:  # beside it, not in it: the checkpoint folder holds the .ckpt files only
            return Path(dirpath).parent / "pretrained"
        return Path(trainer.default_root_dir) / "pretrained"
