"""optuna-dashboard on a study storage, made to tell the truth; and the markdown note of each study.

What optuna-dashboard 0.21 does on its own (read in its ``_app.py`` and ``_serializer.py``):

- A trial's feasibility comes from the legacy system attr ``"constraints"`` (a list; feasible when
  every value is <= 0). ``autotune.study.tell`` writes it for every COMPLETE and PRUNED trial, > 0
  for OOM, over-ceiling, screened and diverged trials, so the trial list and the plots mark those
  infeasible. A trial told before the HF default's loss existed could not be judged for divergence
  then, and Optuna keeps a finished trial's record as told: :class:`FeasibleBestStorage` serves the
  trials as :func:`autotune.result._loss.judged_trials` judges them, as the ranking and export read them.
- Its "Best trial" is ``storage.get_best_trial``: the COMPLETE trial with the largest value,
  feasible or not. autotune records infeasible trials with value 0, so that is a feasible trial
  whenever one exists; but with none feasible it is an infeasible one. :class:`FeasibleBestStorage`
  picks the best *feasible* trial, and :func:`dashboard_app` removes an infeasible "best" from the
  study API, so the card stays empty until a config fits.
"""

from __future__ import annotations

import functools
import ipaddress
import socket
import sys
from collections import Counter
from collections.abc import Callable, Container
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import optuna
from optuna.storages import RDBStorage
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from autotune.errors import AutotuneError
from autotune.result import TimeSpent, judged_trials, memory_source_description
from autotune.storage import open_storage, require_sqlite_file, schema
from autotune.units import format_bytes
from autotune.views.export import export_notes, render, winner_arguments
from autotune.views.ranking import (
    RankedTrial,
    confirmation_label,
    describe_distinct,
    ranked_result,
    study_ranking,
    winner_summary,
)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
# The API route whose "best_trials" the dashboard's Best-trial card and filters read.
STUDY_DETAIL_RULE = "/api/studies/<study_id:int>"
# The last line of every note autotune writes: a note without it was edited by a person and is kept.
NOTE_SIGNATURE = "_Written by autotune; `autotune search` and `autotune dashboard` rewrite this note (delete this line to keep your edits)._"
NOTE_TOP = 5


def constraints_feasible(constraints: list[float]) -> bool:
    """The dashboard's own rule: feasible when every constraint value is <= 0 (none: feasible)."""
    return all(value <= 0 for value in constraints)


def is_feasible(trial: FrozenTrial) -> bool:
    """Whether optuna-dashboard shows ``trial`` as feasible (it reads the legacy list attr only)."""
    return constraints_feasible(trial.system_attrs.get(schema.TRIAL_CONSTRAINTS, []))


class FeasibleBestStorage(RDBStorage):
    """An RDB storage that serves the trials as judged, and whose best trial is the best feasible
    COMPLETE one, as ``study.best_trial`` is.

    optuna-dashboard reads every trial through :meth:`get_all_trials` and asks the storage for the
    best trial; the stock one ignores feasibility. With no feasible trial this falls back to the
    largest value (the stock answer, over the judged trials), which :func:`dashboard_app` then drops.
    """

    def get_all_trials(
        self, study_id: int, deepcopy: bool = True, states: Container[TrialState] | None = None
    ) -> list[FrozenTrial]:
        judged = judged_trials(super().get_all_trials(study_id, deepcopy=deepcopy))  # all: the reference may be PRUNED
        return [t for t in judged if states is None or t.state in states]

    def get_best_trial(self, study_id: int) -> FrozenTrial:
        complete = self.get_all_trials(study_id, deepcopy=False, states=(TrialState.COMPLETE,))
        if not complete:
            return super().get_best_trial(study_id)  # Optuna's own error: no trial is completed yet
        direction = self.get_study_directions(study_id)[0]
        pick = max if direction == StudyDirection.MAXIMIZE else min
        return pick(
            [t for t in complete if is_feasible(t)] or complete, key=lambda t: t.value or 0.0
        )  # a COMPLETE trial has a value


def open_dashboard_storage(storage_url: str) -> FeasibleBestStorage:
    """Open an existing study storage for the dashboard.

    Raises:
        AutotuneError: A SQLite file that does not exist (a typo would otherwise serve an empty,
            newly created database), or a storage that cannot be opened.
    """
    if storage_url.startswith("sqlite:///"):
        require_sqlite_file(storage_url)
    storage = open_storage(storage_url, storage_class=FeasibleBestStorage)
    assert isinstance(storage, FeasibleBestStorage)
    return storage


