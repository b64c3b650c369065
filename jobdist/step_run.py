"""One run of a step: its `do` with timeout and retries, then `alt_do` if `do` failed.

`run_step` runs each attempt's command with /bin/sh in a process group of its own, so a
timeout or a cancel can kill everything the command started, reads its output
(step_output) and applies the step's retry strategy.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from .clock import utc_now
from .javascript_json import text_length
from .logs import EventLog
from .model import Progress
from .processes import group_has_live_members, signal_group
from .step_output import Output, ProgressCallback, ProgressScanner
from .validation import MAX_STREAM_LENGTH

KILL_GRACE_SECONDS = 2.0  # between SIGTERM and SIGKILL of a process group
POLL_SECONDS = 0.05  # how often waits look at the cancel event and the deadline
READER_JOIN_SECONDS = 2.0  # how long to read on to EOF once the process group is gone

RetryCallback = Callable[[int, str], None]


@dataclass(frozen=True)
class StepResult:
    """How a step ended; the fields map onto the job document's step fields."""

    ok: bool  # do (or alt_do) finally exited 0
    used_alt: bool  # the result comes from alt_do
    exit_code: int | None  # of the last attempt (None if killed by timeout/cancel)
    attempts: int  # attempts made, do retries and alt_do included
    exec_time: float  # seconds from the first attempt's start to the end
    start_time: str  # ISO 8601 UTC with microseconds and "Z"
    finish_time: str
    stdout: str  # last OUTPUT_TAIL_BYTES of the last attempt's stdout; when alt_do ran,
    stderr: str  # do's last attempt's and alt_do's, labelled (labelled_outputs)
    reason: str  # human-readable outcome, e.g. "exit 3 after 4 attempts"
    cancelled: bool = False
    timed_out: bool = False
    progress: Progress | None = None  # the last progress report: the pool sets it


def retry_delays(strategy: Mapping[str, Any]) -> Iterator[float]:
    """The sleeps before retries 1..max_retries (max_time is applied later): `sleep`
    (None: 0), times `sleep_factor` (None: 1) for each later one, at most `sleep_max`."""
    delay = float(strategy.get("sleep") or 0)
    factor = strategy.get("sleep_factor") or 1
    cap = strategy.get("sleep_max")
    for _ in range(int(strategy.get("max_retries") or 0)):
        yield delay if cap is None else min(delay, float(cap))
        delay *= factor  # float multiplication saturates at inf instead of raising


# --- one attempt: a process group, its output, its end --------------------------------


@dataclass(frozen=True)
class _Attempt:
    """The end of one attempt of `do` or `alt_do`."""

    exit_code: int | None
    stdout: str
    stderr: str
    timed_out: bool = False
    cancelled: bool = False
    refused: bool = False  # the site's allow-list forbids the command: it never ran
    outcome: str = ""  # "exit 3", "timed out after 2.0 s", "killed by SIGSEGV", "cancelled"

    @property
    def ok(self) -> bool:
        return self.exit_code == 0  # None when the attempt was killed


def step_log(env: Mapping[str, str]) -> EventLog:
    """The log of one step's run: its job, step, site and worker, from the env the
    caller passes to the command."""
    return EventLog("jobdist.workers", **{
        name: env.get(variable, "-")
        for name, variable in (("job", "JOBDIST_JOB_ID"), ("step", "JOBDIST_STEP"),
                                ("site", "JOBDIST_SITE"), ("worker", "JOBDIST_WORKER"))
    })


def _terminate_group(proc: subprocess.Popen[bytes], log: EventLog, output: Output) -> None:
    """SIGTERM the command's whole process group, then SIGKILL what outlives the grace
    (reading its output meanwhile: a process may write on its way out)."""
    pgid = proc.pid  # start_new_session made the shell its group's leader
    signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + KILL_GRACE_SECONDS
    while time.monotonic() < deadline:
        proc.poll()  # reap the shell so it does not count as alive
        if not group_has_live_members(pgid):
            break
        output.read_for(POLL_SECONDS)
    else:
        log.warning("process group survived SIGTERM, sending SIGKILL", pgid=pgid)
        signal_group(pgid, signal.SIGKILL)
    proc.wait()


