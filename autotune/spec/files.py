"""The files a user names on the command line, read once with one-line errors; and what a command writes
(``export``, ``report``, ``chat-corpus``): never over what it reads or an existing file unasked, never
left half-written (:class:`Destination`)."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import stat
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TextIO, TypeVar

from autotune.errors import AutotuneError

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Destination:
    """Where a command writes what it made (``--out``), and the one rule of what it may write over.

    Nothing the command reads is written over, even with ``--force`` (``keep``: a study's database and
    SQLite's journals of it, which ``export`` and ``report`` read); an existing regular file is replaced
    only when the user asked (``--force``); ``-`` is standard output, and a device or a named pipe
    (``/dev/stdout``) is written in place. What is written to a file is written whole or not at all.
    """

    out: str
    force: bool = False
    keep: tuple[str, ...] = ()
    option: str = "--out"

    def check(self, path: str) -> None:
        """The rule for one path this command would write (``out`` or a side file beside it).

        Raises:
            AutotuneError: ``path`` is a file the command reads, a directory, or an existing regular
                file the user did not ask to replace; the line says what to do.
        """
        if path == "-":
            return
        if any(_same_file(path, kept) for kept in self.keep):
            raise AutotuneError(
                f"{self.option} {path}: that is the study's database, which this command reads: choose another file"
            )
        try:
            mode = os.stat(path).st_mode
        except OSError:
            return  # nothing there (or unreachable: writing says why in one line)
        if stat.S_ISDIR(mode):
            raise AutotuneError(f"{self.option} {path}: it is a directory: name a file in it")
        if stat.S_ISREG(mode) and not self.force:
            raise AutotuneError(
                f"{self.option} {path}: the file exists and autotune does not write over a file unasked: "
                "pass --force to replace it, or choose another file"
            )

    @property
    def side_files(self) -> bool:
        """Whether files may be written beside ``out`` (a DeepSpeed config, adapters): only beside a regular
        file, never for standard output (``./name`` would land in the working directory) or a device
        (``/dev/null.adapter_config.json`` would land in ``/dev``)."""
        return writes_beside(self.out)

    def write(self, files: Mapping[str, str]) -> None:
        """Write each file's text (``out`` and any side files), every path checked before the first is written.

        Raises:
            AutotuneError: A path the rule refuses (:meth:`check`), two that name one file, or a write that
                failed (full disk, no such directory, no permission): an existing file is left unchanged.
        """
        paths = list(files)
        for index, path in enumerate(paths):
            self.check(path)
            if any(_same_file(path, earlier) for earlier in paths[:index]):
                raise AutotuneError(f"{self.option} {self.out}: {path} would be written twice: choose another name")
        for path, text in files.items():
            self.stream(functools.partial(_write_text, text=text), path)

    def stream(self, write: Callable[[TextIO], T], path: str | None = None) -> T:
        """Call ``write`` on an open text stream to ``path`` (default ``out``) and return what it returns.

        A regular file is written to a temporary file beside it, flushed to disk, then renamed over it
        (``os.replace``, atomic on POSIX within one file system): on a full disk, an error or Ctrl-C the
        temporary file is removed and a previous file stays as it was. A device or a pipe is written in
        place: renaming over it would replace the device node with a regular file.

        Raises:
            AutotuneError: The rule refuses ``path`` (:meth:`check`), or it cannot be written.
        """
        path = self.out if path is None else path
        self.check(path)
        if path == "-":
            result = write(sys.stdout)
            sys.stdout.flush()
            return result
        target = Path(path)
        try:
            if target.exists() and not target.is_file():
                with open(target, "w", encoding="utf-8") as f:
                    return write(f)
            return _replace_atomically(target, write)
        except OSError as exc:
            raise AutotuneError(
                f"{self.option} {path}: cannot write it ({exc.strerror or exc}); an existing file there is left unchanged"
            ) from None


def write_output(out: str, text: str, force: bool = False, keep: tuple[str, ...] = ()) -> None:
    """Write ``text`` to ``out`` under :class:`Destination`'s rule (``-``: standard output)."""
    Destination(out, force, keep).write({out: text})


def _write_text(stream: TextIO, text: str) -> int:
    return stream.write(text)


def writes_beside(out: str) -> bool:
    """Whether ``out`` is a regular file (or none yet), beside which side files may be written."""
    if out == "-":
        return False
    try:
        return stat.S_ISREG(os.stat(out).st_mode)
    except OSError:
        return True


def _same_file(path: str, other: str) -> bool:
    """Whether two paths name one file: the same inode where both exist (a hard or symbolic link), else
    the same resolved path."""
    with contextlib.suppress(OSError):
        return os.path.samefile(path, other)
    return os.path.realpath(path) == os.path.realpath(other)


def _replace_atomically(path: Path, write: Callable[[TextIO], T]) -> T:
    """Temporary file in the target's directory, fsync, rename; the temporary file never stays behind."""
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as f:
            result = write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(temporary, _mode_for(path))
        os.replace(temporary, path)
        return result
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
