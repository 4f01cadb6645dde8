"""Tracking URIs: resolution, checks that a store answers, and forms without secrets."""

from __future__ import annotations

import base64
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    pass

from lightning_losses.tracking.constants import DEFAULT_TRACKING_URI

#: The scheme and slashes of a SQLite store URI (``sqlite:///<path>``).
SQLITE_PREFIX = "sqlite:///"

#: What a secret is replaced with in a redacted URI.
REDACTED = "***"
#: Query parameters whose name (lower case, ``-`` and ``_`` removed) contains one of these.
_SECRET_WORDS = ("password", "passwd", "secret", "token", "apikey", "signature", "credential")
#: ... or is one of these, ...
_SECRET_NAMES = frozenset({"pwd", "pass", "sig", "key", "auth", "sessionkey"})
#: ... or starts with one of these (S3 and GCS presigned URLs).
_SECRET_PREFIXES = ("xamz", "xgoog")
#: ``scheme://user:password@``: any URI's password in free text.
_USERINFO = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^/?#@\s:]*):[^/?#@\s]*@")


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


def keep_secrets_off_stdout(tracking_uri: str) -> None:
    """Stop MLflow printing run addresses built from ``tracking_uri`` when it holds secrets.

    MLflow's client prints "View run ... at: <tracking URI>/#/..." when a run on a server
    ends, with the URI's user info in it; for a URI with secrets (:func:`redact_uri` changes
    it) ``MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT`` is set to ``true`` for the process. The
    fit's own summary names the run and the address without them (:func:`view_command`).
    """
    if redact_uri(tracking_uri) != tracking_uri:
        os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"


# --- secrets ----------------------------------------------------------------------------------


def is_secret_parameter(name: str) -> bool:
    """Whether a URI query parameter ``name`` holds a secret (case and ``-``/``_`` ignored).

    Example:
        >>> [is_secret_parameter(n) for n in ("token", "X-Amz-Signature", "sslmode", "sig")]
        [True, True, False, True]
    """
    key = urllib.parse.unquote_plus(name).lower().replace("-", "").replace("_", "")
    return (
        key in _SECRET_NAMES
        or key.startswith(_SECRET_PREFIXES)
        or any(word in key for word in _SECRET_WORDS)
    )


def _parts(uri: str) -> tuple[str, str, str, str, str]:
    """``uri`` as (``scheme://``, authority, path, query, ``#fragment``); ``?`` not kept.

    The authority runs from ``://`` to the first ``/``, ``?`` or ``#`` (RFC 3986); a URI
    without ``://`` (a path) has none.
    """
    start = uri.find("://")
    start = 0 if start < 0 else start + 3
    end = len(uri)
    for mark in "/?#":
        found = uri.find(mark, start)
        if found >= 0:
            end = min(end, found)
    authority = uri[start:end] if start else ""
    rest = uri[end:] if start else uri
    rest, hash_mark, fragment = rest.partition("#")
    path, _, query = rest.partition("?")
    return uri[:start], authority, path, query, hash_mark + fragment


def _join(head: str, authority: str, path: str, query: str, fragment: str) -> str:
    return head + authority + path + (f"?{query}" if query else "") + fragment


def _split_authority(authority: str) -> tuple[str, str | None, str]:
    """(user, password or ``None``, host) of an authority; user ``""`` without user info."""
    if "@" not in authority:
        return "", None, authority
    userinfo, _, host = authority.rpartition("@")
    user, colon, password = userinfo.partition(":")
    return user, (password if colon else None), host


