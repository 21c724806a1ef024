"""Library chatter kept off autotune's lines: what an imported library prints, warns or logs goes to a debug log.

autotune answers in its own lines (one ``autotune: error:`` line for bad input, the trial table). The
libraries it imports speak too, and each of these reached the terminal between those lines:
bitsandbytes 0.50.2 logs "Failed to load CPU gemm_4bit_forward from kernels-community ..." whenever it is
imported on an AVX512-BF16 CPU (bitsandbytes/backends/cpu/ops.py; a logger without a handler, which
Python's last-resort handler writes to stderr), and transformers imports it with ``TrainingArguments``
(through peft); DeepSpeed logs "Setting accelerator to CPU ..." through a stdout handler of its own when
it is imported (deepspeed/accelerator/real_accelerator.py); transformers 5.24 warns that
``gradient_checkpointing`` is deprecated whenever an ``SFTConfig`` is built (a FutureWarning,
transformers/training_args.py, ``__post_init__``).

Where it goes:

- In the command line's process (:func:`library_output_to_debug_log`, around ``autotune.__main__.main``): to the debug
  log, :func:`debug_log_path`. Warnings and the loggers of libraries reach it through a handler on the
  root logger; what a library prints or logs through a handler of its own while it is imported, through
  an import hook (:class:`_QuietImports`), which gives a library's modules its
  ``sys.stdout`` and ``sys.stderr`` while they execute, so a handler made then keeps writing there.
- In the forkserver that starts the trials (:func:`process_output_to_debug_log`, only where
  :func:`in_forkserver_preload`): its stdout and stderr are the debug log; it imports torch and
  transformers and writes nothing of autotune's.
- In a trial: the trial's log, ``child.log`` (``runner/_child.py``, ``redirect_output``).

``AUTOTUNE_DEBUG=1`` leaves each library's output where the library sends it (the terminal).
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import io
import logging
import logging.handlers
import os
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import IO, Any

DEBUG_ENV = "AUTOTUNE_DEBUG"  # set (not 0): every library's output where the library sends it
DEBUG_LOG_ENV = "AUTOTUNE_DEBUG_LOG"  # the debug log's path, instead of the cache directory's
DEBUG_LOG_BYTES = 1024**2  # then it is rotated once: the log and one older file, at most 2 MiB of chatter
_FORMAT = "%(asctime)s pid %(process)d %(name)s %(levelname)s: %(message)s"

# What a library's modules printed while they executed, and its own handlers made then: the debug log only.
_printed = logging.getLogger("autotune.library_output")
_printed.propagate = False


def debug_log_path() -> Path:
    """Where the parent's library output goes: ``$AUTOTUNE_DEBUG_LOG``, else ``logs/autotune.log`` in
    autotune's cache directory (``~/.cache/autotune``)."""
    from autotune.spec.files import autotune_cache_dir

    return Path(os.environ.get(DEBUG_LOG_ENV) or autotune_cache_dir() / "logs" / "autotune.log")


def shown() -> bool:
    """``AUTOTUNE_DEBUG`` is set: library output is left where each library sends it."""
    return os.environ.get(DEBUG_ENV, "").strip() not in ("", "0")


@contextlib.contextmanager
def library_output_to_debug_log() -> Iterator[None]:
    """Within the block, every library's output goes to the debug log: its warnings, its loggers, and what
    it prints (or logs through a handler of its own) while it is imported."""
    if shown():
        yield
        return
    handler = _DebugLog(debug_log_path())
    for previous in _printed.handlers:
        previous.close()
    _printed.handlers = [handler]
    root, finder = logging.getLogger(), _QuietImports()
    root.addHandler(handler)
    logging.captureWarnings(True)
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(finder)
        logging.captureWarnings(False)
        root.removeHandler(handler)


def in_forkserver_preload() -> bool:
    """Whether this process is multiprocessing's forkserver importing its preload modules: its
    ``main`` (``multiprocessing/forkserver.py``) is on the stack."""
    frame = sys._getframe()
    while frame is not None:
        code = frame.f_code
        if code.co_name == "main" and code.co_filename.endswith(os.path.join("multiprocessing", "forkserver.py")):
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


def process_output_to_debug_log() -> None:
    """This process's stdout and stderr, as files, become the debug log (the forkserver's: it prints
    nothing of autotune's, and every trial it starts writes to its own log)."""
    if shown():
        return
    path = debug_log_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    except OSError:
        return  # no debug log to be had: the output stays where it was
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


class _DebugLog(logging.handlers.RotatingFileHandler):
    """The debug log file, opened at its first line; a line it cannot write is dropped, never shown."""

    def __init__(self, path: Path) -> None:
        with contextlib.suppress(OSError):
            path.parent.mkdir(parents=True, exist_ok=True)
        super().__init__(path, maxBytes=DEBUG_LOG_BYTES, backupCount=1, encoding="utf-8", delay=True)
        self.setFormatter(logging.Formatter(_FORMAT))

    def handleError(self, record: logging.LogRecord) -> None:
        pass  # a full or read-only disk: the chatter is lost, not turned into a traceback on the terminal


