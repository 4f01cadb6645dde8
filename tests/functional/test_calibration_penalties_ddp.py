"""MDCA, DCA and MMCE over the global batch of 2 gloo processes equal the one-process penalty.

Two processes (``init_process_group("gloo")`` on 127.0.0.1) hold uneven shares (7 and 4 rows,
some ignored) of one float64 batch of features; each computes ``logits = features @ weight``
with the same ``weight`` (the model DDP replicates) and the penalty with ``global_batch=True``.
The value on each rank must equal the penalty of the whole batch in one process (1e-12), and
the average of the ranks' gradients of ``weight`` (what DDP's all-reduce gives) must equal its
one-process gradient: the autograd all-reduce sums the ranks' identical upstream gradients (a
factor W = 2) and DDP divides by W. ``global_batch=False`` gives each rank's own penalty.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers.ddp import spawn_gloo

from lightning_losses.functional.calibration_penalties import (
    dca_penalty,
    mdca_penalty,
    mmce_penalty,
)

SHARES = (7, 4)
PENALTIES = {"mdca": mdca_penalty, "dca": dca_penalty, "mmce": mmce_penalty}


def _data() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(11)
    features = torch.randn(sum(SHARES), 4, generator=generator, dtype=torch.float64)
    weight = torch.randn(4, 5, generator=generator, dtype=torch.float64) * 2
    target = torch.randint(0, 5, (sum(SHARES),), generator=generator)
    target[:4] = (features[:4] @ weight).argmax(1)  # some correct predictions on rank 0
    target[8] = (features[8] @ weight).argmax()  # ... and on rank 1
    target[[2, 9]] = -100  # one ignored row on each rank
    return features, weight, target


def _value_and_grad(penalty, features, weight, target, **kwargs):
    leaf = weight.clone().requires_grad_()
    value = penalty(features @ leaf, target, **kwargs)
    (grad,) = torch.autograd.grad(value, leaf)
    return value.detach(), grad


def _worker(rank: int, out: str) -> None:
    import torch.distributed as dist

    features, weight, target = _data()
    start = sum(SHARES[:rank])
    mine = slice(start, start + SHARES[rank])
    results = {}
    for name, penalty in PENALTIES.items():
        value, grad = _value_and_grad(
            penalty, features[mine], weight, target[mine], global_batch=True
        )
        dist.all_reduce(grad)  # DDP: the mean of the ranks' gradients
        local, _ = _value_and_grad(penalty, features[mine], weight, target[mine])
        results[name] = {"value": value, "ddp_grad": grad / dist.get_world_size(), "local": local}
    torch.save(results, Path(out) / f"rank{rank}.pt")


@pytest.mark.slow
def test_global_batch_penalties_and_ddp_gradients_equal_one_process(tmp_path):
    spawn_gloo(_worker, str(tmp_path), processes=len(SHARES))
    features, weight, target = _data()
    for rank in range(len(SHARES)):
        results = torch.load(tmp_path / f"rank{rank}.pt")
        start = sum(SHARES[:rank])
        mine = slice(start, start + SHARES[rank])
        for name, penalty in PENALTIES.items():
            value, grad = _value_and_grad(penalty, features, weight, target)
            local, _ = _value_and_grad(penalty, features[mine], weight, target[mine])
            result = results[name]
            assert value.item() > 0
            assert local.item() != value.item()
            torch.testing.assert_close(result["value"], value, rtol=0, atol=1e-12)
            torch.testing.assert_close(result["ddp_grad"], grad, rtol=0, atol=1e-12)
            torch.testing.assert_close(result["local"], local, rtol=0, atol=1e-12)