EXIT_POLL_SECONDS = 0.005  # without a pidfd


def _wait_for_exit(
    proc: subprocess.Popen[bytes], timeout: float | None, cancel: threading.Event,
    output: Output,
) -> str:
    """Wait for the shell to exit, reading its output; returns "exited", "timed_out" or
    "cancelled".

    `Popen.wait` with a timeout sleeps in steps that grow to POLL_SECONDS, so a
    step's end was noticed 25 ms late on average; a pidfd (Linux 5.3+) wakes the
    wait at once. Elsewhere, the process is polled every few milliseconds.
    """
    try:
        pidfd: int | None = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # not Linux, or an old kernel
        pidfd = None
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        while not cancel.is_set():
            remaining = math.inf if deadline is None else deadline - time.monotonic()
            if remaining <= 0:
                return "timed_out"
            if _exits_within(proc, output, pidfd, min(POLL_SECONDS, remaining)):
                return "exited"
        return "cancelled"
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _exits_within(proc: subprocess.Popen[bytes], output: Output, pidfd: int | None,
                  seconds: float) -> bool:
    """Whether the process exits within `seconds` (reading `output` meanwhile)."""
    if pidfd is None:
        if proc.poll() is None:
            output.read_for(min(seconds, EXIT_POLL_SECONDS))
        return proc.poll() is not None
    if not output.read_for(seconds, also=pidfd):
        return False
    proc.wait()  # it exited: reap it, which sets its returncode
    return True


def _outcome(ending: str, returncode: int, timeout: float | None) -> tuple[int | None, str]:
    """The exit code to record (None if we killed the command; shell convention 128+N for
    a signal) and its description."""
    if ending == "timed_out":
        return None, f"timed out after {float(timeout or 0)} s"
    if ending == "cancelled":
        return None, "cancelled"
    if returncode >= 0:
        return returncode, f"exit {returncode}"
    signum = -returncode
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    return 128 + signum, f"killed by {name}"


SECRET_VARIABLES = ("JOBDIST_COUCH_", "JOBDIST_ADMIN_TOKEN")


def step_environment() -> dict[str, str]:
    """The daemon's environment without its secrets: a step's output is stored in the
    job document and replicated everywhere, and `env` would print them."""
    return {name: value for name, value in os.environ.items()
            if not name.startswith(SECRET_VARIABLES)}


# --- a whole step: retries, alt_do, the result --------------------------------------------


