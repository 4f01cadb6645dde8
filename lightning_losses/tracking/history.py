"""Resume markers and metric histories that keep one value per step across resumes."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mlflow.entities import Metric, Run
    from mlflow.tracking import MlflowClient

from lightning_losses.tracking.constants import RESUME_TAG

# --- resume markers and the one-value-per-step history -------------------------------------


@dataclass(frozen=True)
class Resume:
    """A resume marker: at ``time_ms`` the run continued from a checkpoint at step ``step``.

    What the run logged before ``time_ms`` at steps ``>= step`` came from the abandoned attempt
    (it ran past the checkpoint, or the user went back to an earlier checkpoint) and is
    superseded by what the resumed fit logs from ``step`` on.

    Attributes:
        step: the checkpoint's ``global_step``, the first step the resumed fit logs.
        time_ms: when the resumed fit started, in milliseconds since the epoch (the clock of
            the metrics' timestamps).
        previous_status: how the previous attempt ended: ``FINISHED``, ``FAILED`` or
            ``KILLED`` (the run was still ``RUNNING``: its process died without ending it).

    Example:
        >>> marker = Resume(step=100, time_ms=5_000)
        >>> marker.supersedes(step=99, timestamp=4_000), marker.supersedes(100, 4_000)
        (False, True)
        >>> marker.supersedes(step=100, timestamp=6_000)  # logged by the resumed fit
        False
    """

    step: int
    time_ms: int
    previous_status: str | None = None

    def supersedes(self, step: int, timestamp: int) -> bool:
        """Whether an entry logged at ``timestamp`` for ``step`` belongs to the abandoned part."""
        return timestamp < self.time_ms and step >= self.step

    def to_tag(self) -> str:
        """The marker as the JSON value of its ``resume.<k>`` tag."""
        return json.dumps(asdict(self))

    @classmethod
    def from_tag(cls, value: str) -> Resume:
        """The marker a ``resume.<k>`` tag holds.

        Raises:
            ValueError: the value is not a marker's JSON.
        """
        fields = json.loads(value)
        if not isinstance(fields, dict):
            raise ValueError(f"a resume marker is a JSON object, not {value!r}")
        return cls(int(fields["step"]), int(fields["time_ms"]), fields.get("previous_status"))


def _marker_tags(tags: Mapping[str, str]) -> dict[int, Resume]:
    """The resume markers among a run's tags, by their index ``k`` (unreadable ones skipped)."""
    markers: dict[int, Resume] = {}
    for key, value in tags.items():
        index = key[len(RESUME_TAG) :]
        if not key.startswith(RESUME_TAG) or not index.isdigit():
            continue
        try:
            markers[int(index)] = Resume.from_tag(value)
        except (ValueError, KeyError, TypeError):
            continue
    return markers


def resume_markers(tags: Mapping[str, str]) -> list[Resume]:
    """A run's resume markers, oldest first, from its tags ``resume.1``, ``resume.2``, ...

    Example:
        >>> tags = {"resume.2": '{"step": 7, "time_ms": 20}', "loss": "FocalLoss",
        ...         "resume.1": '{"step": 4, "time_ms": 10, "previous_status": "KILLED"}'}
        >>> [(r.step, r.previous_status) for r in resume_markers(tags)]
        [(4, 'KILLED'), (7, None)]
    """
    markers = _marker_tags(tags)
    return [markers[index] for index in sorted(markers)]


def cut_history(metrics: Iterable[Metric], resumes: Sequence[Resume] = ()) -> list[Metric]:
    """One entry per step: a metric's raw MLflow history with the run's resumes applied.

    Each resume, oldest first, drops the entries logged before its time at steps ``>=`` its
    step; of the entries left at one step, the latest (by timestamp; on a tie, the later in
    ``metrics``) is kept. The result is sorted by step.

    Example:
        >>> from mlflow.entities import Metric
        >>> raw = [Metric("g", 0.5, 10, 0), Metric("g", 0.99, 20, 1), Metric("g", 0.29, 40, 1)]
        >>> [(m.step, m.value) for m in cut_history(raw, [Resume(step=1, time_ms=30)])]
        [(0, 0.5), (1, 0.29)]
    """
    kept = list(metrics)
    for resume in resumes:
        kept = [m for m in kept if not resume.supersedes(m.step, m.timestamp)]
    latest: dict[int, Metric] = {}
    for metric in sorted(kept, key=lambda m: m.timestamp):  # stable: ties keep their order
        latest[metric.step] = metric
    return [latest[step] for step in sorted(latest)]


def metric_history(
    client: MlflowClient, run_id: str, key: str, resumes: Sequence[Resume] | None = None
) -> list[Metric]:
    """One value per step of a run's metric, as ``compare``, ``reproduce`` and the report read it.

    Args:
        client: an ``MlflowClient`` on the run's store.
        run_id: the run.
        key: the metric, e.g. ``"val/acc"``.
        resumes: the run's resume markers (default: read from its tags).

    Returns:
        :func:`cut_history` of ``client.get_metric_history(run_id, key)``: sorted by step, the
        values of abandoned attempts dropped. A raw reader gets the same by dropping, for each
        ``resume.<k>`` tag in order, the entries with ``timestamp < time_ms`` and
        ``step >= step``, then keeping the latest entry per step.
    """
    if resumes is None:
        resumes = resume_markers(client.get_run(run_id).data.tags)
    return cut_history(client.get_metric_history(run_id, key), resumes)


def final_metrics(client: MlflowClient, run: Run) -> dict[str, float]:
    """The last value (at the highest step left) of every metric of a run, resumes applied.

    MLflow's ``run.data.metrics`` holds, per key, the value at the highest step whichever
    attempt logged it: after a resume from an earlier checkpoint the abandoned attempt's
    later steps would win. This reads :func:`metric_history` instead when the run has resume
    markers (and is ``run.data.metrics`` when it has none); a key whose every entry was
    superseded is left out.
    """
    resumes = resume_markers(run.data.tags)
    if not resumes:
        return dict(run.data.metrics)
    final: dict[str, float] = {}
    for key in run.data.metrics:
        history = metric_history(client, run.info.run_id, key, resumes)
        if history:
            final[key] = history[-1].value
    return final
