"""Property: bad input never passes silently through a public loss or calibration function.

For random shapes, dtypes (float32, float64, float16, bfloat16) and values, including NaN and
infinite logits, negative class weights and ``alpha``, out-of-range targets, soft targets
outside [0, 1], rows of probabilities that do not sum to 1 and hyper-parameters out of range,
each call either

- raises ``ValueError`` or ``TypeError`` whose message names one of the arguments that the
  test knows to be bad (the test decides which arguments are bad from the documented rules, on
  its own), or
- when no argument is bad, returns a finite, non-negative value equal to an independent float64
  reference written plainly below (one per family: cross-entropy, gamma-CE, soft accuracy,
  focal, adaptive focal, hard and soft truncation, Poly-1, EXACT, the binary losses, multi-label,
  n-by-m, Feature Incay, the chunked linear head, MbLS, dual focal, the batch-level calibration
  penalties MDCA, DCA and MMCE alone and added to a base loss; per-bin ECE loops, Brier, NLL,
  accuracy, confidence).

So no NaN comes out of finite inputs, no loss is negative, and a bad argument is never accepted.
References are compared at the precision of the computation (float64 inputs: float64;
float32 and half inputs: float32). Decisions that flip on rounding (a probability on a
truncation margin, a confidence on a bin edge, an arg-max tie) are filtered out with ``assume``.
"""

from __future__ import annotations

import inspect
import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import assume, event, given, settings
from hypothesis import strategies as st

from lightning_losses import functional as LF
from lightning_losses.calibration import functional as CF

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
SPECIAL = [math.nan, math.inf, -math.inf]
REDUCTIONS = ["none", "mean", "sum", "avg"]  # "avg" is bad
IGNORE = -100


# --- drawing inputs ------------------------------------------------------------------------------
# Each example spoils at most one argument (drawn first, so that every kind of bad argument gets
# its share of examples); the test then decides which arguments are bad from the data alone.


def spoil(data, names):
    """The argument this example spoils, or None (every argument good) about half the time."""
    return data.draw(st.sampled_from([None] * len(names) + list(names)), label="spoiled")


def rarely(odds=5):
    """True about once in ``odds + 1`` draws.

    ``st.booleans`` and small ``st.integers`` lean towards their simplest values, which would
    make a rare event common.
    """
    return st.sampled_from([False] * odds + [True])


def draw_tensor(data, shape, low, high, dtype, *, spoiled=False, label="values"):
    """A float tensor of ``shape`` in ``dtype`` with values in ``[low, high]``.

    Spoiled: one of them NaN or infinite.
    """
    n = math.prod(shape)
    values = data.draw(
        st.lists(st.floats(low, high, allow_nan=False), min_size=n, max_size=n), label=label
    )
    tensor = torch.tensor(values, dtype=torch.float64).reshape(shape)
    if spoiled:
        tensor.view(-1)[data.draw(st.integers(0, n - 1))] = data.draw(st.sampled_from(SPECIAL))
    return tensor.to(dtype)


def draw_targets(data, shape, classes, *, spoiled=False, ignore=True):
    """Class indices of ``shape`` in ``[0, classes)``, sometimes one ``IGNORE`` (with ``ignore``).

    Spoiled: one out of range (-1 or ``classes``).
    """
    n = math.prod(shape)
    values = data.draw(st.lists(st.integers(0, classes - 1), min_size=n, max_size=n))
    target = torch.tensor(values, dtype=torch.long).reshape(shape)
    if ignore and data.draw(rarely(2), label="ignore one?"):
        target.view(-1)[data.draw(st.integers(0, n - 1))] = IGNORE
    if spoiled:
        position = data.draw(st.integers(0, n - 1))
        target.view(-1)[position] = data.draw(st.sampled_from([-1, classes]))
    return target


def draw_class_vector(data, classes, *, spoiled=False):
    """``None`` or ``[C]`` weights in [0, 3]; spoiled: one of them negative, NaN or infinite."""
    if not spoiled and data.draw(st.booleans(), label="no class vector?"):
        return None
    values = data.draw(st.lists(st.floats(0, 3), min_size=classes, max_size=classes))
    vector = torch.tensor(values, dtype=torch.float64)
    if spoiled:
        vector[data.draw(st.integers(0, classes - 1))] = data.draw(
            st.sampled_from([-1.0, -1e-6, *SPECIAL])
        )
    return vector


def draw_scalar(data, name, good, bad, spoiled):
    """A hyper-parameter: drawn from ``good``, or (spoiled is ``name``) one of ``bad``."""
    return data.draw(st.sampled_from(bad) if spoiled == name else good, label=name)


def draw_reduction(data, spoiled):
    return "avg" if spoiled == "reduction" else data.draw(st.sampled_from(REDUCTIONS[:3]))


def bad_vector(vector):
    return vector is not None and not bool(((vector >= 0) & torch.isfinite(vector)).all())


def non_finite(tensor):
    return tensor is not None and not bool(torch.isfinite(tensor).all())


def compute_dtype(dtype):
    """Half precision is computed in float32 (class weights too); others in their dtype."""
    return torch.promote_types(dtype, torch.float32)


def tolerance(dtype):
    """(rtol, atol) of a comparison with the float64 reference."""
    return (1e-7, 1e-9) if dtype == torch.float64 else (1e-4, 1e-5)


def outcome(call, bad, reference, dtype, *, spoiled, tol=None, infinite_where_expected=False):
    """Run ``call``: it must raise naming one of ``bad``, or else match ``reference()``.

    With ``bad`` empty it must return a non-negative value equal to ``reference()`` and finite
    (or, with ``infinite_where_expected``, infinite exactly where the reference is).
    """
    assert spoiled is None or spoiled in bad, (spoiled, bad)  # the test spoils what it means to
    try:
        result = call()
    except (ValueError, TypeError) as error:
        raised = error
    else:
        raised = None
    if raised is not None:
        assert bad, f"raised on valid input: {type(raised).__name__}: {raised}"
        assert any(name in str(raised) for name in bad), (str(raised), bad)
        event(f"raised: {sorted(bad)}")
        return
    event("compared")
    assert not bad, f"accepted bad {sorted(bad)}; returned {result}"
    expected = torch.as_tensor(reference()).double()
    result = torch.as_tensor(result).double()
    rtol, atol = tol or tolerance(dtype)
    if infinite_where_expected:
        assert torch.equal(torch.isinf(result), torch.isinf(expected)), (result, expected)
        result, expected = result.nan_to_num(posinf=0.0), expected.nan_to_num(posinf=0.0)
    assert torch.isfinite(result).all(), (result, expected)
    assert (result >= 0).all(), result
    torch.testing.assert_close(result, expected, rtol=rtol, atol=atol)


def reduce(values, reduction, denominator=None):
    if reduction == "none":
        return values
    total = values.sum()
    if reduction == "sum":
        return total
    count = values.numel() if denominator is None else float(denominator)
    return total / count if count > 0 else total * 0


# --- references of the losses (float64) -------------------------------------------------------


