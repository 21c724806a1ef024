"""The files a user names on the command line, read once with one-line errors; and what a command writes
(``export``, ``report``), never left half-written."""

from __future__ import annotations

import contextlib
import os
import stat
import sys
import tempfile
from pathlib import Path

from autotune.errors import AutotuneError


def write_output(out: str, text: str) -> None:
    """Write ``text`` to ``out``: ``-`` is standard output; a file is replaced whole or not at all.

    A regular file is written to a temporary file beside it, flushed to disk, then renamed over it
    (``os.replace``, atomic on POSIX within one file system): on a full disk the previous file stays
    as it was instead of being truncated. A device or a pipe (``/dev/stdout``, a FIFO) is written
    in place: renaming over it would replace the device node with a regular file.

    Raises:
        AutotuneError: ``out`` cannot be written (full disk, no such directory, no permission).
    """
    if out == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    path = Path(out)
    try:
        if path.exists() and not path.is_file():
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
            return
        _replace_atomically(path, text)
    except OSError as exc:
        raise AutotuneError(
            f"--out {out}: cannot write it ({exc.strerror or exc}); an existing file there is left unchanged"
        ) from None


def _replace_atomically(path: Path, text: str) -> None:
    """Temporary file in the target's directory, fsync, rename; the temporary file never stays behind."""
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(temporary, _mode_for(path))
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def _mode_for(path: Path) -> int:
    """The existing file's permissions, or what ``open()`` would give a new file (0666 less the umask)."""
    if path.exists():
        return stat.S_IMODE(path.stat().st_mode)
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


# What a path names, by its file type (POSIX ``stat``: ``S_ISREG`` ...), in the words of the messages.
_KINDS = (
    (stat.S_ISREG, "file"),
    (stat.S_ISDIR, "directory"),
    (stat.S_ISFIFO, "named pipe (FIFO)"),
    (stat.S_ISCHR, "character device"),
    (stat.S_ISBLK, "block device"),
    (stat.S_ISSOCK, "socket"),
)


def user_path_kind(path: str | Path, option: str, allowed: tuple[str, ...] = ("file",)) -> str:
    """The one check of what a path the user named is, before anything opens or reads it.

    Symbolic links are followed (a loop of them is one line, not pathlib's RuntimeError); the path must
    then be one of ``allowed`` (``file``, ``directory``): a named pipe would block a reader for ever,
    and a device such as ``/dev/zero`` never ends or is not data.

    Returns:
        The kind it is (one of ``allowed``).

    Raises:
        AutotuneError: It does not exist, cannot be reached (a loop of symbolic links, no
            permission), or is another kind of file; the line says which.
    """
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:  # ENOENT, ELOOP ("Too many levels of symbolic links"), EACCES, ENAMETOOLONG
        raise AutotuneError(f"{option} {path}: cannot read it ({exc.strerror or exc})") from None
    kind = next((name for is_kind, name in _KINDS if is_kind(mode)), "special file")
    if kind not in allowed:
        wanted = " or a ".join(allowed)
        raise AutotuneError(f"{option} {path}: it is a {kind}, not a {wanted}")
    return kind


def writable_directory(path: str, option: str) -> None:
    """``path`` is a directory autotune can write in, or one it can create: checked before anything is
    written there, and nothing is left behind (a directory is made and removed at once to prove it;
    permissions alone do not say it: root may write anywhere except where the file system refuses,
    ``/proc``, a read-only mount).

    Raises:
        AutotuneError: The path (or the nearest part of it that exists) is not a directory
            (:func:`user_path_kind`), or no directory can be made in it.
    """
    existing = Path(path).expanduser().absolute()
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    user_path_kind(existing, option, ("directory",))  # names the part that is not a directory
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".autotune-probe-", dir=existing))
    except OSError as exc:
        raise AutotuneError(f"{option} {path}: cannot write in {existing} ({exc.strerror or exc})") from None


def read_user_file(path: str, option: str, expected: str, max_bytes: int | None = None, size_hint: str = "") -> str:
    """The text of a file the user named on the command line (``--space``, ``--base-args``, ``--peft``).

    The one ladder of what can go wrong before parsing, each a one-line error naming the option:
    the path is not a regular file, the file cannot be read, is larger than ``max_bytes``, or is not
    UTF-8 text. Parsing (YAML,
    JSON) and its errors belong to the caller, which knows the format.

    Args:
        path: The file.
        option: The command-line option that named it, for the message.
        expected: What it should hold, for the message (``"UTF-8 YAML"``).
        max_bytes: Refuse a larger file (``None``: no limit).
        size_hint: What a file of the right size looks like, for the message.

    Raises:
        AutotuneError: Not a regular file (:func:`user_path_kind`), unreadable, too large, or not UTF-8 text.
    """
    user_path_kind(path, option)
    try:
        with open(path, "rb") as f:
            data = f.read() if max_bytes is None else f.read(max_bytes + 1)
    except OSError as exc:
        raise AutotuneError(f"{option} {path}: cannot read it ({exc.strerror})") from None
    if max_bytes is not None and len(data) > max_bytes:
        raise AutotuneError(
            f"{option} {path}: larger than {max_bytes // 1024} KiB" + (f"; {size_hint}" if size_hint else "")
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise AutotuneError(f"{option} {path}: not a text file ({expected} expected)") from None


def autotune_cache_dir() -> Path:
    """autotune's directory in the user's cache (``$XDG_CACHE_HOME/autotune``, else ``~/.cache/autotune``):
    measured peaks, the CPU process baseline and figures derived from configs live there."""
    return Path(os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")) / "autotune"
