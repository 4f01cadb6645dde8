"""Token metrics of the language model's validation equal a plain float64 computation.

``TinyLanguageModel.validation_step`` feeds :class:`TokenCalibration` the chunked head's
per-token statistics; a real ``Trainer.validate`` runs it under two batchings and under two
gloo processes (7 windows: 4 on rank 0, 3 on rank 1). The reference is written here over the
token logits of all windows concatenated in order (``model.logits``), ``-100`` targets dropped:
NLL, perplexity, accuracy, the binned ECE and the l1 debiased ECE of Kumar, Liang and Ma
("Verified Uncertainty Calibration", NeurIPS 2019): their ``normal_debiased_ce`` (repository
p-lambda/verified_calibration, calibration/utils.py) returns ``2 ECE - mean(resampled ECE)``
with each bin's accuracy redrawn from ``N(acc_b, acc_b (1 - acc_b) / n_b)``; here the mean over
draws is its limit, the folded-normal mean, written with ``math.erf``.

The interval's reference is the package's definition,
:func:`~lightning_losses.calibration.calibration_error_interval` on the same concatenated
logits (token ``i`` at position ``i``).

Tolerance 1e-12: the model runs in float64 (``precision="64-true"``), so the metric's per-token
statistics (logits built a chunk at a time by ``linear_prediction_statistics``) and the
reference's (``model.logits`` then ``log_softmax``) differ only by float64 rounding of differently
ordered sums, ~1e-16 relative per token; the sums over ~90 tokens and the bootstrap quantiles
stay far below 1e-12. (A float32 model would agree only to ~1e-6.)
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

import lightning as L
import pytest
import torch
from helpers.ddp import spawn_gloo
from torch import Tensor
from torch.utils.data import DataLoader, TensorDataset

from lightning_losses.calibration import calibration_error_interval
from lightning_losses.data.samplers import UnpaddedDistributedSampler
from lightning_losses.lm.data import TokenWindows
from lightning_losses.lm.evaluation import held_out_logits, token_metrics
from lightning_losses.lm.model import TinyLanguageModel, TokenCalibration

VOCAB, LENGTH, WINDOWS, BINS = 23, 16, 7, 15
NAMES = ("nll", "ppl", "acc", "ece", "ece_debiased", "ece_low", "ece_high")
TOLERANCE = 1e-12


# --- the model, the windows and the plain reference ------------------------------------------


def _model() -> TinyLanguageModel:
    """A tiny model whose token confidences spread over the bins (0.2 to 1)."""
    torch.manual_seed(0)
    model = TinyLanguageModel(vocab_size=VOCAB, context_length=LENGTH, d_model=16, n_heads=2)
    with torch.no_grad():
        model.token_embedding.weight.mul_(1.5)
        model.output_bias.copy_(torch.randn(VOCAB) * 1.5)
    return model


def _windows(model: TinyLanguageModel) -> tuple[Tensor, Tensor]:
    """7 windows of random tokens and their targets, some of them padding.

    Targets are drawn from the model's tempered softmax (so the model is over-confident); every
    fifth token and the second half of the fourth window are -100.
    """
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, VOCAB, (WINDOWS, LENGTH), generator=generator)
    with torch.no_grad():
        probabilities = (model.eval().logits(tokens) * 0.5).softmax(-1)
    target = torch.multinomial(probabilities.reshape(-1, VOCAB), 1, generator=generator)
    target = target.reshape(WINDOWS, LENGTH)
    target.view(-1)[3::5] = -100
    target[3, LENGTH // 2 :] = -100
    return tokens, target


def _double_logits(model: TinyLanguageModel, tokens: Tensor) -> Tensor:
    """``[W * L, V]`` float64 logits of the windows, concatenated in order."""
    double = copy.deepcopy(model).double().eval()
    with torch.no_grad():
        return double.logits(tokens).reshape(-1, VOCAB)


def _folded_normal_mean(mean: float, std: float) -> float:
    """``E|X|`` for ``X ~ N(mean, std^2)``."""
    if std == 0:
        return abs(mean)
    phi = 0.5 * (1 + math.erf(-mean / std / math.sqrt(2)))  # P(Z < -mean / std)
    return std * math.sqrt(2 / math.pi) * math.exp(-0.5 * (mean / std) ** 2) + mean * (1 - 2 * phi)


def _plain_reference(logits: Tensor, target: Tensor) -> dict[str, float]:
    """NLL, perplexity, accuracy, ECE and l1 debiased ECE, written out in float64."""
    keep = target != -100
    logits, target = logits[keep].double(), target[keep]
    log_probs = logits.log_softmax(dim=1)
    nll = -log_probs.gather(1, target[:, None]).mean().item()
    confidence, prediction = log_probs.exp().max(dim=1)
    correct = (prediction == target).double()
    n = len(target)
    bins = torch.clamp(torch.ceil(confidence * BINS).long() - 1, 0, BINS - 1)
    ece = expected = 0.0
    for b in range(BINS):
        members = bins == b
        count = int(members.sum())
        if count == 0:
            continue
        conf, acc = confidence[members].mean().item(), correct[members].mean().item()
        ece += count / n * abs(conf - acc)
        expected += count / n * _folded_normal_mean(conf - acc, math.sqrt(acc * (1 - acc) / count))
    return {
        "nll": nll,
        "ppl": math.exp(nll),
        "acc": correct.mean().item(),
        "ece": ece,
        "ece_debiased": 2 * ece - expected,
    }


def _full_reference(model: TinyLanguageModel, tokens: Tensor, target: Tensor) -> dict[str, float]:
    logits = _double_logits(model, tokens)
    flat = target.reshape(-1)
    reference = _plain_reference(logits, flat)
    _, low, high = calibration_error_interval(
        logits, flat, n_bins=BINS, input_format="logits", ignore_index=-100
    )
    return {**reference, "ece_low": low.item(), "ece_high": high.item()}


# --- a real Trainer.validate ----------------------------------------------------------------


class WindowsData(L.LightningDataModule):
    """The windows as a validation split, read in order by the package's unpadded sampler."""

    def __init__(self, tokens: Tensor, target: Tensor, batch_size: int) -> None:
        super().__init__()
        self.tokens, self.target, self.batch_size = tokens, target, batch_size

    def val_dataloader(self) -> DataLoader:
        dataset = TensorDataset(self.tokens, self.target)
        sampler = UnpaddedDistributedSampler(dataset)
        return DataLoader(dataset, batch_size=self.batch_size, sampler=sampler)


