"""Hugging Face causal LMs trained with the losses of the family, without patching their code.

- :func:`causal_lm_loss`: ``model(input_ids, labels=labels).loss`` for any loss of the
  target-probability family (TaiLr's gamma-CE, focal, label smoothing...), through the chunked
  linear head: the ``[tokens, vocabulary]`` logits are never built.
- :class:`HFCausalLM`: a ``*ForCausalLM`` (random init from a config, or a local
  ``from_pretrained`` folder) as a LightningModule with a swappable, schedulable criterion and
  the token metrics of the package's own language model; ``lightning-losses lm fit --config
  hf_llama_tiny_ce`` trains one. :class:`SavePretrained` exports it for ``from_pretrained``.
- :class:`BPETokenizer` and :class:`PydocTopicsBPEDataModule`: a byte-level BPE trained here on
  ``pydoc_data.topics``, so nothing is downloaded.

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
from lightning_losses.integrations.huggingface.module import (
    HFCausalLM,
    SavePretrained,
    build_causal_lm,
)
from lightning_losses.integrations.huggingface.tokenizer import (
    BPETokenizer,
    PydocTopicsBPEDataModule,
)

__all__ = [
    "BPETokenizer",
    "HFCausalLM",
    "PydocTopicsBPEDataModule",
    "SavePretrained",
    "build_causal_lm",
    "causal_lm_hidden_states",
    "causal_lm_labels",
    "causal_lm_loss",
    "check_plain_head",
    "output_head",
    "shift_for_next_token",
]
