"""Fit a variant (:func:`lightning_losses.cli.fit.run_fit`) or reuse its run; log post-fit metrics.

Each run is tagged ``claim``, ``variant``, ``seed``, ``epochs``, ``variant_fingerprint``, the
code version that made it (``lightning_losses.code_version``, see
:mod:`~lightning_losses.reproduce.version`) and, once the metrics computed after fit are
logged, ``reproduce_complete=1``; :func:`find_run` looks a run up by these tags with
``MlflowClient.search_runs``, so a finished run of the same code is never trained again, and a
run of other code is never reused.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import torch

from lightning_losses.functional.evaluation import correct_terms, task_accuracy, task_nll
from lightning_losses.reproduce import version
from lightning_losses.reproduce.bins import (
    BINS_ARTIFACT,
    N_BINS,
    SCALED_BINS_ARTIFACT,
    reliability_bins,
)
from lightning_losses.reproduce.spec import PROGRAMS, Claim, Variant, config_path

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

#: Prefix of the metrics logged after fit (computed on the fitted model's predictions).
PREFIX = "rep/"
#: Tag set once a run's post-fit metrics are all logged.
COMPLETE_TAG = "reproduce_complete"
#: The test-NLL curve logged during training by :class:`~lightning_losses.callbacks.SplitCurves`.
TEST_NLL_CURVE = "curve/test_nll"
#: Artifact holding the rare class's test precision-recall curve (binary tasks).
PR_ARTIFACT = "reproduce/test_pr_curve.json"
#: Most points kept of a precision-recall curve.
PR_POINTS = 200
#: Precision at which the rare class's recall is read.
RECALL_AT_PRECISION = 0.9
#: Prefix of the post-hoc arms' metrics (``ph_<method>_test_<m>``, ``ph_best_test_<m>``...).
POSTHOC_PREFIX = "ph_"
#: Tag naming the post-hoc method chosen on the validation split by cross-validated NLL.
POSTHOC_BEST_TAG = "ph_best_method"
#: Floor of a calibrated probability of the true class in the post-hoc arms' NLL.
NLL_FLOOR = 1e-12
#: Folds of that choice (:func:`~lightning_losses.calibration.posthoc.select_calibrator`).
POSTHOC_FOLDS = 5
#: Metrics logged in one ``log_batch`` call (MLflow takes at most 1,000).
METRICS_PER_BATCH = 500
#: Tag of a run whose post-fit metrics a later code version completed (``--post-fit-only``).
POST_FIT_VERSION_TAG = "lightning_losses.post_fit_code_version"
#: Post-fit metrics that later code added, by program (:data:`~.spec.PROGRAMS`) and by the
#: metric marking the runs that get them: a multiclass run (it has ``temperature``) gets the
#: post-hoc arms (``ph_best_test_ece``...); the language model's metrics have all been there
#: since its first run.
ADDED_POST_FIT: dict[str, dict[str, str]] = {
    "classifier": {"temperature": "ph_best_test_ece"},
    "lm": {},
}


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


def probability_metrics(probs: torch.Tensor, target: torch.Tensor) -> dict[str, float]:
    """:func:`multiclass_metrics` of calibrated probabilities ``[N, C]`` (float64).

    A calibrator may give a class the probability 0 (histogram binning, isotonic regression),
    which no logit does: the NLL floors each ``p_y`` at :data:`NLL_FLOOR` (a sample with
    ``p_y = 0`` adds ``-log 1e-12 = 27.6``), so that it stays finite and comparable.

    Example:
        >>> probs = torch.tensor([[0.8, 0.2, 0.0], [0.5, 0.5, 0.0]], dtype=torch.float64)
        >>> m = probability_metrics(probs, torch.tensor([0, 2]))
        >>> m["acc"], round(m["nll"], 4), round(m["conf_gap"], 2)
        (0.5, 13.9271, 0.15)
    """
    from lightning_losses.calibration import brier_score, calibration_error

    confidence, predicted = probs.max(dim=1)
    accuracy = float((predicted == target).double().mean())
    picked = probs.gather(1, target[:, None].long())[:, 0]
    return {
        "acc": accuracy,
        "nll": float(-picked.clamp_min(NLL_FLOOR).log().mean()),
        "ece": float(
            calibration_error(probs, target, n_bins=N_BINS, input_format="probs", task="multiclass")
        ),
        "brier": float(brier_score(probs, target, input_format="probs", task="multiclass")),
        "conf_gap": float(confidence.mean()) - accuracy,
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


def pr_curve(logits: torch.Tensor, target: torch.Tensor) -> dict[str, list[float]]:
    """The rare class's precision-recall curve (sklearn), at most ``PR_POINTS`` points."""
    from sklearn.metrics import precision_recall_curve

    precision, recall, _ = precision_recall_curve(
        target.float().numpy(), torch.sigmoid(logits).numpy()
    )
    keep = np.unique(np.linspace(0, len(recall) - 1, min(len(recall), PR_POINTS)).round())
    keep = keep.astype(int)
    return {"precision": precision[keep].tolist(), "recall": recall[keep].tolist()}