@dataclass
class _StepRun:
    """One execution of a step. A plain loop rather than tenacity.Retrying: the stop rule
    (retries, elapsed + next sleep vs max_time, cancel), the cancel-aware sleep, alt_do and
    per-attempt env all sit outside tenacity's model, so it would need four custom hooks
    to say what this loop says directly.
    """

    step: Mapping[str, Any]
    env: Mapping[str, str]
    cancel: threading.Event
    on_retry: RetryCallback | None
    allows: Callable[[str], bool]
    on_progress: ProgressCallback | None
    attempts: int = 0
    start_time: str = field(default_factory=utc_now)
    started: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        self.log = step_log(self.env)

    def run(self) -> StepResult:
        if self.cancel.is_set():
            self.log.info("step cancelled before its first attempt")
            return not_run("cancelled before start", 0.0, cancelled=True)
        do, summary, cancelled = self._run_do()
        alt_do = self.step.get("alt_do")
        if cancelled or do.ok or do.cancelled or not (isinstance(alt_do, str) and alt_do.strip()):
            return self._result(do, summary, cancelled=cancelled)
        if self.cancel.is_set():
            return self._result(do, f"cancelled before alt_do ({summary})", cancelled=True)
        self.log.info("do failed, running alt_do", reason=summary)
        alt = self._attempt(alt_do)
        return self._result(alt, self._alt_reason(alt, summary), used_alt=True,
                            output=labelled_outputs(do, alt))

    def _attempt(self, command: str) -> _Attempt:
        self.attempts += 1
        if not self.allows(command):
            self.log.warning("command refused", command=command)
            return _Attempt(None, "", "", refused=True,
                            outcome="refused: the command matches no pattern of this "
                                    "site's [commands] allow list (or uses shell operators "
                                    "it does not allow)")
        return self._run(command, self.attempts)

    def _run(self, command: str, number: int) -> _Attempt:
        """Run `command` once with /bin/sh in a new process group and wait for its end."""
        self.log.info("attempt started", attempt=number, command=command)
        try:
            proc = subprocess.Popen(
                ["/bin/sh", "-c", command],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env={**step_environment(), **self.env, "JOBDIST_ATTEMPT": str(number)},
                start_new_session=True,
                bufsize=0,  # raw pipes: readers get whatever is there, no buffering here
            )
        except (OSError, ValueError) as error:  # e.g. a NUL byte in the command
            self.log.error("attempt could not start", attempt=number, error=error)
            return _Attempt(None, "", "", outcome=f"could not start: {error}")
        assert proc.stdout is not None and proc.stderr is not None  # both are PIPE
        scanner = None if self.on_progress is None else ProgressScanner(self.on_progress, self.log)
        output = Output(proc.stdout, proc.stderr, scanner)
        timeout = self.step.get("timeout")
        ending = _wait_for_exit(proc, timeout, self.cancel, output)
        if ending != "exited" or group_has_live_members(proc.pid):
            # Also after a normal exit: a step's processes must not outlive it, and
            # leftovers would keep our pipes open (then the step's author has to know).
            level = logging.WARNING if ending == "exited" else logging.INFO
            self.log.log(level, "killing process group", attempt=number, ending=ending)
            _terminate_group(proc, self.log, output)
        if not output.drain(READER_JOIN_SECONDS):
            self.log.warning("a process that left the group still holds an output pipe")
        exit_code, outcome = _outcome(ending, proc.returncode, timeout)
        self.log.info("attempt ended", attempt=number, outcome=outcome)
        return _Attempt(exit_code, output.stdout.text(), output.stderr.text(),
                        timed_out=ending == "timed_out", cancelled=ending == "cancelled",
                        outcome=outcome)

    def _run_do(self) -> tuple[_Attempt, str, bool]:
        """`do` with its retries: its last attempt, why it ended, and whether a cancel
        came while waiting to retry."""
        strategy = self.step.get("retry_strategy") or {}
        max_time = strategy.get("max_time")
        attempt = self._attempt(self.step["do"])
        for retry_number, delay in enumerate(retry_delays(strategy), start=1):
            if attempt.ok or attempt.cancelled or attempt.refused:
                break  # a refused command would be refused again
            if max_time is not None and self._elapsed() + delay > max_time:
                self.log.info("no retry: max_time reached", max_time=max_time)
                return attempt, f"{self._summary(attempt)} (max_time {max_time} s reached)", False
            if not self.cancel.is_set():  # no "retried" event for a retry that cannot happen
                self._announce_retry(attempt, retry_number, delay)
            if self.cancel.wait(min(delay, threading.TIMEOUT_MAX)):
                return attempt, f"cancelled while waiting to retry ({self._summary(attempt)})", True
            attempt = self._attempt(self.step["do"])
        return attempt, self._summary(attempt), False

    def _announce_retry(self, failed: _Attempt, retry_number: int, delay: float) -> None:
        reason = f"{failed.outcome}; retry {retry_number} in {delay} s"
        self.log.info("retrying", attempt=self.attempts, reason=reason)
        if self.on_retry is None:
            return
        try:
            self.on_retry(self.attempts, reason)
        except Exception:  # a broken history writer must not abort the step
            self.log.exception("on_retry callback failed")

    def _summary(self, attempt: _Attempt) -> str:
        if self.attempts <= 1:
            return attempt.outcome
        return f"{attempt.outcome} after {self.attempts} attempts"

    def _alt_reason(self, alt: _Attempt, do_summary: str) -> str:
        if alt.ok:
            return f"alt_do succeeded after do failed ({do_summary})"
        if alt.cancelled:
            return f"cancelled during alt_do after do failed ({do_summary})"
        return f"alt_do failed ({alt.outcome}) after do failed ({do_summary})"

    def _elapsed(self) -> float:
        return time.monotonic() - self.started

    def _result(
        self, last: _Attempt, reason: str, used_alt: bool = False, cancelled: bool = False,
        output: tuple[str, str] | None = None,
    ) -> StepResult:
        """The step's end, from its `last` attempt; `output`: (stdout, stderr) if not its."""
        cancelled = cancelled or last.cancelled
        stdout, stderr = output or (last.stdout, last.stderr)
        self.log.info("step finished", exit=last.exit_code, reason=reason)
        return StepResult(
            ok=last.ok and not cancelled,
            used_alt=used_alt,
            exit_code=last.exit_code,
            attempts=self.attempts,
            exec_time=self._elapsed(),
            start_time=self.start_time,
            finish_time=utc_now(),
            stdout=stdout,
            stderr=stderr,
            reason=reason,
            cancelled=cancelled,
            timed_out=last.timed_out,
        )


