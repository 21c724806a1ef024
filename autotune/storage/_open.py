"""Optuna storages: open one (SQLite or PostgreSQL, with heartbeats), load a study, keep passwords out of messages.

Everything that reads or writes a study opens it here: the search, ``best``, ``export``, ``report``,
``estimate`` and the dashboard.
"""

from __future__ import annotations

import os
import random
import re
import sqlite3
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy.event
import sqlalchemy.exc
from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback

from autotune.errors import AutotuneError
from autotune.storage._ctrl_c import RDBStorageHoldingCtrlC

# autotune drives heartbeats itself around ask/tell (Optuna only does so inside optimize), and
# relies on the long-stable stale-trial helpers that Optuna still labels experimental.
warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)

DEFAULT_STORAGE = "sqlite:///autotune.db"
# How long a command waits for a lock another connection holds on a SQLite file before it gives up.
# A search's own writes hold one for milliseconds; a lock held for seconds is another program's (an
# open sqlite3 shell's transaction, a backup). `search` writes from several worker threads and
# processes at once (--workers), and a lost tell would leave a trial RUNNING: it waits long. The
# commands that only read (best, export, report, estimate) give up sooner (AUTOTUNE_SQLITE_READ_TIMEOUT_S
# sets how soon: sqlite_read_timeout_s). Either says what it waits for once it has waited
# SQLITE_LOCK_NOTICE_S (_wait_for_sqlite_lock).
SQLITE_BUSY_TIMEOUT_S = 120
SQLITE_READ_TIMEOUT_S = 15
SQLITE_LOCK_NOTICE_S = 1.0
# Every running trial records a heartbeat this often; one silent for the grace period is taken for
# the trial of a dead worker: another worker fails it and queues it again (see heartbeat_settings).
HEARTBEAT_INTERVAL_S = 10
HEARTBEAT_GRACE_S = 60
TABLE_CREATION_ATTEMPTS = 4
# How long a search waits for a PostgreSQL server that went away after it connected: a restart
# (`pg_ctl restart`, a minor-version upgrade) refuses connections for seconds, a managed database's
# failover for up to about two minutes. The trial children train on meanwhile; only the search's calls
# to the study wait. A server never reached (a wrong host or port) fails at once (open_storage).
POSTGRES_RECONNECT_WAIT_S = 120
# What libpq and the server say while a server is down or not yet serving: the operating system's
# refusal, then the postmaster's answers during shut-down, start-up and recovery (PostgreSQL's
# src/backend/tcop/backend_startup.c, "the database system is ..."). Anything else (a wrong password,
# a dropped database) is not waited out.
_SERVER_RESTARTING = re.compile(
    r"Connection refused|the database system is (starting up|shutting down|in recovery mode|not yet accepting)"
)


def open_storage(
    url: str, storage_class: type[RDBStorage] = RDBStorageHoldingCtrlC, *, existing: bool = False
) -> RDBStorage:
    """Open an Optuna RDB storage with heartbeats, or explain in one line why it cannot be opened.

    ``storage_class`` lets the dashboard serve a subclass (see ``autotune.views.dashboard``).
    ``existing``: the storage is only read (``best``, ``export``, ``report``, ``estimate``): a SQLite
    file must exist (a misspelled path would otherwise become a new, empty database) and need not be
    writable (only ``search`` writes).
    """
    _OPENED_URLS.add(url)
    if "://" not in url:
        raise AutotuneError(
            f"--storage {redact(url)!r} is not a database URL: use sqlite:///path.db or postgresql://user@host/db"
        )
    busy_timeout_s = sqlite_read_timeout_s() if existing else SQLITE_BUSY_TIMEOUT_S
    if url.startswith("sqlite:///"):
        if existing:
            require_sqlite_file(url)
        else:
            _check_sqlite_writable(sqlite_file(url))
        _wait_for_sqlite_lock(url, busy_timeout_s, write=not existing)
    heartbeat_interval_s, grace_s = heartbeat_settings()
    driver_url = with_postgres_driver(url)
    engine_kwargs: dict[str, Any] = {"pool_pre_ping": True}
    if url.startswith("sqlite:"):
        # sqlite3 gives up on a lock after 5 s by default, which worker threads writing at once on a
        # loaded machine exceed (see SQLITE_BUSY_TIMEOUT_S).
        engine_kwargs["connect_args"] = {"timeout": busy_timeout_s}
    try:
        for attempt in range(1, TABLE_CREATION_ATTEMPTS + 1):
            try:
                storage = storage_class(
                    driver_url,
                    engine_kwargs=engine_kwargs,
                    heartbeat_interval=heartbeat_interval_s,
                    grace_period=grace_s,
                    heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(max_retry=1),
                )
                if not url.startswith("sqlite:"):
                    _wait_for_a_restarting_server(storage.engine, url, POSTGRES_RECONNECT_WAIT_S)
                return storage
            except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError):
                # Workers starting together on an empty database all create Optuna's tables; on
                # PostgreSQL the losers fail ("duplicate key ... pg_type"). Once they exist, it opens.
                if attempt == TABLE_CREATION_ATTEMPTS:
                    raise
                time.sleep(attempt * random.uniform(0.5, 1.5))
        raise AssertionError("unreachable")
    except Exception as exc:  # noqa: BLE001 - any driver error means "cannot open" to the user
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise AutotuneError(f"--storage {redact(url)}: cannot open it ({scrub_password(reason, url)[:200]})") from None