def posthoc_methods(num_classes: int) -> list[str]:
    """The registry's post-hoc methods that apply to ``num_classes`` classes (in its order).

    Example:
        >>> "beta" in posthoc_methods(2), "beta" in posthoc_methods(10)
        (True, False)
    """
    from lightning_losses.calibration.posthoc import CALIBRATION_METHODS, get_calibrator

    methods = []
    for method in CALIBRATION_METHODS:
        try:
            get_calibrator(method).check_classes(num_classes)
        except ValueError:  # e.g. beta calibration: binary tasks only
            continue
        methods.append(method)
    return methods


def posthoc_metrics(
    val: tuple[torch.Tensor, torch.Tensor], test: tuple[torch.Tensor, torch.Tensor]
) -> tuple[dict[str, float], dict[str, str]]:
    """Every post-hoc method fitted on the validation logits, scored on the test split.

    For each method of :func:`posthoc_methods` (fitted on ``val``, its default
    hyper-parameters): ``ph_<method>_test_<m>`` (the multiclass metrics of its calibrated
    log-probabilities on ``test``), ``ph_<method>_fallback`` (1 when the fit fell back to the
    identity, e.g. fewer validation samples than parameters; its warning is replaced by this
    number) and ``ph_<method>_cv_nll`` (its cross-validated NLL on ``val``,
    :data:`POSTHOC_FOLDS` folds). The method
    :func:`~lightning_losses.calibration.posthoc.select_calibrator` chooses by that NLL (the
    identity ``none`` included) gives ``ph_best_test_<m>``, ``ph_best_cv_nll`` and
    ``ph_<method>_chosen`` (1 for the chosen one, else 0), and its name is the tag
    :data:`POSTHOC_BEST_TAG`.

    Returns:
        ``(metrics, tags)``.
    """
    import warnings

    from lightning_losses.calibration.posthoc import get_calibrator, select_calibrator
    from lightning_losses.warning import LightningLossesWarning

    (val_logits, val_target), (test_logits, test_target) = val, test
    methods = posthoc_methods(val_logits.shape[1])
    metrics: dict[str, float] = {}

    def scored(name: str, calibrator: Any) -> None:
        with torch.no_grad():
            probs = calibrator(test_logits.double()).exp()
        metrics.update(
            {
                f"{POSTHOC_PREFIX}{name}_test_{k}": v
                for k, v in probability_metrics(probs, test_target).items()
            }
        )

    with warnings.catch_warnings():  # a fallback is logged as ph_<method>_fallback instead
        warnings.simplefilter("ignore", LightningLossesWarning)
        for method in methods:
            calibrator = get_calibrator(method).fit(val_logits, val_target)
            scored(method, calibrator)
            metrics[f"{POSTHOC_PREFIX}{method}_fallback"] = float(bool(calibrator.fallback))
        choice = select_calibrator(
            [get_calibrator(m) for m in methods], val_logits, val_target, folds=POSTHOC_FOLDS
        )
    scored("best", choice.calibrator)
    for method in methods:
        metrics[f"{POSTHOC_PREFIX}{method}_cv_nll"] = choice.scores[method]
        metrics[f"{POSTHOC_PREFIX}{method}_chosen"] = float(choice.method == method)
    metrics[f"{POSTHOC_PREFIX}best_cv_nll"] = choice.scores[choice.method]
    return metrics, {POSTHOC_BEST_TAG: choice.method}


