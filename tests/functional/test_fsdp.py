"""The chunked linear-head loss under sharded data parallelism (FSDP), against an unsharded run.

:func:`~lightning_losses.functional.linear_target_loss` takes the head's weight as a tensor. FSDP
shards every parameter across the processes and gathers a module's full parameters only while
that module's ``forward`` runs, so the loss is called inside the forward of the head that owns
the weight (``ChunkedHead`` below, the pattern the "Running on a cluster" page shows).

- FSDP2 (``torch.distributed.fsdp.fully_shard``, Lightning's ``ModelParallelStrategy``) runs on
  this CPU build with gloo: a real 2-process fit, its loss and gradients at the first step and
  its weights after the step compared with a float64 computation of the same model, unsharded,
  in one process; reading the sharded weight outside the head's forward is an error.
- FSDP1 (Lightning's ``FSDPStrategy``) refuses a CPU accelerator: its fit runs on 2 GPUs, and
  is skipped without them.

This file is also the script of the fit: ``python tests/functional/test_fsdp.py STRATEGY OUT``
(Lightning starts the second process by running the same command again).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Subset, TensorDataset

from lightning_losses.functional import linear_target_loss

FEATURES, HIDDEN, CLASSES = 6, 5, 11
SAMPLES, PER_PROCESS = 16, 8  # one step: each of the 2 processes holds 8 samples
GAMMA = 2.0  # focal loss
LR = 0.5
CHUNK = 3  # rows per chunk: 8 rows make chunks of 3, 3 and 2


class ChunkedHead(nn.Linear):
    """A linear head whose forward is the chunked loss, so that FSDP has gathered its weight."""

    def forward(self, hidden: torch.Tensor, target: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return linear_target_loss(
            hidden,
            self.weight,
            target,
            loss="focal",
            gamma=GAMMA,
            bias=self.bias,
            chunk_size=CHUNK,
        )


class TinyChunkedModel(L.LightningModule):
    """A linear body and a :class:`ChunkedHead`; records its first step for the test."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Linear(FEATURES, HIDDEN)
        self.head = ChunkedHead(HIDDEN, CLASSES)
        self.record: dict[str, object] = {}

    def configure_model(self) -> None:
        """FSDP2: the head, the body and the rest each an FSDP unit (ModelParallelStrategy)."""
        if self.device_mesh is None:
            return
        from torch.distributed.fsdp import fully_shard

        mesh = self.device_mesh["data_parallel"]
        fully_shard(self.head, mesh=mesh)
        fully_shard(self.body, mesh=mesh)
        fully_shard(self, mesh=mesh)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.body(features))

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        features, target = batch
        hidden = self(features)
        try:  # the head's weight read outside its forward: a shard, not the weight
            linear_target_loss(hidden, self.head.weight, target, loss="focal", gamma=GAMMA)
            self.record["outside"] = "no error"
        except Exception as error:
            self.record["outside"] = f"{type(error).__name__}: {error}"
        loss = self.head(hidden, target)
        self.record["losses"] = self.all_gather(loss.detach()).cpu()
        return loss

    def on_after_backward(self) -> None:
        self.record["grads"] = full_tensors(self, grads=True)

    def on_train_end(self) -> None:
        self.record["weights"] = full_tensors(self, grads=False)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=LR)


def full_tensors(model: TinyChunkedModel, *, grads: bool) -> dict[str, torch.Tensor]:
    """Every parameter (or its gradient) whole, on the CPU.

    FSDP2's shards are gathered, FSDP1's flat parameters unsharded (a collective: every process
    calls it).
    """
    strategy = model.trainer.strategy
    if type(strategy).__name__ == "FSDPStrategy":
        from torch.distributed.fsdp import FullyShardedDataParallel

        with FullyShardedDataParallel.summon_full_params(strategy.model, with_grads=grads):
            return {
                name: (p.grad if grads else p).detach().cpu().clone()
                for name, p in model.named_parameters()
            }
    values = {}
    for name, p in model.named_parameters():
        tensor = p.grad if grads else p
        tensor = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
        values[name] = tensor.detach().cpu().clone()
    return values


def data() -> TensorDataset:
    """16 samples, fixed by a seed: process r of 2 is given samples r, r + 2, ... (in order)."""
    generator = torch.Generator().manual_seed(1)
    features = torch.randn(SAMPLES, FEATURES, generator=generator)
    target = torch.randint(0, CLASSES, (SAMPLES,), generator=generator)
    return TensorDataset(features, target)


