"""Held-out token metrics and generation statistics of a next-token model.

A *next-token model* here is an ``nn.Module`` with ``logits(tokens)`` (``[P, T]`` ids to
``[P, T, V]`` next-token logits, causal) and ``context_length`` (the longest sequence it reads),
like :class:`~lightning_losses.lm.model.TinyLanguageModel`.

- :func:`held_out_logits` and :func:`token_metrics`: perplexity, accuracy and the top-label ECE
  of every held-out token (with its debiased value and bootstrap interval), by the formulas of
  :class:`~lightning_losses.lm.model.TokenCalibration` (one home);
- :func:`evaluation_prompts`, :func:`generate` and :func:`continuation_probabilities`: greedy
  or sampled continuations of held-out prompts, and the probability a model gives each token
  of a continuation (teacher forcing), both with the context cropped to the model's length;
- :func:`repetition_rate`: seq-rep-n of Welleck, Kulikov, Roller, Dinan, Cho and Weston,
  "Neural Text Generation with Unlikelihood Training" (ICLR 2020);
- :func:`low_probability_share`: the share of probabilities below a threshold (the share of
  generated tokens a reference model finds implausible).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

from lightning_losses.functional.checks import (
    check_flag,
    check_ignore_index,
    check_index_target,
    check_int,
    check_real,
)
from lightning_losses.functional.evaluation import log_softmax_nll
from lightning_losses.lm.model import TokenCalibration

__all__ = [
    "continuation_probabilities",
    "evaluation_prompts",
    "generate",
    "held_out_logits",
    "low_probability_share",
    "repetition_rate",
    "token_metrics",
]

#: Rows of ``[N, V]`` logits turned into float64 statistics at a time by :func:`token_metrics`.
_ROWS_PER_CHUNK = 2048


# --- helpers ---------------------------------------------------------------------------------


@contextmanager
def _evaluating(model: nn.Module) -> Iterator[None]:
    """Eval mode and no gradient inside; the model's own mode restored after."""
    training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        model.train(training)


def _device(model: nn.Module, fallback: torch.device) -> torch.device:
    """The device of the model's first parameter or buffer (``fallback`` if it has none)."""
    tensor = next(itertools.chain(model.parameters(), model.buffers()), None)
    return fallback if tensor is None else tensor.device


def _ids(name: str, value: object, form: str, *, empty_rows: bool = False) -> Tensor:
    """``value`` as an int64 tensor of the shape ``form`` names (``"[N]"`` or ``"[P, T]"``).

    Every dimension must be at least 1, but the last with ``empty_rows``.
    """
    if not isinstance(value, Tensor) or value.is_floating_point() or value.is_complex():
        kind = value.dtype if isinstance(value, Tensor) else type(value).__name__
        raise TypeError(f"{name} must be an integer tensor {form} of token ids; got {kind}")
    dim = form.count(",") + 1
    sizes = value.shape[:-1] if empty_rows else value.shape
    if value.dtype == torch.bool or value.dim() != dim or 0 in sizes:
        raise ValueError(
            f"{name} must be an integer tensor of shape {form} with no empty dimension; got "
            f"{list(value.shape)} {value.dtype}"
        )
    return value.long()


def _context_length(model: nn.Module) -> int:
    return check_int("model.context_length", getattr(model, "context_length", None), low=1)


def _logits(model: nn.Module, tokens: Tensor) -> Tensor:
    """``model.logits(tokens)``: ``[P, T, V]`` next-token logits of ``[P, T]`` ids."""
    logits: Callable[[Tensor], Tensor] = model.logits  # type: ignore[assignment]
    return logits(tokens)


def _next_logits(model: nn.Module, tokens: Tensor, context_length: int) -> Tensor:
    """``[P, V]`` logits of the token after ``tokens``, seeing its last ``context_length``."""
    return _logits(model, tokens[:, -context_length:])[:, -1]


# --- held-out token metrics ------------------------------------------------------------------