def post_fit_metrics(
    model: Any, datamodule: Any
) -> tuple[dict[str, float], dict[str, Any], dict[str, str]]:
    """Metrics of the fitted model on test, val and train, plus test artifacts and tags.

    Keys: ``test_<m>``, ``val_<m>``, ``train_<m>``, ``nll_gap`` (val NLL - train NLL) and
    ``scale`` (the cosine head's final scale) where the model has one. For multiclass models
    also the temperature ``T`` fitted on the validation split
    (:func:`~lightning_losses.calibration.posthoc.temperature.fit_temperature`) as
    ``temperature`` and the test metrics of ``logits / T`` as ``ts_test_<m>``, and the post-hoc
    arms of :func:`posthoc_metrics` (``ph_<method>_test_<m>``, ``ph_best_test_<m>``...). A
    DataModule with ``extra_splits`` (MNIST-1D's published test split beside a generated test
    set: ``published_test``) gets ``<split>_<m>`` of those too. Artifacts, by path: the test
    reliability bins before and after scaling (multiclass) or the test precision-recall curve
    (binary). Tags: the post-hoc method chosen (:data:`POSTHOC_BEST_TAG`, multiclass).
    """
    compute = SPLIT_METRICS[model.task]
    metrics: dict[str, float] = {}
    artifacts: dict[str, Any] = {}
    tags: dict[str, str] = {}
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
        from lightning_losses.calibration.posthoc.temperature import fit_temperature

        temperature = fit_temperature(*logits_of["val"])
        scaled = logits_of["test"][0] / temperature
        target = logits_of["test"][1]
        metrics["temperature"] = temperature
        metrics.update({f"ts_test_{k}": v for k, v in compute(scaled, target).items()})
        artifacts[SCALED_BINS_ARTIFACT] = reliability_bins(scaled, target)
        posthoc, tags = posthoc_metrics(logits_of["val"], logits_of["test"])
        metrics.update(posthoc)
    metrics["nll_gap"] = metrics["val_nll"] - metrics["train_nll"]
    scale = getattr(model.head, "scale", None)
    if scale is not None:
        metrics["scale"] = float(scale)
    return metrics, artifacts, tags


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
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    entries = [
        Metric(PREFIX + key, value if math.isfinite(value) else float("nan"), now, 0)
        for key, value in metrics.items()
    ]
    for start in range(0, len(entries), METRICS_PER_BATCH):  # one write per batch, not per value
        client.log_batch(run_id, metrics=entries[start : start + METRICS_PER_BATCH])
    for path, content in artifacts.items():
        client.log_dict(run_id, content, path)
    for key, tag in tags.items():
        client.set_tag(run_id, key, tag)
    client.set_tag(run_id, COMPLETE_TAG, "1")


#: A fit from command-line options (returns the finished LightningCLI), and the post-fit
#: metrics of its model and DataModule: ``(metrics, artifacts, tags)``.
Fit = Callable[[list[str]], Any]
Score = Callable[[Any, Any], tuple[dict[str, float], dict[str, Any], dict[str, str]]]


