"""Every public ``[N, C]`` loss with ``backend="triton"``: float64 references and the torch path.

Run in a process started with ``TRITON_INTERPRET=1`` (see ``tests/kernels/conftest.py``), or on
a GPU with ``KERNEL_TEST_DEVICE=cuda`` (the kernels compiled; the references stay on the CPU).

Each loss is written here once more, plainly, in float64 from the same (rounded) inputs: the
per-element loss ``e_i`` (0 on ignored rows) and the divisor of ``"mean"``, so that
``"none"`` is ``e``, ``"sum"`` its sum and ``"mean"`` the sum over the divisor (for the losses
with a batch penalty ``e_i = base_i + beta * penalty``, whose mean is the authors' loss). The
reference's gradient is autograd's through these formulas, independent of the hand-written
derivatives of the package. The kernels compute in float32 from the input's values, so values
and gradients sit within a few float32 roundings of the reference scaled by the magnitudes
involved (``|x|`` through ``lse``, the per-row gradient factor ``gain``), plus the gradient's
own output rounding in half precision (2**-11 relative for float16; 2**-7 for bfloat16, which
the interpreter truncates).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor

import lightning_losses.functional as LF
from lightning_losses.functional.adafocal import adafocal_loss
from lightning_losses.functional.calibration_penalties import dca_loss, mdca_loss, mmce_loss
from lightning_losses.functional.dual_focal import dual_focal_loss
from lightning_losses.functional.margin import mbls_loss
from lightning_losses.kernels import mbls, target_probability

EPS32 = 2.0**-24
DEVICE = torch.device(os.environ.get("KERNEL_TEST_DEVICE", "cpu"))
OUTPUT_ROUNDING = {torch.float32: 0.0, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-7}
#: The absolute rounding of a gradient written in each dtype below its normal range: float16's
#: subnormal spacing (2**-24); bfloat16 has float32's range.
OUTPUT_FLOOR = {torch.float32: 0.0, torch.float16: 2.0**-24, torch.bfloat16: 0.0}
IGNORE = -100

Reference = Callable[[Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]


def _log_p(x: Tensor, t: Tensor) -> tuple[Tensor, Tensor]:
    """float64 ``log softmax(x)`` and ``log p_t`` (``t`` 0 on ignored rows)."""
    log_p = torch.log_softmax(x, dim=1)
    return log_p, log_p.gather(1, t[:, None])[:, 0]


def _q(lp: Tensor) -> Tensor:
    """``1 - p``, kept off 0 so that a power of it has a finite gradient at ``p = 1`` (C = 1)."""
    return (1 - lp.exp()).clamp_min(1e-300)


def _weights(columns: int, seed: int = 7) -> Tensor:
    return torch.rand(columns, generator=torch.Generator().manual_seed(seed)) + 0.5


def _per_class(w: Tensor | None, t: Tensor, valid: Tensor, weighted_mean: bool) -> tuple:
    """``w_t`` (1 without weights) and the divisor of ``"mean"``."""
    if w is None:
        return valid.double(), valid.double().sum()
    w_t = w.double()[t] * valid
    return w_t, (w_t.sum() if weighted_mean else valid.double().sum())


def _ce(eps: float = 0.0, weighted: bool = False) -> Reference:
    def reference(x: Tensor, t: Tensor, valid: Tensor) -> tuple[Tensor, Tensor]:
        w = _weights(x.shape[1]) if weighted else None
        log_p, lp = _log_p(x, t)
        w_t, divisor = _per_class(w, t, valid, True)
        all_w = torch.ones(x.shape[1], dtype=torch.float64) if w is None else w.double()
        smooth = -(log_p * all_w).sum(dim=1)
        e = (1 - eps) * w_t * -lp + eps / x.shape[1] * smooth
        return torch.where(valid, e, 0.0), divisor

    return reference


def _gamma_ce(x: Tensor, t: Tensor, valid: Tensor) -> tuple[Tensor, Tensor]:
    w = _weights(x.shape[1])
    _, lp = _log_p(x, t)
    w_t, divisor = _per_class(w, t, valid, True)
    e = w_t * -torch.log(0.5 + 0.5 * lp.exp()) / 0.5
    return torch.where(valid, e, 0.0), divisor


def _tailr(x: Tensor, t: Tensor, valid: Tensor) -> tuple[Tensor, Tensor]:
    log_p, lp = _log_p(x, t)
    p = lp.exp()
    weight = (p / (0.3 + 0.7 * p)).clamp_min(0.2).detach()  # TaiLr's weight: no gradient
    e = 0.9 * -weight * lp + 0.1 / x.shape[1] * -log_p.sum(dim=1)
    return torch.where(valid, e, 0.0), valid.double().sum()


def _phi_reference(
    phi: Callable[[Tensor], Tensor], weighted: bool = False, weighted_mean: bool = True
) -> Reference:
    def reference(x: Tensor, t: Tensor, valid: Tensor) -> tuple[Tensor, Tensor]:
        w = _weights(x.shape[1]) if weighted else None
        _, lp = _log_p(x, t)
        w_t, divisor = _per_class(w, t, valid, weighted_mean)
        return torch.where(valid, w_t * phi(lp), 0.0), divisor

    return reference


def _adafocal(lp: Tensor) -> Tensor:
    p = lp.exp()
    index = (p.detach() >= 0.3).long() + (p.detach() >= 0.7).long()
    g = torch.tensor([4.0, -1.0, 2.0], dtype=torch.float64)[index]
    base = torch.where(g >= 0, _q(lp), 1 + p)
    return -(base ** g.abs()) * lp


def _mbls(x: Tensor, t: Tensor, valid: Tensor) -> tuple[Tensor, Tensor]:
    _, lp = _log_p(x, t)
    hinge = (x.amax(dim=1, keepdim=True) - x - 2.0).clamp_min(0).sum(dim=1)
    return torch.where(valid, -lp + 0.3 / x.shape[1] * hinge, 0.0), valid.double().sum()


def _dual_focal(x: Tensor, t: Tensor, valid: Tensor) -> tuple[Tensor, Tensor]:
    p = torch.softmax(x, dim=1)
    p_t = p.gather(1, t[:, None])
    p_j = torch.where(p < p_t, p, 0.0).max(dim=1).values
    base = (1 - p_t[:, 0] + p_j).clamp_min(1e-300)
    return torch.where(valid, -(base**2) * torch.log(p_t[:, 0]), 0.0), valid.double().sum()


def _batch(x: Tensor, t: Tensor, valid: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """``log p_t``, the softmax, the confidence ``r``, the correctness ``c`` and ``n``."""
    log_p, lp = _log_p(x, t)
    p = log_p.exp()
    r = p.max(dim=1).values
    c = (p.argmax(dim=1) == t).double()
    return lp, p, r, c, valid.double().sum()


def _mdca(x: Tensor, t: Tensor, valid: Tensor) -> tuple[Tensor, Tensor]:
    lp, p, _, _, n = _batch(x, t, valid)
    v = valid.double()
    onehot = torch.nn.functional.one_hot(t, x.shape[1]).double()
    m = n.clamp_min(1)
    penalty = ((v[:, None] * p).sum(0) / m - (v[:, None] * onehot).sum(0) / m).abs().mean()
    base = -_q(lp) * lp  # focal, gamma = 1
    return torch.where(valid, base + 1.0 * penalty, 0.0), n


def _dca(x: Tensor, t: Tensor, valid: Tensor) -> tuple[Tensor, Tensor]:
    lp, _, r, c, n = _batch(x, t, valid)
    v, m = valid.double(), n.clamp_min(1)
    penalty = ((v * r).sum() / m - (v * c).sum() / m).abs()
    return torch.where(valid, -lp + 10.0 * penalty, 0.0), n


def _mmce(x: Tensor, t: Tensor, valid: Tensor) -> tuple[Tensor, Tensor]:
    lp, _, r, c, n = _batch(x, t, valid)
    e = (c - r) * valid
    kernel = torch.exp(-(r[:, None] - r[None, :]).abs() / 0.4)
    penalty = (e[:, None] * e[None, :] * kernel).sum() / n.clamp_min(1) ** 2
    return torch.where(valid, -lp + 1.0 * penalty, 0.0), n


ALPHA = "alpha"  # the option that takes the class weights (focal losses); "weight" elsewhere
#: (name, function, options (``"W"`` stands for the class weights), reference, gain): ``gain``
#: bounds the per-row factor of the gradient (``|d e_i / d log p_t|`` times the weights, plus
#: the smoothing's ``W`` and a batch penalty's weight).
CASES: list[tuple[str, Callable[..., Tensor], dict[str, Any], Reference, float]] = [
    ("ce", LF.cross_entropy, {}, _ce(), 2.0),
    ("ce_smooth_w", LF.cross_entropy, {"label_smoothing": 0.1, "weight": "W"}, _ce(0.1, True), 4),
    ("gamma_ce_w", LF.gamma_cross_entropy, {"gamma": 0.5, "weight": "W"}, _gamma_ce, 4.0),
    (
        "tailr_smooth",
        LF.gamma_cross_entropy,
        {"gamma": 0.3, "threshold": 0.2, "label_smoothing": 0.1},
        _tailr,
        4.0,
    ),
    ("soft_accuracy", LF.soft_accuracy_loss, {}, _phi_reference(lambda lp: 1 - lp.exp()), 2.0),
    (
        "focal_alpha",
        LF.focal_loss,
        {"gamma": 2.0, ALPHA: "W"},
        _phi_reference(lambda lp: -(_q(lp) ** 2) * lp, True, False),
        8.0,
    ),
    (
        "flsd53",
        LF.adaptive_focal_loss,
        {},
        _phi_reference(lambda lp: -(_q(lp) ** torch.where(lp.exp() < 0.2, 5.0, 3.0)) * lp),
        8.0,
    ),
    (
        "hard_truncated_w",
        LF.hard_truncated_loss,
        {"margin": 0.5, "weight": "W"},
        _phi_reference(lambda lp: torch.where(lp.exp() <= 0.5, -lp, 0.0), True),
        4.0,
    ),
    (
        "poly1_w",
        LF.poly1_loss,
        {"epsilon": 1.0, "weight": "W"},
        _phi_reference(lambda lp: -lp + (1 - lp.exp()), True),
        6.0,
    ),
    (
        "adafocal",
        adafocal_loss,
        {
            "edges": torch.tensor([0.0, 0.3, 0.7, 1.0], dtype=torch.float64),
            "gammas": torch.tensor([4.0, -1.0, 2.0], dtype=torch.float64),
        },
        _phi_reference(_adafocal),
        8.0,
    ),
    ("mbls", mbls_loss, {"margin": 2.0, "alpha": 0.3}, _mbls, 4.0),
    ("dual_focal", dual_focal_loss, {"gamma": 2.0}, _dual_focal, 8.0),
    ("mdca_focal", mdca_loss, {"beta": 1.0, "gamma": 1.0}, _mdca, 8.0),
    ("dca", dca_loss, {"beta": 10.0}, _dca, 24.0),
    ("mmce", mmce_loss, {"lambda_": 1.0}, _mmce, 8.0),
]
IDS = [case[0] for case in CASES]
PENALTIES = {"mdca_focal", "dca", "mmce"}


def _inputs(rows: int, columns: int, dtype: torch.dtype, seed: int = 0) -> tuple[Tensor, Tensor]:
    generator = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, columns, generator=generator, dtype=torch.float64) * 3).to(dtype)
    target = torch.randint(0, columns, (rows,), generator=generator)
    ignored = torch.rand(rows, generator=generator) < 0.25
    if rows > 2:
        ignored[1] = True  # at least one ignored row, and one kept
        ignored[0] = False
    return x, torch.where(ignored, IGNORE, target)


def _options(options: dict[str, Any], columns: int) -> dict[str, Any]:
    return {k: (_weights(columns) if v == "W" else v) for k, v in options.items()}


def _call(
    function: Callable[..., Tensor],
    options: dict[str, Any],
    x: Tensor,
    target: Tensor,
    reduction: str,
    backend: str,
    upstream: Tensor,
) -> tuple[Tensor, Tensor]:
    leaf = x.to(DEVICE, copy=True).requires_grad_()
    moved = {k: (v.to(DEVICE) if isinstance(v, Tensor) else v) for k, v in options.items()}
    loss = function(leaf, target.to(DEVICE), reduction=reduction, backend=backend, **moved)
    (loss * upstream.to(DEVICE)).sum().backward()
    assert leaf.grad is not None
    return loss.detach().cpu(), leaf.grad.cpu()


def _reduce(e: Tensor, divisor: Tensor, reduction: str) -> Tensor:
    if reduction == "none":
        return e
    total = e.sum()
    return total if reduction == "sum" else total / torch.where(divisor > 0, divisor, 1.0)


def _within(actual: Tensor, expected: Tensor, bound: Tensor | float, what: str) -> None:
    error = (actual.double() - expected.double()).abs()
    bound = torch.as_tensor(bound, dtype=torch.float64).expand_as(error)
    if error.numel() == 0:
        return
    worst = int((error - bound).argmax())
    assert bool((error <= bound).all()), (
        f"{what}: error {float(error.flatten()[worst]):.3g} > {float(bound.flatten()[worst]):.3g}"
    )


def _check(
    case: tuple[str, Callable[..., Tensor], dict[str, Any], Reference, float],
    rows: int,
    columns: int,
    dtype: torch.dtype,
    reduction: str,
) -> None:
    name, function, raw_options, reference, gain = case
    x, target = _inputs(rows, columns, dtype)
    options = _options(raw_options, columns)
    valid = target != IGNORE
    safe = torch.where(valid, target, 0)
    upstream = torch.linspace(-1.0, 2.0, rows) if reduction == "none" else torch.tensor(1.0)
    value, grad = _call(function, options, x, target, reduction, "triton", upstream)
    assert grad.dtype == dtype
    assert value.dtype == torch.float32

    # (a) the float64 reference, from the same rounded inputs
    leaf = x.double().requires_grad_()
    e, divisor = reference(leaf, safe, valid)
    expected = _reduce(e, divisor, reduction)
    (expected * upstream.double()).sum().backward()
    assert leaf.grad is not None
    big = 1 + (float(x.double().abs().max()) if x.numel() else 0.0)
    n = float(valid.sum())
    if reduction == "none":
        value_bound = 64 * EPS32 * big * (1 + e.detach().abs())
        u = upstream.double().abs()[:, None]
    else:
        per_divisor = 1.0 if reduction == "sum" else 1.0 / max(float(divisor), 1e-300)
        value_bound = 64 * EPS32 * big * (rows + float(e.detach().abs().sum())) * per_divisor
        u = torch.full((rows, 1), per_divisor if float(divisor) > 0 else 0.0)
    if name in PENALTIES:  # the penalty's gradient reaches every row, whatever its upstream
        u = u + float(u.sum()) / max(n, 1.0)
    _within(value, expected.detach(), value_bound, f"{name} value")
    grad_bound = 64 * EPS32 * big * gain * u + OUTPUT_ROUNDING[dtype] * leaf.grad.abs()
    grad_bound = grad_bound + OUTPUT_FLOOR[dtype]
    _within(grad, leaf.grad, grad_bound, f"{name} gradient")
    assert not grad[~valid].any(), "an ignored row has a gradient"

    # (b) the torch path on the same inputs (its own float32 rounding on top of ours)
    torch_value, torch_grad = _call(function, options, x, target, reduction, "torch", upstream)
    _within(value, torch_value, 2 * value_bound, f"{name} value against torch")
    pair = 2 * grad_bound + OUTPUT_ROUNDING[dtype] * torch_grad.double().abs()
    _within(grad, torch_grad, pair + OUTPUT_FLOOR[dtype], f"{name} gradient against torch")


@pytest.fixture
def launches(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The kernels launched, by name (both modules' kernel factories counted)."""
    found: list[str] = []
    for module in (target_probability, mbls):
        original = module.kernel

        def counted(name: str, interpret: bool, original: Any = original) -> Any:
            found.append(name)
            return original(name, interpret)

        monkeypatch.setattr(module, "kernel", counted)
    return found


DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_every_loss_every_dtype(case: Any, dtype: torch.dtype, launches: list[str]) -> None:
    _check(case, 12, 3, dtype, "none")
    assert any(name.endswith("forward") for name in launches)
    assert any(name.endswith("backward") for name in launches)


@pytest.mark.parametrize(
    ("rows", "columns", "dtype"),
    [(6, 1, torch.float32), (10, 1000, torch.float16), (3, 32001, torch.bfloat16)],
    ids=["C1", "C1000_float16", "C32001_bfloat16"],
)
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_every_loss_odd_sizes(case: Any, rows: int, columns: int, dtype: torch.dtype) -> None:
    _check(case, rows, columns, dtype, "none")


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_every_loss_reduced(case: Any, reduction: str) -> None:
    _check(case, 9, 5, torch.float32, reduction)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_every_loss_on_an_empty_batch(case: Any) -> None:
    for reduction in ("none", "mean", "sum"):
        _check(case, 0, 4, torch.float32, reduction)


def test_mbls_over_several_column_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    # blocks of 1 row x 128 columns: the maximum, its first column and the hinge each cross
    # 5 column steps, the last one partial; a tie for the maximum in two blocks goes to the first
    monkeypatch.setattr(target_probability, "INTERPRETER_TILE", 128)
    x, target = _inputs(4, 520, torch.float32)
    x[0, 5] = x[0, 400] = 50.0  # row 0 is never ignored
    x, target = x.to(DEVICE), target.to(DEVICE)
    leaf = x.clone().requires_grad_()
    mbls_loss(leaf, target, margin=2.0, alpha=0.3, backend="triton").backward()
    twin = x.clone().requires_grad_()
    mbls_loss(twin, target, margin=2.0, alpha=0.3, backend="torch").backward()
    assert leaf.grad is not None
    assert twin.grad is not None
    assert leaf.grad[0, 5] > leaf.grad[0, 400]  # the hinge's count lands on the first maximum
    torch.testing.assert_close(leaf.grad.cpu(), twin.grad.cpu(), rtol=0, atol=1e-6)
    _check(next(c for c in CASES if c[0] == "mbls"), 4, 520, torch.float32, "none")


