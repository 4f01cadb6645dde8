"""The three-line change of docs/huggingface.md runs as written and gives TaiLr's loss."""

from __future__ import annotations

import re

import lightning as L
import pytest
import torch
from helpers.paths import ROOT

transformers = pytest.importorskip("transformers", reason="the [hf] extra is not installed")


def test_the_pages_snippet_trains_with_tailr():
    page = (ROOT / "docs" / "huggingface.md").read_text()
    snippet = re.search(r"```python\n(.*?)```", page, re.S).group(1)
    namespace = {"L": L}
    exec(compile(snippet, "docs/huggingface.md", "exec"), namespace)
    module = namespace["MyLM"]()
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
    )
    module.model = transformers.LlamaForCausalLM(config)
    ids = torch.randint(0, 64, (2, 9))
    labels = ids.clone()
    labels[0, :3] = -100
    loss = module.training_step({"input_ids": ids, "labels": labels}, 0)
    # TaiLr on the model's own full logits: -max(b, w) log p_t, w = p/(g + (1 - g) p) constant
    logits = module.model(input_ids=ids).logits[:, :-1].double().reshape(-1, 64)
    target = labels[:, 1:].reshape(-1)
    keep = target != -100
    log_p = torch.log_softmax(logits[keep], -1).gather(1, target[keep, None])[:, 0]
    p = log_p.exp()
    expected = (-torch.clamp(p / (1e-7 + (1 - 1e-7) * p), min=0.2) * log_p).mean()
    torch.testing.assert_close(loss.double(), expected, rtol=1e-5, atol=0.0)