def program(name: str) -> tuple[Fit, Score]:
    """How a variant's config is fitted and scored, by its ``program`` (:data:`PROGRAMS`).

    ``classifier``: :func:`~lightning_losses.cli.fit.run_fit` and :func:`post_fit_metrics`;
    ``lm``: the language model's CLI and its held-out text metrics
    (:mod:`~lightning_losses.reproduce.language_model`).
    """
    if name == "lm":
        from lightning_losses.reproduce import language_model

        return language_model.run_fit, language_model.post_fit_metrics
    if name != "classifier":
        raise ValueError(f"program must be one of {', '.join(PROGRAMS)}; got {name!r}")
    from lightning_losses.cli.fit import run_fit

    return run_fit, post_fit_metrics


def train_variant(
    claim: Claim, variant: Variant, seed: int, epochs: int, tracking_uri: str, out: Path
) -> str:
    """Fit one run (:func:`~lightning_losses.cli.fit.run_fit`), log its post-fit metrics; its id."""
    from lightning.pytorch.loggers import MLFlowLogger

    fit, score = program(variant.program)
    cli = fit(fit_args(claim, variant, seed, epochs, tracking_uri, out))
    logger = cli.trainer.logger
    if not isinstance(logger, MLFlowLogger) or logger.run_id is None:
        raise TypeError(
            f"the config {variant.config!r} must log to MLflow (trainer.logger an MLFlowLogger "
            f"such as lightning_losses.tracking.TrackingLogger); got {type(logger).__name__}"
        )
    run_id = logger.run_id
    metrics, artifacts, tags = score(cli.model, cli.datamodule)
    client = client_for(tracking_uri)
    metrics.update(curve_summary(client, run_id))
    tags.update(run_tags(claim, variant, seed, epochs))
    log_post_fit(client, run_id, metrics, artifacts, tags)
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


class RunResult(NamedTuple):
    """What :func:`run_or_reuse` did with one variant and seed.

    ``run_id``: the run; ``reused``: an existing complete run; ``completed``: its missing
    post-fit metrics were computed from its checkpoint and logged by this call.
    """

    run_id: str
    reused: bool
    completed: bool = False


def run_or_reuse(
    claim: Claim,
    variant: Variant,
    seed: int,
    scale: float,
    tracking_uri: str,
    out: Path,
    since_ms: int | None = None,
    post_fit_only: bool = False,
    train_missing: bool = False,
) -> RunResult:
    """Run id of ``variant`` with ``seed``: an existing complete run, else a new one.

    An existing run counts only with the same tags (:func:`run_tags`: the same config,
    overrides, seed, epochs and code version) and, with ``since_ms``, only when it started at
    or after it (``reproduce --fresh`` passes the start of the invocation).

    ``post_fit_only`` (``reproduce --post-fit-only``) trains nothing: without a run of this
    code version, a complete run of another one is reused (:func:`find_trained_run`) and the
    post-fit metrics it lacks are computed from its last checkpoint
    (:func:`complete_post_fit`); without either, it raises ``LookupError``, unless
    ``train_missing`` (``reproduce --reuse-trained``), which trains the run then.

    Returns:
        ``RunResult(run_id, reused, completed)``: ``completed`` when a reused run's missing
        post-fit metrics were computed and logged by this call.
    """
    epochs = variant.scaled_epochs(scale)
    client = client_for(tracking_uri)
    tags = run_tags(claim, variant, seed, epochs)
    found = find_run(client, claim.experiment, tags, since_ms) or find_equivalent_run(
        client, tags, since_ms
    )
    if found is not None:
        return RunResult(found, True)
    if post_fit_only:
        found = find_trained_run(client, variant, seed, epochs)
        if found is None and train_missing:
            return RunResult(train_variant(claim, variant, seed, epochs, tracking_uri, out), False)
        if found is None:
            raise LookupError(
                f"--post-fit-only trains nothing, and no complete run of {variant.name} with "
                f"seed {seed} and {epochs} epochs (config {variant.config!r} and its overrides, "
                "in this layout or an earlier one) is in the store; run without "
                "--post-fit-only to train it"
            )
        folder = runs_folder(tracking_uri, out)
        completed = complete_post_fit(client, found, folder, variant.program)
        return RunResult(found, True, completed)
    return RunResult(train_variant(claim, variant, seed, epochs, tracking_uri, out), False)