# --- what a library prints while it is imported ---------------------------------------------------------

_lock = threading.RLock()
_importing: dict[int, int] = {}  # thread -> depth of library imports it is executing


class _LibraryStream(io.TextIOBase):
    """``sys.stdout`` or ``sys.stderr`` while a library's modules execute, and for good for any handler a
    library made then: whole lines go to the debug log. Another thread's writes meanwhile (the search's own
    lines, the live view) go on to the stream it replaced."""

    def __init__(self, label: str) -> None:
        super().__init__()
        self.label = label
        self.replaced: IO[str] | None = None
        self._partial = ""

    def _elsewhere(self) -> IO[str] | None:
        """The replaced stream, for a thread that is not importing a library while another one is."""
        with _lock:
            return self.replaced if _importing and threading.get_ident() not in _importing else None

    def write(self, text: str) -> int:
        other = self._elsewhere()
        if other is not None:
            return other.write(text)
        with _lock:
            *lines, self._partial = (self._partial + text).split("\n")
        for line in lines:
            if line.strip():
                _printed.warning("%s: %s", self.label, line.rstrip())
        return len(text)

    def flush(self) -> None:
        other = self._elsewhere()
        if other is not None:
            other.flush()

    def isatty(self) -> bool:
        other = self._elsewhere()
        return other.isatty() if other is not None else False

    def fileno(self) -> int:
        other = self._elsewhere()
        if other is None:
            raise io.UnsupportedOperation("the debug log has no file descriptor here")
        return other.fileno()

    def writable(self) -> bool:
        return True

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return "utf-8"


_stdout, _stderr = _LibraryStream("stdout"), _LibraryStream("stderr")


@contextlib.contextmanager
def _library_executing() -> Iterator[None]:
    """While this thread executes a library's module: ``sys.stdout`` and ``sys.stderr`` are the debug log's."""
    me = threading.get_ident()
    with _lock:
        if not _importing:
            _stdout.replaced, _stderr.replaced = sys.stdout, sys.stderr
            sys.stdout, sys.stderr = _stdout, _stderr
        _importing[me] = _importing.get(me, 0) + 1
    try:
        yield
    finally:
        with _lock:
            _importing[me] -= 1
            if not _importing[me]:
                del _importing[me]
            if not _importing and _stdout.replaced is not None and _stderr.replaced is not None:
                # Put back whatever the library did to them: a library that wrapped sys.stdout at import
                # would otherwise send autotune's own lines through its wrapper to the debug log.
                sys.stdout, sys.stderr = _stdout.replaced, _stderr.replaced


class _Quietly:
    """A loader that executes its module (and creates it: an extension module's C init runs there) quietly."""

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        with _library_executing():
            return super().create_module(spec)  # type: ignore[misc] # a mixin: the loader class comes after it

    def exec_module(self, module: ModuleType) -> None:
        with _library_executing():
            super().exec_module(module)  # type: ignore[misc] # a mixin: the loader class comes after it


# typeshed's stubs of SourceFileLoader and ExtensionFileLoader disagree with their own bases (source_to_code,
# create_module's return): mypy reports any subclass of them.
class _QuietSourceFileLoader(_Quietly, importlib.machinery.SourceFileLoader):  # type: ignore[misc]
    pass


class _QuietSourcelessFileLoader(_Quietly, importlib.machinery.SourcelessFileLoader):
    pass


class _QuietExtensionFileLoader(_Quietly, importlib.machinery.ExtensionFileLoader):  # type: ignore[misc]
    pass


# The loaders of Python's path finder, each with its quiet subclass: a module keeps a loader of its
# usual class (``inspect.getsource``, ``importlib.resources`` read through it as before). Any other
# loader (a zip, an editable install's) is left as it is.
_QUIET_LOADERS: dict[type, Any] = {
    importlib.machinery.SourceFileLoader: _QuietSourceFileLoader,
    importlib.machinery.SourcelessFileLoader: _QuietSourcelessFileLoader,
    importlib.machinery.ExtensionFileLoader: _QuietExtensionFileLoader,
}
# Python's own modules and autotune's are not libraries that chatter.
_NOT_LIBRARIES = frozenset(sys.stdlib_module_names) | {"autotune"}


class _QuietImports(importlib.abc.MetaPathFinder):
    """First on ``sys.meta_path``: each module of a library is found by the finders after it, as always,
    and executed by the quiet subclass of its loader."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.partition(".")[0] in _NOT_LIBRARIES:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if finder is not self and find is not None else None
            if spec is not None:
                break
        else:
            return None
        quiet = _QUIET_LOADERS.get(type(spec.loader))
        if quiet is not None:
            spec.loader = quiet(spec.loader.name, spec.loader.path)
        return spec