def family_values(name, x, t, hyper):
    """Per-row value of a target-probability loss (or soft truncation) on ``[M, C]`` logits."""
    log_p = x.gather(1, t[:, None])[:, 0] - torch.logsumexp(x, dim=1)
    p = torch.exp(log_p)
    if name == "cross_entropy":
        return -log_p
    if name == "soft_accuracy_loss":
        return 1 - p
    if name == "poly1_loss":
        return -log_p + hyper["epsilon"] * -torch.expm1(log_p)  # 1 - p, exact near p = 1
    if name == "gamma_cross_entropy":
        g, b = hyper["gamma"], hyper["threshold"]
        if b > 0:
            return -torch.clamp(p / (g + (1 - g) * p), min=b) * log_p
        if g == 1:
            return 1 - p
        # log(g + (1-g) p), each form where it keeps its digits: near 1 through log1p, and
        # as log(g + (1-g) e^{log p}) where p may be far below float64's epsilon
        q = -torch.expm1(log_p)  # 1 - p
        near_one = torch.log1p(-(1 - g) * q)
        far = torch.logaddexp(
            torch.tensor(math.log(g) if g > 0 else -math.inf), log_p + math.log1p(-g)
        )
        return -torch.where((1 - g) * q < 0.5, near_one, far) / (1 - g)
    if name == "focal_loss":
        return -((1 - p) ** hyper["gamma"]) * log_p
    if name == "adaptive_focal_loss":
        thresholds = torch.tensor(hyper["thresholds"], dtype=torch.float64)
        gammas = torch.tensor(hyper["gammas"], dtype=torch.float64)
        assume(bool((p[:, None] - thresholds).abs().min() > 1e-5) if len(thresholds) else True)
        gamma = gammas[(p[:, None] >= thresholds).sum(1)]
        return -((1 - p) ** gamma) * log_p
    if name == "hard_truncated_loss":
        assume(bool((p - hyper["margin"]).abs().min() > 1e-5))
        return torch.where(p <= hyper["margin"], -log_p, 0.0)
    assert name == "soft_truncated_loss"
    z = -hyper["k"] * x
    factor = torch.exp(z.gather(1, t[:, None])[:, 0] - torch.logsumexp(z, dim=1))
    return -factor * log_p


def index_reference(name, x, t, hyper, vector, reduction, *, alpha):
    """The loss of ``[N, C, *]`` logits against ``[N, *]`` targets (``IGNORE`` ignored)."""
    classes = x.shape[1]
    flat_x = x.double().movedim(1, -1).reshape(-1, classes)
    flat_t = t.reshape(-1).long()
    valid = flat_t != IGNORE
    safe = torch.where(valid, flat_t, 0)
    values = torch.where(valid, family_values(name, flat_x, safe, hyper), 0.0)
    factor = valid.double() if vector is None else vector.double()[safe] * valid
    values = values * factor
    # alpha is part of the formula (a plain mean); a weight normalises the mean
    denominator = valid.sum() if alpha or vector is None else factor.sum()
    return reduce(values.reshape(t.shape), reduction, denominator)


#: loss -> {hyper-parameter: (good values, bad values)}
INDEX_LOSSES = {
    "cross_entropy": {},
    "gamma_cross_entropy": {
        "gamma": (st.floats(0, 1), [-0.5, 1.5, math.nan]),
        "threshold": (st.sampled_from([0.0, 0.0, 0.2, 0.9]), [-0.1, 2.0]),
    },
    "soft_accuracy_loss": {},
    "poly1_loss": {"epsilon": (st.floats(-1, 5), [-1.5, math.nan, math.inf])},
    "focal_loss": {"gamma": (st.floats(0, 4), [-1.0, math.inf])},
    "adaptive_focal_loss": {
        "thresholds": (st.sampled_from([(), (0.2,), (0.3, 0.6)]), [(0.6, 0.3), (1.5,)]),
        "gammas": (st.floats(0, 5), [-2.0, math.nan]),  # one more than thresholds
    },
    "hard_truncated_loss": {"margin": (st.floats(0, 1), [1.5, -0.1, math.nan])},
    "soft_truncated_loss": {"k": (st.floats(0, 5), [-1.0, math.inf])},
}
ALPHA_LOSSES = ("focal_loss", "adaptive_focal_loss")
#: (loss, hyper-parameter) -> (smallest, largest) good value, where it is not [0, inf)
BOUNDS = {
    ("gamma_cross_entropy", "gamma"): (0.0, 1.0),
    ("gamma_cross_entropy", "threshold"): (0.0, 1.0),
    ("adaptive_focal_loss", "thresholds"): (0.0, 1.0),
    ("hard_truncated_loss", "margin"): (0.0, 1.0),
    ("binary_hard_truncated_loss", "margin"): (0.0, 1.0),
    ("binary_focal_loss", "alpha"): (0.0, 1.0),
    ("poly1_loss", "epsilon"): (-1.0, math.inf),  # -log p >= 1 - p keeps it non-negative
}


def draw_hyperparameters(data, table, spoiled):
    hyper = {}
    for key, (good, bad) in table.items():
        if key == "gammas":  # one per interval between thresholds
            count = len(hyper["thresholds"]) + 1
            gammas = data.draw(st.lists(good, min_size=count, max_size=count), label=key)
            if spoiled == key:
                gammas[data.draw(st.integers(0, count - 1))] = data.draw(st.sampled_from(bad))
            hyper[key] = tuple(gammas)
        else:
            hyper[key] = draw_scalar(data, key, good, bad, spoiled)
    return hyper


def bad_hyperparameters(name, hyper):
    bad = set()
    for key, value in hyper.items():
        if value is None:  # binary focal's alpha: weigh both terms by 1
            continue
        values = value if isinstance(value, tuple) else (value,)
        low, high = BOUNDS.get((name, key), (0.0, math.inf))
        if any(not (low <= v <= high) or math.isinf(v) for v in values):
            bad.add(key)
        if key == "thresholds" and list(values) != sorted(set(values)):
            bad.add(key)  # not strictly increasing
    return bad


@settings(max_examples=170)
@given(data=st.data(), name=st.sampled_from(sorted(INDEX_LOSSES)))
def test_index_target_losses(data, name):
    vector_name = "alpha" if name in ALPHA_LOSSES else "weight"
    spoiled = spoil(data, ["logits", "target", vector_name, *INDEX_LOSSES[name], "reduction"])
    dtype = data.draw(st.sampled_from(DTYPES), label="dtype")
    n, classes = data.draw(st.integers(1, 4)), data.draw(st.integers(2, 5))
    extra = data.draw(st.sampled_from([(), (), (3,)]), label="extra dims")
    scale = data.draw(st.sampled_from([1.0, 10.0, 1e3]))
    x = draw_tensor(
        data, (n, classes, *extra), -3 * scale, 3 * scale, dtype, spoiled=spoiled == "logits"
    )
    t = draw_targets(data, (n, *extra), classes, spoiled=spoiled == "target")
    t = t.to(data.draw(st.sampled_from([torch.int64, torch.int32])))
    hyper = draw_hyperparameters(data, INDEX_LOSSES[name], spoiled)
    vector = draw_class_vector(data, classes, spoiled=spoiled == vector_name)
    reduction = draw_reduction(data, spoiled)

    bad = bad_hyperparameters(name, hyper)
    if reduction not in REDUCTIONS[:3]:
        bad.add("reduction")
    if non_finite(x):
        bad.add("logits")
    if bool(((t != IGNORE) & ((t < 0) | (t >= classes))).any()):
        bad.add("target")
    if bad_vector(vector):
        bad.add(vector_name)
    fn = getattr(LF, name)
    applied = None if vector is None else vector.to(compute_dtype(dtype))  # as the loss does
    outcome(
        lambda: fn(x, t, **hyper, **{vector_name: vector}, reduction=reduction),
        bad,
        lambda: index_reference(name, x, t, hyper, applied, reduction, alpha=name in ALPHA_LOSSES),
        dtype,
        spoiled=spoiled,
        # [N, C, *] half logits go through PyTorch's half cross-entropy kernel
        tol=(1e-2, 1e-2) if extra and dtype.itemsize == 2 else None,
    )


