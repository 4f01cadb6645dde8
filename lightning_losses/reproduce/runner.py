"""Fit a variant (:func:`lightning_losses.cli.fit.run_fit`) or reuse its run; log post-fit metrics.

Each run is tagged ``claim``, ``variant``, ``seed``, ``epochs``, ``variant_fingerprint``, the
code version that made it (``lightning_losses.code_version``, see
:mod:`~lightning_losses.reproduce.version`) and, once the metrics computed after fit are
logged, ``reproduce_complete=1``; :func:`find_run` looks a run up by these tags with
``MlflowClient.search_runs``, so a finished run of the same code is never trained again, and a
run of other code is never reused.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from lightning_losses.functional.evaluation import correct_terms, task_accuracy, task_nll
from lightning_losses.reproduce import version
from lightning_losses.reproduce.spec import Claim, Variant, config_path

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

#: Prefix of the metrics logged after fit (computed on the fitted model's predictions).
PREFIX = "rep/"
#: Tag set once a run's post-fit metrics are all logged.
COMPLETE_TAG = "reproduce_complete"
#: Bins of the test reliability diagram.
N_BINS = 15
#: Artifact holding the test reliability bins.
BINS_ARTIFACT = "reproduce/test_bins.json"
#: Artifact holding the test reliability bins after temperature scaling (multiclass).
SCALED_BINS_ARTIFACT = "reproduce/test_bins_scaled.json"
#: The test-NLL curve logged during training by :class:`~lightning_losses.callbacks.SplitCurves`.
TEST_NLL_CURVE = "curve/test_nll"
#: Artifact holding the rare class's test precision-recall curve (binary tasks).
PR_ARTIFACT = "reproduce/test_pr_curve.json"
#: Most points kept of a precision-recall curve.
PR_POINTS = 200
#: Precision at which the rare class's recall is read.
RECALL_AT_PRECISION = 0.9


def client_for(tracking_uri: str) -> MlflowClient:
    """An ``MlflowClient`` on ``tracking_uri``."""
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri)


def run_tags(claim: Claim, variant: Variant, seed: int, epochs: int) -> dict[str, str]:
    """The tags that identify a run of ``variant`` with ``seed`` and ``epochs``.

    ``variant_fingerprint`` (:meth:`Variant.fingerprint`) ties the run to the variant's config
    text and overrides, so an edited experiment is not answered with stale runs;
    ``lightning_losses.code_version`` (:func:`~lightning_losses.reproduce.version.code_version`)
    ties it to the package's code, so a run of other code is not either.
    """
    return {
        "claim": str(claim.number),
        "variant": variant.name,
        "seed": str(seed),
        "epochs": str(epochs),
        "variant_fingerprint": variant.fingerprint(),
        version.CODE_VERSION_TAG: version.code_version(),
    }


def _clauses(tags: dict[str, str], since_ms: int | None) -> str:
    """The filter of ``search_runs`` for complete runs with these tags.

    Keys are quoted (they may hold dots); runs started at or after ``since_ms`` when given.
    """
    clauses = [f"tags.`{key}` = '{value}'" for key, value in {**tags, COMPLETE_TAG: "1"}.items()]
    if since_ms is not None:
        clauses.append(f"attributes.start_time >= {int(since_ms)}")
    return " and ".join(clauses)


def find_run(
    client: MlflowClient, experiment: str, tags: dict[str, str], since_ms: int | None = None
) -> str | None:
    """Run id of a complete run of ``experiment`` with exactly these tags, else None.

    ``since_ms`` (milliseconds since the epoch, as MLflow's start times): only a run started
    at or after it counts (``reproduce --fresh``: a run of this invocation).
    """
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return None
    runs = client.search_runs(
        [found.experiment_id],
        filter_string=_clauses(tags, since_ms),
        order_by=["attributes.start_time DESC"],
        max_results=1,
    )
    return runs[0].info.run_id if runs else None


def find_equivalent_run(
    client: MlflowClient, tags: dict[str, str], since_ms: int | None = None
) -> str | None:
    """A complete run of any claim with the same config, overrides, seed, epochs and code.

    Two claims may share an arm (claim 8's cross-entropy CNN is claim 7's CNN): the run is
    found by ``variant_fingerprint``, ``seed``, ``epochs`` and the code version, whatever its
    claim and variant name, and reused instead of trained twice. ``since_ms`` as in
    :func:`find_run`.
    """
    keys = ("variant_fingerprint", "seed", "epochs", version.CODE_VERSION_TAG)
    experiments = [e.experiment_id for e in client.search_experiments()]
    if not experiments:
        return None
    runs = client.search_runs(
        experiments,
        filter_string=_clauses({key: tags[key] for key in keys}, since_ms),
        order_by=["attributes.start_time DESC"],
        max_results=1,
    )
    return runs[0].info.run_id if runs else None


def runs_folder(tracking_uri: str, out: Path) -> Path:
    """Where the runs keep their files (checkpoints, artifacts such as the test bins).

    Beside the database for a SQLite store (``sqlite:///runs/mlflow.db`` -> ``runs/mlflow_runs``),
    so that the runs outlive the report folder; ``<out>/mlflow_runs`` for a server, which keeps
    its own artifacts.

    Example:
        >>> runs_folder("sqlite:///runs/mlflow.db", Path("reports")).as_posix()
        'runs/mlflow_runs'
    """
    if tracking_uri.startswith("sqlite:///"):
        return Path(tracking_uri.removeprefix("sqlite:///")).parent / "mlflow_runs"
    return out / "mlflow_runs"


def fit_args(
    claim: Claim, variant: Variant, seed: int, epochs: int, tracking_uri: str, out: Path
) -> list[str]:
    """The options of ``lightning-losses fit`` for one run (config, overrides, budget, tracking)."""
    tags = json.dumps(run_tags(claim, variant, seed, epochs))
    return [
        "--config",
        config_path(variant.config),
        *variant.overrides,
        f"--seed_everything={seed}",
        f"--data.init_args.seed={seed}",
        f"--trainer.max_epochs={epochs}",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        f"--trainer.logger.init_args.tracking_uri={tracking_uri}",
        f"--trainer.logger.init_args.experiment_name={claim.experiment}",
        f"--trainer.logger.init_args.run_name={variant.name}-s{seed}",
        f"--trainer.logger.init_args.save_dir={runs_folder(tracking_uri, out)}",
        "--trainer.logger.init_args.log_model=false",
        f"--trainer.logger.init_args.tags={tags}",
    ]


@torch.no_grad()
def predict_logits(model: torch.nn.Module, datamodule: Any, split: str) -> tuple[Any, Any]:
    """Logits and targets of the fitted model on one split of the DataModule."""
    model.eval()
    features, target = datamodule.dataset(split).tensors
    return model(features.to(model.device)).float().cpu(), target


def multiclass_metrics(logits: torch.Tensor, target: torch.Tensor) -> dict[str, float]:
    """Accuracy, NLL, ECE, Brier, mean confidence and confidence - accuracy of top-1."""
    from lightning_losses.calibration import brier_score, calibration_error, negative_log_likelihood

    probs = torch.softmax(logits, dim=1)
    accuracy = float(task_accuracy(logits, target, "multiclass"))
    confidence = float(probs.max(1).values.mean())
    nll = negative_log_likelihood(logits, target, input_format="logits", task="multiclass")
    ece = calibration_error(logits, target, n_bins=N_BINS, input_format="logits", task="multiclass")
    brier = brier_score(logits, target, input_format="logits", task="multiclass")
    return {
        "acc": accuracy,
        "nll": float(nll),
        "ece": float(ece),
        "brier": float(brier),
        "conf_gap": confidence - accuracy,
    }


def binary_metrics(logits: torch.Tensor, target: torch.Tensor) -> dict[str, float]:
    """Rare-class PR-AUC, F1 at 0.5, recall at precision >= 0.9, ECE and NLL (sklearn)."""
    from sklearn.metrics import average_precision_score, f1_score, precision_recall_curve

    from lightning_losses.calibration import calibration_error

    y = target.float().numpy()
    score = torch.sigmoid(logits).numpy()
    precision, recall, _ = precision_recall_curve(y, score)
    reachable = recall[precision >= RECALL_AT_PRECISION]
    return {
        "pr_auc": float(average_precision_score(y, score)),
        "f1": float(f1_score(y, score > 0.5, zero_division=0)),
        "recall_at_p90": float(reachable.max()) if reachable.size else 0.0,
        "ece": float(
            calibration_error(logits, target.float(), n_bins=N_BINS, input_format="logits")
        ),
        "nll": float(task_nll(logits, target, "binary")),
        "acc": float(correct_terms(logits, target, "binary").double().mean()),
    }


def nm_metrics(logits: torch.Tensor, target: torch.Tensor) -> dict[str, float]:
    """How often the target ranks first in each task, and the softmax NLL per task."""
    return {
        "acc": float(task_accuracy(logits, target, "nm")),
        "nll": float(task_nll(logits, target, "nm")),
    }


SPLIT_METRICS = {"multiclass": multiclass_metrics, "binary": binary_metrics, "nm": nm_metrics}


def reliability_bins(logits: torch.Tensor, target: torch.Tensor) -> dict[str, list[float]]:
    """Equal-width reliability bins of the top label on the test split."""
    from lightning_losses.calibration.functional import binned_statistics, confidence_and_correct

    confidence, correct = confidence_and_correct(logits, target, input_format="logits")
    count, conf_sum, correct_sum = binned_statistics(confidence, correct, N_BINS)
    return {"count": count.tolist(), "conf_sum": conf_sum.tolist(), "correct": correct_sum.tolist()}


def pr_curve(logits: torch.Tensor, target: torch.Tensor) -> dict[str, list[float]]:
    """The rare class's precision-recall curve (sklearn), at most ``PR_POINTS`` points."""
    from sklearn.metrics import precision_recall_curve

    precision, recall, _ = precision_recall_curve(
        target.float().numpy(), torch.sigmoid(logits).numpy()
    )
    keep = np.unique(np.linspace(0, len(recall) - 1, min(len(recall), PR_POINTS)).round())
    keep = keep.astype(int)
    return {"precision": precision[keep].tolist(), "recall": recall[keep].tolist()}


def post_fit_metrics(model: Any, datamodule: Any) -> tuple[dict[str, float], dict[str, Any]]:
    """Metrics of the fitted model on test, val and train, plus test artifacts.

    Keys: ``test_<m>``, ``val_<m>``, ``train_<m>``, ``nll_gap`` (val NLL - train NLL) and
    ``scale`` (the cosine head's final scale) where the model has one. For multiclass models
    also the temperature ``T`` fitted on the validation split
    (:func:`~lightning_losses.calibration.scaling.fit_temperature`) as ``temperature`` and the
    test metrics of ``logits / T`` as ``ts_test_<m>``. A DataModule with ``extra_splits``
    (MNIST-1D's published test split beside a generated test set: ``published_test``) gets
    ``<split>_<m>`` of those too. Artifacts, by path: the test reliability bins before and
    after scaling (multiclass) or the test precision-recall curve (binary).
    """
    compute = SPLIT_METRICS[model.task]
    metrics: dict[str, float] = {}
    artifacts: dict[str, Any] = {}
    logits_of = {}
    for split in ("test", "val", "train", *getattr(datamodule, "extra_splits", ())):
        logits, target = predict_logits(model, datamodule, split)
        logits_of[split] = (logits, target)
        metrics.update({f"{split}_{k}": v for k, v in compute(logits, target).items()})
        if split == "test" and model.task == "multiclass":
            artifacts[BINS_ARTIFACT] = reliability_bins(logits, target)
        if split == "test" and model.task == "binary":
            artifacts[PR_ARTIFACT] = pr_curve(logits, target)
    if model.task == "multiclass":
        from lightning_losses.calibration.scaling import fit_temperature

        temperature = fit_temperature(*logits_of["val"])
        scaled = logits_of["test"][0] / temperature
        target = logits_of["test"][1]
        metrics["temperature"] = temperature
        metrics.update({f"ts_test_{k}": v for k, v in compute(scaled, target).items()})
        artifacts[SCALED_BINS_ARTIFACT] = reliability_bins(scaled, target)
    metrics["nll_gap"] = metrics["val_nll"] - metrics["train_nll"]
    scale = getattr(model.head, "scale", None)
    if scale is not None:
        metrics["scale"] = float(scale)
    return metrics, artifacts


def log_post_fit(
    client: MlflowClient,
    run_id: str,
    metrics: dict[str, float],
    artifacts: dict[str, Any],
    tags: dict[str, str],
) -> None:
    """Log the post-fit metrics (``rep/...``) and artifacts into the run, then mark it complete.

    The identifying ``tags`` are set again, as the strings :func:`find_run` searches for: on
    the command line a fingerprint such as ``247691913e07`` is read as the number
    ``2.47691913e+15`` and stored so, and the run would never be found for reuse.
    """
    for key, value in metrics.items():
        client.log_metric(run_id, PREFIX + key, value if math.isfinite(value) else float("nan"))
    for path, content in artifacts.items():
        client.log_dict(run_id, content, path)
    for key, tag in tags.items():
        client.set_tag(run_id, key, tag)
    client.set_tag(run_id, COMPLETE_TAG, "1")


def train_variant(
    claim: Claim, variant: Variant, seed: int, epochs: int, tracking_uri: str, out: Path
) -> str:
    """Fit one run (:func:`~lightning_losses.cli.fit.run_fit`), log its post-fit metrics; its id."""
    from lightning.pytorch.loggers import MLFlowLogger

    from lightning_losses.cli.fit import run_fit

    cli = run_fit(fit_args(claim, variant, seed, epochs, tracking_uri, out))
    logger = cli.trainer.logger
    if not isinstance(logger, MLFlowLogger) or logger.run_id is None:
        raise TypeError(
            f"the config {variant.config!r} must log to MLflow (trainer.logger an MLFlowLogger "
            f"such as lightning_losses.tracking.TrackingLogger); got {type(logger).__name__}"
        )
    run_id = logger.run_id
    metrics, artifacts = post_fit_metrics(cli.model, cli.datamodule)
    client = client_for(tracking_uri)
    metrics.update(curve_summary(client, run_id))
    log_post_fit(client, run_id, metrics, artifacts, run_tags(claim, variant, seed, epochs))
    return run_id


def curve_summary(client: MlflowClient, run_id: str) -> dict[str, float]:
    """The test-NLL curve's minimum and how far the last value rose above it.

    ``test_nll_min`` and ``test_nll_rise`` (last - minimum, ``>= 0``) of
    :data:`TEST_NLL_CURVE`, read back from the run; nothing when the run has no such curve.
    """
    from lightning_losses.tracking import metric_history

    history = [m.value for m in metric_history(client, run_id, TEST_NLL_CURVE)]
    if not history:
        return {}
    return {"test_nll_min": min(history), "test_nll_rise": history[-1] - min(history)}


def run_or_reuse(
    claim: Claim,
    variant: Variant,
    seed: int,
    scale: float,
    tracking_uri: str,
    out: Path,
    since_ms: int | None = None,
) -> tuple[str, bool]:
    """Run id of ``variant`` with ``seed``: an existing complete run, else a new one.

    An existing run counts only with the same tags (:func:`run_tags`: the same config,
    overrides, seed, epochs and code version) and, with ``since_ms``, only when it started at
    or after it (``reproduce --fresh`` passes the start of the invocation).

    Returns:
        ``(run_id, reused)``.
    """
    epochs = variant.scaled_epochs(scale)
    client = client_for(tracking_uri)
    tags = run_tags(claim, variant, seed, epochs)
    found = find_run(client, claim.experiment, tags, since_ms) or find_equivalent_run(
        client, tags, since_ms
    )
    if found is not None:
        return found, True
    return train_variant(claim, variant, seed, epochs, tracking_uri, out), False


def read_code_version(client: MlflowClient, run_id: str) -> str:
    """The ``lightning_losses.code_version`` tag of a run (``unknown`` when it has none)."""
    return client.get_run(run_id).data.tags.get(version.CODE_VERSION_TAG, "unknown")


def read_metrics(client: MlflowClient, run_id: str) -> dict[str, float]:
    """Final value of every metric of a run, from its one-value-per-step history.

    :func:`lightning_losses.tracking.final_metrics`: a resumed run's abandoned steps are
    left out.
    """
    from lightning_losses.tracking import final_metrics

    return final_metrics(client, client.get_run(run_id))


def run_seconds(client: MlflowClient, run_id: str) -> float:
    """Wall time of a run from its MLflow start and end times (0 while it has no end)."""
    info = client.get_run(run_id).info
    if not info.end_time or not info.start_time:
        return 0.0
    return (info.end_time - info.start_time) / 1000.0


def read_json(client: MlflowClient, run_id: str, artifact: str, folder: Path) -> dict | None:
    """A JSON artifact of a run (``BINS_ARTIFACT``, ``PR_ARTIFACT``), or None if it has none."""
    try:
        path = client.download_artifacts(run_id, artifact, str(folder))
    except Exception:  # e.g. bins of a binary run, or a run logged before the artifact existed
        return None
    return json.loads(Path(path).read_text())


def as_array(values: Any) -> np.ndarray:
    """A float64 numpy array."""
    return np.asarray(values, dtype=np.float64)
