"""Claim 9's measure across runs: each run's continuations scored by its reference run's model.

Each variant has a reference variant (claim 9: the cross-entropy arm of its own model, ``ce``
for the tiny Transformer and ``hf_ce`` for the Llama-architecture model), and a run's reference
run is that variant's run of the same seed. The share of a run's generated tokens to which the
reference's model gives a probability below
:data:`~lightning_losses.reproduce.language_model.LOW_PROBABILITY` is a proxy for the mass that
run puts on text the data does not support. The score needs both runs finished, so it is taken
after all of a claim's runs (:attr:`~lightning_losses.reproduce.spec.Claim.after_runs`), logged
into each run as ``rep/<reference>_lowprob_<decoding>``
(:func:`~lightning_losses.reproduce.language_model.low_probability_key`: the name says which
reference), and the run tagged with the reference run's id: a later pass scores only runs whose
reference changed.

Token ids mean something only under the tokenizer that made them: a run whose data settings
(:func:`tokenizer_settings`) differ from its reference's is refused, not scored.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mlflow.tracking import MlflowClient

from lightning_losses.reproduce.language_model import CONTINUATIONS_ARTIFACT, reference_metrics
from lightning_losses.reproduce.runner import (
    _moved_class_paths,
    client_for,
    load_fitted_run,
    log_post_fit,
    read_json,
    runs_folder,
)

#: Tag naming the run whose model scored a run's continuations.
REFERENCE_TAG = "lowprob_reference_run"
#: Data settings that change neither the tokenizer nor the test text (loaders and windows).
LOADER_SETTINGS = frozenset({"batch_size", "num_workers", "context_length", "tokenizer_cache"})


def score_under_reference(
    runs: dict[tuple[str, int], str],
    tracking_uri: str,
    out: Path,
    references: Mapping[str, str],
) -> int:
    """Score every run's continuations under its reference variant's model of the same seed.

    Logs ``<reference>_lowprob_greedy`` and ``<reference>_lowprob_sampled`` (post-fit metrics,
    ``rep/`` prefix) into each run of ``runs`` whose :data:`REFERENCE_TAG` is not already its
    reference run. A reference variant mapped to itself has its own runs scored too (their
    share under themselves).

    Args:
        runs: ``{(variant, seed): run id}``.
        tracking_uri: the MLflow store of the runs.
        out: the report folder (where a server's runs keep their files).
        references: ``{variant: reference variant}``; runs of variants not in it, and seeds
            without a run of the reference, are left alone.

    Returns:
        How many runs were scored.

    Raises:
        ValueError: a run whose text was tokenized otherwise than its reference's
            (:func:`tokenizer_settings` differ).
    """
    client = client_for(tracking_uri)
    folder = runs_folder(tracking_uri, out)
    scored = 0
    for (reference, seed), todo in pending_runs(client, runs, references).items():
        scored += _score_runs(client, folder, reference, runs[(reference, seed)], todo)
    return scored


def pending_runs(
    client: MlflowClient, runs: dict[tuple[str, int], str], references: Mapping[str, str]
) -> dict[tuple[str, int], list[str]]:
    """The runs to score, by ``(reference variant, seed)``, in the order of ``runs``' keys.

    A run is pending when its variant has a reference, the reference has a run of the same
    seed, and the run's :data:`REFERENCE_TAG` is not that run's id.
    """
    pending: dict[tuple[str, int], list[str]] = {}
    for (variant, seed), run_id in sorted(runs.items()):
        reference = references.get(variant)
        reference_id = None if reference is None else runs.get((reference, seed))
        if reference is None or reference_id is None:
            continue
        if client.get_run(run_id).data.tags.get(REFERENCE_TAG) != reference_id:
            pending.setdefault((reference, seed), []).append(run_id)
    return pending


def run_folder(client: MlflowClient, folder: Path, run_id: str) -> Path:
    """``<folder>/<experiment id>/<run id>``: where a run's fit saved its config and checkpoints."""
    return folder / client.get_run(run_id).info.experiment_id / run_id


def tokenizer_settings(folder: Path) -> dict[str, Any]:
    """What decides a run's token ids: its ``config.yaml``'s DataModule and data settings.

    The ``data`` section's class path and arguments but :data:`LOADER_SETTINGS`; two runs
    with the same settings have the same tokenizer, splits and test text.

    Raises:
        FileNotFoundError: the run folder has no ``config.yaml``.
    """
    import yaml

    path = folder / "config.yaml"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing: scoring a run's continuations under another run's model needs "
            "the config.yaml its fit saved beside the MLflow store"
        )
    data = _moved_class_paths(yaml.safe_load(path.read_text())).get("data") or {}
    arguments = data.get("init_args") or {}
    kept = {key: value for key, value in arguments.items() if key not in LOADER_SETTINGS}
    return {"class_path": data.get("class_path"), **kept}


def check_same_tokenizer(
    run_id: str, settings: dict[str, Any], reference_id: str, reference: dict[str, Any]
) -> None:
    """Refuse a run whose :func:`tokenizer_settings` differ from its reference run's.

    Raises:
        ValueError: naming each setting that differs.
    """
    keys = sorted(set(settings) | set(reference))
    differences = [
        f"{key}: {settings.get(key)!r} against {reference.get(key)!r}"
        for key in keys
        if settings.get(key) != reference.get(key)
    ]
    if differences:
        raise ValueError(
            f"run {run_id} cannot be scored under the model of run {reference_id}: their data "
            f"settings differ ({'; '.join(differences)}), so its token ids are other tokens "
            "under that model; map each variant to the cross-entropy variant of its own model "
            "and tokenizer"
        )


def _score_runs(
    client: MlflowClient, folder: Path, reference: str, reference_id: str, todo: list[str]
) -> int:
    """Score ``todo``'s continuations under the model of ``reference_id``; how many were."""
    reference_folder = run_folder(client, folder, reference_id)
    model, _ = load_fitted_run(reference_folder)
    expected = tokenizer_settings(reference_folder)
    scored = 0
    with tempfile.TemporaryDirectory() as scratch:
        for run_id in todo:
            texts = read_json(client, run_id, CONTINUATIONS_ARTIFACT, Path(scratch))
            if texts is None:  # not a language-model run
                continue
            settings = tokenizer_settings(run_folder(client, folder, run_id))
            check_same_tokenizer(run_id, settings, reference_id, expected)
            metrics = reference_metrics(model, texts, reference)
            log_post_fit(client, run_id, metrics, {}, {REFERENCE_TAG: reference_id})
            scored += 1
    return scored
