"""The confirmation in words: which leaders the end-of-search re-runs measured again, what they cost and why they
stopped (:func:`describe_confirmation`), and the winner they left (:func:`describe_winner`); the search's summary and
``autotune best`` print them."""

from __future__ import annotations

from typing import Any

import optuna

from autotune.storage import schema
from autotune.units import format_bytes
from autotune.views.ranking import RankedTrial, study_trainer


def describe_winner(ranking: list[RankedTrial]) -> str:
    """One sentence about the winner of a ranked study: confirmed or not, and any tie."""
    if not ranking:
        return "no feasible configuration"
    leader = ranking[0]
    if leader.confirmation is None:
        return f"winner: #{leader.number} at {leader.samples_per_s:.1f} samples/s (single measurement, not confirmed)"
    repeats = int(leader.confirmation.get("repeats", 0))
    if repeats >= 2:
        how = f"the median of {repeats} interleaved re-runs (run-to-run CV {leader.confirmation.get('cv', 0.0):.1%})"
    else:  # the budget allowed the first round only: one figure measures no run-to-run noise of its own
        noise = float(leader.confirmation.get("noise") or 0.0)
        how = f"from {repeats} interleaved re-run (one figure: its own run-to-run noise not measured"
        how += f"; the search's measured noise, {noise:.0%}, judges what is told apart)" if noise else ")"
    sentence = f"winner: #{leader.number} at {leader.samples_per_s:.1f} samples/s, {how}"
    searched = leader.result.samples_per_s if leader.result else 0.0
    if searched and not 0.5 <= leader.samples_per_s / searched <= 2.0:
        # A re-run under half or over twice its own search-time figure says the machine changed under the search
        # (other work on it, thermal limits), not the config: the ranking's figures are not like for like.
        sentence += (
            f"; its re-run measured {leader.samples_per_s / searched:.2g}x its search-time "
            f"{searched:.3g} samples/s: the machine's speed changed during the search (other load?), so "
            "compare again on a quiet machine (autotune verify)"
        )
    tied = [r for r in ranking[1:] if r.ties_with_leader]
    if leader.ties_with_leader and tied:
        others = ", ".join(
            f"#{r.number} ({r.samples_per_s:.1f} samples/s, {format_bytes(r.peak_memory_bytes)})" for r in tied
        )
        sentence += (
            f"; it ties within noise with {others}, and is preferred for its smaller peak memory "
            f"({format_bytes(leader.peak_memory_bytes)})"
        )
    open_question = [r for r in ranking[1:] if r.unsettled and not r.ties_with_leader]
    if leader.unsettled and open_question:
        others = ", ".join(f"#{r.number} ({r.samples_per_s:.1f} samples/s)" for r in open_question)
        sentence += f"; the budget stopped the re-runs before {others} could be told apart from it"
    return sentence


def describe_confirmation(study: optuna.Study) -> str | None:
    """One line: which candidates the study's last confirmation re-ran, and the HF default beside
    them, how often, what it cost against its budget and why it stopped; ``None`` where there is
    none. Candidates more than the noise behind the leader were not re-run, and the re-runs stopped
    once the order was settled or the budget was spent, the order then possibly unsettled
    (:mod:`autotune.study._confirm`)."""
    record = study.user_attrs.get(schema.STUDY_CONFIRMATION) or {}
    if "candidates" not in record:
        return None
    reference = record.get("reference")
    recorded = {int(number) for number in record.get("trials") or {}}
    rerun = sorted(recorded - {reference})
    left = [int(number) for number in record["candidates"] if int(number) not in recorded]
    width = f"2 x the measured noise of {float(record.get('noise', 0.0)):.1%}"
    if not rerun:
        return None
    runs = int(record.get("runs", 0))
    text = (
        f"confirmation: {runs} re-run{'s' * (runs != 1)} of {', '.join(f'#{n}' for n in rerun)}{default_beside(study, reference)} in "
        f"{float(record.get('seconds', 0.0)):.0f} s "
        f"({_how_the_confirmation_stopped(record)})"
    )
    if left:
        text += f"; {', '.join(f'#{n}' for n in left)} not re-run (behind the leader by more than {width})"
    return text


def default_beside(study: optuna.Study, number: int | None) -> str:
    """`` and the HF default #0 for the speedup`` (the TRL default under SFTTrainer): the HF-default
    seed trial re-run beside the confirmation's candidates; empty for ``None``."""
    return "" if number is None else f" and the {study_trainer(study).baseline_words} #{number} for the speedup"


def _how_the_confirmation_stopped(record: dict[str, Any]) -> str:
    """The budget and why the re-runs stopped, with the candidates tied with the leader; a record
    written before the budget existed says how many re-runs it allowed at most."""
    if "stopped" not in record:
        return f"of at most {len(record['candidates']) * int(record.get('repeats', 0))}"
    budget = (
        f"budget {float(record['budget_s']):.0f} s: {float(record['budget_fraction']):.0%} of the search's "
        f"{float(record['search_s']):.0f} s"
    )
    tied = sorted(int(number) for number, values in record["trials"].items() if values.get("ties_with_leader"))
    ties = f": {', '.join(f'#{n}' for n in tied)} tie within noise" if tied else ""
    # A record written before ``unsettled`` existed flagged the unsettled candidates as ties.
    if all("unsettled" in values for values in record["trials"].values()):
        unsettled = sorted(int(number) for number, values in record["trials"].items() if values["unsettled"])
    else:
        unsettled = tied
    if record["stopped"] == schema.CONFIRMATION_SETTLED:
        return f"{budget}; stopped once the order was settled"
    if record["stopped"] == schema.CONFIRMATION_BUDGET:
        if not unsettled:
            return f"{budget}; stopped by the budget{ties}"
        order = f"{', '.join(f'#{n}' for n in unsettled)} not told apart"
        return f"{budget}; stopped by the budget before the order was settled: {order}" + (
            f"; {', '.join(f'#{n}' for n in tied)} tie within noise" if tied and tied != unsettled else ""
        )
    return f"{budget}; all {int(record.get('repeats', 0))} rounds run{ties}"
