"""Storage URLs: a credential in one (userinfo or query, any driver) is never shown or stored.

``storage.redact`` is the one rule; the scan below plants secrets in every place a user might put
one and reads everything a search and the commands after it leave behind: the study database (all of
it, as bytes), every file and file name under the run's directory (exports, the report, the trial
children's logs), every command's output, and optuna-dashboard's JSON API as ``autotune dashboard``
serves it.
"""

from __future__ import annotations

import json
import os
import queue
import secrets
import subprocess
import sys
import threading
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from autotune.storage import redact
from autotune.storage._open import scrub_password, url_secrets
from tests.support.bad_input import TINY_SPACE
from tests.support.cli import FAST_SEARCH_ARGS, run_cli, run_cli_in_process


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://u:hunter2@h:5432/db", "postgresql://u:***@h:5432/db"),
        ("postgresql://u@127.0.0.1/db?password=hunter2", "postgresql://u@127.0.0.1/db?password=***"),
        (
            "postgresql+psycopg://u:a@h/db?sslmode=require&sslpassword=b&application_name=x",
            "postgresql+psycopg://u:***@h/db?sslmode=require&sslpassword=***",  # what follows a credential too
        ),
        (
            "postgresql:///db?host=/run/pg&user=u&PASSWORD=hunter2#x",
            "postgresql:///db?host=/run/pg&user=u&PASSWORD=***",
        ),
        ("mysql+pymysql://u:p%40ss@h/db?passwd=hunter2", "mysql+pymysql://u:***@h/db?passwd=***"),
        ("postgresql://u:p@ss@h/db", "postgresql://u:***@h/db"),  # an unescaped @ in the password
        ("postgresql://u:pa/ss@h/db", "postgresql://u:***@h/db"),
        ("postgresql://u:pa?ss@h/db?password=x", "postgresql://u:***@h/db?password=***"),
        ("postgresql://u:pw@h/db?options=a@b", "postgresql://u:***@h/db?options=a@b"),
        ("sqlite:///study.db?password=hunter2", "sqlite:///study.db?password=***"),
        (
            "snowflake://u@acct/db?token=t0k&private_key_file_pwd=k3y&api_key=z",
            "snowflake://u@acct/db?token=***",
        ),
        ("sqlite:////data/a@b/study.db", "sqlite:////data/a@b/study.db"),  # nothing secret: shown as given
        ("postgresql://u@h:5432/db?sslmode=require", "postgresql://u@h:5432/db?sslmode=require"),
        # A credential where a parser other than SQLAlchemy's cuts the query (libpq echoes the whole value).
        ("postgresql://u@h/db?sslmode=disable;password=hunter2", "postgresql://u@h/db?sslmode=disable;password=***"),
        ("postgresql://u@h/db?password=ab&cd", "postgresql://u@h/db?password=***"),
    ],
)
def test_every_credential_of_a_storage_url_is_redacted(url, shown):
    assert redact(url) == shown


def test_a_drivers_message_loses_the_password_as_written_and_as_decoded():
    url = "postgresql://u:p%40ss@h/db?sslpassword=s3cr3t"
    assert url_secrets(url) == ["p%40ss", "s3cr3t", "p@ss"]
    message = 'FATAL: password "p@ss" rejected; key "s3cr3t" for postgresql://u:p%40ss@h/db?sslpassword=s3cr3t'
    assert "p@ss" not in scrub_password(message, url) and "s3cr3t" not in scrub_password(message, url)


@pytest.mark.parametrize(
    "url",
    [
        # SQLAlchemy ends the password at the first "@": libpq is handed the host "SECRET@host.invalid".
        "postgresql://u:Abc@SECRET@host.invalid/db",
        # SQLAlchemy splits the query at "&" alone: libpq refuses the sslmode "disable;password=SECRET".
        "postgresql://u@localhost/db?sslmode=disable;password=SECRET",
    ],
)
def test_the_drivers_own_words_lose_every_part_of_a_secret(url):
    """The real driver (psycopg2) refuses each URL in its own words, which carry a part of the secret that
    the URL's parser cut off; the line autotune prints shows neither the URL's secret nor any part of it."""
    pytest.importorskip("psycopg2")
    from autotune.errors import AutotuneError
    from autotune.storage import open_storage

    with pytest.raises(AutotuneError, match="cannot open it") as refused:
        open_storage(url)
    assert "SECRET" not in str(refused.value)
    assert "host.invalid" in str(refused.value) or "sslmode" in str(refused.value)  # the driver's reason stays


def test_any_error_text_loses_the_secrets_of_every_storage_this_process_opened():
    """A storage failure after the storage opened (a lost server's words name its host) goes through the
    same redaction, although the error that carries it knows no URL."""
    from autotune.errors import AutotuneError
    from autotune.storage import open_storage, storage_failure

    with pytest.raises(AutotuneError):
        open_storage("postgresql://u:Xyz@PLANTED@host.invalid/db")
    lost = RuntimeError('could not translate host name "PLANTED@host.invalid" to address')
    assert storage_failure(lost) == 'could not translate host name "***@host.invalid" to address'


