"""New SQLite MLflow stores start as a copy of one store already migrated, for the tests.

MLflow creates a SQLite tracking store by running its whole schema history (some 60 Alembic
migrations, each its own transaction and ``fsync``): about 2 s of CPU and as much again waiting
on the disk, for every test that opens a fresh ``sqlite:///.../mlflow.db``. The suite opens
over a hundred. Here the migrations run once per MLflow version and machine, into a template
file, and every new store is filled from it with SQLite's backup API: the same tables, indexes
and ``alembic_version`` row MLflow's own migrations wrote, page for page. What MLflow does next
(the ``Default`` experiment with this store's artifact location, the runs) is untouched, and a
store that is not empty, or not SQLite, is left to MLflow.

Installed in the test process by ``tests/conftest.py`` and in every subprocess the tests start
(console scripts, DDP ranks, servers) by ``sitecustomize.py`` beside this file, which the
conftest puts on ``PYTHONPATH``; the README's commands run without it, as a new user's do.
"""

from __future__ import annotations

import fcntl
import importlib.abc
import importlib.util
import os
import sqlite3
import sys
import tempfile
from pathlib import Path
from typing import Any

PATCHED_MODULE = "mlflow.store.db.utils"


def template_path() -> Path:
    """Where this machine's template for the installed MLflow lies (made on first use)."""
    from importlib.metadata import version

    tag = f"mlflow-{version('mlflow')}-sqlalchemy-{version('sqlalchemy')}"
    return Path(tempfile.gettempdir()) / f"lightning-losses-test-store-{tag}.db"


def ensure_template(initialize: Any) -> Path:
    """The template, made with MLflow's own ``initialize(engine)`` when missing (atomic)."""
    path = template_path()
    if path.exists():
        return path
    import sqlalchemy

    fd, partial = tempfile.mkstemp(suffix=".db", dir=path.parent)
    os.close(fd)
    os.unlink(partial)
    engine = sqlalchemy.create_engine(f"sqlite:///{partial}")
    try:
        initialize(engine)
    finally:
        engine.dispose()
    os.replace(partial, path)  # another process's template, if it won, is the same schema
    return path


def _is_empty(engine: Any) -> bool:
    import sqlalchemy

    return not sqlalchemy.inspect(engine).get_table_names()


def patch(utils: Any) -> None:
    """Make ``utils._initialize_tables`` fill an empty SQLite store from the template."""
    original = utils._initialize_tables
    if getattr(original, "from_template", False):
        return

    def initialize_tables(engine: Any) -> None:
        database = engine.url.database
        if engine.dialect.name != "sqlite" or not database or database == ":memory:":
            return original(engine)
        template = ensure_template(original)
        with open(f"{database}.template-lock", "w") as lock:  # one filler per store
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not _is_empty(engine):  # another process filled it while this one waited,
                if not utils._all_tables_exist(engine):  # or an earlier attempt failed
                    original(engine)
                return None
            source = sqlite3.connect(template)
            target = engine.raw_connection()
            try:
                source.backup(target.driver_connection)
            finally:
                target.close()
                source.close()
        Path(f"{database}.template-lock").unlink(missing_ok=True)
        return None

    initialize_tables.from_template = True  # type: ignore[attr-defined]
    utils._initialize_tables = initialize_tables


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Patch ``mlflow.store.db.utils`` right after it is first imported (MLflow stays lazy)."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != PATCHED_MODULE:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_and_patch(module: Any) -> None:
            exec_module(module)
            patch(module)

        loader.exec_module = exec_and_patch  # type: ignore[method-assign]
        return spec


def install() -> None:
    """Patch MLflow now if it is imported, else when it is."""
    if PATCHED_MODULE in sys.modules:
        patch(sys.modules[PATCHED_MODULE])
    elif not any(isinstance(f, _PatchOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport())
