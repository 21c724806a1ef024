"""The CPU prior's process baseline, measured once per installation instead of assumed.

A CPU trial's measured peak (``runner._memory_probe.CpuMemoryProbe``) is what the same training shows as a
standalone process: the child's resident set plus the library pages the forkserver maps and the
child does not (``unmapped_import_file_bytes``). The part of it no config moves is the resident set
of an interpreter that has imported what a trial child imports: :data:`CPU_TRIAL_PROCESS_IMPORTS`,
the modules the forkserver preloads on the CPU. How many of those library pages are resident is a property of the
installation and of the page cache, not a constant: in a venv pip has just written, more of torch's
library pages are cached and mapped on each fault (the kernel's fault-around, ``mm/filemap.c``,
``filemap_map_pages``), so a constant baseline would put the prior well under a fresh venv's peaks.
So the prior reads the baseline of this installation: one subprocess, cached per interpreter,
installed torch and transformers and boot (a reboot empties the page cache) in
``$XDG_CACHE_HOME/autotune/process_baseline.json``; the documented constant where it cannot be
measured. The measurements behind this, per venv and per config: docs/estimator.md, "The CPU prior".
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import functools
import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from autotune.estimate import FALLBACK_CPU_PROCESS_BASELINE_BYTES
from autotune.spec.files import autotune_cache_dir

# What a trial child has imported before it builds a model, on any device: the forkserver preloads
# these (runner._pool.forkserver_context), so every child starts with them resident. (Not frozen out
# of the garbage collector's reach with gc.freeze(): that changed how the measured steps page-fault,
# against a plain run's; docs/benchmarks-archive.md, "Isolation overhead".)
TRIAL_PROCESS_IMPORTS = ("autotune.runner._forkserver_signals", "autotune.runner._trial")
# On the CPU, DeepSpeed too, where it is installed: every trial's Trainer imports it (transformers'
# Trainer.__init__ calls accelerate's Accelerator.unwrap_model, which imports deepspeed whenever it is
# installed: accelerate/utils/other.py, extract_model_from_parallel), about 1.3 s of CPU
# per trial on this 2-core machine (py-spy, docs/benchmarks.md "The test suite"); imported once by the
# forkserver instead. Not on CUDA: DeepSpeed's import probes the device unless told which it is
# (torch.cuda.is_available(), which "poisons fork": torch/cuda/__init__.py), and the forkserver is the
# process every trial forks from. The CPU memory prior's baseline measures this list (the CPU's).
CPU_TRIAL_PROCESS_IMPORTS = (*TRIAL_PROCESS_IMPORTS, "autotune.runner._cpu_deepspeed")


def trial_process_imports(device_kind: str) -> tuple[str, ...]:
    """The modules the forkserver preloads for trials on ``device_kind`` (``cpu``, ``cuda``)."""
    return CPU_TRIAL_PROCESS_IMPORTS if device_kind == "cpu" else TRIAL_PROCESS_IMPORTS


# The measuring subprocess imports torch and transformers: seconds, a minute on a loaded machine.
MEASURE_TIMEOUT_S = 300.0
# Prints this interpreter's resident set once the trial's imports are loaded (/proc/self/status, kB).
_MEASURE_SCRIPT = (
    "import importlib, json, sys\n"
    "for name in sys.argv[1:]:\n"
    "    importlib.import_module(name)\n"
    "fields = dict(line.split(':', 1) for line in open('/proc/self/status'))\n"
    "keys = ('VmRSS', 'RssAnon', 'RssFile', 'RssShmem')\n"
    "print(json.dumps({key: int(fields[key].split()[0]) * 1024 for key in keys}))\n"
)


@functools.cache
def cpu_process_baseline_bytes() -> int:
    """The resident memory of a process that has imported what a trial child imports, in this
    installation: read from the cache, else measured once in a subprocess and cached; the fallback
    constant where it cannot be measured."""
    key = installation_key()
    path = baseline_file()
    try:
        with _locked(path):  # concurrent searches and test workers measure once
            cached = _read(path).get(key)
            if isinstance(cached, dict) and isinstance(cached.get("VmRSS"), int) and cached["VmRSS"] > 0:
                return cached["VmRSS"]
            measured = _measure()
            if measured is None:
                return FALLBACK_CPU_PROCESS_BASELINE_BYTES
            stamp = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
            with contextlib.suppress(OSError):  # not kept: measured again by the next process
                _write(path, {**_read(path), key: {**measured, "measured_at": stamp}})
            return measured["VmRSS"]
    except OSError:  # the cache directory cannot be made or locked: measured, not kept
        measured = _measure()
        return measured["VmRSS"] if measured is not None else FALLBACK_CPU_PROCESS_BASELINE_BYTES


def installation_key() -> str:
    """What the baseline depends on: the interpreter, the modules measured, the installed torch,
    transformers and DeepSpeed (their versions and when their files were written: a reinstall into the
    same venv is a new one), and the boot (the page cache does not survive it)."""
    parts = [os.path.realpath(sys.executable), sys.prefix, ",".join(CPU_TRIAL_PROCESS_IMPORTS)]
    for package in ("torch", "transformers", "deepspeed"):
        try:
            version = importlib.metadata.version(package)
            spec = importlib.util.find_spec(package)
            written = os.stat(spec.origin).st_mtime_ns if spec and spec.origin else 0
        except (importlib.metadata.PackageNotFoundError, OSError, ValueError):
            version, written = "absent", 0
        parts.append(f"{package}={version}@{written}")
    try:
        parts.append(Path("/proc/sys/kernel/random/boot_id").read_text().strip())
    except OSError:
        pass
    return " ".join(parts)


def baseline_file() -> Path:
    """Where measured baselines are kept: the user's cache directory, beside ``peaks.json``."""
    return autotune_cache_dir() / "process_baseline.json"


def _measure() -> dict[str, int] | None:
    """One fresh interpreter's resident figures after :data:`CPU_TRIAL_PROCESS_IMPORTS`; ``None`` if it fails."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", _MEASURE_SCRIPT, *CPU_TRIAL_PROCESS_IMPORTS],
            capture_output=True,
            text=True,
            timeout=MEASURE_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
        figures = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, json.JSONDecodeError, IndexError):
        return None
    if not isinstance(figures, dict) or not all(isinstance(v, int) and v >= 0 for v in figures.values()):
        return None
    return figures if figures.get("VmRSS", 0) > 0 else None


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _read(path: Path) -> dict[str, object]:
    try:
        store = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}  # absent or damaged: measured again and rewritten
    return store if isinstance(store, dict) else {}


def _write(path: Path, store: dict[str, object]) -> None:
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(store, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)  # atomic: a reader sees the old file or the new one
