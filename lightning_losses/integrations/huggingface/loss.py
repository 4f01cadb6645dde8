"""Any loss of the target-probability family over a Hugging Face causal LM's head, chunked.

``model(input_ids, labels=labels).loss`` builds the ``[tokens, vocabulary]`` logits and
computes plain cross-entropy. :func:`causal_lm_loss` runs the same model's decoder for its
final hidden states, shifts the labels as Hugging Face does (token ``i`` predicts label
``i + 1``; ``-100`` ignored) and hands hidden states, output weight and bias to
:func:`~lightning_losses.functional.linear.linear_target_loss`: no ``[N, V]`` logits, any loss
of the family, nothing of the model's code patched (Liger-Kernel instead patches each
architecture's forward, cross-entropy only).

Source: the shift and the mean over the non-ignored labels are those of ``transformers``'
``ForCausalLMLoss`` (``transformers/loss/loss_utils.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from torch import Tensor, nn

from lightning_losses.functional.linear import linear_target_loss

__all__ = [
    "UNSUPPORTED_LOGIT_TRANSFORMS",
    "causal_lm_hidden_states",
    "causal_lm_labels",
    "causal_lm_loss",
    "check_plain_head",
    "output_head",
    "shift_for_next_token",
]

#: Config attributes of architectures whose logits are not ``hidden @ weight.T + bias``: the
#: attribute, and what the model does with it. A model with one of them set is refused.
UNSUPPORTED_LOGIT_TRANSFORMS = {
    "final_logit_softcapping": "soft-caps its logits, cap * tanh(logits / cap) (Gemma 2 and 3)",
    "logit_scale": "multiplies its logits by a scale (Cohere)",
    "logits_scaling": "divides its logits by a scale (Granite)",
}


def check_plain_head(model: nn.Module) -> None:
    """Refuse a model whose logits are not ``hidden @ weight.T + bias`` (one-line error).

    A config attribute of :data:`UNSUPPORTED_LOGIT_TRANSFORMS` that is set (not ``None``)
    means the model transforms its logits after the output layer: the chunked head would
    compute another loss than the model's, so it is refused rather than silently wrong.

    Raises:
        ValueError: naming the attribute and what to do (unset it, or use the model's own loss).

    Example:
        >>> from types import SimpleNamespace
        >>> model = nn.Linear(2, 2)
        >>> model.config = SimpleNamespace(final_logit_softcapping=30.0)
        >>> try:
        ...     check_plain_head(model)
        ... except ValueError as error:
        ...     print(str(error)[:75])
        model: its config sets final_logit_softcapping=30.0, so the model soft-caps
    """
    config = getattr(model, "config", None)
    for name, what in UNSUPPORTED_LOGIT_TRANSFORMS.items():
        value = getattr(config, name, None)
        if value is not None:
            raise ValueError(
                f"model: its config sets {name}={value!r}, so the model {what}; the chunked "
                "head computes the loss of the plain logits hidden @ weight.T + bias and "
                f"cannot apply it: set config.{name}=None (training without it), or use "
                "model(input_ids, labels=labels).loss"
            )


def output_head(model: nn.Module) -> tuple[Tensor, Tensor | None]:
    """``(weight [V, H], bias [V] or None)`` of ``model.get_output_embeddings()``.

    Tied or not: the parameter objects themselves, so gradients reach the input embedding
    when the weights are tied.

    Raises:
        ValueError: the model has no output embeddings with a ``[V, H]`` weight.
    """
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    weight = getattr(head, "weight", None)
    if not isinstance(weight, Tensor) or weight.dim() != 2:
        raise ValueError(
            f"model: {type(model).__name__}.get_output_embeddings() gives no linear output "
            "layer with a [vocab, hidden] weight; causal_lm_loss needs a *ForCausalLM model"
        )
    bias = getattr(head, "bias", None)
    return weight, bias if isinstance(bias, Tensor) else None


def causal_lm_hidden_states(
    model: nn.Module,
    input_ids: Tensor,
    *,
    attention_mask: Tensor | None = None,
    model_kwargs: Mapping[str, Any] | None = None,
) -> Tensor:
    """Final hidden states ``[B, L, H]`` of a causal LM: its decoder's ``last_hidden_state``.

    The decoder is ``model.get_decoder()`` (``LlamaModel`` of ``LlamaForCausalLM``,
    ``GPT2Model`` of ``GPT2LMHeadModel``...), else ``model.base_model``; it runs with
    ``use_cache=False`` and the given ``attention_mask`` and ``model_kwargs``
    (``position_ids``...): what ``model.forward`` feeds its output layer.
    """
    get = getattr(model, "get_decoder", None)
    decoder = get() if callable(get) else None
    if decoder is None:
        decoder = getattr(model, "base_model", None)
    if not isinstance(decoder, nn.Module) or decoder is model:
        raise ValueError(
            f"model: {type(model).__name__} has no decoder (get_decoder() or base_model) to "
            "give its final hidden states; causal_lm_loss needs a *ForCausalLM model"
        )
    kwargs = dict(model_kwargs or {})
    kwargs.setdefault("use_cache", False)
    outputs = decoder(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
    hidden = getattr(outputs, "last_hidden_state", None)
    return hidden if isinstance(hidden, Tensor) else outputs[0]


def causal_lm_labels(
    input_ids: Tensor,
    labels: Tensor | None = None,
    *,
    attention_mask: Tensor | None = None,
    ignore_index: int = -100,
) -> Tensor:
    """The labels of a batch, unshifted: ``labels``, or ``input_ids`` with padding ignored.

    Without ``labels``, the labels are the input ids themselves and the positions where
    ``attention_mask`` is 0 (padding) become ``ignore_index``. Given ``labels`` are returned as
    they are (Hugging Face does not mask them by the attention mask either).

    Raises:
        ValueError: ``input_ids`` is not ``[B, L]``, or ``labels`` / ``attention_mask`` has
            another shape.

    Example:
        >>> import torch
        >>> causal_lm_labels(torch.tensor([[5, 6, 0]]), attention_mask=torch.tensor([[1, 1, 0]]))
        tensor([[   5,    6, -100]])
    """
    if not isinstance(input_ids, Tensor) or input_ids.dim() != 2:
        shape = list(input_ids.shape) if isinstance(input_ids, Tensor) else type(input_ids)
        raise ValueError(f"input_ids must be a [batch, length] tensor of token ids; got {shape}")
    for name, value in (("labels", labels), ("attention_mask", attention_mask)):
        if value is not None and tuple(value.shape) != tuple(input_ids.shape):
            raise ValueError(
                f"{name} must have the shape of input_ids {list(input_ids.shape)}; "
                f"got {list(value.shape)}"
            )
    if labels is not None:
        return labels
    if attention_mask is None:
        return input_ids
    return input_ids.masked_fill(attention_mask == 0, ignore_index)


def shift_for_next_token(hidden: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    """``(hidden[:, :-1], labels[:, 1:])``: the state at ``i`` predicts the label at ``i + 1``.

    Hugging Face pads the labels with one ignored column and drops the first; its last
    position then counts for nothing, so leaving it out gives the same loss and gradients.

    Example:
        >>> import torch
        >>> hidden, target = shift_for_next_token(torch.zeros(1, 3, 2), torch.tensor([[7, 8, 9]]))
        >>> hidden.shape, target
        (torch.Size([1, 2, 2]), tensor([[8, 9]]))
    """
    return hidden[:, :-1], labels[:, 1:]


def _shift_token_tensors(hyperparameters: dict[str, Any], labels: Tensor) -> dict[str, Any]:
    """Per-token keyword tensors (the labels' shape, e.g. ``token_weight``) shifted alike."""
    return {
        name: value[:, 1:]
        if isinstance(value, Tensor) and tuple(value.shape) == tuple(labels.shape)
        else value
        for name, value in hyperparameters.items()
    }


def causal_lm_loss(
    model: nn.Module,
    input_ids: Tensor,
    labels: Tensor | None = None,
    *,
    attention_mask: Tensor | None = None,
    loss: str = "ce",
    criterion: Callable[..., Tensor] | None = None,
    model_kwargs: Mapping[str, Any] | None = None,
    **hyperparameters: Any,
) -> Tensor:
    """A loss of the target-probability family of a Hugging Face causal LM, without its logits.

    ``loss="ce"`` is ``model(input_ids, attention_mask=attention_mask, labels=labels).loss``
    (values and gradients); with ``x_i = hidden_i @ weight.T + bias`` the logits of position
    ``i`` and ``t_i = labels[i + 1]``,

        loss = sum_{i: t_i != -100} phi(log softmax(x_i)[t_i]) / #{i: t_i != -100}

    with ``phi`` of ``loss`` (``ce``: ``-log p_t``; ``gamma_ce``: TaiLr; ``focal``...;
    :func:`~lightning_losses.functional.linear.linear_target_loss` lists them). The decoder
    gives the hidden states (:func:`causal_lm_hidden_states`), the labels are shifted as
    Hugging Face does (:func:`shift_for_next_token`), and the chunked head computes the loss
    over ``model.get_output_embeddings()`` (weight and bias, tied or not), a chunk of tokens
    at a time: the ``[tokens, vocabulary]`` logits are never built.

    Source: the shift and the mean are ``transformers``' ``ForCausalLMLoss``; the losses,
    TaiLr (Ji et al., ICLR 2023), focal loss (Lin et al., 2017), label smoothing (Szegedy et
    al., 2016).

    Args:
        model: a ``*ForCausalLM`` (``LlamaForCausalLM``, ``GPT2LMHeadModel``,
            ``Qwen2ForCausalLM``, ``MistralForCausalLM``...); its code is not changed.
        input_ids: ``[B, L]`` token ids.
        labels: ``[B, L]`` labels, unshifted, ``-100`` (``ignore_index``) where no loss is
            wanted; ``None``: ``input_ids`` with the padding (``attention_mask == 0``) ignored.
        attention_mask: ``[B, L]`` 1 for tokens, 0 for padding; passed to the decoder.
        loss: a loss of the family: ``ce``, ``gamma_ce``, ``focal``, ``poly1``...
        criterion: instead of ``loss`` and its keywords, a
            :class:`~lightning_losses.LinearTargetLoss` (e.g. a ``LossMixin``'s
            ``self.criterion``), called as ``criterion(hidden, weight, target, bias)``: its
            attributes can then be scheduled (``GammaAnnealing`` sets ``criterion.gamma``).
        model_kwargs: further keywords for the decoder (``position_ids``...).
        **hyperparameters: the loss's keywords (``gamma``, ``threshold``, ``label_smoothing``)
            and :func:`~lightning_losses.functional.linear.linear_target_loss`'s own
            (``class_weight``, ``chunk_size``, ``ignore_index``, ``reduction``, ``half_matmul``
            and any later ones); a per-token tensor of the labels' shape is shifted with them.

    Returns:
        The loss (``reduction="mean"``: a float32 scalar; ``"none"``: ``[B, L - 1]``).

    Raises:
        ValueError: a model whose logits are soft-capped or scaled
            (:func:`check_plain_head`), shapes that do not match, or a bad hyper-parameter.

    Example:
        >>> import torch
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32,
        ...                      num_hidden_layers=1, num_attention_heads=2)
        >>> model = LlamaForCausalLM(config)
        >>> ids = torch.randint(0, 64, (2, 8))
        >>> ours = causal_lm_loss(model, ids)
        >>> torch.allclose(ours, model(ids, labels=ids).loss)
        True
        >>> causal_lm_loss(model, ids, loss="gamma_ce", gamma=1e-7, threshold=0.2).shape
        torch.Size([])
        >>> from lightning_losses import LinearTargetLoss
        >>> tailr = LinearTargetLoss("gamma_ce", gamma=1e-7, threshold=0.2)
        >>> torch.equal(causal_lm_loss(model, ids, criterion=tailr),
        ...             causal_lm_loss(model, ids, loss="gamma_ce", gamma=1e-7, threshold=0.2))
        True
    """
    check_plain_head(model)
    if criterion is not None and (loss != "ce" or hyperparameters):
        raise ValueError(
            "criterion: give either a criterion or loss= with its keywords, not both; got "
            f"loss={loss!r} and {sorted(hyperparameters)}"
        )
    default_ignore = getattr(criterion, "ignore_index", -100)
    ignore_index = int(hyperparameters.get("ignore_index", default_ignore))
    labels = causal_lm_labels(
        input_ids, labels, attention_mask=attention_mask, ignore_index=ignore_index
    )
    weight, bias = output_head(model)
    hidden = causal_lm_hidden_states(
        model, input_ids, attention_mask=attention_mask, model_kwargs=model_kwargs
    )
    hidden, target = shift_for_next_token(hidden, labels)
    target = target.to(hidden.device)
    if criterion is not None:
        return criterion(hidden, weight, target, bias)
    extra = _shift_token_tensors(hyperparameters, labels)
    return linear_target_loss(hidden, weight, target, loss=loss, bias=bias, **extra)