def redact_uri(uri: str) -> str:
    """``uri`` with its password and secret query values replaced by ``***``.

    The user name and host stay (``user:***@host``); query parameters whose name says they
    hold a secret (``password``, ``token``, ``access_token``, ``secret``, ``sig``,
    ``signature``, ``api_key``, ``X-Amz-*``, ``X-Goog-*``, ...; case-insensitive, see
    :func:`is_secret_parameter`) keep their name with the value ``***``. A URI without
    secrets comes back unchanged, and redacting twice changes nothing more.

    Example:
        >>> redact_uri("postgresql+psycopg2://mlflow:s3cret@db:5432/mlflow")
        'postgresql+psycopg2://mlflow:***@db:5432/mlflow'
        >>> redact_uri("https://host/mlflow?token=abc&x=1")
        'https://host/mlflow?token=***&x=1'
        >>> redact_uri("sqlite:////tmp/mlflow.db")
        'sqlite:////tmp/mlflow.db'
    """
    head, authority, path, query, fragment = _parts(uri)
    user, password, host = _split_authority(authority)
    if password is not None:
        authority = f"{user}:{REDACTED}@{host}"
    pairs = []
    for pair in query.split("&") if query else []:
        name, equals, _ = pair.partition("=")
        pairs.append(f"{name}={REDACTED}" if equals and is_secret_parameter(name) else pair)
    return _join(head, authority, path, "&".join(pairs), fragment)


def without_password(uri: str) -> str:
    """The printable form of ``uri``: the same as :func:`redact_uri` (its older name).

    Example:
        >>> without_password("http://user:pw@127.0.0.1:5000")
        'http://user:***@127.0.0.1:5000'
    """
    return redact_uri(uri)


def without_redacted(uri: str) -> str:
    """``uri`` with what :func:`redact_uri` replaced left out: the form to try without secrets.

    Query parameters whose value is ``***`` are dropped, and so is a ``:***`` password: with
    the whole user info for an HTTP server (whose user info would take the place of MLflow's
    ``MLFLOW_TRACKING_USERNAME`` / ``MLFLOW_TRACKING_PASSWORD`` / ``MLFLOW_TRACKING_TOKEN``),
    the password alone for a database (whose driver may find it for that user, as in
    PostgreSQL's ``~/.pgpass``).

    Example:
        >>> without_redacted("postgresql://mlflow:***@db/mlflow?sslmode=require&password=***")
        'postgresql://mlflow@db/mlflow?sslmode=require'
        >>> without_redacted("http://alice:***@127.0.0.1:5000")
        'http://127.0.0.1:5000'
    """
    head, authority, path, query, fragment = _parts(uri)
    user, password, host = _split_authority(authority)
    if password == REDACTED:
        http = head.lower() in ("http://", "https://")
        authority = f"{user}@{host}" if user and not http else host
    pairs = [p for p in query.split("&") if query and p.partition("=")[2] != REDACTED]
    return _join(head, authority, path, "&".join(pairs), fragment)


def has_redactions(uri: str) -> bool:
    """Whether ``uri`` holds ``***`` where :func:`redact_uri` removed a secret.

    Example:
        >>> has_redactions("http://u:***@h:5000"), has_redactions("http://h:5000")
        (True, False)
    """
    return without_redacted(uri) != uri


def store_key(uri: str) -> str:
    """What identifies a store: its resolved URI without user info, query, fragment or end ``/``.

    URIs of one store have one key: ``sqlite:///mlflow.db`` and its absolute path (symbolic
    links and ``..`` resolved), a server with and without ``user:password@`` or ``?token=``.
    The key holds no secret, so it can be printed.

    Example:
        >>> store_key("http://alice:pw@Example.org:5000/?token=x")
        'http://example.org:5000'
        >>> store_key("sqlite:////tmp/../tmp/mlflow.db")
        'sqlite:////tmp/mlflow.db'
    """
    try:
        uri = resolve_tracking_uri(uri)
        if uri.startswith(SQLITE_PREFIX):
            path = uri[len(SQLITE_PREFIX) :].split("?", 1)[0]
            return SQLITE_PREFIX + (path if path in ("", ":memory:") else os.path.realpath(path))
        parts = urllib.parse.urlsplit(uri)
        if len(parts.scheme) <= 1:  # a plain path (or a drive letter): a local file store
            return "file://" + os.path.realpath(uri)
        if parts.scheme.lower() == "file":
            return "file://" + os.path.realpath(urllib.request.url2pathname(parts.path))
        host = parts.hostname or ""
        netloc = f"[{host}]" if ":" in host else host
        if parts.port is not None:
            netloc += f":{parts.port}"
    except ValueError:  # a NUL byte, a port that is not a number
        return f"(not a tracking URI: {uri[:80]!r})"
    return urllib.parse.urlunsplit((parts.scheme.lower(), netloc, parts.path.rstrip("/"), "", ""))