def fit(strategy_name: str, out: str) -> None:
    """One step of a 2-process fit with ``strategy_name``; process 0 saves the record to ``out``."""
    if strategy_name == "fsdp2":
        from lightning.pytorch.strategies import ModelParallelStrategy

        strategy = ModelParallelStrategy(
            data_parallel_size=2, tensor_parallel_size=1, process_group_backend="gloo"
        )
        accelerator = "cpu"
    else:
        from lightning.pytorch.strategies import FSDPStrategy

        strategy = FSDPStrategy(auto_wrap_policy={ChunkedHead, nn.Linear})
        accelerator = "cuda"
    trainer = L.Trainer(
        accelerator=accelerator,
        devices=2,
        strategy=strategy,
        max_steps=1,
        use_distributed_sampler=False,  # each process's share is chosen below, in order
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    model = TinyChunkedModel()
    rank = int(os.environ.get("LOCAL_RANK", "0"))  # set by Lightning for the second process
    share = Subset(data(), range(rank, SAMPLES, 2))
    trainer.fit(model, DataLoader(share, batch_size=PER_PROCESS, shuffle=False))
    if trainer.is_global_zero:
        torch.save(model.record, out)


# ----------------------------------------------------------------------------------------------
# The reference: the same model unsharded, float64, plain formulas, one process
# ----------------------------------------------------------------------------------------------


def focal_mean(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Focal loss ``-(1 - p_t)^gamma log p_t``, the mean over the rows, written out in float64.

    The loss of Lin et al., "Focal Loss for Dense Object Detection".
    """
    p = torch.softmax(logits, dim=1).gather(1, target[:, None]).squeeze(1)
    return (-((1 - p) ** GAMMA) * torch.log(p)).mean()


def reference() -> dict[str, object]:
    """Per-process losses, the averaged gradient and the weights after one SGD step."""
    model = TinyChunkedModel().double()
    features, target = data().tensors
    features = features.double()
    losses = []
    for rank in range(2):
        hidden = torch.tanh(model.body(features[rank::2]))
        logits = hidden @ model.head.weight.T + model.head.bias
        losses.append(focal_mean(logits, target[rank::2]))
    total = (losses[0] + losses[1]) / 2  # data parallelism averages the processes' gradients
    total.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    weights = {name: (p - LR * p.grad).detach() for name, p in model.named_parameters()}
    return {"losses": torch.stack(losses).detach(), "grads": grads, "weights": weights}


def run_fit(strategy_name: str, tmp_path: Path) -> dict[str, object]:
    out = tmp_path / "record.pt"
    # Imported here: this file is also the script that the fit runs, without tests/ on its path.
    from helpers.ddp import launch_env

    done = subprocess.run(
        [sys.executable, __file__, strategy_name, str(out)],
        capture_output=True,
        text=True,
        env=launch_env(),  # Lightning picks a free port and starts both processes itself
        cwd=tmp_path,
        timeout=300,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    return torch.load(out, weights_only=True)


def assert_matches_reference(record: dict[str, object], tolerance: float) -> None:
    expected = reference()
    names = ["body.weight", "body.bias", "head.weight", "head.bias"]
    assert sorted(record["grads"]) == sorted(names)
    assert torch.allclose(record["losses"].double(), expected["losses"], rtol=tolerance, atol=0)
    for name in names:
        got, want = record["grads"][name].double(), expected["grads"][name]
        assert torch.allclose(got, want, rtol=tolerance, atol=tolerance), name
        got, want = record["weights"][name].double(), expected["weights"][name]
        assert torch.allclose(got, want, rtol=tolerance, atol=tolerance), name


@pytest.mark.slow
def test_chunked_head_under_fsdp2_equals_the_unsharded_model(tmp_path: Path) -> None:
    record = run_fit("fsdp2", tmp_path)
    # float32 against float64: a few units of float32 rounding.
    assert_matches_reference(record, tolerance=1e-5)
    assert record["outside"].startswith("RuntimeError"), record["outside"]
    assert "mixed torch.Tensor and DTensor" in record["outside"]


def test_lightning_refuses_fsdp1_on_cpu() -> None:
    with pytest.raises(ValueError, match="requires a GPU accelerator"):
        L.Trainer(accelerator="cpu", devices=2, strategy="fsdp", logger=False)


@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2,
    reason="FSDP needs a GPU: Lightning's FSDPStrategy refuses accelerator='cpu', and sharding "
    "needs 2 GPUs (one process holds the whole model)",
)
@pytest.mark.slow
def test_chunked_head_under_fsdp1_equals_the_unsharded_model(tmp_path: Path) -> None:
    record = run_fit("fsdp1", tmp_path)
    assert_matches_reference(record, tolerance=1e-4)  # GPU kernels: float32, other order


if __name__ == "__main__":
    fit(sys.argv[1], sys.argv[2])
