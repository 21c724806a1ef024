"""Study set-up (autotune.study._setup): a new study gets its setup and seeds; a study is joined only
by a search of the same setup, space and ceiling (``check_identity``, the one identity check)."""

from __future__ import annotations

import re

import optuna
import pytest
from optuna.trial import TrialState

from autotune.errors import AutotuneError
from autotune.space import SearchSpace, load_space
from autotune.storage import open_storage, schema
from autotune.study import SearchRequest, check_identity, open_study

GiB = 1024**3
SPACE = SearchSpace(choices={"micro_batch": [8, 16], "pin_memory": [False]})


def request_of(workload, space: SearchSpace = SPACE) -> SearchRequest:
    return SearchRequest(workload=workload, space=space)


def test_open_study_writes_a_new_studys_setup_and_joining_it_adds_nothing(sqlite_url, tiny_workload):
    request = request_of(tiny_workload(ceiling_bytes=2 * GiB, base_args={"seed": 7}))
    open_study(open_storage(sqlite_url), "setup", request)
    stored = optuna.load_study(study_name="setup", storage=sqlite_url)  # read back from the database
    assert stored.user_attrs[schema.STUDY_IDENTITY] == request.identity()
    assert stored.user_attrs[schema.STUDY_SPACE] == SPACE.choices
    assert stored.user_attrs[schema.STUDY_CEILING_BYTES] == 2 * GiB
    assert stored.user_attrs[schema.STUDY_DEVICE_KIND] == "cpu"
    assert stored.user_attrs[schema.STUDY_BASE_ARGS] == {"seed": 7}
    assert stored.direction == optuna.study.StudyDirection.MAXIMIZE
    seeds = [t.user_attrs[schema.TRIAL_SEED] for t in stored.get_trials(states=(TrialState.WAITING,))]
    assert seeds == [schema.SEED_HF_DEFAULT, schema.SEED_BEST_PRACTICE]

    joined = open_study(open_storage(sqlite_url), "setup", request)
    assert joined._study_id == stored._study_id and len(joined.trials) == 2


def test_check_identity_names_each_difference_and_what_to_do(sqlite_url, tiny_workload):
    request = request_of(tiny_workload())
    study = open_study(open_storage(sqlite_url), "identity", request)
    identity = request.identity()
    check_identity(study, identity)  # the same setup: no error
    other = {**identity, "seq_len": 64, "base_args": {"seed": 7}}
    with pytest.raises(AutotuneError) as refused:
        check_identity(study, other)
    assert str(refused.value) == (
        f"study 'identity' measured bert-tiny at seq len 32 on {identity['device']}: another setup "
        "(seq_len 32 there, 64 here, base_args {} there, {'seed': 7} here); pass a new --study-name to start one, "
        "or the options that study was made with"
    )
    check_identity(study, other, keys=["model", "task", "device"])  # only the keys asked about (estimate --storage)
    with pytest.raises(AutotuneError, match=re.escape("(seq_len 32 there, 64 here)")):
        check_identity(study, other, keys=["seq_len"])


def test_open_study_refuses_another_setup_and_another_ceiling(sqlite_url, tiny_workload):
    open_study(open_storage(sqlite_url), "resumed", request_of(tiny_workload(ceiling_bytes=2 * GiB)))
    with pytest.raises(AutotuneError, match=re.escape("another setup (seq_len 32 there, 64 here)")):
        open_study(open_storage(sqlite_url), "resumed", request_of(tiny_workload(seq_len=64, ceiling_bytes=2 * GiB)))
    with pytest.raises(
        AutotuneError, match=re.escape("was searched under a memory ceiling of 2.00 GiB, this run asks 4.00 GiB")
    ):
        open_study(open_storage(sqlite_url), "resumed", request_of(tiny_workload(ceiling_bytes=4 * GiB)))
    assert (
        len(optuna.load_study(study_name="resumed", storage=sqlite_url).trials) == 2
    )  # nothing added by a refused run


def test_a_resume_under_another_ceiling_names_the_ceiling_even_where_the_space_changed_with_it(
    sqlite_url, tiny_workload
):
    """A lower ceiling narrows the planned space (the memory prior drops what it predicts cannot fit,
    more or less of it on each CPU): the answer names what the user changed, the ceiling."""
    open_study(open_storage(sqlite_url), "resumed", request_of(tiny_workload(ceiling_bytes=2 * GiB)))
    narrowed = SearchSpace(choices={"micro_batch": [8], "pin_memory": [False]})
    with pytest.raises(AutotuneError) as refused:
        open_study(open_storage(sqlite_url), "resumed", request_of(tiny_workload(ceiling_bytes=GiB), narrowed))
    assert "was searched under a memory ceiling of 2.00 GiB, this run asks 1.00 GiB" in str(refused.value)
    with pytest.raises(AutotuneError, match="was searched over another space"):  # the space alone still says so
        open_study(open_storage(sqlite_url), "resumed", request_of(tiny_workload(ceiling_bytes=2 * GiB), narrowed))


def test_a_study_made_outside_autotune_is_set_up_when_autotune_first_opens_it(sqlite_url, tiny_workload):
    made_by_hand = optuna.create_study(study_name="by-hand", storage=sqlite_url, direction="maximize")
    made_by_hand.enqueue_trial({"micro_batch": 8, "pin_memory": False})  # no setup mark, no identity
    request = request_of(tiny_workload())
    study = open_study(open_storage(sqlite_url), "by-hand", request)  # does not wait for a setup that never comes
    assert study.user_attrs[schema.STUDY_IDENTITY] == request.identity()
    assert len(study.get_trials(states=(TrialState.WAITING,))) == 3  # the hand-queued trial and the two seeds


def test_a_study_resumed_with_another_global_batch_is_refused(tmp_path, cpu, tiny_workload, sqlite_url):
    path = tmp_path / "space.yaml"
    path.write_text("micro_batch: [4, 8, 16, 24, 32, 64, 128]\ngrad_accum: [1, 2]\ndtype: [fp32, bf16]\n")
    open_study(
        open_storage(sqlite_url),
        "gb",
        request_of(tiny_workload(ceiling_bytes=2**30), load_space(str(path), cpu, global_batch=64)),
    )
    same = open_study(
        open_storage(sqlite_url),
        "gb",
        request_of(tiny_workload(ceiling_bytes=2**30), load_space(str(path), cpu, global_batch=64)),
    )
    assert same.study_name == "gb"
    with pytest.raises(AutotuneError, match="was searched over another space"):
        open_study(
            open_storage(sqlite_url),
            "gb",
            request_of(tiny_workload(ceiling_bytes=2**30), load_space(str(path), cpu, global_batch=32)),
        )
