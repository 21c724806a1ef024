"""What went wrong in a trial (autotune.runner._failures), by what happened: the exception's type, the
allocator's message, the exit signal. The GPU messages, with their sources: tests/runner/test_cuda_fakes.py;
real faults in real children: tests/runner/test_pool.py."""

from __future__ import annotations

import pytest

from autotune.runner._failures import classify_exit, is_oom_exception


def real_exception(code: str) -> BaseException:
    """What running ``code`` really raises."""
    try:
        exec(code)
    except BaseException as exc:  # noqa: BLE001 - returned for inspection
        return exc
    raise AssertionError(f"{code!r} raised nothing")


def test_a_memory_error_and_torchs_out_of_memory_error_are_oom_by_type():
    import torch

    assert is_oom_exception(MemoryError())
    assert is_oom_exception(torch.OutOfMemoryError("no message that says so"))  # its type says OOM


def test_the_cpu_allocators_message_is_oom_even_wrapped_by_the_trainer():
    allocator = RuntimeError(
        "[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: you tried to allocate 4294967296 bytes"
    )
    assert is_oom_exception(allocator)
    # Raised while handling it (implicit chaining, __context__), as a dataloader or callback would.
    with pytest.raises(ValueError) as chained:
        try:
            raise allocator
        except RuntimeError:
            raise ValueError("the step failed")  # noqa: B904 - the implicit chain is what is tested
    assert chained.value.__context__ is allocator and is_oom_exception(chained.value)


def test_an_error_that_only_mentions_memory_is_not_oom():
    assert not is_oom_exception(real_exception("[1, 2][5]"))
    assert not is_oom_exception(RuntimeError("error: expected all tensors to be on the same device"))
    assert not is_oom_exception(ValueError("memory_format is not supported here"))


def test_a_cycle_of_chained_exceptions_ends():
    first, second = RuntimeError("a"), RuntimeError("b")
    first.__cause__, second.__cause__ = second, first
    assert not is_oom_exception(first)


@pytest.mark.parametrize(
    ("exitcode", "near_memory_limit", "expected"),
    [
        (-9, True, ("oom", "killed by SIGKILL with memory near the host limit (the kernel's OOM killer)")),
        (-9, False, ("crash", "killed by SIGKILL")),
        (-6, True, ("crash", "killed by SIGABRT")),  # only SIGKILL is the OOM killer's signal
        (3, False, ("crash", "exited with code 3 without a result")),
        (0, False, ("crash", "exited with code 0 without a result")),  # ended cleanly but sent nothing
        (None, False, ("crash", "exited with code None without a result")),
    ],
)
def test_classify_exit_names_the_signal_and_counts_only_sigkill_near_the_limit_as_oom(
    exitcode, near_memory_limit, expected
):
    assert classify_exit(exitcode, near_memory_limit) == expected


def test_onednn_primitive_failure_is_oom_only_under_the_address_space_budget():
    # Without a budget, oneDNN's message means an unsupported primitive: an error, not a size limit.
    unsupported = RuntimeError("could not create a primitive")
    assert not is_oom_exception(unsupported)
    assert is_oom_exception(unsupported, address_space_limited=True)
    wrapped = RuntimeError("training step failed")
    wrapped.__cause__ = unsupported
    assert is_oom_exception(wrapped, address_space_limited=True)
    assert not is_oom_exception(RuntimeError("could not create a tensor"), address_space_limited=True)


def test_a_multi_rank_failure_is_blamed_on_the_rank_that_caused_it():
    from autotune.result import Status, TrialResult
    from autotune.runner._failures import classify_launch

    oom = TrialResult(status=Status.OOM, error="OutOfMemoryError: CUDA out of memory")
    peer_gone = TrialResult(status=Status.ERROR, error="DistBackendError: Connection closed by peer")
    # An OOM on any rank is the trial's OOM, whatever the other ranks said after it.
    assert classify_launch({"failures": {}, "error": ""}, {0: peer_gone, 1: oom}, 2, 29500, False) == (
        Status.OOM,
        "rank 1 of 2: OutOfMemoryError: CUDA out of memory",
        1,
    )
    # A rank killed by a signal comes before the SIGTERM the launcher then sent the others.
    killed = {"0": {"exitcode": -15, "signal": "SIGTERM"}, "1": {"exitcode": -9, "signal": "SIGKILL"}}
    assert classify_launch({"failures": killed, "error": ""}, {}, 2, 29500, False)[:2] == (
        Status.CRASH,
        "rank 1 of 2 killed by SIGKILL",
    )
    assert (
        classify_launch({"failures": killed, "error": ""}, {}, 2, 29500, True)[0] == Status.OOM
    )  # the kernel's OOM killer
    in_use = {"failures": {}, "error": "DistNetworkError: ... address already in use (errno: 98)"}
    assert classify_launch(in_use, {}, 2, 29500, False)[:2] == (
        Status.CRASH,
        "rendezvous port 29500 already in use: the 2 ranks could not meet",
    )
    assert classify_launch({"failures": {}, "error": ""}, {0: peer_gone}, 2, 29500, False)[:2] == (
        Status.ERROR,
        "rank 0 of 2: DistBackendError: Connection closed by peer",
    )