def same_store(first: str, second: str) -> bool:
    r"""Whether two tracking URIs name one store, whatever the credentials they carry.

    Their :func:`store_key`\ s are compared, so a checkpoint's redacted URI matches the URI
    with the password given again.

    Example:
        >>> same_store("http://alice:***@127.0.0.1:5000", "http://alice:pw@127.0.0.1:5000")
        True
        >>> same_store("http://127.0.0.1:5000", "http://127.0.0.1:5001")
        False
    """
    return store_key(first) == store_key(second)


def _without_credentials(uri: str) -> str:
    """``uri`` without user info and without secret query parameters (the store's address)."""
    head, authority, path, query, fragment = _parts(uri)
    pairs = [p for p in query.split("&") if query and not is_secret_parameter(p.split("=")[0])]
    return _join(head, _split_authority(authority)[2], path, "&".join(pairs), fragment)


def _secrets(uri: str) -> list[str]:
    """The secret values of ``uri``: its password and secret query values.

    Each as written and percent-decoded, longest first.
    """
    _, authority, _, query, _ = _parts(uri)
    found = [_split_authority(authority)[1] or ""]
    for pair in query.split("&") if query else []:
        name, equals, value = pair.partition("=")
        if equals and is_secret_parameter(name):
            found.append(value)
    values = {v for raw in found for v in (raw, urllib.parse.unquote_plus(raw))}
    return sorted((v for v in values if v and v != REDACTED), key=len, reverse=True)


def redact_text(text: str, uri: str | None = None) -> str:
    """``text`` with passwords and the secret values of ``uri`` replaced by ``***``.

    The password of any ``scheme://user:password@`` in ``text`` is replaced, and so are the
    secret values of ``uri`` wherever they occur (4 characters or more). For messages that
    may quote a URI, such as an MLflow client's error, which names the request's address with
    its user info.

    Example:
        >>> redact_text("API request to http://u:pw@h:5000/api failed", "http://u:pw@h:5000")
        'API request to http://u:***@h:5000/api failed'
    """
    text = _USERINFO.sub(lambda match: f"{match['head']}:{REDACTED}@", text)
    for secret in _secrets(uri or ""):
        if len(secret) >= 4:
            text = text.replace(secret, REDACTED)
    return text


# --- does the store answer ----------------------------------------------------------------------