def exact_log_p(x, t, sigma):
    """``log P(argmax(x / sigma + e) = t)``, e ~ N(0, I), per row.

    The closed form for two classes, a dense rectangle rule in log space for more.
    """
    rows = []
    for row, target in zip(x.double(), t.tolist(), strict=True):
        d = (row[target] - row) / sigma
        others = torch.cat([d[:target], d[target + 1 :]])
        if len(others) == 1:
            rows.append(torch.special.log_ndtr(others[0] / math.sqrt(2)))
            continue
        u = torch.linspace(-60, 60, 24001, dtype=torch.float64)
        log_phi = -0.5 * u * u - 0.5 * math.log(2 * math.pi)
        terms = log_phi + torch.special.log_ndtr(others[:, None] + u).sum(0)
        rows.append(torch.logsumexp(terms, 0) + math.log(u[1] - u[0]))
    return torch.stack(rows)


@settings(max_examples=40)
@given(data=st.data())
def test_exact_loss(data):
    spoiled = spoil(data, ["logits", "target", "sigma", "reduction"])
    dtype = data.draw(st.sampled_from(DTYPES), label="dtype")
    n, classes = data.draw(st.integers(1, 3)), data.draw(st.integers(2, 3))
    x = draw_tensor(data, (n, classes), -6, 6, dtype, spoiled=spoiled == "logits")
    t = draw_targets(data, (n,), classes, spoiled=spoiled == "target")
    sigma = draw_scalar(data, "sigma", st.floats(0.3, 3), [0.0, -1.0, math.nan, math.inf], spoiled)
    log = data.draw(st.booleans())
    reduction = draw_reduction(data, spoiled)
    bad = set()
    if reduction not in REDUCTIONS[:3]:
        bad.add("reduction")
    if non_finite(x):
        bad.add("logits")
    if bool(((t != IGNORE) & ((t < 0) | (t >= classes))).any()):
        bad.add("target")
    if not (0 < sigma < math.inf):
        bad.add("sigma")

    def reference():
        valid = t != IGNORE
        log_p = exact_log_p(x, torch.where(valid, t, 0), sigma)
        values = torch.where(valid, -log_p if log else -torch.expm1(log_p), 0.0)
        return reduce(values, reduction, valid.sum())

    outcome(
        lambda: LF.exact_loss(x, t, sigma=sigma, log=log, reduction=reduction),
        bad,
        reference,
        dtype,
        spoiled=spoiled,
        tol=(1e-5, 1e-6),
    )


def binary_reference(name, x, y, hyper, reduction):
    x, y = x.double(), y.double()
    log_s, log_not_s = F.logsigmoid(x), F.logsigmoid(-x)
    s, not_s = torch.sigmoid(x), torch.sigmoid(-x)
    if name == "binary_focal_loss":
        a = 1.0 if hyper["alpha"] is None else hyper["alpha"]
        b = 1.0 if hyper["alpha"] is None else 1 - hyper["alpha"]
        positive = -a * not_s ** hyper["gamma"] * log_s
        negative = -b * s ** hyper["gamma"] * log_not_s
    elif name == "binary_soft_truncated_loss":
        k = hyper["k"]
        positive = -torch.sigmoid(-k * x) * log_s
        negative = -torch.sigmoid(k * x) * log_not_s
    else:
        m = hyper["margin"]
        assume(bool(torch.minimum((s - m).abs(), (not_s - m).abs()).min() > 1e-5))
        positive = torch.where(s <= m, -log_s, 0.0)
        negative = torch.where(not_s <= m, -log_not_s, 0.0)
    return reduce(y * positive + (1 - y) * negative, reduction)


BINARY_LOSSES = {
    "binary_focal_loss": {
        "gamma": (st.floats(0, 4), [-1.0, math.nan]),
        "alpha": (st.one_of(st.none(), st.floats(0, 1)), [-0.5, 1.5]),
    },
    "binary_soft_truncated_loss": {"k": (st.floats(0, 5), [-1.0, math.inf])},
    "binary_hard_truncated_loss": {"margin": (st.floats(0, 1), [1.5, math.nan])},
}


@settings(max_examples=80)
@given(data=st.data(), name=st.sampled_from(sorted(BINARY_LOSSES)))
def test_binary_losses(data, name):
    spoiled = spoil(data, ["logits", "target", *BINARY_LOSSES[name], "reduction"])
    dtype = data.draw(st.sampled_from(DTYPES), label="dtype")
    shape = data.draw(st.sampled_from([(1,), (4,), (2, 3)]), label="shape")
    scale = data.draw(st.sampled_from([1.0, 100.0]))
    x = draw_tensor(data, shape, -5 * scale, 5 * scale, dtype, spoiled=spoiled == "logits")
    y = draw_tensor(data, shape, 0, 1, dtype, label="target")
    if spoiled == "target":
        y.view(-1)[0] = data.draw(st.sampled_from([1.5, -0.25, math.nan]))
    hyper = draw_hyperparameters(data, BINARY_LOSSES[name], spoiled)
    reduction = draw_reduction(data, spoiled)
    bad = bad_hyperparameters(name, hyper)
    if reduction not in REDUCTIONS[:3]:
        bad.add("reduction")
    if non_finite(x):
        bad.add("logits")
    if not bool(((y >= 0) & (y <= 1)).all()):
        bad.add("target")
    fn = getattr(LF, name)
    outcome(
        lambda: fn(x, y, **hyper, reduction=reduction),
        bad,
        lambda: binary_reference(name, x, y, hyper, reduction),
        dtype,
        spoiled=spoiled,
    )


@settings(max_examples=50)
@given(data=st.data())
def test_multilabel_categorical_crossentropy(data):
    spoiled = spoil(data, ["logits", "target", "reduction"])
    dtype = data.draw(st.sampled_from(DTYPES), label="dtype")
    n, labels = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 4))
    x = draw_tensor(data, (n, labels), -30, 30, dtype, spoiled=spoiled == "logits")
    label_values = st.sampled_from([0.0, 1.0, 0.25, 0.5, 1.0, 0.0, IGNORE])
    y = torch.tensor(data.draw(st.lists(label_values, min_size=n * labels, max_size=n * labels)))
    y = y.reshape(n, labels)
    y[:, 0] = torch.where(y[:, 0] == IGNORE, 1.0, y[:, 0])  # a label that counts in every row
    if spoiled == "target":  # out of [0, 1], or a row whose labels are all ignored
        bad_value = data.draw(st.sampled_from([1.5, -0.5, math.nan, "row"]))
        if bad_value == "row":
            y[data.draw(st.integers(0, n - 1))] = IGNORE
        else:
            y.view(-1)[data.draw(st.integers(0, y.numel() - 1))] = bad_value
    y = y.to(dtype)
    reduction = draw_reduction(data, spoiled)
    keep = y != IGNORE
    bad = set()
    if reduction not in REDUCTIONS[:3]:
        bad.add("reduction")
    if non_finite(x):
        bad.add("logits")
    if not bool((((y >= 0) & (y <= 1)) | ~keep).all()) or not bool(keep.any(dim=1).all()):
        bad.add("target")

    def reference():
        rows = []
        for xi, yi, ki in zip(x.double(), y.double(), keep, strict=True):
            xs, ys = xi[ki], yi[ki]
            zero = torch.zeros(1, dtype=torch.float64)
            positive = torch.logsumexp(torch.cat([zero, torch.log(ys) - xs]), 0)
            negative = torch.logsumexp(torch.cat([zero, torch.log(1 - ys) + xs]), 0)
            rows.append(positive + negative)
        return reduce(torch.stack(rows), reduction)

    outcome(
        lambda: LF.multilabel_categorical_crossentropy(x, y, reduction=reduction),
        bad,
        reference,
        dtype,
        spoiled=spoiled,
    )