def dashboard_app(storage: FeasibleBestStorage) -> Callable[..., Any]:
    """optuna-dashboard's WSGI app on ``storage``, whose study API never names an infeasible best trial."""
    from importlib.metadata import version

    import optuna_dashboard

    app = optuna_dashboard.wsgi(storage)
    routes = [r for r in app.routes if r.rule == STUDY_DETAIL_RULE and r.method == "GET"]
    if not routes:
        raise RuntimeError(
            f"optuna-dashboard {version('optuna-dashboard')} has no {STUDY_DETAIL_RULE} route; autotune was written against 0.21"
        )
    route = routes[0]
    view = route.callback

    @functools.wraps(view)
    def study_detail(*args: Any, **kwargs: Any) -> Any:
        body = view(*args, **kwargs)
        if isinstance(body, dict) and "best_trials" in body:
            body["best_trials"] = [t for t in body["best_trials"] if constraints_feasible(t.get("constraints", []))]
        return body

    route.callback = study_detail
    route.reset()  # Bottle caches the plugin-wrapped callback: rebuild it around ours
    return app


class _QuietHandler(WSGIRequestHandler):
    """No access log: the dashboard polls its API every few seconds."""

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _ThreadingServer6(_ThreadingServer):
    address_family = socket.AF_INET6