def _http_request(tracking_uri: str, endpoint: str) -> urllib.request.Request:
    """A GET of ``endpoint`` under an HTTP tracking URI, its credentials as a header.

    As MLflow's client does: ``MLFLOW_TRACKING_USERNAME`` and ``MLFLOW_TRACKING_PASSWORD``
    (both set) as basic authentication, else the URI's user info as basic authentication
    (the address keeps only the host and port), else ``MLFLOW_TRACKING_TOKEN`` as a bearer
    token.
    """
    head, authority, path, _, _ = _parts(tracking_uri)
    user, password, host = _split_authority(authority)
    request = urllib.request.Request(head + host + path.rstrip("/") + endpoint)
    env_user = os.environ.get("MLFLOW_TRACKING_USERNAME")
    env_password = os.environ.get("MLFLOW_TRACKING_PASSWORD")
    if env_user and env_password:
        basic = f"{env_user}:{env_password}"
    elif "@" in authority:
        basic = f"{urllib.parse.unquote(user)}:{urllib.parse.unquote(password or '')}"
    else:
        basic = None
    if basic is not None:
        token = base64.b64encode(basic.encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    elif os.environ.get("MLFLOW_TRACKING_TOKEN"):
        request.add_header("Authorization", f"Bearer {os.environ['MLFLOW_TRACKING_TOKEN']}")
    return request


def check_reachable(tracking_uri: str, timeout: float = 5.0) -> None:
    """Raise ``ConnectionError`` naming the URI if an HTTP tracking server does not answer.

    Asks the server's ``/health`` at the URI's host and port; user info in the URI
    (``http://user:password@host:port``, as MLflow accepts it) is sent as basic
    authentication, not read as part of the host. The message shows the URI redacted
    (:func:`redact_uri`). Local stores (``sqlite:``, ``file:``, paths) need no check.
    """
    if not tracking_uri.startswith(("http://", "https://")):
        return
    shown = redact_uri(tracking_uri)
    try:
        with urllib.request.urlopen(_http_request(tracking_uri, "/health"), timeout=timeout) as r:
            if r.status >= 500:
                raise OSError(f"HTTP {r.status}")
    except urllib.error.HTTPError as error:
        if error.code in (401, 403):
            raise ConnectionError(
                f"the MLflow tracking server at {shown} refused the credentials (HTTP "
                f"{error.code}): give them as the URI's user info or in "
                "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD"
            ) from None
        raise ConnectionError(_unreachable(shown, tracking_uri, error)) from None
    except (OSError, ValueError) as error:
        raise ConnectionError(_unreachable(shown, tracking_uri, error)) from None


def _unreachable(shown: str, tracking_uri: str, error: BaseException) -> str:
    return (
        f"the MLflow tracking server at {shown} cannot be reached "
        f"({redact_text(str(error), tracking_uri)}). Start it, or choose another store with "
        "trainer.logger.init_args.tracking_uri or MLFLOW_TRACKING_URI (the default is the "
        f"local {DEFAULT_TRACKING_URI})."
    )


def check_store(tracking_uri: str, timeout: float = 5.0) -> None:
    """Raise ``ConnectionError`` unless the store answers a request that needs its credentials.

    A server is asked for one experiment through MLflow's client (so MLflow's
    ``MLFLOW_TRACKING_USERNAME`` / ``MLFLOW_TRACKING_PASSWORD`` / ``MLFLOW_TRACKING_TOKEN``
    apply); a database (``postgresql://``, ``mysql://``, ...) is connected to once with
    SQLAlchemy, without MLflow's retries. Local files (``sqlite:``, ``file:``, paths) pass.
    The message is redacted (:func:`redact_text`).
    """
    scheme = tracking_uri.partition("://")[0].lower() if "://" in tracking_uri else ""
    if scheme in ("", "file", "sqlite"):
        return
    try:
        if scheme in ("http", "https"):
            check_reachable(tracking_uri, timeout)
            from mlflow.tracking import MlflowClient

            fail_fast_http()
            MlflowClient(tracking_uri).search_experiments(max_results=1)
        elif "+" in scheme or scheme in ("postgresql", "mysql", "mssql"):
            import sqlalchemy

            engine = sqlalchemy.create_engine(tracking_uri, poolclass=sqlalchemy.pool.NullPool)
            try:
                with engine.connect():
                    pass
            finally:
                engine.dispose()
    except ConnectionError as error:
        raise ConnectionError(redact_text(str(error), tracking_uri)) from None
    except Exception as error:
        reason = " ".join(f"{type(error).__name__}: {error}".split())
        raise ConnectionError(redact_text(reason, tracking_uri)[:500]) from None


def view_command(tracking_uri: str) -> str:
    """How to look at a store's runs: ``mlflow ui`` for a local store, the address for a server.

    Secrets are never shown: a server's address is given without user info and secret
    parameters (the browser asks for the credentials), a store's URI redacted.

    Example:
        >>> view_command("sqlite:////tmp/mlflow.db")
        'mlflow ui --backend-store-uri sqlite:////tmp/mlflow.db'
        >>> view_command("http://user:pw@127.0.0.1:5000")
        'open http://127.0.0.1:5000'
    """
    if tracking_uri.startswith(("http://", "https://")):
        return f"open {_without_credentials(tracking_uri)}"
    return f"mlflow ui --backend-store-uri {redact_uri(tracking_uri)}"