class RecordTokenMetrics(L.Callback):
    """Keeps the float64 values of ``TokenCalibration.compute()`` (the module logs float32).

    Callbacks' epoch-end hooks run before the module's; ``compute`` caches its result, so the
    module then logs these same values.
    """

    def __init__(self) -> None:
        self.values: dict[str, float] = {}
        self.local_tokens = 0.0

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        metric = pl_module.val_calibration
        self.local_tokens = metric.tokens.item()  # this process's share, before the sync
        self.values = {name: value.item() for name, value in metric.compute().items()}


def _validate(model: TinyLanguageModel, data: WindowsData, **trainer_options) -> dict:
    record = RecordTokenMetrics()
    trainer = L.Trainer(
        accelerator="cpu",
        precision="64-true",
        logger=False,
        callbacks=[record],
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        **trainer_options,
    )
    trainer.validate(copy.deepcopy(model), datamodule=data, verbose=False)
    logged = {name: float(trainer.callback_metrics[f"val/{name}"]) for name in NAMES}
    return {
        "recorded": record.values,
        "logged": logged,
        "local_tokens": record.local_tokens,
        "world_size": trainer.world_size,
    }


@pytest.fixture(scope="module")
def setup() -> tuple[TinyLanguageModel, Tensor, Tensor, dict[str, float]]:
    model = _model()
    tokens, target = _windows(model)
    return model, tokens, target, _full_reference(model, tokens, target)


def test_the_setup_spreads_confidences_and_ignores_padding(setup):
    model, tokens, target, reference = setup
    logits = _double_logits(model, tokens)
    confidence = logits.softmax(1).max(1).values
    assert torch.histc(confidence, BINS, 0, 1).count_nonzero() >= 8  # many bins in use
    assert int((target == -100).sum()) > 20
    assert reference["ece"] > 0.02
    assert reference["ece_low"] < reference["ece_high"]


@pytest.mark.parametrize("batch_size", [2, 3])
def test_validation_equals_the_plain_computation_under_any_batching(setup, batch_size):
    model, tokens, target, reference = setup
    result = _validate(model, WindowsData(tokens, target, batch_size), devices=1)
    assert sorted(result["recorded"]) == sorted(NAMES)
    for name in NAMES:
        assert result["recorded"][name] == pytest.approx(reference[name], abs=TOLERANCE), name
        # Logged as float32 for the loggers.
        assert result["logged"][name] == pytest.approx(reference[name], rel=1e-6, abs=1e-7)