def nm_reference(s, t, variant, reduction):
    """The pairwise or centered loss per sample, summed term by term.

    Pairwise: ``sum_j log(1 + sum_i sum_{k != j} t_ij e^{s_ik - s_ij})``; centered:
    ``sum_j log(1 + sum_i t_ij e^{mean_k s_ik - s_ij})``.
    """
    s = s.double()
    batch, tasks, m = s.shape
    t = F.one_hot(t.long(), m).double() if not t.is_floating_point() else t.double()
    samples = []
    for b in range(batch):
        total = torch.zeros((), dtype=torch.float64)
        for j in range(m):
            logs = [torch.zeros((), dtype=torch.float64)]
            for i in range(tasks):
                if t[b, i, j] == 0:
                    continue
                if variant == "pairwise":
                    logs += [
                        torch.log(t[b, i, j]) + s[b, i, k] - s[b, i, j] for k in range(m) if k != j
                    ]
                else:
                    logs.append(torch.log(t[b, i, j]) + s[b, i].mean() - s[b, i, j])
            total = total + torch.logsumexp(torch.stack(logs), 0)
        samples.append(total)
    return reduce(torch.stack(samples), reduction)


@settings(max_examples=60)
@given(data=st.data())
def test_nm_categorical_crossentropy(data):
    spoiled = spoil(data, ["logits", "target", "variant", "reduction"])
    dtype = data.draw(st.sampled_from(DTYPES), label="dtype")
    n, tasks = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3))
    m = data.draw(st.integers(2, 4))
    s = draw_tensor(data, (n, tasks, m), -20, 20, dtype, spoiled=spoiled == "logits")
    tolerance_of_sums = max(1e-3, 4 * torch.finfo(dtype).eps)
    # spoiled target: an index out of range, a soft task summing to 0.9 or 1.1, or a soft
    # label out of [0, 1]
    forms = ["index", "sum", "sum", "value"] if spoiled == "target" else ["index", "soft"]
    form = data.draw(st.sampled_from(forms), label="target form")
    if form == "index":
        t = draw_targets(data, (n, tasks), m, spoiled=spoiled == "target", ignore=False)
        target_bad = bool(((t < 0) | (t >= m)).any())
    else:
        raw = draw_tensor(data, (n, tasks, m), 0, 1, torch.float64, label="soft target")
        raw[..., 0] += 1e-3  # no all-zero task
        t = (raw / raw.sum(-1, keepdim=True)).to(dtype)
        if form == "value":
            t[0, 0, 0] = data.draw(st.sampled_from([-0.1, 1.5, math.nan]))
        elif form == "sum":
            t[0, 0] = t[0, 0] * data.draw(st.sampled_from([0.9, 1.1]))
        sums = t.double().sum(-1)
        inside = bool(((t >= 0) & (t <= 1)).all())
        target_bad = not inside or not bool(((sums - 1).abs() <= tolerance_of_sums).all())
    good_variant = st.sampled_from(["pairwise", "centered"])
    variant = draw_scalar(data, "variant", good_variant, ["symmetric", "Pairwise"], spoiled)
    reduction = draw_reduction(data, spoiled)
    bad = set()
    if reduction not in REDUCTIONS[:3]:
        bad.add("reduction")
    if variant not in ("pairwise", "centered"):
        bad.add("variant")
    if non_finite(s):
        bad.add("logits")
    if target_bad:
        bad.add("target")
    outcome(
        lambda: LF.nm_categorical_crossentropy(s, t, variant=variant, reduction=reduction),
        bad,
        lambda: nm_reference(s, t, variant, reduction),
        dtype,
        spoiled=spoiled,
    )


@settings(max_examples=40)
@given(data=st.data())
def test_feature_incay(data):
    spoiled = spoil(data, ["features", "reduction"])
    dtype = data.draw(st.sampled_from(DTYPES), label="dtype")
    shape = (data.draw(st.integers(1, 4)), data.draw(st.integers(1, 3)))
    f = draw_tensor(data, shape, -100, 100, dtype, spoiled=spoiled == "features")
    if spoiled == "features" and data.draw(st.booleans(), label="zero row?"):
        f = torch.where(torch.isfinite(f), f, 0.0)
        # no direction, or a norm so small that 1/||f||^2 overflows the compute dtype
        tiny = 1e-160 if dtype == torch.float64 else 1e-20
        f[0] = data.draw(st.sampled_from([0.0, tiny]))
    reduction = draw_reduction(data, spoiled)
    norm_square = (f.double() ** 2).sum(-1)
    largest = torch.finfo(compute_dtype(dtype)).max
    bad = set()
    if reduction not in REDUCTIONS[:3]:
        bad.add("reduction")
    if non_finite(f) or not bool((norm_square * largest > 1).all()):
        bad.add("features")  # NaN or inf, or 1 / ||f||^2 beyond the compute dtype's range
    assume(not bool(((norm_square * largest - 1).abs() < 1e-3).any()))
    outcome(
        lambda: LF.feature_incay(f, reduction=reduction),
        bad,
        lambda: reduce(1 / norm_square, reduction),
        dtype,
        spoiled=spoiled,
    )


LINEAR_HYPERPARAMETERS = {
    "ce": {},
    "soft_accuracy": {},
    "gamma_ce": {
        "gamma": (st.floats(0, 1), [1.5, -0.1]),
        "threshold": (st.sampled_from([0.0, 0.3]), [2.0]),
    },
    "focal": {"gamma": (st.floats(0, 3), [-1.0, math.inf])},
    "poly1": {"epsilon": (st.floats(-1, 3), [-2.0, math.nan])},
    "hard_truncated": {"margin": (st.floats(0, 1), [math.nan, 1.5])},
    "adaptive_focal": {
        "thresholds": (st.sampled_from([(0.4,), (0.2, 0.7)]), [(0.7, 0.2)]),
        "gammas": (st.floats(0, 4), [-1.0]),
    },
}
LINEAR_NAMES = {
    "ce": "cross_entropy",
    "soft_accuracy": "soft_accuracy_loss",
    "gamma_ce": "gamma_cross_entropy",
    "focal": "focal_loss",
    "poly1": "poly1_loss",
    "hard_truncated": "hard_truncated_loss",
    "adaptive_focal": "adaptive_focal_loss",
}


