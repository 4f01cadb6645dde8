"""The comparison figure: accuracy against ECE, a labelled point per run, reliability diagrams.

Each point is labelled with its run (:func:`point_labels`: the run name, or a short run id,
and the run's hyper-parameters when they tell the runs apart and are short). The labels are
placed so that they overlap neither each other nor any point (:func:`draw_scatter`): sorted by
the height of their points, stacked upwards where they would touch (downwards where the panel
ends), kept inside the panel, each put beside its point where no marker is in its way, and
joined to its point by a thin leader line when it had to move. When there are too many runs
for one column of labels, or a label finds no free place, the points get distinct
colour-and-marker pairs and a legend names them instead.

Imports only the standard library; matplotlib and mlflow are imported inside the functions
that use them.
"""

from __future__ import annotations

import math
import os
import re
import tempfile
import warnings
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from lightning_losses.compare.query import mlflow_client, resolve_tracking_uri
from lightning_losses.warning import LightningLossesWarning

if TYPE_CHECKING:
    import numpy as np
    from matplotlib.axes import Axes
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.text import Annotation, Text
    from matplotlib.transforms import Bbox
    from mlflow.tracking import MlflowClient

__all__ = [
    "DIAGRAM_WIDTH",
    "DPI",
    "FIGURE_HEIGHT",
    "SCATTER_WIDTH",
    "comparison_figure",
    "draw_scatter",
    "point_labels",
    "split_tasks",
]

#: Reliability diagrams logged by CalibrationMonitor: ``calibration/val_epoch=NNN.png``.
DIAGRAM_DIR = "calibration"
DIAGRAM_PATTERN = re.compile(r"val_epoch=(\d+)\.png$")
#: Per calibration error the figure can plot (``ece=``): the metric key, its axis label and
#: the pattern of the matching diagrams (``smooth=True`` monitors log
#: ``calibration/val_smooth_epoch=NNN.png``).
ECE_CHOICES: dict[str, tuple[str, str, re.Pattern[str]]] = {
    "binned": ("val/ece", "validation ECE", DIAGRAM_PATTERN),
    "smooth": (
        "val/smooth_ece",
        "validation smooth ECE",
        re.compile(r"val_smooth_epoch=(\d+)\.png$"),
    ),
}

#: Comparison figure geometry in inches (scatter panel, one diagram tile, height) and DPI.
SCATTER_WIDTH = 6.0
DIAGRAM_WIDTH = 4.5
FIGURE_HEIGHT = 5.0
DPI = 100

#: Font size of the point labels (points).
LABEL_FONTSIZE = 7
#: Horizontal gap between a point and its label, vertical gap between labels (points).
LABEL_GAP = 6.0
LABEL_SPACING = 1.5
#: Area of a point's marker (points squared, matplotlib's ``s``) and the clearance a label
#: keeps from every marker (points).
MARKER_SIZE = 36.0
MARKER_CLEARANCE = 1.0
#: Longest hyper-parameter text put into a point label (longer ones are left to the table).
SHORT_HPARAMS = 24
#: Longest point label (a longer run name is cut with "...").
MAX_LABEL = 48
#: Rows of a legend column (when the labels do not fit in the panel).
LEGEND_ROWS = 40
#: Markers, cycled after the ten default colours, so that a legend tells many runs apart.
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
#: Environment variable that turns MLflow's artifact download progress bar off.
PROGRESS_BAR_VARIABLE = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"


# --------------------------------------------------------------------------------------------
# Labels
# --------------------------------------------------------------------------------------------