#: Most spellings of a config tried by :func:`layout_fingerprints`.
MAX_LAYOUTS = 1 << 16


def _fingerprint(text: str, overrides: tuple[str, ...]) -> str:
    """:meth:`Variant.fingerprint` of a config text (SHA-1 of it and the overrides, 12 digits)."""
    digest = hashlib.sha1(text.encode())
    for override in overrides:
        digest.update(b"\0" + override.encode())
    return digest.hexdigest()[:12]


def layout_fingerprints(variant: Variant) -> set[str]:
    """The fingerprints of the variant's config as each earlier layout of the package spelt it.

    Its text with any of its class paths written as before a move of
    :data:`~lightning_losses.cli.moved.MOVED` (``lightning_losses.lightning.CNN1D`` was
    ``lightning_losses.backbones.CNN1D`` before 0.2.0), every combination, and the text as it
    is (:meth:`Variant.fingerprint`). A run whose ``variant_fingerprint`` is among them was
    made from this config and these overrides, with nothing changed but moved class paths.

    Example:
        >>> from lightning_losses.reproduce.claims import CLAIMS
        >>> cnn = CLAIMS[7].variant("cnn")
        >>> cnn.fingerprint() in layout_fingerprints(cnn)
        True
    """
    from lightning_losses.cli.moved import MOVED

    text = Path(config_path(variant.config)).read_text()
    paths = sorted(set(re.findall(r"class_path:\s*([\w.]+)", text)))
    spellings = [
        [path, *(old + path[len(new) :] for old, (new, _) in MOVED.items() if path.startswith(new))]
        for path in paths
    ]
    found = set()
    for spelling in itertools.islice(itertools.product(*spellings), MAX_LAYOUTS):
        written = text
        for path, old in zip(paths, spelling, strict=True):
            if old != path:
                pattern = r"(class_path:\s*)" + re.escape(path) + r"(?![\w.])"
                written = re.sub(pattern, _keep_prefix(old), written)
        found.add(_fingerprint(written, variant.overrides))
    return found


def find_trained_run(client: MlflowClient, variant: Variant, seed: int, epochs: int) -> str | None:
    """The newest complete run of ``variant`` with ``seed`` and ``epochs``, of any code version.

    The run may belong to any claim (as :func:`find_equivalent_run`); its
    ``variant_fingerprint`` must be one of :func:`layout_fingerprints`.
    """
    experiments = [e.experiment_id for e in client.search_experiments()]
    if not experiments:
        return None
    accepted = layout_fingerprints(variant)
    runs = client.search_runs(
        experiments,
        filter_string=_clauses({"seed": str(seed), "epochs": str(epochs)}, None),
        order_by=["attributes.start_time DESC"],
        max_results=1000,
    )
    for run in runs:
        if run.data.tags.get("variant_fingerprint") in accepted:
            return run.info.run_id
    return None


def _moved_class_paths(value: Any) -> Any:
    """``value`` (a config or hyper-parameters) with every moved ``class_path`` written anew."""
    from lightning_losses.cli.moved import MOVED

    if isinstance(value, list):
        return [_moved_class_paths(item) for item in value]
    if not isinstance(value, dict):
        return value
    moved = {key: _moved_class_paths(item) for key, item in value.items()}
    path = moved.get("class_path")
    if isinstance(path, str):
        for old, (new, _) in MOVED.items():
            if path.startswith(old):
                moved["class_path"] = new + path[len(old) :]
    return moved


def _keep_prefix(replacement: str) -> Callable[[re.Match[str]], str]:
    """A ``re.sub`` replacement: the match's first group, then ``replacement``."""

    def replace(match: re.Match[str]) -> str:
        return match[1] + replacement

    return replace


def _import_class(path: str) -> Any:
    from lightning_losses.lightning.class_path import import_path

    return import_path(path, argument="class_path of the run's config.yaml")