def held_out_logits(
    model: nn.Module, dataset: Dataset, *, batch_size: int = 64
) -> tuple[Tensor, Tensor]:
    """The model's next-token logits over every window of ``dataset``, in order.

    ``dataset`` yields ``(tokens [L], target [L])`` windows (a
    :class:`~lightning_losses.lm.data.TokenWindows`); row ``w * L + o`` of the result is token
    ``o`` of window ``w``, the position :meth:`TokenCalibration.window_positions
    <lightning_losses.lm.model.TokenCalibration.window_positions>` gives it. Computed in eval
    mode without gradient (the model's mode is restored), on the model's device; returned on
    the CPU.

    Args:
        model: a next-token model (``logits(tokens)``).
        dataset: the windows.
        batch_size: windows per forward pass.

    Returns:
        ``(logits, target)``: ``[N, V]`` float32 (the model's dtype if wider) and ``[N]`` int64,
        ``N`` = windows x ``L``.

    Raises:
        ValueError: ``batch_size < 1`` or an empty ``dataset``.

    Example:
        >>> from lightning_losses.lm.data import TokenWindows
        >>> from lightning_losses.lm.model import TinyLanguageModel
        >>> model = TinyLanguageModel(vocab_size=20, context_length=4, d_model=8, n_heads=2)
        >>> logits, target = held_out_logits(model, TokenWindows(torch.arange(13) % 20, 4))
        >>> logits.shape, target[:5].tolist()
        (torch.Size([12, 20]), [1, 2, 3, 4, 5])
    """
    batch_size = check_int("batch_size", batch_size, low=1)
    if len(dataset) == 0:  # type: ignore[arg-type]
        raise ValueError("dataset must hold at least one window; got an empty dataset")
    logits_parts, target_parts = [], []
    device = _device(model, torch.device("cpu"))
    with _evaluating(model):
        for tokens, target in DataLoader(dataset, batch_size=batch_size, shuffle=False):
            logits = _logits(model, tokens.to(device))
            dtype = torch.promote_types(logits.dtype, torch.float32)
            logits_parts.append(logits.reshape(-1, logits.shape[-1]).to("cpu", dtype))
            target_parts.append(target.reshape(-1).long().cpu())
    return torch.cat(logits_parts), torch.cat(target_parts)