def test_token_metrics_equals_the_plain_computation(setup):
    model, tokens, target, reference = setup
    logits = _double_logits(model, tokens)
    values = token_metrics(logits, target.reshape(-1), n_bins=BINS)
    assert sorted(values) == sorted(NAMES)
    for name in NAMES:
        assert values[name] == pytest.approx(reference[name], abs=TOLERANCE), name


def test_held_out_logits_are_the_windows_in_order():
    model = _model().train()
    ids = torch.randint(0, VOCAB, (5 * LENGTH + 3,), generator=torch.Generator().manual_seed(2))
    windows = TokenWindows(ids, LENGTH)
    logits, target = held_out_logits(model, windows, batch_size=2)
    assert model.training  # the mode is restored
    assert logits.dtype == torch.float32
    assert logits.shape == (5 * LENGTH, VOCAB)
    assert target.tolist() == ids[1 : 5 * LENGTH + 1].tolist()
    with torch.no_grad():
        expected = model.eval().logits(ids[: 5 * LENGTH].reshape(5, LENGTH))
    torch.testing.assert_close(logits, expected.reshape(-1, VOCAB), rtol=1e-5, atol=1e-5)
    # token_metrics of float32 logits: float32 logits, float64 statistics.
    values = token_metrics(logits, target)
    plain = _plain_reference(logits, target)
    for name in plain:
        assert values[name] == pytest.approx(plain[name], abs=1e-12), name


def test_token_metrics_rejects_bad_inputs():
    logits = torch.zeros(4, 3)
    with pytest.raises(ValueError, match="target values must lie in"):
        token_metrics(logits, torch.tensor([0, 1, 3, 0]))
    with pytest.raises(ValueError, match="target must have shape"):
        token_metrics(logits, torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="n_bins must be >= 1"):
        token_metrics(logits, torch.tensor([0, 1, 2, 0]), n_bins=0)
    with pytest.raises(ValueError, match=r"logits must have shape \[N, V\]"):
        token_metrics(torch.zeros(2, 3, 4), torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        held_out_logits(_model(), TokenWindows(torch.arange(40) % VOCAB, LENGTH), batch_size=0)


def test_window_positions_follow_the_windows_not_the_batches():
    metric = TokenCalibration()
    first = metric.window_positions(torch.zeros(2, 4, dtype=torch.long))
    second = metric.window_positions(torch.tensor([[1, -100, 1, 1]]))
    assert first.tolist() == list(range(8))
    assert second.tolist() == [8, 10, 11]
    metric.reset()
    assert metric.window_positions(torch.zeros(1, 4, dtype=torch.long)).tolist() == [0, 1, 2, 3]
    with pytest.raises(ValueError, match=r"target must be a \[B, L\] tensor"):
        metric.window_positions(torch.zeros(4, dtype=torch.long))


# --- two gloo processes --------------------------------------------------------------------


def _ddp_worker(rank: int, folder: str) -> None:
    import os

    # Launched here (externally): Lightning's DDP takes the ranks from these variables and
    # keeps the process group spawn_gloo made.
    os.environ.update({"LOCAL_RANK": str(rank), "NODE_RANK": "0", "WORLD_SIZE": "2"})
    model = _model()
    tokens, target = _windows(model)
    result = _validate(model, WindowsData(tokens, target, batch_size=2), devices=2, strategy="ddp")
    torch.save(result, Path(folder) / f"rank{rank}.pt")


@pytest.mark.slow
def test_two_gloo_processes_give_the_single_process_values(setup, tmp_path):
    _, _, target, reference = setup
    spawn_gloo(_ddp_worker, str(tmp_path))
    kept = (target != -100).sum(dim=1)
    for rank in (0, 1):
        result = torch.load(tmp_path / f"rank{rank}.pt")
        assert result["world_size"] == 2
        # Rank 0 validated windows 0, 2, 4, 6 and rank 1 windows 1, 3, 5: then summed.
        assert result["local_tokens"] == kept[rank::2].sum().item()
        for name in NAMES:
            assert result["recorded"][name] == pytest.approx(reference[name], abs=TOLERANCE), (
                rank,
                name,
            )