def load_fitted_run(folder: Path) -> tuple[Any, Any]:
    """The fitted model of a run folder (``checkpoints/last.ckpt``) and its DataModule.

    The DataModule is built from the run's ``config.yaml`` (its ``data`` section), the model
    from the checkpoint's hyper-parameters, both with moved class paths written anew.

    Raises:
        FileNotFoundError: the folder lacks ``config.yaml`` or ``checkpoints/last.ckpt``.
    """
    import yaml

    from lightning_losses.lightning.classifier import ClassifierModule

    config_file, checkpoint = folder / "config.yaml", folder / "checkpoints" / "last.ckpt"
    for path in (config_file, checkpoint):
        if not path.is_file():
            raise FileNotFoundError(
                f"{path} is missing: completing a run's post-fit metrics needs the config.yaml "
                "and the checkpoints/last.ckpt its fit saved beside the MLflow store"
            )
    config = _moved_class_paths(yaml.safe_load(config_file.read_text()))
    data = config["data"]
    datamodule = _import_class(data["class_path"])(**(data.get("init_args") or {}))
    model_class = config.get("model", {}).get("class_path")
    cls = _import_class(model_class) if model_class else ClassifierModule
    saved = torch.load(checkpoint, map_location="cpu", weights_only=True)
    hparams = _moved_class_paths(dict(saved.get("hyper_parameters") or {}))
    hparams.pop("_instantiator", None)
    model = cls.load_from_checkpoint(checkpoint, map_location="cpu", weights_only=True, **hparams)
    return model, datamodule


def needs_completion(stored: dict[str, float], program_name: str = "classifier") -> bool:
    """Whether a run of ``program_name`` lacks post-fit metrics this code adds (:data:`ADDED_POST_FIT`)."""  # noqa: E501
    return any(
        PREFIX + marker in stored and PREFIX + added not in stored
        for marker, added in ADDED_POST_FIT[program_name].items()
    )


def complete_post_fit(
    client: MlflowClient, run_id: str, folder: Path, program_name: str = "classifier"
) -> bool:
    """Log the post-fit metrics a run lacks, computed from its last checkpoint; whether it did.

    Nothing happens unless :func:`needs_completion`. The model of ``<folder>/<experiment
    id>/<run id>/checkpoints/last.ckpt`` (:func:`load_fitted_run`) is scored again by its
    program's post-fit metrics (:func:`program`; ``program_name`` is the variant's
    ``program``, :func:`post_fit_metrics` for a classifier); every metric the run already
    has must come out exactly as stored (the checkpoint holds the weights the run's numbers
    came from), else nothing is logged. Then the missing metrics and the new tags are logged, with
    :data:`POST_FIT_VERSION_TAG` set to this code version.

    Raises:
        ValueError: a recomputed metric differs from the stored one.
    """
    run = client.get_run(run_id)
    stored = read_metrics(client, run_id)
    if not needs_completion(stored, program_name):
        return False
    model, datamodule = load_fitted_run(folder / run.info.experiment_id / run_id)
    metrics, _, tags = program(program_name)[1](model, datamodule)
    differ = {
        key: (value, stored[PREFIX + key])
        for key, value in metrics.items()
        if PREFIX + key in stored and not _same(value, stored[PREFIX + key])
    }
    if differ:
        shown = "; ".join(
            f"{PREFIX}{k} {new!r} != stored {old!r}" for k, (new, old) in differ.items()
        )
        raise ValueError(
            f"run {run_id}: its last checkpoint does not reproduce its stored metrics "
            f"({shown}); its post-fit metrics are left as they are"
        )
    missing = {key: value for key, value in metrics.items() if PREFIX + key not in stored}
    tags[POST_FIT_VERSION_TAG] = version.code_version()
    log_post_fit(client, run_id, missing, {}, tags)
    return True


def _same(new: float, stored: float) -> bool:
    """Equal, or both not finite (a non-finite value is stored as NaN)."""
    return new == stored or (not math.isfinite(new) and math.isnan(stored))


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
