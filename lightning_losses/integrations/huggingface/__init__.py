"""Hugging Face causal LMs trained with the losses of the family, without patching their code.

- :func:`causal_lm_loss`: ``model(input_ids, labels=labels).loss`` for any loss of the
  target-probability family (TaiLr's gamma-CE, focal, label smoothing...), through the chunked
  linear head: the ``[tokens, vocabulary]`` logits are never built.

``transformers`` is an optional extra (``pip install lightning-losses[hf]``): nothing here
imports it until a model is built from a config.
"""

from __future__ import annotations

from lightning_losses.integrations.huggingface.loss import (
    causal_lm_hidden_states,
    causal_lm_labels,
    causal_lm_loss,
    check_plain_head,
    output_head,
    shift_for_next_token,
)

__all__ = [
    "causal_lm_hidden_states",
    "causal_lm_labels",
    "causal_lm_loss",
    "check_plain_head",
    "output_head",
    "shift_for_next_token",
]
