"""``lightning-losses sync-tracking``: replay spools into a store, one line per spool."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from lightning_losses.cli.commands import PROG, sync_tracking_parser
from lightning_losses.tracking.replay import (
    SpoolReplayError,
    replay_summary,
    spools_in,
    sync_tracking,
)

__all__ = ["sync_main", "sync_paths"]


def sync_main(argv: Sequence[str] | None = None) -> int:
    """``lightning-losses sync-tracking PATH [PATH ...] [--tracking-uri URI]``.

    The options are parsed by :func:`lightning_losses.cli.commands.sync_tracking_parser` (light:
    the console script answers ``--help`` from it without importing this module); the spools
    are replayed by :func:`sync_paths`.

    Returns:
        0 when every spool was replayed whole; 1 when a path holds no spool or a spool had
        lines that were not replayed (each named on stderr by its line number).
    """
    args = sync_tracking_parser().parse_args(None if argv is None else list(argv))
    return sync_paths(args.paths, args.tracking_uri)


def sync_paths(paths: Sequence[str | Path], tracking_uri: str | None = None) -> int:
    """Replay every spool in ``paths`` (spool files or folders holding them); print a summary.

    Args:
        paths: spool files (``tracking-spool.jsonl``) or folders searched for them.
        tracking_uri: the store to replay into; ``None``: the store each spool recorded, if
            :func:`sync_tracking` accepts it.

    Returns:
        0 when every spool was replayed whole; 1 when a path holds no spool or a spool had
        lines that were not replayed (each named on its own stderr line by its number) or
        was refused whole.
    """
    prog = f"{PROG} sync-tracking"
    status = 0
    for given in paths:
        try:
            spools = spools_in(Path(given))
        except OSError as error:
            print(f"{prog}: error: {error}", file=sys.stderr)
            status = 1
            continue
        for spool in spools:
            try:
                done = sync_tracking(spool, tracking_uri)
            except SpoolReplayError as error:
                print(f"{spool}: replayed {replay_summary(error.done)}")
                for line in str(error).splitlines():  # a summary, then one line per problem
                    print(f"{prog}: error: {spool}: {line}", file=sys.stderr)
                status = 1
                continue
            except (OSError, RuntimeError, ValueError) as error:
                print(f"{prog}: error: {spool}: {error}", file=sys.stderr)
                status = 1
                continue
            print(f"{spool}: replayed {replay_summary(done)}")
    return status
