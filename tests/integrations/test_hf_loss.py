"""causal_lm_loss against Hugging Face's own loss and float64 references from the full logits.

Tiny random-init models (2 layers, hidden 32, vocabulary 96) of four architectures; the batch
has left padding in one row (labels from ``attention_mask``) or ``-100`` labels.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers", reason="the [hf] extra is not installed")

from lightning_losses.integrations.huggingface import causal_lm_loss  # noqa: E402

VOCAB = 96
WIDTH = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)
DECODER = dict(WIDTH, num_key_value_heads=2, max_position_embeddings=32, attention_dropout=0.0)


def make_model(arch: str, *, tied: bool = False, bias: bool = False) -> nn.Module:
    torch.manual_seed(0)
    if arch == "gpt2":
        config = transformers.GPT2Config(
            vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=32, bos_token_id=1,
            eos_token_id=2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
            tie_word_embeddings=tied,
        )  # fmt: skip
    else:
        name = {"llama": "LlamaConfig", "qwen2": "Qwen2Config", "mistral": "MistralConfig"}[arch]
        config = getattr(transformers, name)(vocab_size=VOCAB, tie_word_embeddings=tied, **DECODER)
    model = transformers.AutoModelForCausalLM.from_config(config)
    if bias:  # an output layer with a bias: the model's forward uses it, so must we
        model.lm_head.bias = nn.Parameter(torch.randn(VOCAB) * 0.5)
    assert (model.get_output_embeddings().weight is model.get_input_embeddings().weight) == tied
    return model


def batch(kind: str) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(3, VOCAB, (3, 12), generator=generator)
    if kind == "padding":  # left padding in row 1, right padding in row 2
        mask = torch.ones_like(ids)
        mask[1, :4] = 0
        mask[2, -3:] = 0
        ids = ids.masked_fill(mask == 0, 0)
        return {"input_ids": ids, "attention_mask": mask}
    labels = ids.clone()
    labels[0, 3:6] = -100
    labels[2, :5] = -100
    return {"input_ids": ids, "labels": labels}


def hf_labels(inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    if "labels" in inputs:
        return inputs["labels"]
    return inputs["input_ids"].masked_fill(inputs["attention_mask"] == 0, -100)


def gradients(model: nn.Module, loss: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return grads


CASES = [
    ("llama", False, False, "padding"),
    ("llama", True, False, "labels"),
    ("llama", False, True, "labels"),
    ("gpt2", True, False, "padding"),
    ("gpt2", False, False, "labels"),
    ("qwen2", False, False, "padding"),
    ("qwen2", True, False, "labels"),
    ("mistral", False, False, "labels"),
    ("mistral", True, True, "padding"),
]


@pytest.mark.parametrize(("arch", "tied", "bias", "kind"), CASES)
def test_ce_equals_the_models_own_loss_and_gradients(arch, tied, bias, kind):
    model = make_model(arch, tied=tied, bias=bias)
    inputs = batch(kind)
    theirs = model(**{**inputs, "labels": hf_labels(inputs)}).loss
    expected = gradients(model, theirs)
    ours = causal_lm_loss(model, **inputs, loss="ce")
    assert ours.dtype == torch.float32
    torch.testing.assert_close(ours, theirs.detach(), rtol=1e-6, atol=0.0)
    got = gradients(model, ours)
    assert got.keys() == expected.keys() == {n for n, _ in model.named_parameters()}
    for name, grad in expected.items():
        scale = grad.abs().max().item()
        torch.testing.assert_close(got[name], grad, rtol=1e-5, atol=1e-5 * scale, msg=name)


def reference(loss: str, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The family's losses written plainly on the full float64 logits, mean over kept tokens."""
    keep = target != -100
    logits, target = logits[keep], target[keep]
    log_probs = torch.log_softmax(logits, dim=-1)
    log_p = log_probs.gather(1, target[:, None])[:, 0]
    p = log_p.exp()
    if loss == "focal":  # -(1 - p)^2 log p
        values = -((1 - p) ** 2) * log_p
    elif loss == "tailr":  # -max(b, w) log p, w = p / (g + (1 - g) p) held constant
        g, b = 1e-7, 0.2
        w = (p / (g + (1 - g) * p)).detach()
        values = -torch.clamp(w, min=b) * log_p
    elif loss == "label_smoothing":  # (1 - eps)(-log p_t) + eps / V * sum_c (-log p_c)
        eps = 0.1
        values = (1 - eps) * -log_p + eps / logits.shape[1] * -log_probs.sum(1)
    else:
        raise AssertionError(loss)
    return values.mean()


OURS = {
    "focal": {"loss": "focal", "gamma": 2.0},
    "tailr": {"loss": "gamma_ce", "gamma": 1e-7, "threshold": 0.2},
    "label_smoothing": {"loss": "ce", "label_smoothing": 0.1},
}


