"""``lightning-losses compare``: point labels, their placement, metric names, a light ``--help``.

The labels are checked on the figure as drawn: their boxes come from the Agg renderer
(``Text.get_window_extent``) after a full draw, that is, as the saved PNG shows them.
"""

from __future__ import annotations

import itertools
import subprocess
import sys

import pytest

from lightning_losses import compare
from lightning_losses.compare import figure, query

HEAVY = ("torch", "lightning", "mlflow", "matplotlib")


def _rows(n: int, spread: float) -> list[dict]:
    """``n`` runs of one loss at (0.9, 0.05), ``spread`` apart along both axes (0: identical)."""
    return [
        {
            "run_id": f"{i:02d}" + "c" * 30,
            "run_name": f"focal-{i}",
            "loss": "FocalLoss",
            "hparams": f"gamma={i}",
            "val/acc": 0.9 + spread * (i % 3),
            "val/ece": 0.05 + spread * (i % 2),
        }
        for i in range(n)
    ]


def _drawn_scatter(rows: list[dict]):
    """A figure laid out like the comparison figure's scatter panel, drawn; its label texts."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(
        figsize=(figure.SCATTER_WIDTH, figure.FIGURE_HEIGHT), dpi=figure.DPI, layout="constrained"
    )
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    texts = figure.draw_scatter(ax, rows)
    fig.canvas.draw()  # what savefig renders
    renderer = fig.canvas.get_renderer()
    return fig, ax, texts, [text.get_window_extent(renderer) for text in texts]


def _disjoint(a, b) -> bool:
    """Whether two display boxes share no area (touching edges allowed)."""
    return a.x1 <= b.x0 or b.x1 <= a.x0 or a.y1 <= b.y0 or b.y1 <= a.y0


@pytest.mark.parametrize("spread", [0.0, 1e-4, 2e-3])
def test_labels_of_close_runs_do_not_overlap_and_name_their_runs(spread):
    rows = _rows(8, spread)
    fig, ax, texts, boxes = _drawn_scatter(rows)
    assert len(texts) == 8
    assert ax.get_legend() is None  # 8 labels fit in the panel: placed next to the points
    for row, text in zip(rows, texts, strict=True):
        assert text.get_text().startswith(row["run_name"] + " ")
        assert "FocalLoss" not in text.get_text()  # labels name runs, not losses
    for (i, a), (j, b) in itertools.combinations(enumerate(boxes), 2):
        assert _disjoint(a, b), (texts[i].get_text(), texts[j].get_text(), a, b)
    panel = ax.get_window_extent(fig.canvas.get_renderer())
    for box in boxes:  # every label inside the panel
        assert panel.x0 - 0.5 <= box.x0
        assert box.x1 <= panel.x1 + 0.5
        assert panel.y0 - 0.5 <= box.y0
        assert box.y1 <= panel.y1 + 0.5


def test_labels_moved_away_get_leader_lines_to_their_points():
    rows = _rows(8, 0.0)
    _, ax, _, boxes = _drawn_scatter(rows)
    point = ax.transData.transform((0.9, 0.05))
    leaders = [a for a in ax.texts if a.get_text() == "" and a.arrow_patch is not None]
    # One label can sit level with the point; the seven stacked above it need leaders.
    above = [box for box in boxes if box.y0 > point[1]]
    assert len(above) >= 7
    assert len(leaders) == len(above)
    for leader in leaders:
        assert tuple(leader.xy) == pytest.approx((0.9, 0.05))


def test_too_many_runs_for_the_panel_get_a_legend_whose_entries_do_not_overlap():
    rows = _rows(60, 1e-4)
    _, ax, texts, boxes = _drawn_scatter(rows)
    legend = ax.get_legend()
    assert legend is not None
    assert list(legend.get_texts()) == texts
    assert [text.get_text().split(" ")[0] for text in texts] == [r["run_name"] for r in rows]
    for a, b in itertools.combinations(boxes, 2):
        assert _disjoint(a, b)
    # Distinct colour-and-marker pairs tell the 60 points apart.
    styles = {
        (tuple(c.get_facecolor()[0]), c.get_paths()[0].vertices.tobytes()) for c in ax.collections
    }
    assert len(styles) == 60


def test_runs_without_finite_accuracy_and_ece_are_left_out():
    rows = _rows(3, 0.01)
    rows.insert(1, {"run_name": "nan-run", "val/acc": float("nan"), "val/ece": 0.1})
    rows.append({"run_name": "no-ece-run", "val/acc": 0.8, "val/ece": None})
    _, ax, texts, _ = _drawn_scatter(rows)
    assert [text.get_text().split(" ")[0] for text in texts] == ["focal-0", "focal-1", "focal-2"]
    assert len(ax.collections) == 3


def test_comparison_figure_with_close_runs_keeps_its_size(tmp_path):
    from matplotlib.image import imread

    rows = _rows(8, 0.0)
    path = figure.comparison_figure(rows, tmp_path / "close.png", diagrams=0)
    image = imread(path)
    expected = (round(figure.FIGURE_HEIGHT * figure.DPI), round(figure.SCATTER_WIDTH * figure.DPI))
    assert image.shape[:2] == expected


def test_point_labels_tell_runs_of_one_loss_apart():
    rows = [
        {"run_name": "focal", "run_id": "aaaaaa1111", "loss": "FocalLoss", "hparams": "gamma=1"},
        {"run_name": "focal", "run_id": "bbbbbb2222", "loss": "FocalLoss", "hparams": "gamma=3"},
        {"run_name": None, "run_id": "0123456789abcdef", "loss": "FocalLoss", "hparams": ""},
        {"run_name": "ce", "run_id": "c", "loss": "CE", "hparams": "x" * 25},  # too long
        {"loss": "CE"},  # neither name nor id
    ]
    assert figure.point_labels(rows) == [
        "focal [aaaaaa] (gamma=1)",
        "focal [bbbbbb] (gamma=3)",
        "01234567",
        "ce",
        "run 5",
    ]
    same = [{"run_name": "a", "hparams": "gamma=2"}, {"run_name": "b", "hparams": "gamma=2"}]
    assert figure.point_labels(same) == ["a", "b"]  # the same hparams tell nothing apart
    long_name = [{"run_name": "n" * 60}]
    assert figure.point_labels(long_name) == ["n" * (figure.MAX_LABEL - 3) + "..."]


def _run(metrics: dict[str, float]):
    """An MLflow run entity with these final metrics (real mlflow entities, no store)."""
    from mlflow.entities import Metric, Run, RunData, RunInfo

    info = RunInfo(
        run_id="r" * 32,
        experiment_id="0",
        user_id="u",
        status="FINISHED",
        start_time=1_000,
        end_time=3_000,
        lifecycle_stage="active",
        run_name="run",
    )
    data = RunData(metrics=[Metric(key, value, 0, 1) for key, value in metrics.items()])
    return Run(info, data)


def test_accuracy_is_read_under_the_module_name_first():
    both = query.run_row(_run({"val/acc": 0.81, "val/accuracy": 0.5, "val/ece": 0.04}))
    assert (both["val/acc"], both["val/ece"]) == (0.81, 0.04)
    older = query.run_row(_run({"val/accuracy": 0.77}))  # a store from before one name each
    assert older["val/acc"] == 0.77
    assert "val/accuracy" not in query.COLUMNS
    assert query.METRICS["val/acc"][0] == "val/acc"


def test_package_exports_resolve_lazily_to_the_submodules():
    from lightning_losses.compare import cli, describe, params, table

    assert compare.collect_runs is query.collect_runs
    assert compare.hparams_text is describe.hparams_text
    assert compare.unflatten is params.unflatten
    assert compare.format_table is table.format_table
    assert compare.main is cli.main
    assert compare.build_parser is cli.build_parser
    assert compare.comparison_figure is figure.comparison_figure
    for name in compare.__all__:
        assert getattr(compare, name) is not None
    with pytest.raises(AttributeError, match="no_such_name"):
        compare.no_such_name  # noqa: B018
    # The --help text names the same default store that resolve_tracking_uri falls back to.
    assert cli._DEFAULT_TRACKING_URI == query.DEFAULT_TRACKING_URI


def test_compare_help_imports_no_heavy_package():
    code = (
        "import contextlib, io, sys\n"
        "from lightning_losses.compare.cli import build_parser\n"
        "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
        "    try:\n"
        "        build_parser().parse_args(['--help'])\n"
        "    except SystemExit:\n"
        "        pass\n"
        "assert '--tracking-uri' in out.getvalue()\n"
        f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""
