"""Claim 9's measure across runs: each run's continuations scored by a reference run's model.

Cross-entropy's model of the same seed is the reference: the share of a run's generated tokens
to which it gives a probability below
:data:`~lightning_losses.reproduce.language_model.LOW_PROBABILITY` is a proxy for the mass that
run puts on text the data does not support. The score needs both runs finished, so it is taken
after all of a claim's runs (:attr:`~lightning_losses.reproduce.spec.Claim.after_runs`), logged
into each run as ``rep/<reference>_lowprob_<decoding>``, and the run tagged with the reference
run's id: a later pass scores only runs whose reference changed.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from lightning_losses.reproduce.language_model import CONTINUATIONS_ARTIFACT, reference_metrics
from lightning_losses.reproduce.runner import (
    client_for,
    load_fitted_run,
    log_post_fit,
    read_json,
    runs_folder,
)

#: Tag naming the run whose model scored a run's continuations.
REFERENCE_TAG = "lowprob_reference_run"


def score_under_reference(
    runs: dict[tuple[str, int], str], tracking_uri: str, out: Path, reference: str = "ce"
) -> int:
    """Score every run's continuations under the ``reference`` variant's model of its seed.

    Logs ``<reference>_lowprob_greedy`` and ``<reference>_lowprob_sampled`` (post-fit metrics,
    ``rep/`` prefix) into each run of ``runs`` (``{(variant, seed): run id}``) whose
    :data:`REFERENCE_TAG` is not already the reference run; the reference's own runs are scored
    too (their share under themselves). Seeds without a reference run are left alone.

    Returns:
        How many runs were scored.
    """
    client = client_for(tracking_uri)
    folder = runs_folder(tracking_uri, out)
    scored = 0
    for seed in sorted({seed for _, seed in runs}):
        reference_id = runs.get((reference, seed))
        if reference_id is None:
            continue
        todo = [
            run_id
            for (_, run_seed), run_id in sorted(runs.items())
            if run_seed == seed
            and client.get_run(run_id).data.tags.get(REFERENCE_TAG) != reference_id
        ]
        if not todo:
            continue
        experiment = client.get_run(reference_id).info.experiment_id
        model, _ = load_fitted_run(folder / experiment / reference_id)
        with tempfile.TemporaryDirectory() as scratch:
            for run_id in todo:
                texts = read_json(client, run_id, CONTINUATIONS_ARTIFACT, Path(scratch))
                if texts is None:  # not a language-model run
                    continue
                metrics = {
                    f"{reference}_{key}": value
                    for key, value in reference_metrics(model, texts).items()
                }
                log_post_fit(client, run_id, metrics, {}, {REFERENCE_TAG: reference_id})
                scored += 1
    return scored
