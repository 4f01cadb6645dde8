"""The post-hoc example of docs/calibration.md runs as written, and does what it says."""

from __future__ import annotations

import re

import torch
from helpers.paths import ROOT

from lightning_losses.calibration import get_calibrator, select_calibrator


def post_hoc_example() -> str:
    """The first code block of the page's post-hoc section."""
    text = (ROOT / "docs" / "calibration.md").read_text(encoding="utf-8")
    section = text[text.index("## Post-hoc calibration") :]
    return re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)


def test_the_documented_example_runs_and_chooses_by_cross_validated_nll() -> None:
    generator = torch.Generator().manual_seed(0)
    target = torch.randint(0, 4, (600,), generator=generator)
    logits = 3.0 * (torch.randn(600, 4, generator=generator) + 2.0 * torch.eye(4)[target])
    namespace = {
        "val_logits": logits[:400],
        "val_target": target[:400],
        "test_logits": logits[400:],
    }
    exec(post_hoc_example(), namespace)
    log_probs, choice = namespace["log_probs"], namespace["choice"]
    torch.testing.assert_close(log_probs.exp().sum(1), torch.ones(200))
    # the same choice as select_calibrator called here, with the identity among the scores
    again = select_calibrator(
        [get_calibrator(m) for m in ("temperature", "vector", "ensemble_temperature")],
        logits[:400],
        target[:400],
        folds=5,
    )
    assert choice.method == again.method
    assert set(choice.scores) == {"none", "temperature", "vector", "ensemble_temperature"}
    assert choice.scores[choice.method] == min(choice.scores.values())