@settings(max_examples=80)
@given(data=st.data(), loss=st.sampled_from(sorted(LINEAR_HYPERPARAMETERS)))
def test_linear_target_loss(data, loss):
    tensors = ["hidden", "weight", "bias", "target", "class_weight"]
    spoiled = spoil(data, [*tensors, *LINEAR_HYPERPARAMETERS[loss], "reduction"])
    dtype = data.draw(st.sampled_from(DTYPES), label="dtype")
    n, hidden_size = data.draw(st.integers(1, 5)), data.draw(st.integers(1, 3))
    vocab = data.draw(st.integers(2, 4))
    hidden = draw_tensor(data, (n, hidden_size), -3, 3, dtype, spoiled=spoiled == "hidden")
    weight = draw_tensor(data, (vocab, hidden_size), -3, 3, dtype, spoiled=spoiled == "weight")
    bias = None
    if spoiled == "bias" or data.draw(st.booleans(), label="bias?"):
        bias = draw_tensor(data, (vocab,), -3, 3, dtype, spoiled=spoiled == "bias")
    target = draw_targets(data, (n,), vocab, spoiled=spoiled == "target")
    class_weight = draw_class_vector(data, vocab, spoiled=spoiled == "class_weight")
    hyper = draw_hyperparameters(data, LINEAR_HYPERPARAMETERS[loss], spoiled)
    reduction = draw_reduction(data, spoiled)
    chunk_size = data.draw(st.sampled_from([None, 1, 2]))
    bad = bad_hyperparameters(LINEAR_NAMES[loss], hyper)
    if reduction not in REDUCTIONS[:3]:
        bad.add("reduction")
    for name, tensor in (("hidden", hidden), ("weight", weight), ("bias", bias)):
        if non_finite(tensor):
            bad.add(name)
    if bool(((target != IGNORE) & ((target < 0) | (target >= vocab))).any()):
        bad.add("target")
    if bad_vector(class_weight):
        bad.add("class_weight")

    def reference():
        logits = hidden.double() @ weight.double().T
        if bias is not None:
            logits = logits + bias.double()
        # the class weight normalises "mean" for every loss of the linear head
        applied = None if class_weight is None else class_weight.to(compute_dtype(dtype))
        return index_reference(
            LINEAR_NAMES[loss], logits, target, hyper, applied, reduction, alpha=False
        )

    outcome(
        lambda: LF.linear_target_loss(
            hidden,
            weight,
            target,
            loss=loss,
            bias=bias,
            class_weight=class_weight,
            chunk_size=chunk_size,
            reduction=reduction,
            **hyper,
        ),
        bad,
        reference,
        dtype,
        spoiled=spoiled,
    )


def adafocal_reference(x, t, edges, gammas, reduction):
    """AdaFocal as its authors' code writes it, in float64.

    The bin of ``p_t`` by a loop over the bins (first ``p < e_1``, last ``p >= e_{B-1}``, else
    ``e_k <= p < e_{k+1}``), then ``-(1 - sign(g) p + 1e-20)^|g| log p``. ``p_t`` for the
    lookup is taken in the loss's compute dtype (float32 below float64), as the loss sees it.
    """
    flat_x = x.movedim(1, -1).reshape(-1, x.shape[1])
    flat_t = t.reshape(-1).long()
    keep = flat_t != IGNORE
    lookup_p = torch.softmax(flat_x.to(compute_dtype(x.dtype)), dim=1)
    log_p = torch.log_softmax(flat_x.double(), dim=1)
    values = []
    for row, target in enumerate(flat_t.tolist()):
        if target == IGNORE:
            values.append(0.0)
            continue
        p = float(lookup_p[row, target])
        bins = len(gammas)
        k = next(
            k
            for k in range(bins)
            if (k == 0 and p < edges[1] if bins > 1 else True)
            or (k == bins - 1 and p >= edges[bins - 1])
            or (edges[k] <= p < edges[k + 1])
        )
        g = gammas[k]
        lp = float(log_p[row, target])
        sign = (g > 0) - (g < 0)
        values.append(-((1 - sign * math.exp(lp) + 1e-20) ** abs(g)) * lp)
    values = torch.tensor(values, dtype=torch.float64).reshape(t.shape)
    return reduce(values, reduction, denominator=int(keep.sum()))


@settings(max_examples=100)
@given(data=st.data())
def test_adafocal_loss(data):
    spoiled = spoil(data, ["logits", "target", "gammas", "edges", "reduction"])
    dtype = data.draw(st.sampled_from(DTYPES), label="dtype")
    n, classes = data.draw(st.integers(1, 4)), data.draw(st.integers(2, 5))
    extra = data.draw(st.sampled_from([(), (), (3,)]), label="extra dims")
    scale = data.draw(st.sampled_from([1.0, 10.0, 1e3]))
    x = draw_tensor(
        data, (n, classes, *extra), -3 * scale, 3 * scale, dtype, spoiled=spoiled == "logits"
    )
    t = draw_targets(data, (n, *extra), classes, spoiled=spoiled == "target")
    bins = data.draw(st.integers(1, 6), label="bins")
    inner = sorted(data.draw(st.lists(st.integers(1, 15), min_size=bins - 1, max_size=bins - 1)))
    edges = [0.0, *(k / 16 for k in inner), 1.0]
    gammas = data.draw(st.lists(st.floats(-20, 20), min_size=bins, max_size=bins), label="g")
    edges_t = torch.tensor(edges, dtype=torch.float64)
    gammas_t = torch.tensor(gammas, dtype=torch.float64)
    if spoiled == "gammas":
        gammas_t[data.draw(st.integers(0, bins - 1))] = data.draw(st.sampled_from(SPECIAL))
    if spoiled == "edges":
        edges_t = edges_t.flip(0) if bins > 1 else edges_t[:1]  # decreasing, or one too few
    reduction = draw_reduction(data, spoiled)
    bad = set()
    if reduction not in REDUCTIONS[:3]:
        bad.add("reduction")
    if non_finite(x):
        bad.add("logits")
    if bool(((t != IGNORE) & ((t < 0) | (t >= classes))).any()):
        bad.add("target")
    if spoiled in ("gammas", "edges"):
        bad.add(spoiled)
    outcome(
        lambda: LF.adafocal_loss(x, t, edges=edges_t, gammas=gammas_t, reduction=reduction),
        bad,
        lambda: adafocal_reference(x, t, edges, gammas, reduction),
        dtype,
        spoiled=spoiled,
        tol=(1e-2, 1e-2) if extra and dtype.itemsize == 2 else None,
    )


# --- MbLS, dual focal and the batch-level calibration penalties ---------------------------------
# Their own tests transcribe the authors' released code at rtol 1e-10; the references here are
# the papers' formulas written again, plainly, per row of the flattened [M, C] logits.


def flat_rows(x, t):
    """``[N, C, *]`` logits and ``[N, *]`` targets as float64 ``[M, C]`` rows and ``[M]``."""
    return x.double().movedim(1, -1).reshape(-1, x.shape[1]), t.reshape(-1).long()