def _dashboard_responses(storage: str, cwd: Path) -> tuple[str, list[bytes]]:
    """``autotune dashboard`` on ``storage``: what it printed, and every GET its JSON API answers for the study."""
    process = subprocess.Popen(
        [sys.executable, "-m", "autotune", "dashboard", "--storage", storage, "--port", "0"],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "COLUMNS": "400"},
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in process.stdout], daemon=True).start()
    printed, bodies = "", []
    try:
        while "http://" not in printed:
            printed += lines.get(timeout=120)
        base = printed[printed.index("http://") :].split()[0].split("/dashboard")[0]

        def get(path: str) -> bytes:
            with urllib.request.urlopen(base + path, timeout=60) as response:
                return response.read()

        summaries = get("/api/studies")
        bodies += [summaries, get("/api/meta"), get("/dashboard/")]
        for summary in json.loads(summaries)["study_summaries"]:
            study_id = summary["study_id"]
            bodies += [
                get(f"/api/studies/{study_id}"),
                get(f"/api/studies/{study_id}/param_importances"),
                get(f"/csv/{study_id}"),
            ]
    finally:
        process.terminate()
        process.wait(timeout=30)
    return printed, bodies


@pytest.mark.slow
def test_no_secret_is_stored_or_shown_anywhere_a_search_leaves_something(tmp_path):
    """Secrets in the storage URL's query (``password``, ``sslpassword``), in HF_TOKEN (where the refusal
    of ``hub_token`` sends the user) and in a refused ``hub_token``: none of them in any output, any file
    or file name, the study database, the report, the exports or the dashboard's API."""
    planted = {name: f"{name}-{secrets.token_hex(8)}" for name in ("password", "sslpassword", "hf-token", "hub-token")}
    storage = f"sqlite:///{tmp_path / 'study.db'}?password={planted['password']}&sslpassword={planted['sslpassword']}"
    env = {"HF_TOKEN": planted["hf-token"]}
    search = [
        "search",
        "--model",
        "bert-tiny",
        "--device",
        "cpu",
        "--space",
        TINY_SPACE,
        *FAST_SEARCH_ARGS,
        "--storage",
        storage,
        "--work-dir",
        str(tmp_path / "runs"),
    ]
    token_file = tmp_path / "with-token.json"
    token_file.write_text(json.dumps({"learning_rate": 1e-4, "hub_token": planted["hub-token"]}))
    base_file = tmp_path / "base.json"
    base_file.write_text(json.dumps({"learning_rate": 1e-4}))

    outputs: dict[str, str] = {}
    # Refused before any trial: the entry point in this process. The search that runs trials is a real
    # process, so that its trial children see HF_TOKEN.
    refused = run_cli_in_process(*search, "--trials", "2", "--base-args", str(token_file), cwd=tmp_path, env=env)
    assert refused.returncode == 2 and "remove hub_token" in refused.stderr and "HF_TOKEN" in refused.stderr
    outputs["refused search"] = refused.stdout + refused.stderr
    token_file.unlink()  # the user's own file: what is scanned is what autotune wrote
    completed = run_cli(*search, "--trials", "2", "--base-args", str(base_file), cwd=tmp_path, env=env)
    assert completed.returncode == 0, completed.stderr[-3000:]
    outputs["search"] = completed.stdout + completed.stderr
    # The storage is still named, redacted: all that follows a credential in the query is hidden too.
    assert "study.db?password=***" in outputs["search"]

    exports = {fmt: tmp_path / f"export-{fmt}.out" for fmt in ("json", "cli", "python", "accelerate")}
    commands = {
        "best": ["best", "--storage", storage],
        "best --all": ["best", "--all", "--storage", storage],
        "report": ["report", "--storage", storage, "--out", str(tmp_path / "report.html")],
        "estimate --storage": [
            "estimate",
            "--model",
            "bert-tiny",
            "--seq-len",
            "32",
            "--space",
            TINY_SPACE,
            "--storage",
            storage,
        ],
        "best of a missing study": ["best", "--storage", storage, "--study-name", "absent"],
        **{
            f"export {fmt}": ["export", "--format", fmt, "--storage", storage, "--out", str(out)]
            for fmt, out in exports.items()
        },
        "export to stdout": ["export", "--storage", storage, "--out", "-"],
    }
    # The read-only commands through the real entry point in this process (no torch import each), while
    # `autotune dashboard` starts in its own.
    with ThreadPoolExecutor(max_workers=1) as pool:
        dashboard = pool.submit(_dashboard_responses, storage, tmp_path)
        done = {name: run_cli_in_process(*args, cwd=tmp_path, env=env) for name, args in commands.items()}
        dashboard_printed, api_bodies = dashboard.result()
    for name, result in done.items():
        assert result.returncode == (2 if name == "best of a missing study" else 0), (name, result.stderr[-2000:])
        outputs[name] = result.stdout + result.stderr
    assert "password=***" in outputs["best of a missing study"]  # the message names the storage, redacted
    outputs["dashboard"] = dashboard_printed
    assert "password=***" in dashboard_printed
    assert all(out.stat().st_size > 0 for out in exports.values()) and (tmp_path / "report.html").stat().st_size > 0
    assert list((tmp_path / "runs").rglob("*.log")), "the trial children's logs are part of the scan"

    everything = [(f"output of {name}", text.encode()) for name, text in outputs.items()]
    everything += [(f"dashboard API response {i}", body) for i, body in enumerate(api_bodies)]
    for path in tmp_path.rglob("*"):  # the database (and any journal), exports, report, children's logs
        everything.append((f"name of {path}", str(path).encode()))
        if path.is_file():
            everything.append((str(path), path.read_bytes()))
    leaks = [(where, name) for where, data in everything for name, secret in planted.items() if secret.encode() in data]
    assert not leaks, leaks