def _cut(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, ending in ``...`` when cut."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def point_labels(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The label of each run's point: its run, not its loss (two runs of one loss differ).

    A label is the run name, or the first 8 characters of the run id when the run has no name
    (``run N`` when it has neither); a name that several rows share gets the first 6 characters
    of its run id in brackets. The run's ``hparams`` text follows in parentheses when the rows
    do not all have the same one and it is at most :data:`SHORT_HPARAMS` characters long.

    Args:
        rows: comparison rows (:func:`~lightning_losses.compare.query.collect_runs`).

    Returns:
        One label per row, in order, each at most :data:`MAX_LABEL` characters.

    Example:
        >>> point_labels([
        ...     {"run_name": "focal", "run_id": "a1b2c3d4e5", "hparams": "gamma=1"},
        ...     {"run_name": "focal", "run_id": "f6e5d4c3b2", "hparams": "gamma=3"},
        ...     {"run_id": "0123456789abcdef", "hparams": ""},
        ... ])
        ['focal [a1b2c3] (gamma=1)', 'focal [f6e5d4] (gamma=3)', '01234567']
    """
    names = []
    for i, row in enumerate(rows):
        run_id = str(row.get("run_id") or "")
        names.append(str(row.get("run_name") or run_id[:8] or f"run {i + 1}"))
    shared = Counter(names)
    hparams = [str(row.get("hparams") or "") for row in rows]
    distinct = len(set(hparams)) > 1
    labels = []
    for name, row, text in zip(names, rows, hparams, strict=True):
        run_id = str(row.get("run_id") or "")
        if shared[name] > 1 and run_id:
            name = f"{name} [{run_id[:6]}]"
        if distinct and text and len(text) <= SHORT_HPARAMS:
            name = f"{name} ({text})"
        labels.append(_cut(name, MAX_LABEL))
    return labels


def _free_spans(
    lo: float, hi: float, blocked: Sequence[tuple[float, float]]
) -> list[tuple[float, float]]:
    """The parts of ``[lo, hi]`` outside every ``blocked`` interval, left to right."""
    spans, cursor = [], lo
    for start, end in sorted(blocked):
        if start > cursor:
            spans.append((cursor, min(start, hi)))
        cursor = max(cursor, end)
        if cursor >= hi:
            break
    if cursor < hi:
        spans.append((cursor, hi))
    return [(a, b) for a, b in spans if b > a]


def _beside(
    x: float, width: float, gap: float, spans: Sequence[tuple[float, float]]
) -> tuple[float, float] | None:
    """``(shift, left)``: the left edge of a label beside a point at ``x`` within ``spans``.

    The label goes right of the point at ``gap``, or left of it; where markers or the panel's
    edge are in the way, it slides along its line to the nearest free place (``shift`` is how
    far, in pixels; right wins a tie). ``None`` when no span is wide enough.
    """
    best: tuple[float, int, float] | None = None
    for a, b in spans:
        if b - a < width:
            continue
        for side, target in enumerate((x + gap, x - gap - width)):
            left = min(max(target, a), b - width)
            candidate = (abs(left - target), side, left)
            best = candidate if best is None or candidate < best else best
    return None if best is None else (best[0], best[2])


def _root_figure(ax: Axes) -> Figure:
    """The top-level figure ``ax`` is drawn in: the one that lays out and renders."""
    from matplotlib.figure import Figure

    fig = ax.figure
    return fig if isinstance(fig, Figure) else fig.figure


def _place_labels(
    ax: Axes, points: Sequence[tuple[float, float]], labels: Sequence[str]
) -> list[Annotation] | None:
    """Annotate each point with its label, no label overlapping another or any marker.

    Works in display pixels of the figure as laid out now, then fixes the layout (the labels'
    offsets are in points from their points, so a later layout would move them). Labels are
    placed one by one, lowest point first, each on its own line (no two labels share a
    height): on the line nearest its point's height (above it where there is room, else below)
    where it can sit beside its point clear of every marker (:func:`_label_spot`). Returns
    ``None`` (nothing drawn) when a label finds no place in the panel.
    """
    fig = _root_figure(ax)
    # The figures drawn here are on an Agg canvas (comparison_figure makes them so; pyplot's
    # interactive canvases derive from it): its renderer measures the texts in pixels.
    renderer = cast("FigureCanvasAgg", fig.canvas).get_renderer()
    box = ax.get_window_extent(renderer)
    pixels = fig.dpi / 72.0  # pixels per point
    xy = ax.transData.transform(points)
    texts = [
        ax.annotate(
            label,
            point,
            xytext=(0, 0),
            textcoords="offset points",
            ha="left",
            va="center",
            fontsize=LABEL_FONTSIZE,
            annotation_clip=False,
        )
        for point, label in zip(points, labels, strict=True)
    ]
    extents = [text.get_window_extent(renderer) for text in texts]
    spacing = LABEL_SPACING * pixels
    reach = (math.sqrt(MARKER_SIZE) / 2 + MARKER_CLEARANCE) * pixels  # a marker's half-width
    taken: list[tuple[float, float]] = []  # the lines (bottom, top) of the labels placed
    placed: list[tuple[int, float, float]] = []
    for i in sorted(range(len(points)), key=lambda i: (xy[i][1], xy[i][0], i)):
        spot = _label_spot(xy, i, extents[i], box, taken, spacing, reach, pixels)
        if spot is None:
            for text in texts:
                text.remove()
            return None
        centre, left = spot
        taken.append((centre - extents[i].height / 2, centre + extents[i].height / 2))
        placed.append((i, centre, left))
    for i, centre, left in placed:
        (x, y), width = xy[i], extents[i].width
        moved = abs(centre - y) > extents[i].height / 2
        gap = LABEL_GAP * pixels * (3 if moved else 1)
        texts[i].xyann = ((left - x) / pixels, (centre - y) / pixels)
        end = left if abs(left - x) <= abs(left + width - x) else left + width  # nearer edge
        if moved or abs(end - x) > 2 * gap:
            ax.annotate(
                "",
                points[i],
                xytext=((end - x) / pixels, (centre - y) / pixels),
                textcoords="offset points",
                arrowprops={"arrowstyle": "-", "color": "0.55", "lw": 0.5, "shrinkA": 1},
                annotation_clip=False,
            )
    fig.set_layout_engine("none")
    return texts


def _label_spot(
    xy: np.ndarray,
    i: int,
    extent: Bbox,
    box: Bbox,
    taken: Sequence[tuple[float, float]],
    spacing: float,
    reach: float,
    pixels: float,
) -> tuple[float, float] | None:
    """``(centre, left)`` in pixels for the label of point ``i``, or ``None`` if none is free.

    The candidate heights are the point's own and those where the label just clears a taken
    line, a marker or the panel's edge (where what is free changes); of the free ones, the one
    with the least move wins: the vertical distance plus the sideways slide, any place above
    the point before any below it (labels stack upwards, and downwards only where the panel
    ends).
    """
    x, y = xy[i]
    width, half = extent.width, extent.height / 2
    tiny = 1e-3
    heights = {y, box.y0 + half + tiny, box.y1 - half - tiny}
    for bottom, top in taken:
        heights.update((top + spacing + half + tiny, bottom - spacing - half - tiny))
    for _, py in xy:
        heights.update((py + reach + half + tiny, py - reach - half - tiny))
    best: tuple[float, float, float] | None = None
    for centre in sorted(heights, key=lambda c: abs(c - y)):
        vertical = centre - y if centre >= y else y - centre + box.height  # above wins
        if best is not None and vertical >= best[0]:
            continue
        if centre - half < box.y0 or centre + half > box.y1:
            continue
        if any(centre + half + spacing > b and centre - half - spacing < t for b, t in taken):
            continue
        moved = abs(centre - y) > half
        gap = LABEL_GAP * pixels * (3 if moved else 1)  # moved labels fan out from the point
        blocked = [(px - reach, px + reach) for px, py in xy if abs(py - centre) < half + reach]
        beside = _beside(x, width, gap, _free_spans(box.x0, box.x1, blocked))
        if beside is not None and (best is None or vertical + beside[0] < best[0]):
            best = (vertical + beside[0], centre, beside[1])
    return None if best is None else (best[1], best[2])


def _finite(value: Any) -> bool:
    """Whether ``value`` is a finite number (not ``None``, NaN or infinite)."""
    return isinstance(value, (int, float)) and math.isfinite(value)


def split_tasks(rows: Sequence[Mapping[str, Any]]) -> tuple[Sequence[Mapping[str, Any]], str]:
    """The rows the figure plots, of one task, and a line on the runs of other tasks left out.

    Accuracy and ECE of a binary task (one probability, a rare positive class) do not compare
    with a multiclass task's: the scatter holds the runs of the task most runs have
    (multiclass on a tie), and the line names the others and the ``--where`` that plots them.

    Example:
        >>> rows = [{"task": "multiclass"}, {"task": "binary", "run_name": "b"}, {"task": None}]
        >>> plotted, line = split_tasks(rows)
        >>> len(plotted), line
        (2, 'the figure plots the multiclass runs; left out 1 binary run (b): --where model.task=binary plots them')
    """  # noqa: E501
    tasks = [row.get("task") or "multiclass" for row in rows]
    counts = {task: tasks.count(task) for task in dict.fromkeys(tasks)}
    if len(counts) < 2:
        return rows, ""
    main = max(counts, key=lambda task: (counts[task], task == "multiclass"))
    plotted = [row for row, task in zip(rows, tasks, strict=True) if task == main]
    others = []
    for task in counts:
        if task != main:
            names = [
                str(r.get("run_name") or r.get("run_id", "")[:8])
                for r, t in zip(rows, tasks, strict=True)
                if t == task
            ]
            runs = "run" if len(names) == 1 else "runs"
            listed = ", ".join(names)
            plots = f"--where model.task={task} plots them"
            others.append(f"{len(names)} {task} {runs} ({listed}): {plots}")
    return plotted, f"the figure plots the {main} runs; left out " + "; ".join(others)


def _ece_choice(ece: str) -> tuple[str, str, re.Pattern[str]]:
    """The metric key, axis label and diagram pattern of ``ece`` (``"binned"``/``"smooth"``)."""
    if ece not in ECE_CHOICES:
        raise ValueError(f"ece must be one of {', '.join(map(repr, ECE_CHOICES))}; got {ece!r}")
    return ECE_CHOICES[ece]


def draw_scatter(ax: Axes, rows: Sequence[Mapping[str, Any]], ece: str = "binned") -> list[Text]:
    """Accuracy (x) against ECE (y), one point per run that has both, labelled with its run.

    Draw the figure's other panels first: this lays the figure out, places the labels in that
    layout (:func:`point_labels`, sorted by height, stacked where they would overlap, kept in
    the panel, each beside its point on the nearest side that no marker is in the way of,
    leader lines to points they moved away from) and then fixes the layout: no label overlaps
    another label or any point. When the labels do not fit in one column, or a label finds no
    place clear of the markers, the points get distinct colour-and-marker pairs and a legend
    beside the panel names them instead (the layout is then left to the figure).

    Args:
        ax: the panel, in a figure with an Agg-based canvas (it measures the labels with the
            canvas's renderer), such as :func:`comparison_figure`'s.
        rows: comparison rows; rows without a finite ``val/acc`` and ECE are left out, and
            so are the runs of other tasks than the one most rows have (:func:`split_tasks`:
            a binary task's accuracy and ECE do not compare with a multiclass task's; the
            title names the task plotted)
            (labels are made for all ``rows`` at once: :func:`point_labels`).
        ece: ``"binned"`` (``val/ece``) or ``"smooth"`` (``val/smooth_ece``, the smooth ECE
            of Blasiok and Nakkiran).

    Returns:
        The label texts (in the panel, or the legend's), in the order of the plotted rows.
    """
    key, axis_label, _ = _ece_choice(ece)
    rows = split_tasks(rows)[0]
    has_both = [_finite(row.get("val/acc")) and _finite(row.get(key)) for row in rows]
    plotted = [row for row, keep in zip(rows, has_both, strict=True) if keep]
    labels = [label for label, keep in zip(point_labels(rows), has_both, strict=True) if keep]
    points = [(float(r["val/acc"]), float(r[key])) for r in plotted]
    handles = [
        ax.scatter(
            x,
            y,
            color=f"C{i % 10}",
            marker=MARKERS[i // 10 % len(MARKERS)],
            s=MARKER_SIZE,
            zorder=3,
        )
        for i, (x, y) in enumerate(points)
    ]
    if not points:
        ax.text(0.5, 0.5, f"no run has val/acc and {key}", ha="center", transform=ax.transAxes)
    ax.set_xlabel("validation accuracy")
    ax.set_ylabel(axis_label)
    task = next((str(row.get("task")) for row in rows if row.get("task")), "")
    title = f"{task} runs: " if task else ""  # the one task plotted
    ax.set_title(f"{title}accuracy vs calibration (lower ECE is better)", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.margins(0.15)
    if not points:
        return []
    _root_figure(ax).draw_without_rendering()  # lays the figure out and fixes the axis limits
    texts = _place_labels(ax, points, labels)
    if texts is not None:
        return list(texts)
    columns = -(-len(points) // LEGEND_ROWS)
    legend = ax.legend(
        handles,
        labels,
        fontsize=6,
        ncols=columns,
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        borderaxespad=0.0,
        frameon=False,
    )
    return list(legend.get_texts())


# --------------------------------------------------------------------------------------------
# Reliability diagrams
# --------------------------------------------------------------------------------------------


def _latest_diagram(
    client: MlflowClient, run_id: str, pattern: re.Pattern[str] = DIAGRAM_PATTERN
) -> str | None:
    """The artifact path of the run's reliability diagram with the highest epoch, if any."""
    best: tuple[int, str] | None = None
    for info in client.list_artifacts(run_id, DIAGRAM_DIR):
        match = pattern.search(info.path)
        if not info.is_dir and match and (best is None or int(match.group(1)) > best[0]):
            best = (int(match.group(1)), info.path)
    return None if best is None else best[1]


@contextmanager
def _environ(name: str, value: str) -> Iterator[None]:
    """Set an environment variable for the duration of a block (unless the user set it)."""
    previous = os.environ.get(name)
    os.environ.setdefault(name, value)
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(name, None)


def _fetch_diagrams(
    rows: Sequence[Mapping[str, Any]],
    tracking_uri: str,
    limit: int,
    folder: str,
    pattern: re.Pattern[str] = DIAGRAM_PATTERN,
) -> list[tuple[Mapping[str, Any], Path]]:
    """Download the latest diagram of the first ``limit`` rows that have one into ``folder``.

    Runs without a diagram are skipped; a diagram that cannot be read is skipped with a warning.
    """
    if limit <= 0:
        return []
    import mlflow.artifacts
    from mlflow.exceptions import MlflowException

    client = mlflow_client(tracking_uri)
    found: list[tuple[Mapping[str, Any], Path]] = []
    for i, row in enumerate(rows):
        run_id = row.get("run_id")
        try:
            artifact = _latest_diagram(client, run_id, pattern) if run_id else None
            if artifact is None:
                continue
            local = mlflow.artifacts.download_artifacts(
                run_id=run_id,
                artifact_path=artifact,
                dst_path=os.path.join(folder, str(i)),
                tracking_uri=tracking_uri,
            )
        except (OSError, MlflowException) as error:
            warnings.warn(
                f"skipping the diagram of run {run_id}: {error}",
                LightningLossesWarning,
                stacklevel=2,
            )
            continue
        found.append((row, Path(local)))
        if len(found) == limit:
            break
    return found


def _draw_diagram(ax: Axes, row: Mapping[str, Any], label: str, image_path: Path) -> None:
    """One reliability-diagram image, titled with the run's label, loss and hyper-parameters."""
    from matplotlib.image import imread

    ax.imshow(imread(image_path))
    loss = _cut(" ".join(str(row.get(k) or "") for k in ("loss", "hparams")).strip(), 60)
    ax.set_title(f"{label}\n{loss}", fontsize=8)
    ax.set_axis_off()


def comparison_figure(
    rows: Sequence[Mapping[str, Any]],
    path: str | os.PathLike[str],
    *,
    tracking_uri: str | None = None,
    diagrams: int = 4,
    ece: str = "binned",
) -> Path:
    """Save one PNG comparing the runs: accuracy against ECE, and their reliability diagrams.

    The left panel plots each run's validation accuracy (x) against its ECE (y), labelled with
    the run (see :func:`draw_scatter`). To its right, side by side, come the latest reliability
    diagrams (``calibration/val_epoch=NNN.png`` with the highest epoch) of the first
    ``diagrams`` runs in ``rows`` that logged one. The PNG is
    ``(SCATTER_WIDTH + n * DIAGRAM_WIDTH) * DPI`` by ``FIGURE_HEIGHT * DPI`` pixels for ``n``
    diagrams shown. Only the runs of one task are plotted, and only their diagrams shown
    (:func:`split_tasks`).

    Args:
        rows: comparison rows, in the order of preference for the diagrams.
        path: the PNG to write; its folder is created.
        tracking_uri: where the runs' artifacts are (``None``: as in
            :func:`~lightning_losses.compare.query.collect_runs`).
        diagrams: at most this many diagrams (``0``: the scatter panel only).
        ece: ``"binned"`` plots ``val/ece`` beside the binned diagrams; ``"smooth"`` plots
            ``val/smooth_ece`` beside the smoothed diagrams (``val_smooth_epoch=NNN.png``) of
            runs monitored with ``CalibrationMonitor(smooth=True)``.

    Returns:
        The path written.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    _, _, pattern = _ece_choice(ece)
    rows = list(rows)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with (
        tempfile.TemporaryDirectory(prefix="lightning-losses-compare-") as folder,
        _environ(PROGRESS_BAR_VARIABLE, "false"),
    ):
        rows = split_tasks(rows)[0]  # the scatter's task: its diagrams beside it
        tiles = _fetch_diagrams(rows, resolve_tracking_uri(tracking_uri), diagrams, folder, pattern)
        width = SCATTER_WIDTH + DIAGRAM_WIDTH * len(tiles)
        fig = Figure(figsize=(width, FIGURE_HEIGHT), dpi=DPI, layout="constrained")
        FigureCanvasAgg(fig)
        grid = fig.add_gridspec(
            1, 1 + len(tiles), width_ratios=[SCATTER_WIDTH] + [DIAGRAM_WIDTH] * len(tiles)
        )
        scatter = fig.add_subplot(grid[0, 0])
        labels = {id(row): label for row, label in zip(rows, point_labels(rows), strict=True)}
        for i, (row, image) in enumerate(tiles):
            _draw_diagram(fig.add_subplot(grid[0, i + 1]), row, labels[id(row)], image)
        draw_scatter(scatter, rows, ece)  # last: it fixes the layout
        fig.savefig(path, dpi=DPI)
    return path