def mbls_values(x, t, margin, alpha):
    """MbLS per row: ``-log p_t + alpha / C * sum_k max(0, max_j x_j - x_k - margin)``.

    The hinge is continuous at its margin, so its value needs no filter (only its gradient
    flips there, which is not this file's concern).
    """
    log_p_t = x.gather(1, t[:, None])[:, 0] - torch.logsumexp(x, dim=1)
    hinge = torch.relu(x.max(dim=1, keepdim=True).values - x - margin)
    return -log_p_t + alpha * hinge.sum(dim=1) / x.shape[1]


def dual_focal_values(x, t, gamma):
    """Dual focal per row: ``-(1 - p_t + p_j)^gamma log p_t``, ``p_j = max {p_k : p_k < p_t}``.

    ``p_j`` is 0 where no class lies strictly below ``p_t``. The strict ``<`` decides on the
    compute dtype's rounding where ``x_k`` and ``x_t`` are distinct but close: such rows are
    filtered out, unless ``p_t < e^-40`` (then ``p_j < p_t`` moves the value by nothing).
    """
    log_p = x - torch.logsumexp(x, dim=1, keepdim=True)
    p = torch.exp(log_p)
    log_p_t = log_p.gather(1, t[:, None])[:, 0]
    p_t = torch.exp(log_p_t)
    for row, target, lpt in zip(x.tolist(), t.tolist(), log_p_t.tolist(), strict=True):
        gaps = [abs(v - row[target]) for v in row]
        assume(lpt < -40 or all(g == 0 or g > 1e-3 for g in gaps))
    p_j = torch.where(p < p_t[:, None], p, 0.0).max(dim=1).values
    return -((1 - p_t + p_j) ** gamma) * log_p_t


def first_argmax(x):
    """The first maximal class of each row (``[n, C]`` logits), off near-ties.

    Distinct logits closer than 1e-6 may round to one log-probability in float32, which would
    move the prediction: such rows are filtered out.
    """
    predicted = []
    for row in x.tolist():
        top = max(row)
        assume(all(v == top or top - v > 1e-6 for v in row))
        predicted.append(row.index(top))
    return torch.tensor(predicted, dtype=torch.long)


def calibration_penalty(kind, x, t):
    """MDCA, DCA or MMCE (unweighted, squared) of ``[n, C]`` float64 logits; 0 when n = 0.

    With ``p = softmax(x)``, ``r_i = max_c p_ic``, ``c_i = [argmax_c p_ic = t_i]``:
    MDCA ``(1/C) sum_c |mean_i p_ic - mean_i [t_i = c]|`` (Hebbalaguppe et al. 2022),
    DCA ``|mean_i r_i - mean_i c_i|`` (Liang et al. 2020),
    MMCE ``(1/n^2) sum_ij (c_i - r_i)(c_j - r_j) exp(-|r_i - r_j| / 0.4)`` (Kumar et al. 2018),
    the full ``n x n`` matrix.
    """
    n, classes = x.shape
    if n == 0:
        return torch.zeros((), dtype=torch.float64)
    p = torch.softmax(x, dim=1)
    if kind == "mdca":
        return (p.mean(dim=0) - F.one_hot(t, classes).double().mean(dim=0)).abs().mean()
    r = p.max(dim=1).values
    c = (first_argmax(x) == t).double()
    if kind == "dca":
        return (r.mean() - c.mean()).abs()
    e = c - r
    kernel = torch.exp(-(r[:, None] - r[None, :]).abs() / 0.4)
    return (e[:, None] * e[None, :] * kernel).sum() / n**2


#: loss -> {hyper-parameter: (good values, bad values)}; the bare penalties take none
ROW_AND_BATCH_LOSSES = {
    "mbls_loss": {
        "margin": (st.floats(0, 20), [-1.0, math.nan, math.inf]),
        "alpha": (st.floats(0, 2), [-0.1, math.inf]),
    },
    "dual_focal_loss": {"gamma": (st.floats(0, 5), [-1.0, math.nan, math.inf])},
    "mdca_loss": {
        "beta": (st.floats(0, 10), [-1.0, math.nan]),
        "gamma": (st.floats(0, 4), [-0.5, math.inf]),
    },
    "dca_loss": {"beta": (st.floats(0, 20), [-1.0, math.inf])},
    "mmce_loss": {"lambda_": (st.floats(0, 10), [-0.5, math.nan, math.inf])},
    "mdca_penalty": {},
    "dca_penalty": {},
    "mmce_penalty": {},
}
ROW_LOSSES = ("mbls_loss", "dual_focal_loss")
#: the weight of each batch-level penalty in its loss
PENALTY_WEIGHT = {"mdca_loss": "beta", "dca_loss": "beta", "mmce_loss": "lambda_"}


def row_and_batch_reference(name, x, t, hyper, reduction):
    """The value of ``name`` on ``[N, C, *]`` logits (positions are elements; ``IGNORE`` ignored).

    The batch-level losses are ``base_i + weight * penalty`` per non-ignored element (0 where
    ignored) with ``base`` cross-entropy, or focal loss for MDCA's ``gamma > 0``; so "mean" is
    the mean base loss plus the weighted penalty and "sum" ``n`` times it.
    """
    rows, target = flat_rows(x, t)
    valid = target != IGNORE
    safe = torch.where(valid, target, 0)
    if name == "mbls_loss":
        values = mbls_values(rows, safe, hyper["margin"], hyper["alpha"])
    elif name == "dual_focal_loss":
        values = dual_focal_values(rows[valid], target[valid], hyper["gamma"])
        values = torch.zeros(len(target), dtype=torch.float64).index_put((valid,), values)
    else:
        penalty = calibration_penalty(name.split("_")[0], rows[valid], target[valid])
        if name.endswith("_penalty"):
            return penalty
        base = family_values("focal_loss", rows, safe, {"gamma": hyper.get("gamma", 0.0)})
        values = base + hyper[PENALTY_WEIGHT[name]] * penalty
    values = torch.where(valid, values, 0.0)
    return reduce(values.reshape(t.shape), reduction, valid.sum())


def spoilable(name):
    """The arguments of ``name`` that an example may spoil."""
    options = [] if name.endswith("_penalty") else ["reduction"]
    if name not in ROW_LOSSES:
        options.append("global_batch")
    return ["logits", "target", *ROW_AND_BATCH_LOSSES[name], *options]