@pytest.mark.parametrize(
    ("loss", "arch", "tied", "kind"),
    [
        ("focal", "llama", False, "padding"),
        ("tailr", "gpt2", True, "labels"),
        ("tailr", "qwen2", False, "padding"),
        ("label_smoothing", "mistral", True, "labels"),
    ],
)
def test_family_equals_a_float64_reference_from_the_full_logits(loss, arch, tied, kind):
    model = make_model(arch, tied=tied).double()
    inputs = batch(kind)
    labels = hf_labels(inputs)
    logits = model(**inputs).logits  # the model's own full [B, L, V] logits
    expected_value = reference(loss, logits[:, :-1].reshape(-1, VOCAB), labels[:, 1:].reshape(-1))
    expected = gradients(model, expected_value)
    ours = causal_lm_loss(model, **inputs, **OURS[loss])
    torch.testing.assert_close(ours, expected_value.detach(), rtol=1e-10, atol=0.0)
    got = gradients(model, ours)
    for name, grad in expected.items():
        scale = grad.abs().max().item()
        torch.testing.assert_close(got[name], grad, rtol=1e-9, atol=1e-9 * scale, msg=name)


def test_per_token_tensors_are_shifted_with_the_labels():
    model = make_model("llama")
    inputs = batch("labels")
    per_token = causal_lm_loss(model, **inputs, reduction="none")
    assert per_token.shape == (3, 11)
    labels = inputs["labels"]
    assert bool((per_token[labels[:, 1:] == -100] == 0).all())
    kept = labels[:, 1:] != -100
    torch.testing.assert_close(per_token[kept].mean(), causal_lm_loss(model, **inputs))


def test_soft_capped_logits_are_refused_in_one_line():
    model = make_model("llama")
    model.config.final_logit_softcapping = 30.0
    with pytest.raises(ValueError, match=r"final_logit_softcapping=30\.0") as info:
        causal_lm_loss(model, **batch("labels"))
    assert "\n" not in str(info.value)


def test_mismatched_shapes_and_models_without_a_head_are_refused():
    model = make_model("llama")
    ids = batch("labels")["input_ids"]
    with pytest.raises(ValueError, match=r"^labels must have the shape of input_ids"):
        causal_lm_loss(model, ids, ids[:, :-1])
    with pytest.raises(ValueError, match=r"^input_ids must be a \[batch, length\]"):
        causal_lm_loss(model, ids[0])
    with pytest.raises(ValueError, match=r"get_output_embeddings\(\) gives no linear output"):
        causal_lm_loss(model.model, ids)


def test_a_missing_extra_is_one_line_naming_the_install(monkeypatch):
    from lightning_losses.integrations.huggingface._imports import require

    monkeypatch.setitem(__import__("sys").modules, "tokenizers", None)
    with pytest.raises(ModuleNotFoundError, match=r"pip install lightning-losses\[hf\]") as info:
        require("tokenizers")
    assert "\n" not in str(info.value)


def test_a_criterion_module_gives_the_loss_of_its_keywords_and_follows_its_attributes():
    from lightning_losses.losses import LinearTargetLoss

    model = make_model("qwen2")
    inputs = batch("padding")
    criterion = LinearTargetLoss("gamma_ce", gamma=1e-7, threshold=0.2)
    by_name = causal_lm_loss(model, **inputs, loss="gamma_ce", gamma=1e-7, threshold=0.2)
    torch.testing.assert_close(causal_lm_loss(model, **inputs, criterion=criterion), by_name)
    criterion.gamma = 0.5  # what GammaAnnealing does
    moved = causal_lm_loss(model, **inputs, loss="gamma_ce", gamma=0.5, threshold=0.2)
    torch.testing.assert_close(causal_lm_loss(model, **inputs, criterion=criterion), moved)
    assert not torch.allclose(moved, by_name)
    with pytest.raises(ValueError, match=r"^criterion: give either a criterion or loss="):
        causal_lm_loss(model, **inputs, criterion=criterion, gamma=0.5)


def test_class_weights_pass_through_as_cross_entropys_weight():
    model = make_model("llama").double()
    inputs = batch("labels")
    weights = torch.rand(VOCAB, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    logits = model(input_ids=inputs["input_ids"]).logits[:, :-1].reshape(-1, VOCAB)
    target = inputs["labels"][:, 1:].reshape(-1)
    keep = target != -100
    log_p = torch.log_softmax(logits[keep], -1).gather(1, target[keep, None])[:, 0]
    expected = (-weights[target[keep]] * log_p).sum() / weights[target[keep]].sum()
    ours = causal_lm_loss(model, **inputs, class_weight=weights)
    torch.testing.assert_close(ours, expected, rtol=1e-10, atol=0.0)