def _statistics(logits: Tensor, target: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``(log p_t, top-label confidence, correct)`` of ``[n, V]`` logits, in float64."""
    log_probs, nll = log_softmax_nll(logits, target, dtype=torch.float64)
    top, prediction = log_probs.max(dim=1)
    return -nll, top.exp(), prediction == target


def token_metrics(
    logits: Tensor, target: Tensor, *, n_bins: int = 15, ignore_index: int = -100
) -> dict[str, float]:
    """Token NLL, perplexity, accuracy and top-label ECE with its debiased value and interval.

    The values of :class:`~lightning_losses.lm.model.TokenCalibration` (the one home of the
    formulas) over the rows of ``logits`` whose target is not ``ignore_index``, row ``i`` at
    position ``i`` (so the interval is that of the model's validation when the rows are the
    windows' tokens concatenated in order, as :func:`held_out_logits` returns them). Each row's
    ``log p_t``, confidence and correctness are computed in float64, a chunk of rows at a time.

    Args:
        logits: ``[N, V]`` next-token logits.
        target: ``[N]`` target token ids (or ``ignore_index``).
        n_bins: equal-width bins of the ECE.
        ignore_index: target value of the rows left out.

    Returns:
        ``{"nll", "ppl", "acc", "ece", "ece_debiased", "ece_low", "ece_high"}`` as floats
        (``ece_debiased``: the l1 debiased ECE of Kumar, Liang and Ma; ``ece_low``,
        ``ece_high``: the 95% interval of
        :func:`~lightning_losses.calibration.calibration_error_interval`).

    Raises:
        TypeError: ``logits`` not floating point, ``target`` not integer.
        ValueError: shapes that do not match, targets outside ``[0, V)`` other than
            ``ignore_index``, non-finite logits, a bad ``n_bins``.

    Example:
        >>> logits = torch.tensor([[2.0, 0.0], [0.0, 2.0], [1.0, 0.0]])
        >>> values = token_metrics(logits, torch.tensor([0, 0, -100]), n_bins=5)
        >>> round(values["acc"], 4), round(values["ece"], 4), round(values["nll"], 4)
        (0.5, 0.3808, 1.1269)
    """
    check_ignore_index(ignore_index)
    check_index_target(logits, target, ignore_index=ignore_index, validate_args=True)
    if logits.dim() != 2:
        raise ValueError(f"logits must have shape [N, V]; got {list(logits.shape)}")
    metric = TokenCalibration(n_bins).to(logits.device)
    positions = torch.arange(target.shape[0], device=target.device)
    for start in range(0, target.shape[0], _ROWS_PER_CHUNK):
        rows = slice(start, start + _ROWS_PER_CHUNK)
        keep = target[rows] != ignore_index
        chunk_target = target[rows][keep]
        statistics = _statistics(logits[rows][keep], chunk_target)
        metric.update(*statistics, index=positions[rows][keep])
    return {name: float(value) for name, value in metric.compute().items()}


# --- prompts and generation ------------------------------------------------------------------


def evaluation_prompts(ids: Tensor, *, count: int, length: int) -> Tensor:
    """``count`` slices of ``length`` ids, evenly spaced over a held-out id stream.

    Slice ``i`` starts at ``floor(i (N - length) / (count - 1))`` (``0`` for one slice): the
    first starts the stream, the last ends it. Slices overlap when ``count * length > N``.

    Args:
        ids: ``[N]`` token ids.
        count: number of prompts (at least 1).
        length: ids per prompt, in ``[1, N]``.

    Returns:
        int64 ``[count, length]``.

    Example:
        >>> evaluation_prompts(torch.arange(10), count=3, length=2)
        tensor([[0, 1],
                [4, 5],
                [8, 9]])
    """
    ids = _ids("ids", ids, "[N]")
    count = check_int("count", count, low=1)
    length = check_int("length", length, low=1, high=ids.numel())
    room = ids.numel() - length
    starts = [i * room // max(count - 1, 1) for i in range(count)]
    return torch.stack([ids[start : start + length] for start in starts])


def generate(
    model: nn.Module,
    prompts: Tensor,
    *,
    steps: int,
    greedy: bool,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Autoregressive continuations of ``prompts``: ``steps`` new tokens per prompt.

    At each step the model reads the last ``model.context_length`` tokens of prompt and
    continuation so far (a sliding window) and the next token is ``argmax`` of its logits
    (``greedy``, the first on ties) or a draw from their softmax at temperature 1 with
    ``generator`` (the same generator state gives the same tokens; it draws on its own
    device). Eval mode, no gradient; the model's mode is restored.

    Args:
        model: a next-token model (``logits(tokens)``, ``context_length``).
        prompts: ``[P, T]`` token ids.
        steps: new tokens per prompt (0 gives ``[P, 0]``).
        greedy: ``True`` for argmax decoding, ``False`` for sampling.
        generator: the random generator of the draws (``None``: torch's default one).

    Returns:
        int64 ``[P, steps]`` on the model's device.

    Example:
        >>> from lightning_losses.lm.model import TinyLanguageModel
        >>> model = TinyLanguageModel(vocab_size=20, context_length=4, d_model=8, n_heads=2)
        >>> generate(model, torch.zeros(2, 6, dtype=torch.long), steps=3, greedy=True).shape
        torch.Size([2, 3])
    """
    prompts = _ids("prompts", prompts, "[P, T]")
    steps = check_int("steps", steps, low=0)
    check_flag("greedy", greedy)
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None; got {generator!r}")
    context_length = _context_length(model)
    device = _device(model, prompts.device)
    tokens = prompts.to(device)
    with _evaluating(model):
        for _ in range(steps):
            logits = _next_logits(model, tokens, context_length)
            if greedy:
                token = logits.argmax(dim=1)
            else:
                probabilities = torch.softmax(logits.to(torch.float64), dim=1)
                if generator is not None:
                    probabilities = probabilities.to(generator.device)
                token = torch.multinomial(probabilities, 1, generator=generator)[:, 0]
            tokens = torch.cat([tokens, token.to(device)[:, None]], dim=1)
    return tokens[:, prompts.shape[1] :]


def continuation_probabilities(model: nn.Module, prompts: Tensor, continuations: Tensor) -> Tensor:
    """The probability the model gives each token of ``continuations`` (teacher forcing).

    Entry ``[p, t]`` is ``softmax(logits)[c_t]`` for the logits :func:`generate` would compute
    before step ``t``: the model reads the last ``model.context_length`` tokens of prompt ``p``
    followed by ``c_0 .. c_{t-1}``. So a greedy continuation of the same model gets its top
    probabilities. Eval mode, no gradient; the model's mode is restored.

    Args:
        model: a next-token model (``logits(tokens)``, ``context_length``).
        prompts: ``[P, T]`` token ids.
        continuations: ``[P, S]`` token ids that follow them.

    Returns:
        float64 ``[P, S]`` probabilities, on the model's device.

    Raises:
        ValueError: ``prompts`` and ``continuations`` with different numbers of rows.

    Example:
        >>> from lightning_losses.lm.model import TinyLanguageModel
        >>> model = TinyLanguageModel(vocab_size=20, context_length=4, d_model=8, n_heads=2)
        >>> prompts = torch.zeros(2, 6, dtype=torch.long)
        >>> greedy = generate(model, prompts, steps=3, greedy=True)
        >>> p = continuation_probabilities(model, prompts, greedy)
        >>> p.shape, bool((p > 1 / 20).all())  # the top token beats the uniform share
        (torch.Size([2, 3]), True)
    """
    prompts = _ids("prompts", prompts, "[P, T]")
    continuations = _ids("continuations", continuations, "[P, S]", empty_rows=True)
    if continuations.shape[0] != prompts.shape[0]:
        raise ValueError(
            f"continuations must have one row per prompt ({prompts.shape[0]}); got "
            f"{continuations.shape[0]} rows"
        )
    context_length = _context_length(model)
    device = _device(model, prompts.device)
    tokens = prompts.to(device)
    continuations = continuations.to(device)
    columns = [torch.zeros(prompts.shape[0], 0, dtype=torch.float64, device=device)]
    with _evaluating(model):
        for step in range(continuations.shape[1]):
            logits = _next_logits(model, tokens, context_length)
            probabilities = torch.softmax(logits.to(torch.float64), dim=1)
            token = continuations[:, step]
            columns.append(probabilities.gather(1, token[:, None]))
            tokens = torch.cat([tokens, token[:, None]], dim=1)
    return torch.cat(columns, dim=1)


# --- statistics of generated text ------------------------------------------------------------


def repetition_rate(sequences: Tensor | Sequence[Sequence[int]], n: int) -> float:
    """seq-rep-n: the mean share of repeated n-grams per sequence.

    Per sequence ``1 - |unique n-grams| / |n-grams|`` (Welleck, Kulikov, Roller, Dinan, Cho and
    Weston, "Neural Text Generation with Unlikelihood Training", ICLR 2020), averaged over the
    sequences of at least ``n`` tokens (shorter ones have no n-gram and are skipped).

    Args:
        sequences: ``[P, S]`` token ids, or a sequence of token-id sequences (any lengths).
        n: the n-gram length (at least 1).

    Returns:
        The mean rate, in ``[0, 1)``.

    Raises:
        ValueError: no sequence has ``n`` tokens, or a ``[P, S]`` tensor of another shape.

    Example:
        >>> repetition_rate([[1, 2, 1, 2, 1]], 2)  # 4 bigrams, 2 distinct
        0.5
        >>> round(repetition_rate(torch.tensor([[1, 2, 3], [4, 4, 4]]), 1), 4)  # (0 + 2/3) / 2
        0.3333
    """
    n = check_int("n", n, low=1)
    if isinstance(sequences, Tensor):
        if sequences.dim() != 2 or sequences.is_floating_point():
            raise ValueError(
                "sequences must be an integer tensor [P, S] (one row per sequence) or a "
                f"sequence of id sequences; got a tensor of shape {list(sequences.shape)} "
                f"{sequences.dtype}"
            )
        rows: list[list[int]] = sequences.tolist()
    else:
        try:
            rows = [[int(token) for token in sequence] for sequence in sequences]
        except TypeError as error:
            raise TypeError(
                "sequences must be an integer tensor [P, S] or a sequence of token-id "
                f"sequences; got {type(sequences).__name__} ({error})"
            ) from None
    rates = []
    for row in rows:
        if len(row) < n:
            continue
        grams = [tuple(row[i : i + n]) for i in range(len(row) - n + 1)]
        rates.append(1.0 - len(set(grams)) / len(grams))
    if not rates:
        raise ValueError(
            f"sequences must hold at least one sequence of n={n} or more tokens; got "
            f"{len(rows)} sequences, the longest {max(map(len, rows), default=0)} tokens"
        )
    return sum(rates) / len(rates)


def low_probability_share(probabilities: Tensor, threshold: float = 1e-3) -> float:
    """The share of ``probabilities`` strictly below ``threshold``.

    With :func:`continuation_probabilities` of a reference model: the share of generated tokens
    that model finds implausible.

    Args:
        probabilities: a non-empty floating tensor of probabilities in ``[0, 1]`` (any shape).
        threshold: in ``(0, 1]``.

    Returns:
        A fraction in ``[0, 1]``.

    Raises:
        TypeError: ``probabilities`` not a floating tensor.
        ValueError: empty, or values outside ``[0, 1]`` (NaN included), or a bad ``threshold``.

    Example:
        >>> low_probability_share(torch.tensor([[0.5, 1e-4], [1e-3, 0.0]]))
        0.5
    """
    threshold = check_real("threshold", threshold, low=0.0, high=1.0, low_open=True)
    if not isinstance(probabilities, Tensor) or not probabilities.is_floating_point():
        kind = probabilities.dtype if isinstance(probabilities, Tensor) else type(probabilities)
        raise TypeError(f"probabilities must be a floating-point tensor; got {kind}")
    if probabilities.numel() == 0:
        raise ValueError("probabilities must hold at least one value; got an empty tensor")
    outside = ~((probabilities >= 0) & (probabilities <= 1))
    if bool(outside.any()):
        value = probabilities[outside].flatten()[0].item()
        raise ValueError(f"probabilities must lie in [0, 1]; found {value}")
    return float((probabilities < threshold).to(torch.float64).mean())
