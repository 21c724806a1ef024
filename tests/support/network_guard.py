"""A guard that records, and refuses, every attempt of a process to reach the network.

Installed at interpreter start by a ``sitecustomize`` module that a test puts first on ``PYTHONPATH``
(:func:`sitecustomize_dir`): Python imports it in every interpreter it starts (the ``autotune``
command, its forkserver, hence every trial child forked from it, and a multi-rank trial's launcher
and ranks), before any of autotune, transformers or huggingface_hub is imported. Each attempt is one
line in the file that ``AUTOTUNE_TEST_CONNECTIONS`` names: a connect to an address other than the
loopback, or a host name looked up (a DNS query is itself network traffic). The attempt then fails
as on a machine without a network, so nothing leaves even when the guard finds something.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
from pathlib import Path

LOG_VARIABLE = "AUTOTUNE_TEST_CONNECTIONS"


def sitecustomize_dir(root: Path) -> Path:
    """A directory holding a ``sitecustomize.py`` that installs the guard; put it first on PYTHONPATH."""
    directory = root / "network-guard"
    directory.mkdir(exist_ok=True)
    (directory / "sitecustomize.py").write_text("from tests.support.network_guard import install\ninstall()\n")
    return directory


def attempts(log: Path) -> list[str]:
    """The attempts recorded so far: ``<pid> connect <address>`` or ``<pid> resolve <host>``."""
    return log.read_text().splitlines() if log.exists() else []


def _leaves_the_machine(host: object) -> bool:
    if not isinstance(host, str):
        return False
    try:
        return not ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return host != "localhost"


def install() -> None:
    """Wrap ``socket.socket.connect``/``connect_ex`` and ``socket.getaddrinfo`` (every HTTP client in
    Python, httpx and urllib3 among them, reaches the network through them)."""
    log = os.environ.get(LOG_VARIABLE)
    if not log:
        return

    def record(what: str) -> None:
        with open(log, "a") as f:
            f.write(f"{os.getpid()} {what}\n")

    connect, connect_ex, getaddrinfo = socket.socket.connect, socket.socket.connect_ex, socket.getaddrinfo

    def outside(sock: socket.socket, address: object) -> bool:
        return (
            sock.family in (socket.AF_INET, socket.AF_INET6)
            and isinstance(address, tuple)
            and _leaves_the_machine(address[0])
        )

    def guarded_connect(self: socket.socket, address: object) -> None:
        if outside(self, address):
            record(f"connect {address!r}")
            raise OSError(errno.ENETUNREACH, "network unreachable (the test's network guard)")
        return connect(self, address)

    def guarded_connect_ex(self: socket.socket, address: object) -> int:
        if outside(self, address):
            record(f"connect {address!r}")
            return errno.ENETUNREACH
        return connect_ex(self, address)

    def guarded_getaddrinfo(host: object, *args: object, **kwargs: object) -> list:
        if isinstance(host, bytes):
            host = host.decode()
        if host is not None and _leaves_the_machine(host) and not _is_address(host):
            record(f"resolve {host}")
            raise socket.gaierror(socket.EAI_NONAME, "name unknown (the test's network guard)")
        return getaddrinfo(host, *args, **kwargs)

    socket.socket.connect = guarded_connect  # type: ignore[method-assign]  # the guard, for the test's duration
    socket.socket.connect_ex = guarded_connect_ex  # type: ignore[method-assign]  # the guard, for the test's duration
    socket.getaddrinfo = guarded_getaddrinfo  # type: ignore[assignment]  # the guard, for the test's duration


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return False
    return True
