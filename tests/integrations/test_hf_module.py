"""HFCausalLM: its loss, its token metrics against the full logits, and save_pretrained."""

from __future__ import annotations

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

transformers = pytest.importorskip("transformers", reason="the [hf] extra is not installed")

from lightning_losses.integrations.huggingface import (  # noqa: E402
    HFCausalLM,
    SavePretrained,
    causal_lm_loss,
)
from lightning_losses.losses import LinearTargetLoss  # noqa: E402

VOCAB, LENGTH = 80, 10
LLAMA = {
    "class_path": "transformers.LlamaConfig",
    "init_args": {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 4,  # raised to the context length
    },
}


def make_module(criterion="ce", **kwargs):
    torch.manual_seed(0)
    return HFCausalLM(LLAMA, criterion, vocab_size=VOCAB, context_length=LENGTH, **kwargs)


def windows(n=6, seed=0):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (n, LENGTH + 1), generator=generator)
    return ids[:, :-1], ids[:, 1:]


def test_the_config_is_built_with_the_datas_sizes_and_kept_plain():
    module = make_module()
    config = module.model.config
    assert type(module.model).__name__ == "LlamaForCausalLM"
    assert config.vocab_size == VOCAB
    assert config.max_position_embeddings == LENGTH
    assert module.hparams["config"] == LLAMA  # plain data: checkpoints load weights_only
    given = transformers.LlamaConfig(**LLAMA["init_args"])  # a config object works too
    from_object = HFCausalLM(given, vocab_size=VOCAB, context_length=LENGTH)
    assert from_object.model.config.hidden_size == 32
    assert from_object.hparams["config"]["class_path"].endswith("LlamaConfig")


def test_window_loss_is_the_criterion_on_the_full_logits():
    module = make_module(LinearTargetLoss("focal", gamma=2.0))
    tokens, target = windows()
    _, _, loss = module._loss((tokens, target))
    logits = module.logits(tokens).double().reshape(-1, VOCAB)
    log_p = torch.log_softmax(logits, -1).gather(1, target.reshape(-1, 1))[:, 0]
    expected = (-((1 - log_p.exp()) ** 2) * log_p).mean()  # focal, gamma 2
    torch.testing.assert_close(loss.double(), expected, rtol=1e-5, atol=0.0)


def test_a_hugging_face_batch_is_shifted_as_the_model_does():
    module = make_module()
    tokens, _ = windows()
    mask = torch.ones_like(tokens)
    mask[0, :3] = 0
    batch = {"input_ids": tokens, "attention_mask": mask}
    _, _, loss = module._loss(batch)
    labels = tokens.masked_fill(mask == 0, -100)
    expected = module.model(input_ids=tokens, attention_mask=mask, labels=labels).loss
    torch.testing.assert_close(loss, expected, rtol=1e-6, atol=0.0)
    torch.testing.assert_close(loss, causal_lm_loss(module.model, **batch), rtol=0.0, atol=0.0)