def _wait_for_a_restarting_server(engine: sqlalchemy.engine.Engine, url: str, wait_s: float) -> None:
    """Make every later connection of ``engine`` wait up to ``wait_s`` for a server that is restarting.

    ``pool_pre_ping`` finds a pooled connection dead after a restart and opens a new one; while the
    server is down that fails with "Connection refused", which Optuna turns into a
    StorageInternalError that would end the search. SQLAlchemy's ``do_connect`` event lets a listener
    open the DBAPI connection itself (docs.sqlalchemy.org/en/20/core/events.html,
    DialectEvents.do_connect): this one retries while the error is a restart's, with one line on
    stderr, and gives up with the driver's error after ``wait_s``.
    """

    @sqlalchemy.event.listens_for(engine, "do_connect")
    def connect_when_the_server_is_back(dialect: Any, record: Any, cargs: Any, cparams: Any) -> Any:
        deadline, delay, told = time.monotonic() + wait_s, 0.25, False
        while True:
            try:
                return dialect.connect(*cargs, **cparams)
            except dialect.loaded_dbapi.OperationalError as exc:
                if not _SERVER_RESTARTING.search(str(exc)) or time.monotonic() + delay > deadline:
                    raise
                if not told:
                    reason = scrub_password(str(exc).strip().splitlines()[0], url)
                    print(
                        f"autotune: the study's database is not answering ({reason}); "
                        f"waiting up to {wait_s:.0f} s for it to come back (a second Ctrl-C stops now)",
                        file=sys.stderr,
                        flush=True,
                    )
                    told = True
                time.sleep(delay)
                delay = min(delay * 2, 5.0)


def with_postgres_driver(url: str) -> str:
    """``postgresql://...`` with an installed driver named: SQLAlchemy's default changed with 2.1.

    SQLAlchemy 2.0 takes a bare ``postgresql://`` to mean psycopg2, 2.1 psycopg 3; users have
    whichever ``autotune[postgres]`` or their image brought. Other URLs pass unchanged.
    """
    scheme, separator, rest = url.partition("://")
    if scheme not in ("postgresql", "postgres"):
        return url
    import importlib.util

    for module, driver in (("psycopg", "psycopg"), ("psycopg2", "psycopg2")):
        if importlib.util.find_spec(module) is not None:
            return f"postgresql+{driver}{separator}{rest}"
    raise AutotuneError("--storage postgresql://...: no PostgreSQL driver installed; pip install 'autotune[postgres]'")


def heartbeat_settings() -> tuple[int, int]:
    """Heartbeat interval and grace period in whole seconds (Optuna takes integers).

    ``AUTOTUNE_HEARTBEAT_INTERVAL_S`` and ``AUTOTUNE_HEARTBEAT_GRACE_S`` override the defaults: a
    shorter grace re-runs a dead worker's trial sooner; it must exceed the interval, or live trials
    would be taken for dead ones.

    Raises:
        AutotuneError: A value is not a positive integer, or the grace is not above the interval.
    """
    interval_s = _whole_seconds("AUTOTUNE_HEARTBEAT_INTERVAL_S", HEARTBEAT_INTERVAL_S)
    grace_s = _whole_seconds("AUTOTUNE_HEARTBEAT_GRACE_S", HEARTBEAT_GRACE_S)
    if grace_s <= interval_s:
        raise AutotuneError(
            f"AUTOTUNE_HEARTBEAT_GRACE_S={grace_s} must be above AUTOTUNE_HEARTBEAT_INTERVAL_S={interval_s} (e.g. twice it)"
        )
    return interval_s, grace_s