def labelled_outputs(do: _Attempt, alt: _Attempt) -> tuple[str, str]:
    """(stdout, stderr) of a step whose alt_do ran: in each, the main command's last
    attempt's output (why it failed), then alt_do's, each under a label, within the
    document's limit for a stream."""
    do_label = f"--- do ({_short(do.outcome)}) ---\n"
    alt_label = f"--- alt_do ({_short(alt.outcome)}) ---\n"
    return (_joined(do_label, do.stdout, alt_label, alt.stdout),
            _joined(do_label, do.stderr, alt_label, alt.stderr))


def _short(outcome: str) -> str:
    """The outcome as a label says it: "exit 3", "killed by SIGKILL", "refused" (no why)."""
    return outcome.partition(":")[0]


def _joined(first_label: str, first: str, second_label: str, second: str) -> str:
    """Both texts labelled, each keeping its end; when both are long each keeps half
    the room, else the shorter one is whole and the other takes the rest."""
    if not (first or second):
        return ""
    room = MAX_STREAM_LENGTH - text_length(first_label + second_label) - 1  # 1: "\n" after first
    second = _last_units(second, max(room // 2, room - text_length(first)))
    first = _last_units(first, room - text_length(second))
    if first and not first.endswith("\n"):
        first += "\n"
    return first_label + first + second_label + second


def _last_units(text: str, units: int) -> str:
    """The end of `text` that is at most `units` UTF-16 code units long (a JSON string's
    length); a character cut in two is left out."""
    encoded = text.encode("utf-16-le", "surrogatepass")
    return encoded[max(0, len(encoded) - 2 * units):].decode("utf-16-le", "ignore")


def allow_all(command: str) -> bool:
    return True


def run_step(
    step: Mapping[str, Any],
    env: Mapping[str, str],
    cancel: threading.Event | None = None,
    on_retry: RetryCallback | None = None,
    allows: Callable[[str], bool] = allow_all,
    on_progress: ProgressCallback | None = None,
) -> StepResult:
    """Run a step's `do` with its timeout and retries, then `alt_do` if `do` failed.

    `env` is added to the current environment (the caller passes JOBDIST_JOB_ID,
    JOBDIST_STEP, JOBDIST_SITE, JOBDIST_EPOCH; JOBDIST_ATTEMPT is set here, 1, 2, ...).
    Setting `cancel` kills the running attempt's process group and ends the step at
    once, with no more retries nor alt_do. `on_retry(failed_attempt_number, reason)`
    is called before each retry's sleep. A command `allows` refuses fails at once,
    without retries (alt_do, if allowed, still runs). `on_progress(report)` is called
    for each progress line on stdout, from the thread that runs the step (or, once the
    step is over, the one reading a pipe that a process outside its group still holds).
    An exception it raises is logged and ignored.
    """
    return _StepRun(step, env, cancel or threading.Event(), on_retry, allows,
                    on_progress).run()


def not_run(reason: str, exec_time: float, *, cancelled: bool = False) -> StepResult:
    """A result for a step whose command never ran to an exit code."""
    now = utc_now()
    return StepResult(ok=False, used_alt=False, exit_code=None, attempts=0,
                      exec_time=exec_time, start_time=now, finish_time=now,
                      stdout="", stderr="", reason=reason, cancelled=cancelled)

