"""The work of ``lightning-losses reproduce``: run or reuse each claim's fits, write the report.

Every variant of each claim runs (or is reused, by MLflow tags, among runs of the same code
version; ``--fresh``: among runs of this invocation only) for each seed, one MLflow
experiment per claim (``claim-3-gamma-ce``...); the numbers are read back from MLflow and
``<out>/REPORT.md`` gets a table (mean ± std over seeds), a verdict with the numbers it rests
on, the run ids, the figures and an appendix of every per-seed value. The command line is
parsed by the light :mod:`lightning_losses.reproduce.cli`, which imports this module (and
torch, MLflow) only once the arguments are known to be good.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
import traceback
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from lightning_losses.cli.quiet import fit_output_aside, silence_libraries, verbose_requested
from lightning_losses.reproduce import version
from lightning_losses.reproduce.claims import CLAIMS
from lightning_losses.reproduce.report import (
    ClaimResult,
    collect,
    curves_figure,
    metrics_figure,
    nll_curves_figure,
    pr_figure,
    reliability_figures,
    scale_figure,
    scaling_reliability_figures,
    write_report,
)
from lightning_losses.reproduce.runner import (
    COMPLETE_TAG,
    POST_FIT_VERSION_TAG,
    client_for,
    find_run,
    run_or_reuse,
    run_tags,
)
from lightning_losses.reproduce.spec import Claim, Table, Variant

__all__ = ["reproduce", "reproduce_all", "reproduce_claim", "run_claim", "run_command"]

#: Tracking URI used when neither ``--tracking-uri`` nor ``MLFLOW_TRACKING_URI`` is set.
DEFAULT_URI = "sqlite:///mlflow.db"


def threshold_run(
    claim: Claim, tracking_uri: str, out: Path, since_ms: int | None = None
) -> tuple[str, bool]:
    """Claim 1's single MLflow run: reuse it, or compute the numbers and log them into one.

    ``since_ms``: reuse only a run started at or after it (``--fresh``).
    """
    from lightning_losses.reproduce import threshold

    variant = claim.variants[0]
    tags = run_tags(claim, variant, 0, 1)
    client = client_for(tracking_uri)
    found = find_run(client, claim.experiment, tags, since_ms)
    if found is not None:
        return found, True
    experiment = client.get_experiment_by_name(claim.experiment)
    experiment_id = (
        experiment.experiment_id if experiment else client.create_experiment(claim.experiment)
    )
    run = client.create_run(experiment_id, tags=tags, run_name="threshold-analysis")
    for key, value in threshold.analysis().items():
        client.log_metric(run.info.run_id, key, value)
    client.set_tag(run.info.run_id, COMPLETE_TAG, "1")
    client.set_terminated(run.info.run_id)
    return run.info.run_id, False


def quiet_libraries() -> None:
    """Library chatter out of the terminal unless ``--verbose``: the progress lines are the output.

    :func:`lightning_losses.cli.quiet.silence_libraries`, for the whole process. Each fit's own
    summary lines are kept out too (:func:`_run_one`); the runs, their failures, this
    package's warnings and the report are printed.
    """
    if not verbose_requested():
        silence_libraries()


def _no_conditions(table: Table) -> list:
    return []


def _worker_start(threads: int) -> None:
    """Each worker process: ``threads`` torch threads, so the workers share the cores."""
    import torch

    quiet_libraries()
    torch.set_num_threads(threads)


def _run_one(
    claim: Claim,
    variant: Variant,
    seed: int,
    scale: float,
    tracking_uri: str,
    out: Path,
    since_ms: int | None = None,
    post_fit_only: bool = False,
    train_missing: bool = False,
) -> tuple[str, bool, bool, float]:
    started = time.perf_counter()
    with fit_output_aside():  # the progress line says what matters; the run is in MLflow
        result = run_or_reuse(
            claim, variant, seed, scale, tracking_uri, out, since_ms, post_fit_only, train_missing
        )
    return result.run_id, result.reused, result.completed, time.perf_counter() - started


def run_claim(
    claim: Claim,
    seeds: int,
    scale: float,
    tracking_uri: str,
    out: Path,
    jobs: int = 1,
    since_ms: int | None = None,
    post_fit_only: bool = False,
    train_missing: bool = False,
) -> tuple[dict[tuple[str, int], str], int, list[str]]:
    """Run or reuse every (variant, seed) of a claim, ``jobs`` fits at a time.

    A run is reused only when it has the same tags, the code version included; with
    ``since_ms`` (``--fresh``) only when it also started at or after it. ``post_fit_only``
    (``--post-fit-only``): nothing is trained; a run of another code version is reused and
    the post-fit metrics it lacks are computed from its checkpoint
    (:func:`~lightning_losses.reproduce.runner.run_or_reuse`); with ``train_missing``
    (``--reuse-trained``) as well, a variant and seed with no complete run of any code version
    is trained.

    With ``jobs > 1`` the fits run in that many worker processes (each with
    ``cpu_count // jobs`` torch threads); MLflow's SQLite store takes their writes in turn.
    Progress goes to stdout as ``[k/N] claim <n> <variant> seed <s>: <run id> (<time>) ETA``.
    A run that fails (an exception, or a config the CLI rejects) is reported and skipped: the
    other runs go on, the report lists the failure, and its numbers count as missing.

    Returns:
        ``(run ids by (variant, seed), how many were reused, failures)``.
    """
    if claim.number == 1:
        run_id, reused = threshold_run(claim, tracking_uri, out, since_ms)
        return {("analysis", 0): run_id}, int(reused), []
    tasks = [(v, seed) for v in claim.variants for seed in range(claim.seeds(seeds))]
    runs: dict[tuple[str, int], str] = {}
    reused_count = 0
    trained_count = 0
    failures: list[str] = []
    started = time.perf_counter()

    def report(k: int, variant: Variant, seed: int, outcome: Any) -> None:
        nonlocal reused_count, trained_count
        where = f"[{k}/{len(tasks)}] claim {claim.number} {variant.name} seed {seed}"
        if isinstance(outcome, BaseException):
            failures.append(f"{variant.name} seed {seed}: {type(outcome).__name__}: {outcome}")
            traceback.print_exception(outcome)
            print(f"{where}: FAILED ({outcome})", flush=True)
            return
        run_id, reused, completed, seconds = outcome
        runs[(variant.name, seed)] = run_id
        reused_count += reused
        # the pace: fits, and with --post-fit-only the runs completed from their checkpoints
        trained_count += not reused or completed
        eta = eta_text(time.perf_counter() - started, trained_count, len(tasks) - k)
        state = "reused" if reused else f"{seconds:.1f} s"
        if completed:
            state = f"reused, post-fit metrics completed in {seconds:.1f} s"
        print(f"{where}: {run_id} ({state}) ETA {eta}", flush=True)

    if jobs <= 1:
        for k, (variant, seed) in enumerate(tasks, 1):
            try:
                outcome: Any = _run_one(
                    claim,
                    variant,
                    seed,
                    scale,
                    tracking_uri,
                    out,
                    since_ms,
                    post_fit_only,
                    train_missing,
                )
            except (Exception, SystemExit) as error:  # SystemExit: the CLI rejected the config
                outcome = error
            report(k, variant, seed, outcome)
        return runs, reused_count, failures
    import multiprocessing

    # Create the store (its schema) here, before the workers race to create it.
    client_for(tracking_uri).search_experiments(max_results=1)
    portable = dataclasses.replace(claim, conditions=_no_conditions, extra=None, after_runs=None)
    threads = max(1, (os.cpu_count() or 1) // jobs)
    with ProcessPoolExecutor(
        jobs,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_worker_start,
        initargs=(threads,),
    ) as pool:
        futures = [
            (
                variant,
                seed,
                pool.submit(
                    _run_one,
                    portable,
                    variant,
                    seed,
                    scale,
                    tracking_uri,
                    out,
                    since_ms,
                    post_fit_only,
                    train_missing,
                ),
            )
            for variant, seed in tasks
        ]
        for k, (variant, seed, future) in enumerate(futures, 1):
            raised = future.exception()  # waits, in submission order
            report(k, variant, seed, raised if raised is not None else future.result())
    return runs, reused_count, failures


def eta_text(elapsed: float, trained: int, remaining: int) -> str:
    """The time left if every remaining run trains at the pace of those trained so far.

    Reused runs take no time, so the pace counts trained runs only; before the first trained
    run there is no pace (``?``).

    Example:
        >>> eta_text(600.0, 4, 10), eta_text(1.0, 0, 10), eta_text(600.0, 4, 0)
        ('1500 s', '?', '0 s')
    """
    if remaining == 0:
        return "0 s"
    if trained == 0:
        return "?"
    return f"{elapsed / trained * remaining:.0f} s"


def figures(result: ClaimResult, tracking_uri: str, out: Path) -> list[str]:
    """Draw the claim's figures into ``out``; names relative to the report."""
    number = result.claim.number
    if number == 1:
        from lightning_losses.reproduce.threshold import figure

        figure(str(out / "claim1_losses.png"))
        return ["claim1_losses.png"]
    names = []
    bars = f"claim{number}_metrics.png"
    if metrics_figure(result, out / bars):
        names.append(bars)
    if number == 5 and scale_figure(result, out / "claim5_scale.png"):
        names.append("claim5_scale.png")
    curves = f"claim{number}_curves.png"
    if curves_figure(result, tracking_uri, out / curves):
        names.append(curves)
    if number in (2, 3, 9):  # claim 9: the test tokens of each loss
        names += reliability_figures(result, tracking_uri, out)
    nll_curves = f"claim{number}_test_nll.png"
    if nll_curves_figure(result, tracking_uri, out / nll_curves):
        names.append(nll_curves)
    if number == 8:
        names += scaling_reliability_figures(result, tracking_uri, out)
    pr = f"claim{number}_pr_curves.png"
    if pr_figure(result, tracking_uri, out / pr):
        names.append(pr)
    return names


def reproduce_claim(
    claim: Claim,
    seeds: int,
    scale: float,
    tracking_uri: str,
    out: Path,
    jobs: int = 1,
    since_ms: int | None = None,
    post_fit_only: bool = False,
    train_missing: bool = False,
) -> ClaimResult:
    """Run or reuse a claim's runs, read them back from MLflow, draw its figures."""
    runs, reused, failures = run_claim(
        claim, seeds, scale, tracking_uri, out, jobs, since_ms, post_fit_only, train_missing
    )
    if claim.after_runs is not None and runs:
        claim.after_runs(runs, tracking_uri, out)
    result = collect(claim, runs, tracking_uri)
    result.reused = reused
    result.failures = failures
    result.epochs = {v.name: v.scaled_epochs(scale) for v in claim.variants if claim.number != 1}
    result.figures = figures(result, tracking_uri, out)
    return result


def reproduce(
    claims: Sequence[int],
    seeds: int,
    out: Path,
    tracking_uri: str,
    scale: float,
    jobs: int = 1,
    fresh: bool = False,
    post_fit_only: bool = False,
    train_missing: bool = False,
) -> Path:
    """Reproduce ``claims`` and write ``out/REPORT.md``; returns its path."""
    return reproduce_all(
        claims, seeds, out, tracking_uri, scale, jobs, fresh, post_fit_only, train_missing
    )[0]


def display_uri(uri: str) -> str:
    """``uri`` for the report: a SQLite file as a path relative to the working directory.

    The report then names the store as the reader would open it from the same folder, not by
    the absolute path of the machine that produced it.

    Example:
        >>> display_uri("http://127.0.0.1:5000")
        'http://127.0.0.1:5000'
        >>> display_uri("sqlite:///" + str(Path.cwd() / "runs" / "mlflow.db"))
        'sqlite:///runs/mlflow.db'
    """
    prefix = "sqlite:///"
    if not uri.startswith(prefix) or ":memory:" in uri:
        return uri
    relative = os.path.relpath(Path(uri[len(prefix) :]).resolve(), Path.cwd().resolve())
    return prefix + Path(relative).as_posix()


def reproduce_all(
    claims: Sequence[int],
    seeds: int,
    out: Path,
    tracking_uri: str,
    scale: float,
    jobs: int = 1,
    fresh: bool = False,
    post_fit_only: bool = False,
    train_missing: bool = False,
) -> tuple[Path, list[ClaimResult]]:
    """:func:`reproduce`, also returning each claim's result (failed runs included).

    ``fresh``: reuse no run made before this call; every run is trained again (a run this
    call made, such as claim 7's CNN for claim 8's cross-entropy arm, is still shared).
    ``post_fit_only``: train nothing; reuse runs of other code versions and complete their
    post-fit metrics from their checkpoints (``--post-fit-only``). ``train_missing`` (with
    ``post_fit_only``; ``--reuse-trained``): the same reuse, and the runs that have no complete
    run of any code version are trained.
    """
    from lightning_losses.tracking import resolve_tracking_uri

    uri = resolve_tracking_uri(tracking_uri)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    # MLflow's start times are whole milliseconds; a run started in this call is not earlier.
    since_ms = int(time.time() * 1000) - 1 if fresh else None
    results = [
        reproduce_claim(
            CLAIMS[n], seeds, scale, uri, out, jobs, since_ms, post_fit_only, train_missing
        )
        for n in claims
    ]
    more = [
        f"claim {n}: {CLAIMS[n].seeds(seeds)}" for n in claims if CLAIMS[n].seeds(seeds) > seeds
    ]
    raised = f" ({', '.join(more)}, the minimum its experiment file asks for)" if more else ""
    header = [
        f"Claims {', '.join(map(str, claims))}; {seeds} seed(s){raised}; epochs scale "
        f"{scale:g}; {jobs} fit(s) at a time; tracking URI `{display_uri(uri)}`; the runs took "
        f"{sum(r.seconds for r in results):.0f} s in all (MLflow start to end times), and "
        f"this invocation {time.perf_counter() - started:.0f} s.",
        f"Code version `{version.code_version()}` (the package version and a hash of its "
        f"source and shipped configs). Each run carries the version that made it as the MLflow "
        f"tag `{version.CODE_VERSION_TAG}`, and each claim names the versions of its runs; a "
        "run of another code version is never reused"
        + ("; `--fresh`: no run made before this invocation was reused." if fresh else "."),
    ]
    if post_fit_only:
        trained = (
            "`--reuse-trained`: only the runs with no complete run of any code version were "
            "trained (by this code version)."
            if train_missing
            else "`--post-fit-only`: nothing was trained."
        )
        header.append(
            f"{trained} Where no run of this code version was found, a complete run of "
            "another one was reused (the same config text, or that "
            "text with class paths spelt as before a move, the same overrides, seed and "
            "epochs), and the post-fit metrics it lacked were computed from its last "
            "checkpoint by this code version (the run's MLflow tag "
            f"`{POST_FIT_VERSION_TAG}`), once every metric it had came out exactly as stored."
        )
    if any(CLAIMS[n].seeds(seeds) < 2 for n in claims if n != 1):
        header.append(
            "With one seed the ± columns are 0 and say nothing about noise: a difference "
            "smaller than the seed-to-seed spread can flip a verdict. Use `--seeds 3`."
        )
    failed = sum(len(r.failures) for r in results)
    if failed:
        header.append(
            f"**{failed} run(s) failed**; each claim lists its failures, and their numbers "
            "are missing (a missing number never supports a claim)."
        )
    return write_report(results, out, header), results


def run_command(args: argparse.Namespace) -> int:
    """Run ``lightning-losses reproduce`` with parsed options; returns the exit status.

    ``args`` comes from :func:`lightning_losses.reproduce.cli.parse_args`. Prints the report's
    path; the status is 1 when a run failed (the report lists it), else 0.
    """
    quiet_libraries()
    path, results = reproduce_all(
        args.claims,
        args.seeds,
        args.out,
        args.tracking_uri,
        args.epochs_scale,
        args.jobs,
        args.fresh,
        args.post_fit_only or args.reuse_trained,
        args.reuse_trained,
    )
    print(f"report: {path}")
    failed = sum(len(r.failures) for r in results)
    if failed:
        print(f"{failed} run(s) failed; see the report", file=sys.stderr)
        return 1
    return 0