def sqlite_read_timeout_s() -> int:
    """How long a command that only reads waits for a lock another process holds on a SQLite file:
    ``AUTOTUNE_SQLITE_READ_TIMEOUT_S``, else :data:`SQLITE_READ_TIMEOUT_S`.

    Raises:
        AutotuneError: The value is not a positive integer.
    """
    return _whole_seconds("AUTOTUNE_SQLITE_READ_TIMEOUT_S", SQLITE_READ_TIMEOUT_S)


def _whole_seconds(name: str, default: int) -> int:
    """The environment variable ``name``, a whole number of seconds above 0; ``default`` where it is unset."""
    text = os.environ.get(name, str(default)).strip()
    if not text.isdigit() or int(text) <= 0:
        raise AutotuneError(f"{name}={text!r}: give a whole number of seconds above 0")
    return int(text)


def require_sqlite_file(storage_url: str) -> None:
    """A ``sqlite:///`` storage that is read must name an existing file: SQLite creates a missing one.

    Raises:
        AutotuneError: No such file (a typo would otherwise read, or serve, a new, empty database).
    """
    path = Path(sqlite_file(storage_url))
    if not path.is_file():
        raise AutotuneError(
            f"--storage {redact(storage_url)}: no such database file; run `autotune search` first, or pass the --storage it used"
        )


def sqlite_file(storage_url: str) -> str:
    """The file of a ``sqlite:///`` URL: its path without the query, which SQLAlchemy hands to the driver
    (sqlalchemy/engine/url.py, ``make_url``: the database ends at ``?``).

    With ``uri=true`` SQLAlchemy hands the database to SQLite as a URI (sqlalchemy/dialects/sqlite/pysqlite.py,
    ``create_connect_args``), and SQLite reads a name that starts with ``file:`` as one: its path
    percent-decoded, ``mode=memory`` no file at all (https://www.sqlite.org/uri.html). So
    ``sqlite:///file:/data/study.db?mode=ro&uri=true``, SQLite's read-only open, names ``/data/study.db``.
    """
    from urllib.parse import parse_qs, unquote, urlsplit

    from sqlalchemy.util import asbool

    database, _, query = storage_url.removeprefix("sqlite:///").partition("?")
    parameters = {key: values[-1] for key, values in parse_qs(query).items()}
    try:
        as_uri = asbool(parameters.get("uri", False))
    except ValueError:
        as_uri = False  # not a boolean: the driver refuses it when the storage is opened
    if not (as_uri and database.startswith("file:")):
        return database
    if parameters.get("mode") == "memory":
        return ":memory:"
    return unquote(urlsplit(database).path)


def storage_files(storage_url: str) -> tuple[str, ...]:
    """The files a ``sqlite:///`` storage lives in: the database and SQLite's journals of it (rollback,
    write-ahead log and its index: https://www.sqlite.org/tempfiles.html), which no command writes over;
    none for a server's database."""
    if not storage_url.startswith("sqlite:///"):
        return ()
    path = sqlite_file(storage_url)
    if path in ("", ":memory:"):
        return ()
    return (path, *(path + suffix for suffix in ("-journal", "-wal", "-shm")))


def _wait_for_sqlite_lock(url: str, wait_s: float, write: bool) -> None:
    """Return once no other connection holds a lock that keeps this command off the SQLite file.

    A reader is kept off by a writer's exclusive lock, a writer by any other write transaction
    (SQLite's locking: https://www.sqlite.org/lockingv3.html). SQLite's busy handler waits silently,
    so the wait is taken here in steps of :data:`SQLITE_LOCK_NOTICE_S`: after the first, one line on
    stderr says what the command waits for and for how long at most.

    Raises:
        AutotuneError: The lock was still held after ``wait_s`` seconds, or the file is not a whole SQLite
            database (random bytes, a file cut short): the probe reads its header and schema first.
    """
    path = Path(sqlite_file(url))
    if str(path) in ("", ":memory:"):
        return
    deadline = time.monotonic() + wait_s
    said = False
    while True:
        try:
            # Read-only for a reader: the probe never creates or changes the file.
            target = path.resolve().as_uri() + ("" if write else "?mode=ro")
            connection = sqlite3.connect(target, uri=True, timeout=SQLITE_LOCK_NOTICE_S)
            try:
                connection.execute("BEGIN IMMEDIATE" if write else "BEGIN")
                missing = _header_fault(connection, path)
                connection.rollback()
            finally:
                connection.close()
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) and "busy" not in str(exc):
                return  # not a lock: opening the storage says what is wrong
        except sqlite3.DatabaseError as exc:
            # Random bytes ("file is not a database") or a file cut short ("database disk image is
            # malformed"): SQLite reads its header and schema on the first statement, here.
            raise AutotuneError(_unreadable(path, str(exc))) from None
        else:
            if missing:
                raise AutotuneError(_unreadable(path, missing))
            return
        if time.monotonic() >= deadline:
            raise AutotuneError(
                f"--storage {redact(url)}: another process has held a lock on this database for {wait_s:g} s (a search "
                "holds one only for moments: an open sqlite3 shell or a backup holds it longer); end it, then run "
                "the command again"
            )
        if not said:
            print(
                f"autotune: waiting for {redact(url)}: another process holds a lock on it (giving up after {wait_s:g} s)",
                file=sys.stderr,
                flush=True,
            )
            said = True