# One run per loss and spoiled argument (None: every argument good): Hypothesis' derandomized
# draws cluster, and a single drawn ``spoiled`` left some hyper-parameters never spoiled.
@pytest.mark.parametrize(
    ("name", "spoiled"),
    [
        (name, spoiled)
        for name in sorted(ROW_AND_BATCH_LOSSES)
        for spoiled in [None, *spoilable(name)]
    ],
)
@settings(max_examples=25)
@given(data=st.data())
def test_margin_dual_focal_and_batch_penalties(data, name, spoiled):
    arguments = spoilable(name)
    dtype = data.draw(st.sampled_from(DTYPES), label="dtype")
    n, classes = data.draw(st.integers(1, 4)), data.draw(st.integers(2, 5))
    extra = data.draw(st.sampled_from([(), (), (3,)]), label="extra dims")
    scale = data.draw(st.sampled_from([1.0, 10.0, 1e3]))
    x = draw_tensor(
        data, (n, classes, *extra), -3 * scale, 3 * scale, dtype, spoiled=spoiled == "logits"
    )
    t = draw_targets(data, (n, *extra), classes, spoiled=spoiled == "target")
    t = t.to(data.draw(st.sampled_from([torch.int64, torch.int32])))
    hyper = draw_hyperparameters(data, ROW_AND_BATCH_LOSSES[name], spoiled)
    kwargs = dict(hyper)
    bad = bad_hyperparameters(name, hyper)
    reduction = "none"  # the bare penalties: one number
    if "reduction" in arguments:
        reduction = kwargs["reduction"] = draw_reduction(data, spoiled)
        if reduction not in REDUCTIONS[:3]:
            bad.add("reduction")
    if "global_batch" in arguments:  # no process group: the batch's own penalty either way
        flag = draw_scalar(data, "global_batch", st.booleans(), ["yes", 1], spoiled)
        kwargs["global_batch"] = flag
        if not isinstance(flag, bool):
            bad.add("global_batch")
    if non_finite(x):
        bad.add("logits")
    if bool(((t != IGNORE) & ((t < 0) | (t >= classes))).any()):
        bad.add("target")
    fn = getattr(LF, name)
    outcome(
        lambda: fn(x, t, **kwargs),
        bad,
        lambda: row_and_batch_reference(name, x, t, hyper, reduction),
        dtype,
        spoiled=spoiled,
    )


NOT_LOSSES = {"exact_log_probability", "normface_min_scale", "adafocal_update"}  # helpers


def test_every_public_loss_has_a_property():
    covered = {*INDEX_LOSSES, *BINARY_LOSSES, "exact_loss", "feature_incay", "linear_target_loss"}
    covered.add("adafocal_loss")
    covered |= {"multilabel_categorical_crossentropy", "nm_categorical_crossentropy"}
    covered |= set(ROW_AND_BATCH_LOSSES)
    assert covered == set(LF.__all__) - NOT_LOSSES


# --- calibration ---------------------------------------------------------------------------------


def draw_preds(data, task, input_format, dtype, spoiled):
    """Preds and targets of ``task``.

    Spoiled preds: a NaN or infinite logit; a probability out of [0, 1] or NaN; a multiclass row
    that is no distribution. Spoiled target: a class out of range, or a label that is neither 0
    nor 1.
    """
    n = data.draw(st.integers(1, 6), label="n")
    classes = data.draw(st.integers(2, 4), label="classes")
    shape = (n,) if task == "binary" else (n, classes)
    if input_format == "logits":
        preds = draw_tensor(data, shape, -8, 8, dtype, spoiled=spoiled == "preds", label="preds")
    else:
        raw = draw_tensor(data, shape, 0, 1, torch.float64, label="preds")
        if task == "multiclass":
            raw = raw + 1e-3
            raw = raw / raw.sum(1, keepdim=True)
        preds = raw.to(dtype)
        if spoiled == "preds":
            kinds = ["value", "sum"] if task == "multiclass" else ["value"]
            if data.draw(st.sampled_from(kinds), label="spoiled how") == "value":
                preds.view(-1)[0] = data.draw(st.sampled_from([-0.1, 1.5, math.nan]))
            else:  # no distribution in any dtype: 0.5 and 0.99 are off by more than 0.031
                preds[0] = preds[0] * data.draw(st.sampled_from([0.5, 0.99]))
        elif task == "multiclass":  # still a distribution: 0.9995 is within 1e-3
            preds[0] = preds[0] * data.draw(st.sampled_from([1.0, 1.0, 0.9995]))
    if task == "multiclass":
        target = draw_targets(data, (n,), classes, spoiled=spoiled == "target", ignore=False)
    else:  # labels 0 or 1; spoiled: a -1 or 2; bool when they allow it
        target = draw_targets(data, shape, 2, spoiled=spoiled == "target", ignore=False)
        labels = bool(((target == 0) | (target == 1)).all())
        if labels and data.draw(st.booleans(), label="bool target?"):
            target = target.bool()
    return preds, target


def bad_calibration_arguments(preds, target, task, input_format):
    bad = set()
    if task == "multiclass":
        if bool(((target < 0) | (target >= preds.shape[1])).any()):
            bad.add("target")
    elif not bool(((target == 0) | (target == 1)).all()):
        bad.add("target")
    if input_format == "logits":
        if non_finite(preds):
            bad.add("preds")
    elif not bool(((preds >= 0) & (preds <= 1)).all()):
        bad.add("preds")
    elif task == "multiclass":
        sums = preds.double().sum(1)
        if not bool(((sums - 1).abs() <= max(1e-3, 4 * torch.finfo(preds.dtype).eps)).all()):
            bad.add("preds")
    return bad


def probabilities(preds, task, input_format):
    """Class probabilities, float64: [N, C] (multiclass) or positive-class [N] / [N, K]."""
    if input_format == "probs":
        return preds.double()
    if task == "multiclass":
        return torch.softmax(preds.double(), dim=1)
    return torch.sigmoid(preds.double())


def top_label(preds, target, task, input_format):
    """(confidence, correct) per decision as the binned metrics see them.

    Multiclass: the top label (first arg-max); binary and multi-label: the positive class.
    Confidences of probabilities keep their dtype's values.
    """
    if task == "multiclass":
        probs = probabilities(preds, task, input_format)
        confidence, correct = [], []
        for row, label in zip(probs.tolist(), target.tolist(), strict=True):
            best = max(row)
            confidence.append(best)
            correct.append(float(row.index(best) == label))
        return torch.tensor(confidence, dtype=torch.float64), torch.tensor(
            correct, dtype=torch.float64
        )
    probs = probabilities(preds, task, input_format).reshape(-1)
    return probs, target.reshape(-1).double()


def edges_of(dtype, n_bins):
    """Inner bin edges k/B rounded to the confidences' dtype."""
    return [
        float(torch.tensor(k / n_bins, dtype=torch.float64).to(dtype)) for k in range(1, n_bins)
    ]


def binned_error(confidence, correct, edges, n_bins, norm):
    """The calibration error of per-bin sums, a plain loop over the bins ``(e_k, e_k+1]``."""
    count = [0.0] * n_bins
    conf_sum = [0.0] * n_bins
    correct_sum = [0.0] * n_bins
    for c, a in zip(confidence.tolist(), correct.tolist(), strict=True):
        b = sum(1 for e in edges if e < c)
        count[b] += 1
        conf_sum[b] += c
        correct_sum[b] += a
    return error_from_bins(count, conf_sum, correct_sum, norm)


def error_from_bins(count, conf_sum, correct_sum, norm):
    total = sum(count)
    gaps = [(abs(s - a) / c, c) for c, s, a in zip(count, conf_sum, correct_sum, strict=True) if c]
    if norm == "l1":
        return sum(g * c for g, c in gaps) / total
    if norm == "l2":
        return math.sqrt(sum(g * g * c for g, c in gaps) / total)
    if norm == "max":
        return max(g for g, _ in gaps)
    return sum(g for g, _ in gaps) / len(gaps)


def assume_no_edge(confidence, edges, input_format, dtype):
    """Keep confidences from float32 (or half) logits off the bin edges.

    They carry float32 rounding, and at an edge the bin would depend on it.
    """
    if input_format == "logits" and dtype != torch.float64:
        assume(all(abs(c - e) > 1e-6 for c in confidence.tolist() for e in edges))


def _confidence_and_correct_reference(preds, target, task, input_format, n_bins, norm):
    return torch.stack(top_label(preds, target, task, input_format))


