"""Two-process runs on this CPU: gloo process groups, and Lightning's DDP launch of the CLI.

:func:`spawn_gloo` runs a function in processes joined by a gloo process group on 127.0.0.1
(the metrics' own DDP tests). :func:`run_ddp_console` runs ``lightning-losses`` with
:data:`DDP_ARGS`, Lightning starting the second process itself, and checks that it ran.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from helpers.preloaded import run_preloaded
from helpers.server import free_port

__all__ = [
    "DDP_ARGS",
    "RENDEZVOUS_VARIABLES",
    "launch_env",
    "run_ddp_console",
    "spawn_gloo",
]

#: The trainer options of a 2-process DDP fit on the CPU.
DDP_ARGS = ("--trainer.strategy=ddp", "--trainer.devices=2", "--trainer.accelerator=cpu")
#: The variables of a launch besides the ranks (``lightning_losses.tracking.RANK_VARIABLES``)
#: that must not leak from this process into a child that launches its own processes.
RENDEZVOUS_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE")
#: What the server process that forks the ranks of :func:`spawn_gloo` imports once.
FORKSERVER_PRELOAD = ("torch", "torch.distributed", "lightning", "lightning_losses", "mlflow")
#: How long a collective may wait for the other process before the run fails instead of hanging.
GLOO_TIMEOUT = timedelta(seconds=120)


def _gloo_process(
    rank: int, world_size: int, port: int, worker: Callable[..., None], args: tuple[Any, ...]
) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world_size,
        timeout=GLOO_TIMEOUT,
    )
    try:
        worker(rank, *args)
    finally:
        dist.destroy_process_group()


def spawn_gloo(worker: Callable[..., None], *args: Any, processes: int = 2) -> None:
    """Run ``worker(rank, *args)`` in ``processes`` processes joined by a gloo process group.

    Each process (forked from a server that imported :data:`FORKSERVER_PRELOAD`, with this
    process's ``sys.path``) uses one thread and joins the group on a free port of 127.0.0.1 before
    ``worker`` runs; the group is destroyed after it. ``worker`` must be importable (a module
    level function of a test file: it is pickled to the new process); it writes
    what the test reads into a folder passed in ``args``. An exception in one process fails
    the call.
    """
    # Forked from a server process that imported torch and the package once per pytest worker
    # (it never ran a torch op, so no thread pool is forked): each rank then starts in about a
    # second instead of importing them again (about 9 s of CPU each with spawn).
    mp.set_forkserver_preload(list(FORKSERVER_PRELOAD))
    mp.start_processes(
        _gloo_process,
        args=(processes, free_port(), worker, args),
        nprocs=processes,
        join=True,
        start_method="forkserver",
    )


def launch_env(**variables: str) -> dict[str, str]:
    """The environment of a child that launches its own DDP processes.

    No launch variables (the ranks, :data:`RENDEZVOUS_VARIABLES`: Lightning picks a free port
    and starts the other processes), no inherited MLflow store, ``PYTHONWARNINGS=ignore``;
    ``variables`` set.
    """
    from lightning_losses.tracking import RANK_VARIABLES  # Lightning: here, not in the workers

    unset = {*RANK_VARIABLES, *RENDEZVOUS_VARIABLES, "MLFLOW_TRACKING_URI"}
    env = {name: value for name, value in os.environ.items() if name not in unset}
    env["PYTHONWARNINGS"] = "ignore"
    env.update(variables)
    return env


def run_ddp_console(arguments: Sequence[str], cwd: Path, *, timeout: float = 300) -> str:
    """``lightning-losses ARGUMENTS --verbose`` in ``cwd``; its output, once it succeeded.

    ``ARGUMENTS`` include :data:`DDP_ARGS`. ``--verbose`` shows Lightning's
    ``GLOBAL_RANK: 1, MEMBER: 2/2`` line, printed by the second process: its presence shows
    that a second process really ran. A hang (collectives out of step) fails after ``timeout``
    seconds instead of blocking the suite.
    """
    done = run_preloaded([*arguments, "--verbose"], cwd=cwd, env=launch_env(), timeout=timeout)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in output  # a second process really ran
    return output
