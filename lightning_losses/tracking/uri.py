"""Tracking URIs: resolution, a fast reachability check for servers, and printable forms."""

from __future__ import annotations

import os
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    pass

from lightning_losses.tracking.constants import DEFAULT_TRACKING_URI


def resolve_tracking_uri(tracking_uri: str | None = None) -> str:
    """``tracking_uri``, else ``$MLFLOW_TRACKING_URI``, else ``sqlite:///mlflow.db``.

    A relative SQLite path is made absolute (MLflow caches stores by URI, so a relative one
    would follow the first working directory, not the current one).

    Example:
        >>> resolve_tracking_uri("http://127.0.0.1:5000")
        'http://127.0.0.1:5000'
    """
    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri.startswith(prefix + "/") and ":memory:" not in uri:
        uri = prefix + str(Path(uri[len(prefix) :]).resolve())
    return uri


def fail_fast_http() -> None:
    """Make MLflow's HTTP client give up in seconds, not minutes (unless the user chose).

    MLflow retries a failed request with back-off for minutes by default; with a spool behind
    it there is nothing to gain from waiting. Variables already set are left alone.
    """
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")


def check_reachable(tracking_uri: str, timeout: float = 5.0) -> None:
    """Raise ``ConnectionError`` naming the URI if an HTTP tracking server does not answer.

    Local stores (``sqlite:``, ``file:``, paths) need no check.
    """
    if not tracking_uri.startswith(("http://", "https://")):
        return
    url = tracking_uri.rstrip("/") + "/health"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            if response.status >= 500:
                raise OSError(f"HTTP {response.status}")
    except (OSError, urllib.error.URLError) as error:
        raise ConnectionError(
            f"the MLflow tracking server at {tracking_uri} cannot be reached ({error}). Start "
            "it, or choose another store with trainer.logger.init_args.tracking_uri or "
            f"MLFLOW_TRACKING_URI (the default is the local {DEFAULT_TRACKING_URI})."
        ) from None


def without_password(uri: str) -> str:
    """``uri`` with the password of its user info replaced by ``***``, for printing.

    Example:
        >>> without_password("postgresql+psycopg2://mlflow:s3cret@db:5432/mlflow")
        'postgresql+psycopg2://mlflow:***@db:5432/mlflow'
        >>> without_password("http://user:pw@127.0.0.1:5000")
        'http://user:***@127.0.0.1:5000'
        >>> without_password("sqlite:////tmp/mlflow.db")
        'sqlite:////tmp/mlflow.db'
    """
    parts = urllib.parse.urlsplit(uri)
    if parts.password is None:
        return uri
    user, _, host = parts.netloc.rpartition("@")
    name = user.partition(":")[0]
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{name}:***@{host}"))


def view_command(tracking_uri: str) -> str:
    """How to look at a store's runs: ``mlflow ui`` for a local store, the address for a server.

    Example:
        >>> view_command("sqlite:////tmp/mlflow.db")
        'mlflow ui --backend-store-uri sqlite:////tmp/mlflow.db'
        >>> view_command("http://127.0.0.1:5000")
        'open http://127.0.0.1:5000'
    """
    if tracking_uri.startswith(("http://", "https://")):
        return f"open {tracking_uri}"
    return f"mlflow ui --backend-store-uri {tracking_uri}"