def _calibration_error_reference(preds, target, task, input_format, n_bins, norm):
    dtype = preds.dtype
    confidence, correct = top_label(preds, target, task, input_format)
    edge_dtype = dtype if input_format == "probs" else torch.float64
    edges = edges_of(edge_dtype, n_bins)
    assume_no_edge(confidence, edges, input_format, dtype)
    return torch.tensor(binned_error(confidence, correct, edges, n_bins, norm))


def _adaptive_calibration_error_reference(preds, target, task, input_format, n_bins, norm):
    dtype = preds.dtype
    confidence, correct = top_label(preds, target, task, input_format)
    if input_format == "logits" and dtype != torch.float64:
        c = sorted(confidence.tolist())
        assume(all(b - a == 0 or b - a > 1e-6 for a, b in itertools.pairwise(c)))
    pairs = sorted(zip(confidence.tolist(), correct.tolist(), strict=True))
    n = len(pairs)
    count, conf_sum, correct_sum = [0.0] * n_bins, [0.0] * n_bins, [0.0] * n_bins
    for position, (c, a) in enumerate(pairs):
        b = ((position + 1) * n_bins - 1) // n
        count[b] += 1
        conf_sum[b] += c
        correct_sum[b] += a
    return torch.tensor(error_from_bins(count, conf_sum, correct_sum, norm))


def _classwise_calibration_error_reference(preds, target, task, input_format, n_bins, norm):
    if task == "multiclass":
        probs = probabilities(preds, task, input_format)
        labels = F.one_hot(target.long(), probs.shape[1]).double()
        probs = probs if input_format == "logits" else preds  # as given, in their dtype
    else:
        p = preds if input_format == "probs" else torch.sigmoid(preds.double())
        y = target.double()
        probs = torch.stack([1 - p, p], 1) if task == "binary" else p
        labels = torch.stack([1 - y, y], 1) if task == "binary" else y
    edges = edges_of(probs.dtype, n_bins)
    per_class = [
        binned_error(probs[:, c].double(), labels[:, c], edges, n_bins, norm)
        for c in range(probs.shape[1])
    ]
    return torch.tensor(sum(per_class) / len(per_class))


def _brier_score_reference(preds, target, task, input_format, n_bins, norm):
    probs = probabilities(preds, task, input_format)
    y = target.double()
    if task == "multiclass":
        onehot = F.one_hot(target.long(), probs.shape[1]).double()
        return ((probs - onehot) ** 2).sum(1).mean()
    return ((probs - y) ** 2).mean()


def _negative_log_likelihood_reference(preds, target, task, input_format, n_bins, norm):
    probs = probabilities(preds, task, input_format)
    y = target.double()
    if task == "multiclass":
        if input_format == "logits":
            log_probs = preds.double() - torch.logsumexp(preds.double(), 1, keepdim=True)
            return -log_probs.gather(1, target.long()[:, None]).mean()
        return -torch.log(probs.gather(1, target.long()[:, None])).mean()
    if input_format == "logits":
        x = preds.double()
        return (y * -F.logsigmoid(x) + (1 - y) * -F.logsigmoid(-x)).mean()
    terms = [
        -(math.log(p) if label else math.log1p(-p)) if (p if label else 1 - p) > 0 else math.inf
        for p, label in zip(probs.reshape(-1).tolist(), y.reshape(-1).tolist(), strict=True)
    ]
    return torch.tensor(sum(terms) / len(terms))


def _accuracy_reference(preds, target, task, input_format, n_bins, norm):
    probs = probabilities(preds, task, input_format)
    y = target.double()
    if task == "multiclass":
        return top_label(preds, target, task, input_format)[1].mean()
    decision = (preds.double() > 0) if input_format == "logits" else (probs > 0.5)
    return (decision.double() == y).double().mean()


def _mean_confidence_reference(preds, target, task, input_format, n_bins, norm):
    probs = probabilities(preds, task, input_format)
    if task == "multiclass":
        return top_label(preds, target, task, input_format)[0].mean()
    return torch.maximum(probs, 1 - probs).mean()


#: The float64 reference of each calibration function, by the function's name.
CALIBRATION_REFERENCES = {
    "confidence_and_correct": _confidence_and_correct_reference,
    "calibration_error": _calibration_error_reference,
    "adaptive_calibration_error": _adaptive_calibration_error_reference,
    "classwise_calibration_error": _classwise_calibration_error_reference,
    "brier_score": _brier_score_reference,
    "negative_log_likelihood": _negative_log_likelihood_reference,
    "accuracy": _accuracy_reference,
    "mean_confidence": _mean_confidence_reference,
}


def calibration_reference(name, preds, target, task, input_format, n_bins, norm):
    """The reference value of the calibration function ``name`` (one helper per function)."""
    return CALIBRATION_REFERENCES[name](preds, target, task, input_format, n_bins, norm)


CALIBRATION_FUNCTIONS = [
    "confidence_and_correct",
    "calibration_error",
    "adaptive_calibration_error",
    "classwise_calibration_error",
    "brier_score",
    "negative_log_likelihood",
    "accuracy",
    "mean_confidence",
]


@settings(max_examples=200)
@given(
    data=st.data(),
    name=st.sampled_from(CALIBRATION_FUNCTIONS),
    task=st.sampled_from(["multiclass", "binary", "multilabel"]),
    input_format=st.sampled_from(["probs", "logits"]),
)
def test_calibration_functions(data, name, task, input_format):
    binned = "calibration_error" in name
    spoiled = spoil(data, ["preds", "target", *(["n_bins", "norm"] if binned else [])])
    dtype = data.draw(st.sampled_from(DTYPES), label="dtype")
    preds, target = draw_preds(data, task, input_format, dtype, spoiled)
    bad = bad_calibration_arguments(preds, target, task, input_format)
    options = {"input_format": input_format}
    n_bins = norm = None
    if binned:
        n_bins = draw_scalar(data, "n_bins", st.integers(1, 20), [0, -3, 2.0], spoiled)
        norm = draw_scalar(
            data, "norm", st.sampled_from(["l1", "max", "l2", "mean"]), ["L1"], spoiled
        )
        options.update(n_bins=n_bins, norm=norm)
        if isinstance(n_bins, float) or n_bins < 1:
            bad.add("n_bins")
        if norm == "L1":
            bad.add("norm")
    fn = getattr(CF, name)

    def call():
        result = fn(preds, target, **options)
        if name == "confidence_and_correct":
            return torch.stack([result[0].double(), result[1]])
        return result

    outcome(
        call,
        bad,
        lambda: calibration_reference(name, preds, target, task, input_format, n_bins, norm),
        torch.float64 if input_format == "probs" or dtype == torch.float64 else torch.float32,
        spoiled=spoiled,
        # -log 0 = inf is the documented NLL where the probability of the target is 0
        infinite_where_expected=name == "negative_log_likelihood",
    )


def test_every_calibration_function_of_preds_and_target_has_a_property():
    takes_preds = {
        name
        for name in CF.__all__
        if list(inspect.signature(getattr(CF, name)).parameters)[:2] == ["preds", "target"]
    }
    # resolve_task returns the task's name only; its errors are those of the functions
    assert takes_preds - {"resolve_task"} == set(CALIBRATION_FUNCTIONS)
