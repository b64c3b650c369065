"""Tests of the shell-command workers: real /bin/sh commands, outcomes and generous bounds only."""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from jobdist import step_run
from jobdist.javascript_json import text_length
from jobdist.step_output import (
    OUTPUT_TAIL_BYTES,
    PROGRESS_PREFIX,
    Output,
    ProgressScanner,
    parse_progress,
)
from jobdist.step_run import StepResult, _wait_for_exit, retry_delays, run_step
from jobdist.validation import MAX_STREAM_LENGTH
from jobdist.workers import Execution, WorkerPool

ISO_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")
JOB_ENV = {
    "JOBDIST_JOB_ID": "job-1",
    "JOBDIST_STEP": "0",
    "JOBDIST_SITE": "alpha",
    "JOBDIST_EPOCH": "7",
}


def make_step(do: str, **fields: Any) -> dict[str, Any]:
    retry = {"max_retries": 0, "max_time": None, "sleep": None, "sleep_factor": None}
    retry.update(fields.pop("retry", {}))
    return {"do": do, "alt_do": None, "timeout": 30, "retry_strategy": retry, **fields}


def wait_until(condition: Callable[[], bool], seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def process_gone(pid: int) -> bool:
    """Dead: no /proc entry, or a zombie nobody reaps (this container's init does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def run_in_thread(step: dict[str, Any], cancel: threading.Event) -> tuple[threading.Thread, list]:
    results: list[StepResult] = []
    thread = threading.Thread(target=lambda: results.append(run_step(step, JOB_ENV, cancel)))
    thread.start()
    return thread, results


# --- run_step: outcomes -------------------------------------------------------------------


def test_success() -> None:
    result = run_step(make_step("echo hello"), JOB_ENV)
    assert result.ok and not result.used_alt and not result.cancelled and not result.timed_out
    assert (result.exit_code, result.attempts, result.reason) == (0, 1, "exit 0")
    assert (result.stdout, result.stderr) == ("hello\n", "")
    assert ISO_UTC.match(result.start_time) and ISO_UTC.match(result.finish_time)
    assert result.start_time <= result.finish_time
    assert 0 <= result.exec_time < 10


def test_env_and_stdin(tmp_path: Path) -> None:
    out = tmp_path / "env"
    # `cat` would block if stdin were not /dev/null.
    command = (
        'cat; printf \'%s\\n\' "$JOBDIST_JOB_ID" "$JOBDIST_STEP" "$JOBDIST_SITE" '
        f'"$JOBDIST_EPOCH" "$JOBDIST_ATTEMPT" "$HOME" > {out}'
    )
    result = run_step(make_step(command, timeout=10), JOB_ENV)
    assert result.ok
    job, step, site, epoch, attempt, home = out.read_text().splitlines()
    assert (job, step, site, epoch, attempt) == ("job-1", "0", "alpha", "7", "1")
    assert home  # the current environment is inherited


def test_failure_exit_code() -> None:
    result = run_step(make_step("echo oops >&2; exit 3"), JOB_ENV)
    assert not result.ok
    assert (result.exit_code, result.attempts, result.reason) == (3, 1, "exit 3")
    assert result.stderr == "oops\n"


def test_killed_by_signal_uses_shell_exit_code() -> None:
    result = run_step(make_step("kill -KILL $$"), JOB_ENV)
    assert not result.ok
    assert result.exit_code == 128 + 9
    assert result.reason == "killed by SIGKILL"


def test_command_that_cannot_start_fails_cleanly() -> None:
    result = run_step(make_step("echo a\x00b"), JOB_ENV)
    assert not result.ok and result.exit_code is None
    assert result.reason.startswith("could not start")


FAIL_UNTIL_THIRD = (
    "n=$(cat {counter} 2>/dev/null || echo 0); n=$((n+1)); echo $n > {counter}; "
    'echo "attempt $JOBDIST_ATTEMPT"; [ "$n" -ge 3 ]'
)


def test_retries_then_success(tmp_path: Path) -> None:
    retries: list[tuple[int, str]] = []
    step = make_step(FAIL_UNTIL_THIRD.format(counter=tmp_path / "n"), retry={"max_retries": 5})
    result = run_step(step, JOB_ENV, on_retry=lambda n, why: retries.append((n, why)))
    assert result.ok and not result.used_alt
    assert (result.attempts, result.reason, result.stdout) == (
        3,
        "exit 0 after 3 attempts",
        "attempt 3\n",
    )
    assert [n for n, _ in retries] == [1, 2]
    assert retries[0][1].startswith("exit 1; retry 1")


def test_retries_exhausted_then_alt_do_succeeds() -> None:
    step = make_step("exit 1", alt_do="echo alt $JOBDIST_ATTEMPT", retry={"max_retries": 2})
    result = run_step(step, JOB_ENV)
    assert result.ok and result.used_alt
    assert (result.exit_code, result.attempts) == (0, 4)
    assert result.stdout == "--- do (exit 1) ---\n--- alt_do (exit 0) ---\nalt 4\n"
    assert result.stderr == ""  # neither wrote to it
    assert result.reason == "alt_do succeeded after do failed (exit 1 after 3 attempts)"


def test_alt_do_keeps_the_main_commands_output_labelled() -> None:
    step = make_step("echo why; echo it failed >&2; exit 3", alt_do="echo fallback")
    result = run_step(step, JOB_ENV)
    assert result.ok and result.used_alt
    assert result.stdout == "--- do (exit 3) ---\nwhy\n--- alt_do (exit 0) ---\nfallback\n"
    assert result.stderr == "--- do (exit 3) ---\nit failed\n--- alt_do (exit 0) ---\n"


EMOJI_6000_BYTES = "i=0; while [ $i -lt 1500 ]; do printf '\\360\\237\\230\\200'; i=$((i+1)); done"


def test_both_outputs_of_an_alt_do_step_share_the_documents_limit() -> None:
    # Each fills its tail: do with 4-byte characters (2 UTF-16 units each), no final newline.
    step = make_step(f"{EMOJI_6000_BYTES}; exit 1", alt_do="yes b | head -c 6000")
    result = run_step(step, JOB_ENV)
    do_part, alt_part = result.stdout.split("\n--- alt_do (exit 0) ---\n")
    assert do_part.startswith("--- do (exit 1) ---\n\U0001f600")
    assert set(do_part.split("\n", 1)[1]) == {"\U0001f600"}  # the end of it, whole characters
    assert alt_part.endswith("b\nb\n") and text_length(alt_part) > MAX_STREAM_LENGTH // 2 - 40
    assert MAX_STREAM_LENGTH - 4 < text_length(result.stdout) <= MAX_STREAM_LENGTH


def test_a_short_alt_do_output_leaves_the_room_to_the_main_commands() -> None:
    result = run_step(make_step("yes a | head -c 6000; exit 1", alt_do="echo short"), JOB_ENV)
    do_part, alt_part = result.stdout.split("\n--- alt_do (exit 0) ---\n")
    assert do_part.endswith("a\na") and alt_part == "short\n"
    assert MAX_STREAM_LENGTH - 4 < text_length(result.stdout) <= MAX_STREAM_LENGTH


def test_alt_do_failure() -> None:
    step = make_step("exit 1", alt_do="exit 7", retry={"max_retries": 1})
    result = run_step(step, JOB_ENV)
    assert not result.ok and result.used_alt
    assert (result.exit_code, result.attempts) == (7, 3)
    assert result.reason == "alt_do failed (exit 7) after do failed (exit 1 after 2 attempts)"


@pytest.mark.parametrize("alt_do", [None, "", "   "])
def test_blank_alt_do_is_not_run(alt_do: str | None) -> None:
    result = run_step(make_step("exit 2", alt_do=alt_do), JOB_ENV)
    assert not result.ok and not result.used_alt
    assert (result.exit_code, result.attempts) == (2, 1)


def test_broken_on_retry_callback_does_not_abort_the_step(tmp_path: Path) -> None:
    def explode(attempt: int, reason: str) -> None:
        raise RuntimeError("history writer down")

    step = make_step(FAIL_UNTIL_THIRD.format(counter=tmp_path / "n"), retry={"max_retries": 3})
    result = run_step(step, JOB_ENV, on_retry=explode)
    assert result.ok and result.attempts == 3


# --- retry schedule -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("strategy", "expected"),
    [
        ({"max_retries": 5, "sleep": 1, "sleep_factor": 2, "sleep_max": 5}, [1, 2, 4, 5, 5]),
        ({"max_retries": 3, "sleep": 3, "sleep_factor": None, "sleep_max": None}, [3, 3, 3]),
        ({"max_retries": 3, "sleep": 0.5, "sleep_factor": 3}, [0.5, 1.5, 4.5]),
        ({"max_retries": 2, "sleep": None, "sleep_factor": 2}, [0, 0]),
        ({"max_retries": 2, "sleep": 4, "sleep_max": 0}, [0, 0]),
        ({"max_retries": 0, "sleep": 1}, []),
        ({}, []),
    ],
)
def test_retry_schedule(strategy: dict[str, Any], expected: list[float]) -> None:
    assert list(retry_delays(strategy)) == expected


def test_retry_schedule_survives_huge_growth() -> None:
    delays = list(
        retry_delays({"max_retries": 3000, "sleep": 1, "sleep_factor": 10, "sleep_max": 60})
    )
    assert len(delays) == 3000 and max(delays) == 60


def test_max_time_stops_retries() -> None:
    step = make_step("exit 1", retry={"max_retries": 100, "sleep": 0.2, "max_time": 1})
    result = run_step(step, JOB_ENV)
    assert not result.ok
    # Retry k needs elapsed >= 0.2 * (k - 1) and elapsed + 0.2 <= 1, so k <= 5.
    assert 1 <= result.attempts <= 6
    assert "max_time 1 s reached" in result.reason
    assert result.exec_time < 10


def test_max_time_shorter_than_first_sleep_means_no_retry() -> None:
    step = make_step("exit 1", retry={"max_retries": 3, "sleep": 10, "max_time": 5})
    result = run_step(step, JOB_ENV)
    assert result.attempts == 1
    assert result.reason == "exit 1 (max_time 5 s reached)"


# --- timeouts and cancellation ------------------------------------------------------------


def test_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    step = make_step(f"sleep 100 & echo $! > {pid_file}; sleep 100", timeout=0.5)
    started = time.monotonic()
    result = run_step(step, JOB_ENV)
    assert time.monotonic() - started < 10
    assert result.timed_out and not result.ok and not result.cancelled
    assert (result.exit_code, result.attempts, result.reason) == (None, 1, "timed out after 0.5 s")
    assert wait_until(lambda: process_gone(int(pid_file.read_text())))


def test_timed_out_attempts_are_retried() -> None:
    step = make_step("sleep 100", timeout=0.2, retry={"max_retries": 1})
    result = run_step(step, JOB_ENV)
    assert result.timed_out and result.attempts == 2
    assert result.reason == "timed out after 0.2 s after 2 attempts"


def test_group_ignoring_sigterm_gets_sigkill(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(step_run, "KILL_GRACE_SECONDS", 0.3)
    pid_file = tmp_path / "child.pid"
    # An ignored signal stays ignored across exec, so the sleep ignores SIGTERM too.
    step = make_step(f"trap '' TERM; sleep 100 & echo $! > {pid_file}; wait", timeout=0.3)
    result = run_step(step, JOB_ENV)
    assert result.timed_out
    assert wait_until(lambda: process_gone(int(pid_file.read_text())))


def test_processes_left_behind_by_a_finished_step_are_killed(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    result = run_step(make_step(f"sleep 100 & echo $! > {pid_file}; echo done"), JOB_ENV)
    assert result.ok and result.stdout == "done\n"
    assert wait_until(lambda: process_gone(int(pid_file.read_text())))


def test_a_group_stopped_for_its_timeout_may_write_on_its_way_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Its SIGTERM handler writes more than a pipe holds: read while the grace runs,
    # it exits by itself, with no SIGKILL.
    step = make_step("trap 'head -c 200000 /dev/zero | tr \"\\\\0\" z; exit 3' TERM; "
                     "sleep 100 & wait", timeout=0.3)
    with caplog.at_level("WARNING", logger="jobdist.workers"):
        result = run_step(step, JOB_ENV)
    assert result.timed_out
    assert result.stdout == "z" * OUTPUT_TAIL_BYTES
    assert "process group survived SIGTERM" not in caplog.text


def test_a_process_that_left_the_group_keeps_its_output_pipe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    # setsid takes it out of the step's group, which is killed at the end: it lives on,
    # holding stdout. The step ends without waiting for it, and the pipe is read on, so
    # its later writes neither block nor kill it.
    monkeypatch.setattr(step_run, "READER_JOIN_SECONDS", 0.3)
    alive, left = tmp_path / "alive", tmp_path / "left"
    # The step waits until the process has left its group (it writes its pid from its
    # new session), or the group's kill at the end could still reach it.
    step = make_step(f"setsid sh -c 'echo $$ > {left}; sleep 1; echo late; echo yes > {alive}' & "
                     f"while [ ! -s {left} ]; do sleep 0.01; done; echo started")
    with caplog.at_level("WARNING", logger="jobdist.workers"):
        result = run_step(step, JOB_ENV)
    assert result.ok and result.stdout == "started\n"
    assert "still holds an output pipe" in caplog.text
    assert wait_until(lambda: alive.exists() and alive.read_text() == "yes\n")


def test_cancel_mid_run(tmp_path: Path) -> None:
    marker = tmp_path / "started"
    step = make_step(f"touch {marker}; sleep 100", alt_do="echo alt", retry={"max_retries": 3})
    cancel = threading.Event()
    thread, results = run_in_thread(step, cancel)
    assert wait_until(marker.exists)
    cancel.set()
    thread.join(10)
    assert not thread.is_alive()
    (result,) = results
    assert result.cancelled and not result.ok and not result.used_alt
    assert (result.exit_code, result.attempts, result.reason) == (None, 1, "cancelled")


def test_cancel_during_retry_sleep() -> None:
    cancel = threading.Event()
    step = make_step("exit 1", alt_do="echo alt", retry={"max_retries": 3, "sleep": 100})
    started = time.monotonic()
    result = run_step(step, JOB_ENV, cancel, on_retry=lambda n, why: cancel.set())
    assert time.monotonic() - started < 10
    assert result.cancelled and not result.ok and not result.used_alt
    assert (result.exit_code, result.attempts) == (1, 1)
    assert result.reason.startswith("cancelled while waiting to retry")


def test_cancelled_before_start_runs_nothing(tmp_path: Path) -> None:
    cancel = threading.Event()
    cancel.set()
    result = run_step(make_step(f"touch {tmp_path / 'ran'}"), JOB_ENV, cancel)
    assert result.cancelled and result.attempts == 0
    assert not (tmp_path / "ran").exists()


# --- output tails -------------------------------------------------------------------------


def test_large_and_binary_output_keeps_only_the_tails() -> None:
    command = "yes | head -c 5000000; head -c 3000000 /dev/urandom >&2"
    result = run_step(make_step(command), JOB_ENV)
    assert result.ok
    # Each tail byte decodes to at most one character.
    assert 0 < len(result.stdout) <= OUTPUT_TAIL_BYTES
    assert 0 < len(result.stderr) <= OUTPUT_TAIL_BYTES
    assert result.stdout == "y\n" * (OUTPUT_TAIL_BYTES // 2)
    assert "\x00" not in result.stderr
    result.stderr.encode("utf-8")  # valid text: no surrogates


def test_tail_is_the_end_of_the_stream_and_nuls_are_replaced() -> None:
    command = "head -c 10000 /dev/zero | tr '\\0' a; printf 'END\\0!'"
    result = run_step(make_step(command), JOB_ENV)
    assert len(result.stdout) == OUTPUT_TAIL_BYTES
    assert result.stdout.endswith("aEND\ufffd!")


def test_tail_cut_inside_a_utf8_character_drops_the_fragment() -> None:
    # 3-byte characters; 4096 is not a multiple of 3, so the cut splits one.
    result = run_step(
        make_step("i=0; while [ $i -lt 2000 ]; do printf '€'; i=$((i+1)); done"), JOB_ENV
    )
    assert set(result.stdout) == {"€"}


# --- worker pool --------------------------------------------------------------------------


class DoneLog:
    """Collects on_done calls and what the pool looked like at that moment."""

    def __init__(self) -> None:
        self.pool: WorkerPool | None = None
        self.calls: list[tuple[Execution, StepResult, int, bool]] = []
        self.event = threading.Event()

    def __call__(self, execution: Execution, result: StepResult) -> None:
        assert self.pool is not None
        seen = (self.pool.snapshot()["free"], self.pool.is_busy(execution.key))
        self.calls.append((execution, result, *seen))
        self.event.set()

    def wait_for(self, count: int) -> None:
        assert wait_until(lambda: len(self.calls) >= count)


@pytest.fixture
def done() -> DoneLog:
    return DoneLog()


@pytest.fixture
def make_pool(done: DoneLog) -> Iterator[Callable[[int], WorkerPool]]:
    pools: list[WorkerPool] = []

    def make(size: int) -> WorkerPool:
        pool = WorkerPool("alpha", size, done)
        done.pool = pool
        pools.append(pool)
        return pool

    yield make
    for pool in pools:
        pool.shutdown(grace=0)


def gated_step(gate: Path, **fields: Any) -> dict[str, Any]:
    """A step that runs until the gate file exists."""
    return make_step(f"while [ ! -f {gate} ]; do sleep 0.02; done; echo $JOBDIST_WORKER", **fields)


K1, K2, K3 = ("job-1", 0), ("job-2", 0), ("job-3", 1)


def test_book_unbook_and_idempotent_book(make_pool: Callable[[int], WorkerPool]) -> None:
    pool = make_pool(2)
    assert pool.snapshot()["free"] == 2
    assert pool.book(K1) == "alpha/w1"
    assert pool.book(K1) == "alpha/w1"
    assert pool.book(K2) == "alpha/w2"
    assert pool.book(K3) is None
    assert pool.snapshot()["free"] == 0
    assert pool.is_booked(K1) and not pool.is_busy(K1)
    assert sorted(pool.bookings()) == [K1, K2]
    pool.unbook(K1)
    pool.unbook(K3)  # not booked: no-op
    assert pool.snapshot()["free"] == 1 and not pool.is_booked(K1)
    assert pool.book(K3) == "alpha/w1"


def test_free_since_is_when_each_free_slot_was_last_given_back(
        make_pool: Callable[[int], WorkerPool], done: DoneLog) -> None:
    """The core holds claims until a worker has been free a while (PoolView.idle_for):
    a slot's free time starts when its booking or run ends, not when the pool began."""
    before = time.monotonic()
    pool = make_pool(2)
    assert set(pool.free_since()) == {"alpha/w1", "alpha/w2"}
    assert all(before <= at <= time.monotonic() for at in pool.free_since().values())
    pool.book(K1)
    assert list(pool.free_since()) == ["alpha/w2"]
    time.sleep(0.05)
    freed = time.monotonic()
    pool.unbook(K1)
    assert pool.free_since()["alpha/w1"] >= freed > pool.free_since()["alpha/w2"]
    pool.start(K2, 0, make_step("true"), JOB_ENV)
    done.wait_for(1)
    assert pool.free_since()["alpha/w1"] > freed  # the run took alpha/w1, and gave it back


def test_book_takes_the_worker_asked_for_when_it_is_free(
        make_pool: Callable[[int], WorkerPool]) -> None:
    pool = make_pool(3)
    assert pool.book(K1, "alpha/w2") == "alpha/w2"  # the worker the decision core chose
    assert pool.book(K2, "alpha/w2") == "alpha/w1"  # taken: the first free one instead


def test_start_runs_and_frees_the_slot_before_on_done(
    make_pool: Callable[[int], WorkerPool], done: DoneLog, tmp_path: Path
) -> None:
    pool = make_pool(1)
    assert pool.book(K1) == "alpha/w1"
    execution = pool.start(K1, 3, gated_step(tmp_path / "go"), JOB_ENV)
    assert (execution.key, execution.epoch, execution.worker) == (K1, 3, "alpha/w1")
    assert pool.is_busy(K1) and not pool.is_booked(K1)
    assert pool.book(K1) == "alpha/w1"  # idempotent while busy too
    assert pool.snapshot()["free"] == 0
    (tmp_path / "go").touch()
    done.wait_for(1)
    finished, result, free_seen, busy_seen = done.calls[0]
    assert finished is execution
    assert result.ok and result.stdout == "alpha/w1\n"
    assert (free_seen, busy_seen) == (1, False)
    assert not pool.is_busy(K1)


def test_start_without_booking_and_when_full(
    make_pool: Callable[[int], WorkerPool], done: DoneLog, tmp_path: Path
) -> None:
    pool = make_pool(1)
    pool.start(K1, 0, gated_step(tmp_path / "go"), JOB_ENV)
    with pytest.raises(RuntimeError):
        pool.start(K1, 0, make_step("true"), JOB_ENV)
    with pytest.raises(RuntimeError):
        pool.start(K2, 0, make_step("true"), JOB_ENV)
    assert pool.book(K2) is None
    (tmp_path / "go").touch()
    done.wait_for(1)


def test_cancel_running_execution(make_pool: Callable[[int], WorkerPool], done: DoneLog) -> None:
    pool = make_pool(1)
    pool.start(K1, 0, make_step("sleep 100", retry={"max_retries": 5}), JOB_ENV)
    assert not pool.cancel(K2)
    assert pool.cancel(K1)
    done.wait_for(1)
    result = done.calls[0][1]
    assert result.cancelled and result.attempts == 1
    assert pool.snapshot()["free"] == 1


def test_resize_grow_and_shrink_while_busy(
    make_pool: Callable[[int], WorkerPool], done: DoneLog, tmp_path: Path
) -> None:
    pool = make_pool(2)
    pool.start(K1, 0, gated_step(tmp_path / "go"), JOB_ENV)  # on w1
    pool.resize(4)
    assert pool.snapshot()["free"] == 3
    pool.resize(1)  # only free slots can go now; the busy one stays
    assert pool.snapshot()["free"] == 0 and pool.snapshot()["size"] == 1 and pool.is_busy(K1)
    pool.resize(0)  # the busy slot retires when its step ends
    assert pool.snapshot()["size"] == 0 and pool.is_busy(K1)
    (tmp_path / "go").touch()
    done.wait_for(1)
    assert done.calls[0][1].ok  # never killed by the resize
    assert pool.snapshot()["free"] == 0 and pool.book(K2) is None
    pool.resize(2)
    assert pool.snapshot()["free"] == 2
    assert [pool.book(K2), pool.book(K3)] == ["alpha/w1", "alpha/w2"]


def test_shrinking_keeps_booked_slots_until_unbooked(
    make_pool: Callable[[int], WorkerPool],
) -> None:
    pool = make_pool(2)
    assert pool.book(K1) == "alpha/w1"
    pool.resize(0)
    assert pool.is_booked(K1) and pool.book(K1) == "alpha/w1"
    pool.unbook(K1)
    assert pool.snapshot()["free"] == 0 and pool.book(K2) is None


def test_shutdown_waits_then_cancels_the_rest(
    make_pool: Callable[[int], WorkerPool], done: DoneLog
) -> None:
    pool = make_pool(2)
    long_run = pool.start(K1, 0, make_step("sleep 100"), JOB_ENV)
    pool.start(K2, 0, make_step("sleep 0.1; echo short"), JOB_ENV)
    started = time.monotonic()
    cancelled = pool.shutdown(grace=1.0)
    assert time.monotonic() - started < 10
    assert cancelled == [long_run]
    results = {execution.key: result for execution, result, *_ in done.calls}
    assert results[K1].cancelled and not results[K1].ok
    assert results[K2].ok and results[K2].stdout == "short\n"
    assert pool.book(K3) is None  # a stopped pool takes no more work
    with pytest.raises(RuntimeError):
        pool.start(K3, 0, make_step("true"), JOB_ENV)


def test_snapshot_shape(
    make_pool: Callable[[int], WorkerPool], done: DoneLog, tmp_path: Path
) -> None:
    pool = make_pool(3)
    pool.book(K2)
    pool.start(K1, 5, gated_step(tmp_path / "go"), JOB_ENV)
    snapshot = pool.snapshot()
    assert {key: snapshot[key] for key in ("size", "free", "booked", "busy")} == {
        "size": 3,
        "free": 1,
        "booked": 1,
        "busy": 1,
    }
    (running,) = snapshot["running"]
    assert set(running) == {"job_id", "step", "epoch", "worker", "seconds"}
    assert (running["job_id"], running["step"], running["epoch"]) == ("job-1", 0, 5)
    assert running["worker"] in {"alpha/w1", "alpha/w2", "alpha/w3"}
    assert running["seconds"] >= 0
    (tmp_path / "go").touch()
    done.wait_for(1)


# --- progress reports ---------------------------------------------------------------------


@pytest.mark.parametrize(("line", "expected"), [
    ("JOBDIST_PROGRESS 0.4 copying volume 3", (0.4, "copying volume 3")),
    ("  JOBDIST_PROGRESS 1\r", (1.0, "")),
    ("JOBDIST_PROGRESS 0   spaced   out  ", (0.0, "spaced   out")),
    ("JOBDIST_PROGRESS 1.5 too far", None),
    ("JOBDIST_PROGRESS -0.1 below", None),
    ("JOBDIST_PROGRESS nan what", None),
    ("JOBDIST_PROGRESS 40% percent", None),
    ("JOBDIST_PROGRESSED 0.4 another word", None),
    ("echo JOBDIST_PROGRESS 0.4", None),
])
def test_parse_progress(line: str, expected: tuple[float, str] | None) -> None:
    parsed = parse_progress(line)
    if expected is None:
        assert parsed is None
    else:
        assert parsed is not None and (parsed["fraction"], parsed["message"]) == expected
        assert ISO_UTC.match(parsed["at"])


def test_a_long_message_is_cut_to_what_the_document_allows() -> None:
    parsed = parse_progress("JOBDIST_PROGRESS 0.5 " + "\U0001f600" * 150)
    assert parsed is not None and parsed["message"] == "\U0001f600" * 100  # 200 UTF-16 units


def test_reports_are_found_however_the_output_is_cut_into_chunks() -> None:
    reports: list[dict[str, Any]] = []
    scanner = ProgressScanner(reports.append, step_run.step_log({}))
    stream = (b"noise\nJOBDIST_PROGRESS 0.1 one\n" + b"x" * 5000 + b" JOBDIST_PROGRESS 0.2 in a"
              b" long line\nJOBDIST_PROGRESS 0.3 three\nJOBDIST_PROGRESS 0.4 at EOF")
    for size in (1, 7, 4096):
        reports.clear()
        for start in range(0, len(stream), size):
            scanner.feed(stream[start:start + size])
        scanner.end()
        assert [(r["fraction"], r["message"]) for r in reports] == [
            (0.1, "one"), (0.3, "three"), (0.4, "at EOF")], size


def test_a_step_reports_progress_as_it_runs(tmp_path: Path) -> None:
    gate = tmp_path / "go"
    seen: list[dict[str, Any]] = []
    command = (f"echo 'JOBDIST_PROGRESS 0.5 halfway'; while [ ! -f {gate} ]; do sleep 0.02; "
               "done; printf 'JOBDIST_PROGRESS 0.75 nearly'; echo ' there'")
    thread = threading.Thread(target=lambda: seen.append(
        {"result": run_step(make_step(command), JOB_ENV, on_progress=seen.append)}))
    thread.start()
    assert wait_until(lambda: len(seen) == 1)  # reported while the command still runs
    assert (seen[0]["fraction"], seen[0]["message"]) == (0.5, "halfway")
    gate.touch()
    thread.join(10)
    result = seen[-1]["result"]
    assert (seen[-2]["fraction"], seen[-2]["message"]) == (0.75, "nearly there")
    assert result.ok and "JOBDIST_PROGRESS 0.5 halfway" in result.stdout  # lines stay in output


def test_the_pool_holds_each_running_steps_latest_report(
        make_pool: Callable[[int], WorkerPool], done: DoneLog, tmp_path: Path) -> None:
    pool = make_pool(1)
    pool.start(K1, 1, make_step(f"echo JOBDIST_PROGRESS 0.2 early; "
                                f"while [ ! -f {tmp_path / 'go'} ]; do sleep 0.02; done"),
               JOB_ENV)
    assert pool.progress_of(K2) is None
    assert wait_until(lambda: pool.progress_of(K1) is not None)
    assert pool.progress_of(K1)["message"] == "early"  # type: ignore[index]
    (tmp_path / "go").touch()
    done.wait_for(1)
    assert pool.progress_of(K1) is None  # not running any more
    assert done.calls[0][1].progress["fraction"] == 0.2


def test_a_step_may_write_its_progress_to_the_file_the_pool_names(
        make_pool: Callable[[int], WorkerPool], done: DoneLog, tmp_path: Path) -> None:
    pool = make_pool(1)
    gate = tmp_path / "go"
    pool.start(K1, 1, make_step(
        'echo "$JOBDIST_PROGRESS_FILE"; echo "0.3 from the file" > "$JOBDIST_PROGRESS_FILE"; '
        f"while [ ! -f {gate} ]; do sleep 0.02; done; "
        'echo "JOBDIST_PROGRESS 0.9 last" >> "$JOBDIST_PROGRESS_FILE"'), JOB_ENV)
    assert wait_until(lambda: pool.progress_of(K1) is not None)
    report = pool.progress_of(K1)
    assert report is not None and (report["fraction"], report["message"]) == (0.3, "from the file")
    gate.touch()
    done.wait_for(1)
    result = done.calls[0][1]
    assert (result.progress["fraction"], result.progress["message"]) == (0.9, "last")
    assert not Path(result.stdout.strip()).exists()  # the daemon removes the file after the step


def test_a_pool_keeps_progress_files_in_its_own_directory_and_clears_what_a_killed_one_left(
        done: DoneLog, tmp_path: Path) -> None:
    directory = tmp_path / "journal" / "progress"
    directory.mkdir(parents=True)
    leftover = directory / f"{PROGRESS_PREFIX}a-killed-daemons"
    leftover.write_text("0.5 cut short\n")
    unrelated = directory / "notes.txt"
    unrelated.write_text("not ours")
    pool = WorkerPool("alpha", 1, done, progress_dir=directory)
    done.pool = pool
    try:
        assert not leftover.exists() and unrelated.exists()
        pool.start(K1, 1, make_step('echo "$JOBDIST_PROGRESS_FILE"'), JOB_ENV)
        done.wait_for(1)
    finally:
        pool.shutdown(grace=0)
    used = Path(done.calls[0][1].stdout.strip())
    assert used.parent == directory and used.name.startswith(PROGRESS_PREFIX)
    assert sorted(directory.iterdir()) == [unrelated]  # removed after the step


def test_the_wait_for_exit_reads_the_output_while_it_waits() -> None:
    # More than a pipe holds, then an exit: unread, the writer would never exit.
    proc = subprocess.Popen(["sh", "-c", "head -c 300000 /dev/zero; echo end >&2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0)
    assert proc.stdout is not None and proc.stderr is not None
    output = Output(proc.stdout, proc.stderr)
    try:
        assert _wait_for_exit(proc, 10.0, threading.Event(), output) == "exited"
        assert output.drain(10.0)
        assert output.stdout.text() == "\ufffd" * OUTPUT_TAIL_BYTES  # NULs, replaced
        assert output.stderr.text() == "end\n"
    finally:
        proc.kill()
        proc.wait()


def test_output_read_to_its_end_is_done_at_once() -> None:
    # Both pipes closed by their writer: the drain returns at EOF, never waits its bound.
    read_ends = []
    for read_end, write_end in (os.pipe(), os.pipe()):
        os.write(write_end, b"bye\n")
        os.close(write_end)
        read_ends.append(open(read_end, "rb", buffering=0))  # noqa: SIM115 (closed at EOF)
    output = Output(*read_ends)
    began = time.monotonic()
    assert output.drain(60.0)
    assert time.monotonic() - began < 30.0
    assert output.stdout.text() == output.stderr.text() == "bye\n"


def test_a_progress_callback_that_raises_stops_neither_the_step_nor_its_output() -> None:
    calls: list[Any] = []

    def broken(report: Any) -> None:
        calls.append(report)
        raise RuntimeError("broken")

    result = run_step(make_step("echo 'JOBDIST_PROGRESS 0.5 half'; echo done"), JOB_ENV,
                      on_progress=broken)
    assert result.ok and result.stdout.endswith("done\n")
    assert [report["fraction"] for report in calls] == [0.5]


def test_output_is_read_on_descriptors_past_1024() -> None:
    # select() refuses descriptors numbered 1024 and above; a busy daemon may hold that many.
    read_end, write_end = os.pipe()
    high = os.dup2(read_end, 1500)
    os.close(read_end)
    os.write(write_end, b"high\n")
    os.close(write_end)
    stderr_read, stderr_write = os.pipe()
    os.close(stderr_write)
    output = Output(open(high, "rb", buffering=0),  # noqa: SIM115 (closed at EOF)
                             open(stderr_read, "rb", buffering=0))  # noqa: SIM115
    assert output.drain(10.0)
    assert output.stdout.text() == "high\n"


@pytest.mark.parametrize("pidfd", [True, False])
def test_the_wait_for_exit_tells_a_running_process_from_one_that_exited(
        pidfd: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if not pidfd:  # as on a system without pidfd_open: the process is polled
        monkeypatch.delattr(os, "pidfd_open")
    proc = subprocess.Popen(["sleep", "30"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            bufsize=0)
    assert proc.stdout is not None and proc.stderr is not None
    output, cancel = Output(proc.stdout, proc.stderr), threading.Event()
    try:
        assert _wait_for_exit(proc, 0.05, cancel, output) == "timed_out"
        proc.kill()
        assert _wait_for_exit(proc, 10.0, cancel, output) == "exited"
        assert proc.returncode is not None  # reaped
        cancel.set()
        assert _wait_for_exit(proc, 10.0, cancel, output) == "cancelled"
    finally:
        proc.kill()
        proc.wait()