def _header_fault(connection: sqlite3.Connection, path: Path) -> str:
    """Why the file holds less than its header records (``""`` if it does not), read inside the probe's
    transaction, where no writer changes the file.

    A file cut inside its last page reads without an error from SQLite, which takes the missing bytes
    for zeros (its pager zero-fills a short read), and hands the study's JSON back cut. The header
    records the database's size in pages (https://www.sqlite.org/fileformat.html, "In-header database
    size"); in WAL mode pages also live in the ``-wal`` file, so the comparison is the rollback
    journal's only.
    """
    connection.execute("SELECT count(*) FROM sqlite_master").fetchone()  # the header and the schema read
    (mode,) = connection.execute("PRAGMA journal_mode").fetchone()
    (pages,) = connection.execute("PRAGMA page_count").fetchone()
    (page_size,) = connection.execute("PRAGMA page_size").fetchone()
    size = path.stat().st_size
    if size == 0 or str(mode).lower() == "wal" or size >= pages * page_size:
        return ""  # an empty file is an empty database (SQLite counts the page it would write first)
    return f"truncated: {size} bytes of the {pages * page_size} its header records"


def _unreadable(path: Path, reason: str) -> str:
    return (
        f"{path} is not a readable study database ({reason}): pass the --storage of a study autotune wrote, "
        "or restore this file from a backup"
    )


def _check_sqlite_writable(path: str) -> None:
    if path in ("", ":memory:"):
        return
    target = Path(path)
    directory = target.parent if str(target.parent) else Path(".")
    if target.exists() and not os.access(target, os.W_OK):
        raise AutotuneError(f"--storage: {target} is not writable; choose another path")
    if not target.exists() and not (directory.is_dir() and os.access(directory, os.W_OK)):
        raise AutotuneError(f"--storage: cannot create {target} (is {directory} an existing, writable directory?)")
    # os.access answers yes to root for any mode, and knows nothing of read-only or special file
    # systems (/proc): only opening the file tells. Append mode changes nothing in an existing
    # file; a new, empty file is a valid empty SQLite database.
    try:
        with open(target, "ab"):
            pass
    except OSError as exc:
        raise AutotuneError(f"--storage: cannot write {target} ({exc.strerror}); choose a writable path") from None


# Query parameters that carry a credential, as parts of the parameter's name in any case: libpq's
# ``password`` and ``sslpassword`` (https://www.postgresql.org/docs/current/libpq-connect.html,
# "Parameter Key Words"; SQLAlchemy hands a URL's query to the driver: its ``URL.query``), MySQL's
# ``passwd``, and any token, secret, key or auth parameter another driver takes. Naming a non-secret
# one (``passfile``, a path) only hides a value that was never secret.
_CREDENTIAL_WORDS = ("pass", "pwd", "secret", "token", "key", "auth", "credential")
REDACTED = "***"
# Where a parser may cut a credential into parts, each of which a driver's message can then carry alone:
# SQLAlchemy's URL takes the password to the first "@" (sqlalchemy/engine/url.py, ``_parse_url``), so
# ``u:Abc@SECRET@host`` reaches libpq as host ``SECRET@host``; a query value holds ``;`` or ``&``.
_SECRET_PARTS = re.compile(r"[@:/?#&;=,\s\"']+")
# The URLs this process opened (:func:`open_storage`): every error text is scrubbed of their secrets.
_OPENED_URLS: set[str] = set()


def redact(url: str) -> str:
    """The URL with every credential in it replaced by ``***``: the one rule for showing a storage URL.

    Both places a driver takes a password from: the userinfo (``user:password@host``) and the query
    (``?password=...``, ``sslpassword=``, ``token=``, ... for every driver). Every command that prints a
    storage URL, and every message that names one, shows it through this function; a driver's words go
    through :func:`scrub_password`, which hides the same secrets.
    """
    shown, end = [], 0
    for start, stop in _credential_spans(url):
        shown += [url[end:start], REDACTED]
        end = stop
    return "".join([*shown, url[end:]])