def test_one_synchronisation_with_checks_and_none_without(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every read of a tensor by the host is counted: one ``tolist`` with the checks, none without.

    On a GPU (``KERNEL_TEST_DEVICE=cuda``) the call without checks also runs under
    ``torch.cuda.set_sync_debug_mode("error")``, which catches the synchronisations no method
    call shows (a copy to the host, ``nonzero``).
    """
    reads: list[str] = []
    for method in ("item", "tolist", "__bool__", "__int__", "__float__", "__index__"):
        original = getattr(torch.Tensor, method)

        def counted(self: Tensor, *args: Any, _name: str = method, _f: Any = original) -> Any:
            reads.append(_name)
            return _f(self, *args)

        monkeypatch.setattr(torch.Tensor, method, counted)
    for _, function, raw_options, _, _ in CASES:
        x, target = _inputs(8, 5, torch.float32)
        options = {
            k: (v.to(DEVICE) if isinstance(v, Tensor) else v)
            for k, v in _options(raw_options, 5).items()
        }
        for validate_args, allowed in ((True, ["tolist"]), (False, [])):
            reads.clear()
            leaf, on_device = x.to(DEVICE).requires_grad_(), target.to(DEVICE)
            arguments = {"backend": "triton", "validate_args": validate_args, **options}
            function(leaf, on_device, **arguments).backward()
            assert reads == allowed, (function.__name__, validate_args, reads)
            if DEVICE.type == "cuda" and not validate_args:
                torch.cuda.set_sync_debug_mode("error")
                try:
                    function(leaf, on_device, **arguments).backward()
                finally:
                    torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("case", [c for c in CASES if c[0] in ("ce_smooth_w", "focal_alpha")])
def test_the_checks_keep_their_one_line_errors(case: Any) -> None:
    _, function, raw_options, _, _ = case
    x, target = _inputs(6, 5, torch.float32)
    options = {
        k: (v.to(DEVICE) if isinstance(v, Tensor) else v)
        for k, v in _options(raw_options, 5).items()
    }
    bad_target = target.clone()
    bad_target[0] = 5
    with pytest.raises(ValueError, match=r"target values must lie in \[0, 4\].*found 5$"):
        function(x.to(DEVICE), bad_target.to(DEVICE), backend="triton", **options)
    bad_x = x.clone()
    bad_x[3, 2] = math.nan
    with pytest.raises(ValueError, match=r"logits must be finite .* found nan at logits\[3, 2\]"):
        function(bad_x.to(DEVICE), target.to(DEVICE), backend="triton", **options)
    name = "weight" if "weight" in options else "alpha"
    options[name] = options[name].clone()
    options[name][1] = -1.0
    with pytest.raises(ValueError, match=f"{name} must hold finite weights >= 0"):
        function(x.to(DEVICE), target.to(DEVICE), backend="triton", **options)


def test_adafocal_bins_are_checked_in_the_one_read() -> None:
    x, target = (tensor.to(DEVICE) for tensor in _inputs(4, 3, torch.float32))
    edges = torch.tensor([0.0, 0.7, 0.3, 1.0], dtype=torch.float64)
    gammas = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    with pytest.raises(ValueError, match="edges must be non-decreasing"):
        adafocal_loss(x, target, edges=edges, gammas=gammas, backend="triton")
    with pytest.raises(ValueError, match="gammas must be finite"):
        adafocal_loss(x, target, edges=edges.sort().values, gammas=gammas / 0, backend="triton")


@settings(max_examples=12, deadline=None)
@given(
    case=st.sampled_from(CASES),
    rows=st.integers(0, 6),
    columns=st.integers(1, 40),
    dtype=st.sampled_from(DTYPES),
    reduction=st.sampled_from(["none", "mean", "sum"]),
    seed=st.integers(0, 2**16),
)
def test_property_the_kernels_give_the_torch_path(
    case: Any, rows: int, columns: int, dtype: torch.dtype, reduction: str, seed: int
) -> None:
    """Any shape, dtype, reduction and ignore pattern: the same values and gradients."""
    name, function, raw_options, _, gain = case
    x, target = _inputs(rows, columns, dtype, seed)
    options = _options(raw_options, columns)
    upstream = torch.linspace(-1.0, 2.0, rows) if reduction == "none" else torch.tensor(1.0)
    value, grad = _call(function, options, x, target, reduction, "triton", upstream)
    torch_value, torch_grad = _call(function, options, x, target, reduction, "torch", upstream)
    big = 1 + (float(x.double().abs().max()) if x.numel() else 0.0)
    scale = 1 + float(torch_value.abs().sum())
    _within(value, torch_value, 128 * EPS32 * big * scale, f"{name} value")
    bound = 128 * EPS32 * big * gain * (1 + rows) + 2 * OUTPUT_ROUNDING[dtype] * torch_grad.abs()
    bound = bound + 2 * OUTPUT_FLOOR[dtype]
    _within(grad, torch_grad, bound, f"{name} gradient")
    assert not grad[target == IGNORE].any()