def exposure_warning(host: str) -> str | None:
    """The warning for a dashboard others can reach: none on hosts only this machine can reach
    (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return None
    try:
        if ipaddress.ip_address(host).is_loopback:
            return None
    except ValueError:
        pass
    return f"warning: listening on {host}: the dashboard has no login, and anyone who reaches it can read, edit and delete studies"


def serve(storage_url: str, host: str, port: int, on_listening: Callable[[str], None]) -> None:
    """Refresh every autotune study's note, then serve the dashboard until Ctrl-C.

    Args:
        storage_url: The study storage.
        host: The address to listen on (loopback by default: the dashboard has no login and can
            edit and delete studies).
        port: The port; 0 picks a free one.
        on_listening: Called with the dashboard's URL once the socket listens.

    Raises:
        AutotuneError: The storage cannot be opened, or the address cannot be listened on.
    """
    storage = open_dashboard_storage(storage_url)
    refresh_notes(storage)
    app = dashboard_app(storage)
    server_class = _ThreadingServer6 if ":" in host else _ThreadingServer
    try:
        server = make_server(host, port, app, server_class=server_class, handler_class=_QuietHandler)
    except OSError as exc:
        raise AutotuneError(
            f"cannot listen on {host}:{port} ({exc.strerror or exc}); pick another --port or --host"
        ) from None
    shown_host = f"[{host}]" if ":" in host else host
    on_listening(f"http://{shown_host}:{server.server_port}/dashboard/")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


def refresh_notes(storage: RDBStorage) -> int:
    """Rewrite the note of every autotune study in ``storage``; returns how many changed."""
    changed = 0
    for summary in storage.get_all_studies():
        if schema.STUDY_IDENTITY not in summary.user_attrs:
            continue  # not an autotune study: leave it alone
        study = optuna.load_study(study_name=summary.study_name, storage=storage)
        changed += save_study_note(study)
    return changed


DASHBOARD_MISSING = (
    "autotune: the dashboard note was not written: optuna-dashboard is not installed "
    "(pip install optuna-dashboard, then `autotune dashboard` writes it)"
)


def save_study_note(study: optuna.Study) -> bool:
    """Write :func:`study_note` as the study's dashboard note, unless it is unchanged or a person
    edited it (the note no longer ends with :data:`NOTE_SIGNATURE`).

    Without optuna-dashboard (an optional part: an air-gapped GPU machine may lack it) the note is
    skipped with one line on stderr; ``autotune dashboard`` writes it when it starts (``refresh_notes``).

    Returns:
        Whether the note was written.
    """
    try:
        from optuna_dashboard import get_note, save_note
    except ImportError:
        print(DASHBOARD_MISSING, file=sys.stderr)
        return False

    current = get_note(study)
    if current and NOTE_SIGNATURE not in current:
        return False
    note = study_note(study)
    if note == current:
        return False
    save_note(study, note)
    return True


def study_note(study: optuna.Study) -> str:
    """The study's markdown note: what is measured, how the trials ended, the ranked top configs and
    the winner's export."""
    attrs = study.user_attrs
    identity = attrs.get(schema.STUDY_IDENTITY) or {}
    trials = judged_trials(study.get_trials(deepcopy=False))
    statuses = Counter(_status(t) for t in trials)
    ranking = study_ranking(study)
    sources = {
        r["memory_source"] for t in trials if (r := t.user_attrs.get(schema.TRIAL_RESULT)) and r.get("memory_source")
    }
    memory = ", ".join(memory_source_description(source) for source in sorted(sources)) or "peak memory"
    lines = [
        f"## {study.study_name}",
        "",
        f"**Objective: {attrs.get(schema.STUDY_METRIC, schema.METRIC_NAME)}** (maximized): useful training work per second, "
        "6N + 12·L·h·s FLOPs per token, N the parameters a token multiplies (a mixture of experts: k of its E routed experts; PaLM, appendix B; 4N + 6N_adapter + 12·L·h·s under --peft); recomputation from checkpointing is not counted.",
        "",
        f"Model **{identity.get('model', '?')}** ({identity.get('task', '?')}), sequence length {identity.get('seq_len', '?')}, "
        f"device {identity.get('device', '?')}; memory ceiling **{format_bytes(attrs.get('ceiling_bytes', 0))}** "
        f'of {memory} ("peak memory" below).',
        "",
        "Infeasible trials (ran out of memory, went over the ceiling, or were screened as not fitting) have value 0 "
        "and a memory constraint (peak − ceiling, GiB) above 0: the dashboard marks them infeasible, and its best "
        "trial is always a feasible one. Diverged trials (ran, but their loss went non-finite or far above the HF "
        "default's) are recorded the same way, with the constraint at 1.0 where their memory fitted.",
        "",
        f"Trials: {len(trials)} ({', '.join(f'{status} {count}' for status, count in sorted(statuses.items())) or 'none yet'}).",
        "",
        # How often the sampler came back to a measured config (autotune.study._proposals).
        describe_distinct(trials) + ".",
        "",
    ]
    spent = attrs.get(schema.STUDY_TIME_SPENT)
    if spent:  # where the last search's wall time went, as `autotune search` printed it
        lines += ["Last search: " + TimeSpent.from_dict(spent).line() + ".", ""]
    if not ranking:
        lines += ["No feasible configuration yet.", ""]
    else:
        lines += [f"### Fastest feasible configurations (top {min(NOTE_TOP, len(ranking))} of {len(ranking)})", ""]
        lines += _ranking_table(ranking[:NOTE_TOP])
        best = ranking[0]
        arguments = winner_arguments(study)
        lines += [
            "",
            f"### Winner: trial {best.number}",
            "",
            f"Trial {winner_summary(best)}.",
            "",
            *(f"Note: {note}." for note in export_notes(best, study)),
            "",
            "`autotune export` (TrainingArguments keyword arguments, JSON):",
            "",
            "```json",
            render(arguments, "json").rstrip(),
            "```",
            "",
            "`autotune export --format cli` (flags for HF example scripts):",
            "",
            "```",
            render(arguments, "cli").rstrip(),
            "```",
            "",
        ]
    lines.append(NOTE_SIGNATURE)
    return "\n".join(lines) + "\n"


def _status(trial: FrozenTrial) -> str:
    result = trial.user_attrs.get(schema.TRIAL_RESULT) or {}
    return str(result.get("status") or trial.state.name.lower())


def _ranking_table(rows: list[RankedTrial]) -> list[str]:
    lines = [
        "| rank | trial | config | samples/s | model TFLOPs | MFU | peak memory | step-time CV |",
        "|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for rank, row in enumerate(rows, start=1):
        result = ranked_result(row)
        if result is None:
            continue
        samples = f"{result.samples_per_s:.1f}{confirmation_label(row)}"
        mfu = f"{result.mfu:.1%}" if result.mfu is not None else "-"
        lines.append(
            f"| {rank} | {row.number} | `{row.config.short()}` | {samples} | {result.model_tflops:.4g} | {mfu} | "
            f"{format_bytes(result.peak_memory_bytes)} | {result.step_time_cv:.1%} |"
        )
    return lines