def url_secrets(url: str) -> list[str]:
    """The credentials in ``url`` (as written and percent-decoded), longest first: what no message may show."""
    from urllib.parse import unquote, unquote_plus

    found = {
        variant
        for start, stop in _credential_spans(url)
        for variant in _decoded(url[start:stop], unquote, unquote_plus)
    }
    return sorted((secret for secret in found if secret), key=lambda secret: (-len(secret), secret))


def _secret_parts(url: str) -> list[str]:
    """The parts a parser may cut each credential of ``url`` into (:data:`_SECRET_PARTS`), longest first."""
    parts = {part for secret in url_secrets(url) for part in _SECRET_PARTS.split(secret) if part and part != secret}
    return sorted(parts, key=lambda part: (-len(part), part))


def _decoded(text: str, *decoders: Any) -> set[str]:
    return {text, *(decode(text) for decode in decoders)}


def _credential_spans(url: str) -> list[tuple[int, int]]:
    """Where the credentials of ``url`` are (start, stop), in order.

    The userinfo is read generously, so that a password written unescaped (``p@ss``, ``pa/ss``,
    ``pa?ss``) is hidden whole: the user name ends at the first ``:``, the password at the last ``@``
    before the query that follows the first ``@``. In the query, a credential runs from its parameter's
    ``=`` to the end of the URL: whatever follows it may be read as part of it (``password=a&b``, ``a#b``),
    and a parameter is found wherever a parser may cut one (``sslmode=disable;password=...``: SQLAlchemy
    splits at ``&`` alone, and libpq echoes the whole value in its refusal).
    """
    spans: list[tuple[int, int]] = []
    scheme = url.find("://")
    rest = scheme + 3 if scheme >= 0 else 0
    query_from = rest
    first_at = url.find("@", rest)
    if scheme >= 0 and first_at >= 0 and not url.startswith("/", rest):
        query_after = url.find("?", first_at)
        userinfo_end = url.rfind("@", rest, query_after if query_after >= 0 else len(url))
        colon = url.find(":", rest, userinfo_end)
        if colon >= 0 and "/" not in url[rest:colon]:
            spans.append((colon + 1, userinfo_end))
        query_from = userinfo_end
    query = url.find("?", query_from)
    if query >= 0:
        from urllib.parse import unquote_plus

        for parameter in re.finditer(r"[^&;?=#]*=", url[query + 1 :]):
            value_start = query + 1 + parameter.end()
            if value_start < len(url) and any(w in unquote_plus(parameter.group()).lower() for w in _CREDENTIAL_WORDS):
                spans.append((value_start, len(url)))
                break
    return spans


def scrub_password(text: str, url: str | None = None) -> str:
    """``text`` (a driver's error message, say) with every secret of ``url`` redacted: each credential as
    written and decoded, each part a parser may cut one into (as a whole word: the text keeps its other
    words), and any URL in it shown through :func:`redact`. Without ``url``: the secrets of every storage
    URL this process opened, which any error text may carry."""
    for each in [url] if url is not None else sorted(_OPENED_URLS):
        for secret in url_secrets(each):
            text = text.replace(secret, REDACTED)
        for part in _secret_parts(each):
            text = re.sub(rf"(?<![A-Za-z0-9]){re.escape(part)}(?![A-Za-z0-9])", REDACTED, text)
    return re.sub(r"[a-z0-9+]+://\S+", lambda m: redact(m.group(0)), text)


def load_study(storage_url: str, study_name: str | None) -> optuna.Study:
    """Load an existing study for reading; the only one in the storage if no name is given."""
    storage = open_storage(storage_url, existing=True)
    names = [s.study_name for s in storage.get_all_studies()]
    if study_name is None:
        if not names:
            raise AutotuneError(
                f"{redact(storage_url)} holds no study: run autotune search with this --storage first, or point "
                "--storage at the database a search wrote"
            )
        if len(names) > 1:
            raise AutotuneError(
                f"{redact(storage_url)} holds {len(names)} studies ({', '.join(names)}); name one with --study-name"
            )
        study_name = names[0]
    if study_name not in names:
        raise AutotuneError(f"no study {study_name!r} in {redact(storage_url)} (studies: {', '.join(names) or 'none'})")
    return optuna.load_study(study_name=study_name, storage=storage)


def storage_failure(exc: BaseException) -> str:
    """The database's own reason under Optuna's generic ``StorageInternalError`` ("database or disk is full")."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    text = scrub_password(str(exc)).strip()  # a lost server's words name its host, where a secret may be
    return text.splitlines()[0][:200] if text else type(exc).__name__