def test_validation_logs_the_token_metrics_of_the_full_logits(tmp_path):
    module = make_module("gamma_ce")
    tokens, target = windows(n=7)
    loader = DataLoader(TensorDataset(tokens, target), batch_size=3)
    trainer = L.Trainer(
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    (metrics,) = trainer.validate(module, loader, verbose=False)
    logits = module.logits(tokens).double().reshape(-1, VOCAB)
    flat = target.reshape(-1)
    nll = F.cross_entropy(logits, flat)
    probs = logits.softmax(-1)
    confidence, prediction = probs.max(-1)
    correct = (prediction == flat).double()
    edges = torch.linspace(0, 1, 16, dtype=torch.float64)
    bins = torch.bucketize(confidence, edges[1:-1], right=False)  # (k/B, (k+1)/B]
    ece = (
        sum((confidence[bins == b].sum() - correct[bins == b].sum()).abs() for b in range(15))
        / flat.numel()
    )
    assert metrics["val/nll"] == pytest.approx(nll.item(), rel=1e-5)
    assert metrics["val/ppl"] == pytest.approx(nll.exp().item(), rel=1e-5)
    assert metrics["val/acc"] == pytest.approx(correct.mean().item(), abs=1e-7)
    assert metrics["val/ece"] == pytest.approx(ece.item(), abs=1e-6)
    assert metrics["val/ece_low"] <= metrics["val/ece"] <= metrics["val/ece_high"]


def test_save_pretrained_reloads_with_from_pretrained_and_gives_the_same_logits(tmp_path):
    module = make_module("focal")
    tokens, _ = windows()
    with torch.no_grad():
        module.model.lm_head.weight.mul_(3.0)  # trained-looking, not the initialisation
        expected = module.logits(tokens)
    module.save_pretrained(tmp_path / "export")
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "export")
    torch.testing.assert_close(reloaded(tokens).logits, expected, rtol=0.0, atol=0.0)
    again = HFCausalLM(pretrained=str(tmp_path / "export"), vocab_size=VOCAB)
    torch.testing.assert_close(again.logits(tokens), expected, rtol=0.0, atol=0.0)
    with pytest.raises(ValueError, match=r"^pretrained: the model at .* 80 tokens, the data 81"):
        HFCausalLM(pretrained=str(tmp_path / "export"), vocab_size=VOCAB + 1)


def test_the_callback_exports_after_a_fit(tmp_path):
    module = make_module()
    tokens, target = windows()
    callback = SavePretrained(str(tmp_path / "hf"))
    trainer = L.Trainer(
        accelerator="cpu",
        max_epochs=1,
        limit_train_batches=2,
        limit_val_batches=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[callback],
        default_root_dir=tmp_path,
    )
    loader = DataLoader(TensorDataset(tokens, target), batch_size=3)
    trainer.fit(module, loader, loader)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(callback.last_folder)
    torch.testing.assert_close(reloaded(tokens).logits, module.logits(tokens), rtol=0, atol=0)


def test_config_and_pretrained_are_one_or_the_other():
    with pytest.raises(ValueError, match=r"^config / pretrained: give exactly one"):
        HFCausalLM(vocab_size=VOCAB)
    with pytest.raises(ValueError, match=r"^config: class_path 'torch.nn.Linear' does not name"):
        HFCausalLM({"class_path": "torch.nn.Linear"})


def test_soft_capped_models_are_refused_when_built():
    config = {"class_path": "transformers.Gemma2Config", "init_args": {
        "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8}}  # fmt: skip
    with pytest.raises(ValueError, match=r"^model: its config sets final_logit_softcapping"):
        HFCausalLM(config, vocab_size=VOCAB)


def test_the_lm_evaluation_reads_it_as_a_next_token_model():
    from lightning_losses.lm.data import TokenWindows
    from lightning_losses.lm.evaluation import generate, held_out_logits, token_metrics

    module = make_module()
    assert module.context_length == LENGTH
    ids = torch.randint(0, VOCAB, (3 * LENGTH + 1,), generator=torch.Generator().manual_seed(3))
    logits, target = held_out_logits(module, TokenWindows(ids, LENGTH), batch_size=2)
    with torch.no_grad():
        expected = module.logits(ids[: 3 * LENGTH].reshape(3, LENGTH)).reshape(-1, VOCAB)
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)
    nll = F.cross_entropy(expected.double(), ids[1:].double().long())
    assert token_metrics(logits, target)["nll"] == pytest.approx(nll.item(), rel=1e-5)
    prompt = ids[: LENGTH + 2].reshape(1, -1)  # longer than the context: cropped to its end
    continued = generate(module, prompt, steps=2, greedy=True)
    with torch.no_grad():
        first = module.logits(prompt[:, -LENGTH:])[0, -1].argmax()
        second_context = torch.cat([prompt[0], first.reshape(1)])[-LENGTH:]
        second = module.logits(second_context.reshape(1, -1))[0, -1].argmax()
    assert continued.tolist() == [[first.item(), second.item()]]
