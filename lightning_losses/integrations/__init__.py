"""Other ecosystems' models trained with the package's losses (optional extras, lazy imports).

- :mod:`lightning_losses.integrations.huggingface`: a Hugging Face ``*ForCausalLM`` trained
  with any loss of the target-probability family through the chunked linear head
  (:func:`~lightning_losses.integrations.huggingface.causal_lm_loss`), without patching the
  model's code; ``pip install lightning-losses[hf]``.
"""
