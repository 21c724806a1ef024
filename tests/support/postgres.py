"""A real PostgreSQL server for the tests: initdb in a temporary directory, loopback only.

The server runs as an unprivileged user (PostgreSQL refuses to run as root): the invoking user,
or, under root, Debian's ``postgres`` account or ``nobody``. It listens on 127.0.0.1 at a free
port and on a Unix socket inside its own directory, requires a password over TCP (SCRAM), and is
stopped and deleted when the test session ends. Every test gets a database of its own.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

SERVER_PROGRAMS = ("initdb", "pg_ctl", "postgres")
MISSING_REASON = (
    "PostgreSQL server binaries (initdb, pg_ctl, postgres) not found on PATH or in /usr/lib/postgresql/*/bin: "
    "apt-get install postgresql"
)


@dataclasses.dataclass(frozen=True)
class PostgresServer:
    """A running test server: connect as ``user`` with ``password`` on ``host:port``; ``control``
    restarts or pauses it (the fault tests, tests/study/test_postgres_faults.py)."""

    host: str
    port: int
    user: str
    password: str
    control: _ServerProcess | None = dataclasses.field(default=None, compare=False, repr=False)

    def url(self, database: str, password: str | None = None) -> str:
        return f"postgresql://{self.user}:{password or self.password}@{self.host}:{self.port}/{database}"

    def execute(self, statement: str) -> None:
        """Run one statement outside a transaction (CREATE / DROP DATABASE) in the ``postgres`` database."""
        import psycopg2

        connection = psycopg2.connect(
            host=self.host, port=self.port, user=self.user, password=self.password, dbname="postgres"
        )
        connection.autocommit = True  # CREATE and DROP DATABASE cannot run inside a transaction
        try:
            with connection.cursor() as cursor:
                cursor.execute(statement)
        finally:
            connection.close()


def server_bin_dir() -> Path | None:
    """The directory holding initdb, pg_ctl and postgres, or ``None`` when they are not installed."""
    candidates = []
    found = shutil.which("initdb")
    if found:
        candidates.append(Path(found).resolve().parent)
    # Debian keeps them off PATH, one directory per major version: newest first.
    candidates += sorted((Path(p) for p in glob.glob("/usr/lib/postgresql/*/bin")), key=_major_version, reverse=True)
    for directory in candidates:
        if all((directory / program).is_file() for program in SERVER_PROGRAMS):
            return directory
    return None


def _major_version(bin_dir: Path) -> int:
    name = bin_dir.parent.name
    return int(name) if name.isdigit() else 0


def _server_account() -> tuple[int, int]:
    """uid and gid to run the server as: ourselves, or an unprivileged account when we are root."""
    if os.geteuid() != 0:
        return os.geteuid(), os.getegid()
    for name in ("postgres", "nobody"):
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            continue
        return entry.pw_uid, entry.pw_gid
    raise RuntimeError("running as root and neither a 'postgres' nor a 'nobody' account exists to run PostgreSQL as")


def _free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class _ServerProcess:
    def __init__(self, bin_dir: Path) -> None:
        self.bin_dir = bin_dir
        self.uid, self.gid = _server_account()
        self.root = Path(tempfile.mkdtemp(prefix="autotune-pg-"))
        os.chown(self.root, self.uid, self.gid)
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.options = ""  # the postmaster options of the last start (serve_again reuses them)

    def run(self, *args: str) -> subprocess.CompletedProcess:
        as_other_user = self.uid != os.geteuid()
        completed = subprocess.run(
            [str(self.bin_dir / args[0]), *args[1:]],
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=120,
            env={"PATH": f"{self.bin_dir}:/usr/bin:/bin", "LC_ALL": "C", "HOME": str(self.root)},
            user=self.uid if as_other_user else None,
            group=self.gid if as_other_user else None,
            extra_groups=[] if as_other_user else None,
        )
        if completed.returncode != 0:
            log = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
            raise RuntimeError(
                f"{' '.join(args[:2])} failed ({completed.returncode}): {completed.stderr[-2000:]}\n{log}"
            )
        return completed

    def start(self, user: str, password: str) -> int:
        password_file = self.root / "password"
        password_file.write_text(password + "\n")
        os.chown(password_file, self.uid, self.gid)
        self.run(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            user,
            f"--pwfile={password_file}",
            "--auth-local=trust",
            "--auth-host=scram-sha-256",
            "--no-locale",
            "--encoding=UTF8",
            "--no-sync",
        )
        password_file.unlink()
        last_error: RuntimeError | None = None
        for _ in range(3):  # a free port can be taken between probing and binding: try another
            port = _free_loopback_port()
            options = (
                f"-h 127.0.0.1 -p {port} -k {self.root} -c max_connections=100 -c shared_buffers=16MB "
                "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
            )
            try:
                self.run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "-o", options, "start")
                self.options = options
                return port
            except RuntimeError as exc:
                last_error = exc
        raise RuntimeError(f"PostgreSQL did not start: {last_error}")

    def restart(self) -> None:
        """Stop the server (fast: every connection is closed) and start it again, on the same port with
        the same options (pg_ctl reuses those of the previous start: ``postmaster.opts``)."""
        self.run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "-m", "fast", "restart")

    def stop_serving(self) -> None:
        """Shut the server down (fast: every connection is closed); ``serve_again`` brings it back."""
        self.run("pg_ctl", "-D", str(self.data), "-w", "-m", "fast", "stop")

    def serve_again(self) -> None:
        """Start the server stopped by ``stop_serving`` on the same port with the same options."""
        self.run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "-o", self.options, "start")

    def processes(self) -> list:
        """The postmaster and every process it forked (backends, checkpointer, ...), as psutil processes."""
        import psutil

        postmaster = psutil.Process(int((self.data / "postmaster.pid").read_text().split()[0]))
        return [postmaster, *postmaster.children(recursive=True)]

    def stop(self) -> None:
        try:
            self.run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        except RuntimeError:
            pass  # never started, or already gone
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One PostgreSQL server for the session; skipped (failed on CI) where the binaries are absent."""
    bin_dir = server_bin_dir()
    if bin_dir is None:
        if os.environ.get("CI"):
            pytest.fail(f"{MISSING_REASON} (.ci/run should have installed them)")
        pytest.skip(MISSING_REASON)
    server = _ServerProcess(bin_dir)
    password = "pw-" + secrets.token_hex(8)
    try:
        port = server.start(user="autotune", password=password)
        yield PostgresServer(host="127.0.0.1", port=port, user="autotune", password=password, control=server)
    finally:
        server.stop()


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> str:
    """The URL (password included) of a fresh, empty database for one test."""
    database = "test_" + secrets.token_hex(6)
    postgres_server.execute(f"CREATE DATABASE {database}")
    return postgres_server.url(database)
