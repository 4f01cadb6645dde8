"""The example of docs/lm.md ("Measuring a language model") runs as written."""

from __future__ import annotations

import contextlib
import io
import math
import re

from helpers.paths import ROOT

SECTION = "## Measuring a language model"


def test_the_measuring_example_runs_and_prints_its_numbers():
    text = (ROOT / "docs" / "lm.md").read_text()
    block = re.search(r"```python\n(.*?)```", text[text.index(SECTION) :], re.S)
    assert block is not None
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(block.group(1), "docs/lm.md", "exec"), {})
    first, second = printed.getvalue().splitlines()
    ppl, ece, rep_greedy, rep_sampled = map(float, first.split())
    assert ppl > 1.0
    assert 0.0 <= ece <= 1.0
    assert 0.0 <= rep_greedy <= 1.0
    assert 0.0 <= rep_sampled <= 1.0
    share = float(second)
    assert 0.0 <= share <= 1.0
    assert math.isfinite(ppl)
