"""Where studies live: open an Optuna storage (SQLite or PostgreSQL, heartbeats, busy timeouts), load a
study for reading, keep credentials out of messages (``_open``), finish each storage call before a Ctrl-C lands (``_ctrl_c``); every key autotune writes into a study
(:mod:`autotune.storage.schema`). Everything that touches a study opens it here.
"""

from __future__ import annotations

from autotune.storage import schema
from autotune.storage._ctrl_c import STOP_SIGNALS, RDBStorageHoldingCtrlC
from autotune.storage._open import (
    DEFAULT_STORAGE,
    heartbeat_settings,
    load_study,
    open_storage,
    redact,
    require_sqlite_file,
    scrub_password,
    storage_failure,
    storage_files,
)

__all__ = [
    "DEFAULT_STORAGE",
    "STOP_SIGNALS",
    "RDBStorageHoldingCtrlC",
    "heartbeat_settings",
    "load_study",
    "open_storage",
    "redact",
    "require_sqlite_file",
    "schema",
    "scrub_password",
    "storage_failure",
    "storage_files",
]
