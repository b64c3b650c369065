"""Shell-command workers: run one step's `do` (with retries and `alt_do`) and a slot pool.

`run_step` runs a step's command in a process group of its own so a timeout or a
cancel can kill everything the command started, keeps only the last
OUTPUT_TAIL_BYTES of each output stream, and applies the step's retry strategy.
`WorkerPool` holds the site's worker slots (free, booked, busy) and runs steps in
daemon threads.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import select
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from .clock import utc_now
from .logs import EventLog
from .model import Progress, StepKey
from .processes import group_has_live_members, signal_group
from .validation import MAX_PROGRESS_MESSAGE, text_length

OUTPUT_TAIL_BYTES = 4096
KILL_GRACE_SECONDS = 2.0  # between SIGTERM and SIGKILL of a process group
POLL_SECONDS = 0.05  # how often waits look at the cancel event and the deadline
READER_JOIN_SECONDS = 2.0  # how long to read on to EOF once the process group is gone
_READ_CHUNK = 65536

RetryCallback = Callable[[int, str], None]
Report = Progress  # a progress report: {fraction, message, at}, as the step holds it
ProgressCallback = Callable[[Report], None]
PROGRESS_MARK = b"JOBDIST_PROGRESS"  # a stdout line `JOBDIST_PROGRESS 0.4 copying volume 3`
MAX_PROGRESS_LINE = 1024  # bytes: a longer line is no progress report, and is not kept


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
    stdout: str  # last OUTPUT_TAIL_BYTES of the last attempt's stdout
    stderr: str
    reason: str  # human-readable outcome, e.g. "exit 3 after 4 attempts"
    cancelled: bool = False
    timed_out: bool = False
    progress: Report | None = None  # the last progress report the command printed


def retry_delays(strategy: Mapping[str, Any]) -> Iterator[float]:
    """The sleeps before retries 1..max_retries, in order (pure; max_time is applied later).

    `sleep` before the first retry, multiplied by `sleep_factor` for each later one
    (None: fixed), never above `sleep_max` (None: no cap); None sleep means 0.
    """
    delay = float(strategy.get("sleep") or 0)
    factor = strategy.get("sleep_factor")
    cap = strategy.get("sleep_max")
    for _ in range(int(strategy.get("max_retries") or 0)):
        yield delay if cap is None else min(delay, float(cap))
        if factor is not None:
            delay *= factor  # float multiplication saturates at inf instead of raising


# --- one attempt: a process group, its output tails, its end ------------------------------


def parse_progress(line: str) -> Report | None:
    """`JOBDIST_PROGRESS 0.4 copying volume 3` as a report; None for any other line.

    The fraction is a number from 0 to 1; the message, possibly empty, is cut
    to what the document allows. A malformed report is an ordinary output line.
    """
    mark, _, rest = line.strip().partition(" ")
    number, _, message = rest.strip().partition(" ")
    try:
        fraction = float(number)
    except ValueError:
        return None
    if mark != PROGRESS_MARK.decode() or not 0 <= fraction <= 1:  # (NaN compares false)
        return None
    message = message.strip().replace("\x00", "\ufffd")
    while text_length(message) > MAX_PROGRESS_MESSAGE:
        message = message[:-1]
    return {"fraction": fraction, "message": message, "at": utc_now()}


class _ProgressScanner:
    """Finds progress reports in a stream that arrives in chunks of any size."""

    def __init__(self, report: ProgressCallback) -> None:
        self._report = report
        self._partial = bytearray()  # the line read so far
        self._overlong = False  # the current line is already too long to be a report

    def feed(self, chunk: bytes) -> None:
        *complete, rest = chunk.split(b"\n")
        for line in complete:
            if not self._overlong:
                self._take(bytes(self._partial + line))
            self._partial.clear()
            self._overlong = False
        if not self._overlong:
            self._partial += rest
        if len(self._partial) > MAX_PROGRESS_LINE:
            self._partial.clear()
            self._overlong = True

    def end(self) -> None:
        """EOF: a last line without a newline counts too."""
        self.feed(b"\n")

    def _take(self, line: bytes) -> None:
        if len(line) > MAX_PROGRESS_LINE or not line.lstrip().startswith(PROGRESS_MARK):
            return
        report = parse_progress(line.decode("utf-8", errors="replace"))
        if report is None:
            return
        try:
            self._report(report)
        except Exception:  # it runs in the step's wait: never let it stop the wait or the kill
            EventLog("jobdist.workers").exception("the progress callback failed")


PROGRESS_PREFIX = "jobdist-progress-"


def clear_progress_dir(directory: Path) -> None:
    """Make the pool's directory of progress files, and remove the ones a daemon killed
    mid-step left behind (its steps were killed too: nobody reads them)."""
    directory.mkdir(parents=True, exist_ok=True)
    for leftover in directory.glob(f"{PROGRESS_PREFIX}*"):
        with contextlib.suppress(OSError):
            leftover.unlink()


class ProgressFile:
    """$JOBDIST_PROGRESS_FILE: where a step may also write its progress, a line in the stdout
    form with or without the mark (`0.4 copying volume 3`); the file's last line counts."""

    def __init__(self, directory: Path | None = None) -> None:
        handle, name = tempfile.mkstemp(prefix=PROGRESS_PREFIX, dir=directory)
        os.close(handle)
        self.path = Path(name)
        self._seen: tuple[int, int] | None = None  # (mtime, size) when last read

    def poll(self) -> Report | None:
        """A new report if the file changed since the last look, else None."""
        try:
            stat = self.path.stat()
            if (stat.st_mtime_ns, stat.st_size) == self._seen:
                return None
            self._seen = (stat.st_mtime_ns, stat.st_size)
            with self.path.open("rb") as file:
                file.seek(max(0, stat.st_size - MAX_PROGRESS_LINE))
                tail = file.read(MAX_PROGRESS_LINE).decode("utf-8", errors="replace")
        except OSError:  # removed or unreadable: the step's business; stdout still counts
            return None
        lines = tail.strip().splitlines()
        line = lines[-1].strip() if lines else ""
        mark = PROGRESS_MARK.decode()
        return parse_progress(line if line.startswith(mark) else f"{mark} {line}")

    def remove(self) -> None:
        with contextlib.suppress(OSError):
            self.path.unlink()


class _Tail:
    """One output pipe's last `limit` bytes (each chunk handed to `scanner` too)."""

    def __init__(self, stream: IO[bytes], limit: int,
                 scanner: _ProgressScanner | None = None) -> None:
        self.stream = stream
        self._scanner = scanner
        self._limit = limit
        self._tail = bytearray()
        self._truncated = False
        self._lock = threading.Lock()  # read on by a thread once the step's result is out
        self.at_eof = False

    def read_some(self) -> None:
        """One read of a pipe found ready (_readable); at EOF the pipe is closed."""
        chunk = os.read(self.stream.fileno(), _READ_CHUNK)
        if not chunk:
            self.at_eof = True
            self.stream.close()
            if self._scanner is not None:
                self._scanner.end()
            return
        with self._lock:
            self._tail += chunk
            if len(self._tail) > self._limit:
                del self._tail[: -self._limit]
                self._truncated = True
        if self._scanner is not None:
            self._scanner.feed(chunk)

    def text(self) -> str:
        """The tail decoded as UTF-8; undecodable bytes and NULs become U+FFFD."""
        with self._lock:
            data = bytes(self._tail)
            if self._truncated:
                data = _drop_leading_continuation_bytes(data)
        return data.decode("utf-8", errors="replace").replace("\x00", "\ufffd")


class _Output:
    """A command's stdout and stderr, read by the thread that waits for its exit.

    Two reader threads an attempt cost a short step more CPU than everything else the
    daemon does to run it (0.46 -> 0.25 ms a `true` step). A pipe still held open once
    the process group is gone (a process that left the group) is read on by a thread
    of its own, as a pipe must be until EOF, or that process would block or die on it.
    """

    def __init__(self, stdout: IO[bytes], stderr: IO[bytes],
                 scanner: _ProgressScanner | None = None) -> None:
        self.stdout = _Tail(stdout, OUTPUT_TAIL_BYTES, scanner)
        self.stderr = _Tail(stderr, OUTPUT_TAIL_BYTES)
        self._tails = {stdout.fileno(): self.stdout, stderr.fileno(): self.stderr}

    def _open(self) -> list[int]:
        return [fd for fd, tail in self._tails.items() if not tail.at_eof]

    def read_for(self, seconds: float, also: int | None = None) -> bool:
        """Read what the pipes bring for up to `seconds`; True as soon as `also` (a
        pidfd) is readable too."""
        fds = self._open()
        if also is None and not fds:
            time.sleep(seconds)  # nothing left to read: the caller still waits that long
            return False
        deadline = time.monotonic() + seconds
        while True:
            remaining = max(0.0, deadline - time.monotonic())
            ready = _readable([*fds, *([] if also is None else [also])], remaining)
            if also is not None and also in ready:
                return True
            for fd in ready:
                self._tails[fd].read_some()
            fds = self._open()
            if not ready or time.monotonic() >= deadline or (also is None and not fds):
                return False

    def drain(self, seconds: float) -> bool:
        """Read both pipes to EOF for up to `seconds`; False if a process outside the
        group still holds one open (a thread then reads it on)."""
        deadline = time.monotonic() + seconds
        while self._open():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                threading.Thread(target=self._read_to_eof, name="jobdist-output",
                                 daemon=True).start()
                return False
            self.read_for(remaining)
        return True

    def _read_to_eof(self) -> None:
        while fds := self._open():
            ready = _readable(fds, None)
            for fd in ready:
                self._tails[fd].read_some()


def _readable(fds: list[int], seconds: float | None) -> list[int]:
    """The descriptors of `fds` ready to read (or at EOF) within `seconds` (None: no
    bound). poll, not select: select refuses descriptors numbered 1024 and above."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    return [fd for fd, _ in poller.poll(None if seconds is None else max(0.0, seconds) * 1000)]


def _drop_leading_continuation_bytes(data: bytes) -> bytes:
    """Cutting a tail may split a UTF-8 character; drop its orphaned continuation bytes."""
    start = 0
    while start < min(3, len(data)) and data[start] & 0xC0 == 0x80:
        start += 1
    return data[start:]


@dataclass(frozen=True)
class _Attempt:
    """The end of one attempt of `do` or `alt_do`."""

    number: int
    exit_code: int | None
    stdout: str
    stderr: str
    timed_out: bool = False
    cancelled: bool = False
    refused: bool = False  # the site's allow-list forbids the command: it never ran
    outcome: str = ""  # "exit 3", "timed out after 2.0 s", "killed by SIGSEGV", "cancelled"

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not (self.timed_out or self.cancelled)


def step_log(env: Mapping[str, str]) -> EventLog:
    """The log of one step's run: its job, step, site and worker, from the env the
    caller passes to the command."""
    return EventLog("jobdist.workers", **{
        field: env.get(variable, "-")
        for field, variable in (("job", "JOBDIST_JOB_ID"), ("step", "JOBDIST_STEP"),
                                ("site", "JOBDIST_SITE"), ("worker", "JOBDIST_WORKER"))
    })


def _terminate_group(proc: subprocess.Popen[bytes], log: EventLog, output: _Output) -> None:
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


def _wait_for_exit(
    proc: subprocess.Popen[bytes], timeout: float | None, cancel: threading.Event,
    output: _Output,
) -> str:
    """Wait for the shell to exit, reading its output; returns "exited", "timed_out" or
    "cancelled"."""
    deadline = None if timeout is None else time.monotonic() + timeout
    with _exit_watch(proc, output) as exits_within:
        while True:
            if cancel.is_set():
                return "cancelled"
            remaining = math.inf if deadline is None else deadline - time.monotonic()
            if remaining <= 0:
                return "timed_out"
            if exits_within(min(POLL_SECONDS, remaining)):
                return "exited"


@contextlib.contextmanager
def _exit_watch(proc: subprocess.Popen[bytes],
                output: _Output) -> Iterator[Callable[[float], bool]]:
    """A wait for the process's exit that returns the moment it exits, reading `output`
    while it waits.

    `Popen.wait` with a timeout sleeps in steps that grow to POLL_SECONDS, so a
    step's end was noticed 25 ms late on average; a pidfd (Linux 5.3+) wakes the
    wait at once. Elsewhere, the process is polled every few milliseconds.
    """
    try:
        pidfd: int | None = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # not Linux, or an old kernel
        pidfd = None

    def exits_within(seconds: float) -> bool:
        if pidfd is None:
            return _polled_exit(proc, output, seconds)
        exited = output.read_for(seconds, also=pidfd)
        if exited:
            proc.wait()  # it exited: reap it, which sets its returncode
        return exited

    try:
        yield exits_within
    finally:
        if pidfd is not None:
            os.close(pidfd)


EXIT_POLL_SECONDS = 0.005  # without a pidfd


def _polled_exit(proc: subprocess.Popen[bytes], output: _Output, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while proc.poll() is None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        output.read_for(min(EXIT_POLL_SECONDS, remaining))
    return True


def _exit_outcome(returncode: int) -> tuple[int, str]:
    """The exit code to record (shell convention 128+N for a signal) and its description."""
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


def _run_attempt(
    command: str,
    env: Mapping[str, str],
    number: int,
    timeout: float | None,
    cancel: threading.Event,
    log: EventLog,
    on_progress: ProgressCallback | None = None,
) -> _Attempt:
    """Run `command` once with /bin/sh in a new process group and wait for its end."""
    log.info("attempt started", attempt=number, command=command)
    try:
        proc = subprocess.Popen(
            ["/bin/sh", "-c", command],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**step_environment(), **env, "JOBDIST_ATTEMPT": str(number)},
            start_new_session=True,
            bufsize=0,  # raw pipes: readers get whatever is there, no buffering here
        )
    except (OSError, ValueError) as error:  # e.g. a NUL byte in the command
        log.error("attempt could not start", attempt=number, error=error)
        return _Attempt(number, None, "", "", outcome=f"could not start: {error}")
    assert proc.stdout is not None and proc.stderr is not None  # both are PIPE
    scanner = None if on_progress is None else _ProgressScanner(on_progress)
    output = _Output(proc.stdout, proc.stderr, scanner)
    ending = _wait_for_exit(proc, timeout, cancel, output)
    if ending != "exited" or group_has_live_members(proc.pid):
        # Also after a normal exit: a step's processes must not outlive it, and
        # leftovers would keep our pipes open.
        log.warning("killing process group", attempt=number, ending=ending)
        _terminate_group(proc, log, output)
    if not output.drain(READER_JOIN_SECONDS):
        log.warning("a process that left the group still holds an output pipe")
    return _attempt_from_ending(ending, proc.returncode, number, timeout, output, log)


def _attempt_from_ending(
    ending: str,
    returncode: int,
    number: int,
    timeout: float | None,
    output: _Output,
    log: EventLog,
) -> _Attempt:
    out, err = output.stdout.text(), output.stderr.text()
    if ending == "timed_out":
        outcome = f"timed out after {float(timeout or 0)} s"
        attempt = _Attempt(number, None, out, err, timed_out=True, outcome=outcome)
    elif ending == "cancelled":
        attempt = _Attempt(number, None, out, err, cancelled=True, outcome="cancelled")
    else:
        exit_code, outcome = _exit_outcome(returncode)
        attempt = _Attempt(number, exit_code, out, err, outcome=outcome)
    log.info("attempt ended", attempt=number, outcome=attempt.outcome)
    return attempt


# --- a whole step: retries, alt_do, the result --------------------------------------------


@dataclass(frozen=True)
class _DoPhase:
    """How `do` ended after its retries."""

    last: _Attempt
    summary: str  # e.g. "exit 1 after 3 attempts (max_time 10 s reached)"
    cancelled_while_waiting: bool = False


class _StepRun:
    """One execution of a step. A plain loop rather than tenacity.Retrying: the stop rule
    (retries, elapsed + next sleep vs max_time, cancel), the cancel-aware sleep, alt_do and
    per-attempt env all sit outside tenacity's model, so it would need four custom hooks
    to say what this loop says directly.
    """

    def __init__(
        self,
        step: Mapping[str, Any],
        env: Mapping[str, str],
        cancel: threading.Event,
        on_retry: RetryCallback | None,
        allows: Callable[[str], bool],
        on_progress: ProgressCallback | None = None,
    ) -> None:
        self._on_progress = on_progress
        self._progress: Report | None = None
        self._step = step
        self._env = env
        self._allows = allows
        self._cancel = cancel
        self._on_retry = on_retry
        self._log = step_log(env)
        self._attempts = 0
        self._start_time = utc_now()
        self._started = time.monotonic()

    def run(self) -> StepResult:
        if self._cancel.is_set():
            return self._cancelled_before_start()
        do = self._run_do()
        if do.cancelled_while_waiting:
            reason = f"cancelled while waiting to retry ({do.summary})"
            return self._result(do.last, reason, cancelled=True)
        if do.last.ok or do.last.cancelled:
            return self._result(do.last, do.summary)
        alt_do = self._step.get("alt_do")
        if not (isinstance(alt_do, str) and alt_do.strip()):
            return self._result(do.last, do.summary)
        if self._cancel.is_set():
            return self._result(do.last, f"cancelled before alt_do ({do.summary})", cancelled=True)
        self._log.info("do failed, running alt_do", reason=do.summary)
        alt = self._attempt(alt_do)
        return self._result(alt, self._alt_reason(alt, do), used_alt=True)

    def _attempt(self, command: str) -> _Attempt:
        self._attempts += 1
        if not self._allows(command):
            self._log.warning("command refused", command=command)
            return _Attempt(self._attempts, None, "", "", refused=True,
                            outcome="refused: the command matches no pattern of this "
                                    "site's [commands] allow list (or uses shell operators "
                                    "it does not allow)")
        timeout = self._step.get("timeout")
        return _run_attempt(command, self._env, self._attempts, timeout, self._cancel, self._log,
                            self._note_progress)

    def _note_progress(self, report: Report) -> None:
        """From the thread that waits for the attempt: keep the latest, and pass it on."""
        self._progress = report
        if self._on_progress is not None:
            self._on_progress(report)

    def _run_do(self) -> _DoPhase:
        strategy = self._step.get("retry_strategy") or {}
        max_time = strategy.get("max_time")
        attempt = self._attempt(self._step["do"])
        for retry_number, delay in enumerate(retry_delays(strategy), start=1):
            if attempt.ok or attempt.cancelled or attempt.refused:
                break  # a refused command would be refused again
            if max_time is not None and self._elapsed() + delay > max_time:
                self._log.info("no retry: max_time reached", max_time=max_time)
                summary = f"{self._summary(attempt)} (max_time {max_time} s reached)"
                return _DoPhase(attempt, summary)
            if self._cancel.is_set():  # no "retried" event for a retry that cannot happen
                return _DoPhase(attempt, self._summary(attempt), cancelled_while_waiting=True)
            self._announce_retry(attempt, retry_number, delay)
            if self._cancel.wait(min(delay, threading.TIMEOUT_MAX)):
                return _DoPhase(attempt, self._summary(attempt), cancelled_while_waiting=True)
            attempt = self._attempt(self._step["do"])
        return _DoPhase(attempt, self._summary(attempt))

    def _announce_retry(self, failed: _Attempt, retry_number: int, delay: float) -> None:
        reason = f"{failed.outcome}; retry {retry_number} in {delay} s"
        self._log.info("retrying", attempt=failed.number, reason=reason)
        if self._on_retry is None:
            return
        try:
            self._on_retry(failed.number, reason)
        except Exception:  # a broken history writer must not abort the step
            self._log.exception("on_retry callback failed")

    def _summary(self, attempt: _Attempt) -> str:
        if self._attempts <= 1:
            return attempt.outcome
        return f"{attempt.outcome} after {self._attempts} attempts"

    def _alt_reason(self, alt: _Attempt, do: _DoPhase) -> str:
        if alt.ok:
            return f"alt_do succeeded after do failed ({do.summary})"
        if alt.cancelled:
            return f"cancelled during alt_do after do failed ({do.summary})"
        return f"alt_do failed ({alt.outcome}) after do failed ({do.summary})"

    def _elapsed(self) -> float:
        return time.monotonic() - self._started

    def _result(
        self, last: _Attempt, reason: str, used_alt: bool = False, cancelled: bool = False
    ) -> StepResult:
        cancelled = cancelled or last.cancelled
        self._log.info("step finished", exit=last.exit_code, reason=reason)
        return StepResult(
            ok=last.ok and not cancelled,
            used_alt=used_alt,
            exit_code=last.exit_code,
            attempts=self._attempts,
            exec_time=self._elapsed(),
            start_time=self._start_time,
            finish_time=utc_now(),
            stdout=last.stdout,
            stderr=last.stderr,
            reason=reason,
            cancelled=cancelled,
            timed_out=last.timed_out,
            progress=self._progress,
        )

    def _cancelled_before_start(self) -> StepResult:
        self._log.info("step cancelled before its first attempt")
        return _not_run("cancelled before start", 0.0, cancelled=True)


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
    is called before each retry's sleep. A command `allows` refuses is not run: the
    attempt fails at once, without retries (alt_do, if allowed, still runs).
    `on_progress(report)` is called for each progress line the command prints on stdout
    (`parse_progress`), from the thread that runs the step (or, once the step is over,
    the one reading a pipe that a process outside its group still holds); the result
    keeps the last one. An exception it raises is logged and ignored.
    """
    return _StepRun(step, env, cancel or threading.Event(), on_retry, allows,
                    on_progress).run()


# --- the worker pool ----------------------------------------------------------------------


@dataclass(eq=False)
class Execution:
    """A step running on a worker slot; compared by identity."""

    key: StepKey  # (job_id, step index)
    epoch: int
    worker: str
    started_at: float  # time.monotonic()
    cancel: threading.Event
    thread: threading.Thread = field(init=False, repr=False)
    progress: Report | None = None  # the latest report, from stdout's reader or the file
    progress_file: ProgressFile | None = None

    def poll_progress(self) -> Report | None:
        """The latest report, after a look at the progress file."""
        report = None if self.progress_file is None else self.progress_file.poll()
        if report is not None:
            self.progress = report
        return self.progress


DoneCallback = Callable[[Execution, StepResult], None]


class WorkerPool:
    """The site's worker slots, each free, booked (reserved for a claim) or busy (running).

    Slots are named f"{site}/w{n}". Shrinking retires free slots at once and booked or
    busy ones when they become free, so running work is never killed by a resize.
    """

    def __init__(self, site: str, size: int, on_done: DoneCallback,
                 allows: Callable[[str], bool] = allow_all,
                 progress_dir: Path | None = None) -> None:
        self._site = site
        # The steps' progress files: in the system's temporary directory unless given
        # (the daemon gives its own, cleared at start: a killed daemon leaves files).
        self._progress_dir = progress_dir
        if progress_dir is not None:
            clear_progress_dir(progress_dir)
        self._on_done = on_done
        self._allows = allows
        self._lock = threading.Lock()
        self._slots: list[str] = []  # active slots, in name order
        self._retiring: set[str] = set()  # booked/busy slots to drop once free
        self._booked: dict[StepKey, str] = {}
        self._busy: dict[StepKey, Execution] = {}
        self._free_at: dict[str, float] = {}  # when each slot last became free (monotonic)
        self._closed = False
        self.resize(size)

    # -- queries --

    def free_count(self) -> int:
        with self._lock:
            return len(self._free_slots())

    def is_booked(self, key: StepKey) -> bool:
        with self._lock:
            return key in self._booked

    def is_busy(self, key: StepKey) -> bool:
        with self._lock:
            return key in self._busy

    def free_workers(self) -> list[str]:
        """Names of the free slots, in the order `book` takes them."""
        with self._lock:
            return [] if self._closed else self._free_slots()

    def free_since(self) -> dict[str, float]:
        """When each free slot became free (time.monotonic), in the order `book` takes
        them (free_workers)."""
        with self._lock:
            return {} if self._closed else {worker: self._free_at[worker]
                                            for worker in self._free_slots()}

    def bookings(self) -> dict[StepKey, str]:
        with self._lock:
            return dict(self._booked)

    def booked_keys(self) -> list[StepKey]:
        with self._lock:
            return list(self._booked)

    def progress_of(self, key: StepKey) -> Report | None:
        """The latest progress report of the step running as `key` (None: none, or not
        running)."""
        with self._lock:
            execution = self._busy.get(key)
        return None if execution is None else execution.poll_progress()

    def running(self) -> list[Execution]:
        with self._lock:
            return list(self._busy.values())

    def snapshot(self) -> dict[str, Any]:
        """The pool's state for /status."""
        now = time.monotonic()
        with self._lock:
            return {
                "size": len(self._slots),
                "free": len(self._free_slots()),
                "booked": len(self._booked),
                "busy": len(self._busy),
                "running": [_describe(execution, now) for execution in self._busy.values()],
            }

    # -- booking and running --

    def book(self, key: StepKey, worker: str | None = None) -> str | None:
        """Reserve a free slot for `key` (`worker` if it is free); its name, or None if
        no slot is free."""
        with self._lock:
            existing = self._worker_of(key)
            if existing is not None:
                return existing
            free = self._free_slots()
            if self._closed or not free:
                return None
            chosen = worker if worker in free else free[0]
            self._booked[key] = chosen
            return chosen

    def unbook(self, key: StepKey) -> None:
        """Free the slot booked for `key` (no-op if not booked; a busy slot is left alone)."""
        with self._lock:
            worker = self._booked.pop(key, None)
            if worker is not None:
                self._release(worker)

    def start(
        self,
        key: StepKey,
        epoch: int,
        step: Mapping[str, Any],
        env: Mapping[str, str],
        on_retry: RetryCallback | None = None,
    ) -> Execution:
        """Run the step on the key's booked slot (or a free one) in a daemon thread.

        When the step ends its slot is freed first, then on_done(execution, result) is
        called from the worker thread. The command also sees JOBDIST_WORKER and
        JOBDIST_PROGRESS_FILE (unless no file could be made).
        """
        with self._lock:
            worker = self._take_slot_for(key)
            execution = Execution(key, epoch, worker, time.monotonic(), threading.Event())
            execution.progress_file = progress_file = _new_progress_file(self._progress_dir,
                                                                         self._log_of(execution))
            extra = {} if progress_file is None else {
                "JOBDIST_PROGRESS_FILE": str(progress_file.path)}
            execution.thread = threading.Thread(
                target=self._execute,
                args=(execution, step, {**env, "JOBDIST_WORKER": worker, **extra}, on_retry),
                name=f"jobdist-{worker}",
                daemon=True,
            )
            self._busy[key] = execution
        self._log_of(execution).info("step started", epoch=epoch)
        execution.thread.start()
        return execution

    def cancel(self, key: StepKey) -> bool:
        """Ask the execution running `key` to stop; False if `key` is not running."""
        with self._lock:
            execution = self._busy.get(key)
        if execution is None:
            return False
        self._log_of(execution).info("cancelling")
        execution.cancel.set()
        return True

    # -- size and lifetime --

    def resize(self, size: int) -> None:
        """Grow at once; shrink by dropping free slots now and booked/busy ones once free."""
        if size < 0:
            raise ValueError(f"pool size must be >= 0, not {size}")
        with self._lock:
            while len(self._slots) < size:
                self._add_slot()
            excess = len(self._slots) - size
            if excess > 0:
                self._retire(excess)

    def shutdown(self, grace: float) -> list[Execution]:
        """Stop taking work, give running steps `grace` seconds, then cancel the rest.

        Returns the executions that had to be cancelled, once they have all ended.
        """
        with self._lock:
            self._closed = True
            executions = list(self._busy.values())
        deadline = time.monotonic() + grace
        for execution in executions:
            execution.thread.join(max(0.0, deadline - time.monotonic()))
        stragglers = [execution for execution in executions if execution.thread.is_alive()]
        for execution in stragglers:
            self._log_of(execution).info("shutdown cancels")
            execution.cancel.set()
        for execution in stragglers:
            execution.thread.join()
        return stragglers

    # -- internals (the caller holds the lock unless said otherwise) --

    def _execute(
        self,
        execution: Execution,
        step: Mapping[str, Any],
        env: Mapping[str, str],
        on_retry: RetryCallback | None,
    ) -> None:
        """The worker thread's body (no lock held): run, free the slot, then report."""
        try:
            result = run_step(step, env, execution.cancel, on_retry, self._allows,
                              on_progress=lambda report: setattr(execution, "progress", report))
        except Exception as error:  # the slot must be freed and the end reported anyway
            self._log_of(execution).exception("step crashed")
            result = _crashed_result(execution, error)
        result = dataclasses.replace(result, progress=execution.poll_progress())  # either source
        if execution.progress_file is not None:
            execution.progress_file.remove()
        with self._lock:
            del self._busy[execution.key]
            self._release(execution.worker)
        try:
            self._on_done(execution, result)
        except Exception:
            self._log_of(execution).exception("on_done failed")

    def _log_of(self, execution: Execution) -> EventLog:
        job_id, step = execution.key
        return EventLog("jobdist.workers", job=job_id, step=step, site=self._site,
                        worker=execution.worker)

    def _take_slot_for(self, key: StepKey) -> str:
        if key in self._busy:
            raise RuntimeError(f"step {key} is already running on {self._busy[key].worker}")
        if self._closed:
            raise RuntimeError("the worker pool is shut down")
        worker = self._booked.pop(key, None)
        if worker is not None:
            return worker
        free = self._free_slots()
        if not free:
            raise RuntimeError(f"no free worker slot for step {key}")
        return free[0]

    def _free_slots(self) -> list[str]:
        taken = self._busy_or_booked_workers()
        return [worker for worker in self._slots if worker not in taken]

    def _busy_or_booked_workers(self) -> set[str]:
        return set(self._booked.values()) | {e.worker for e in self._busy.values()}

    def _worker_of(self, key: StepKey) -> str | None:
        if key in self._busy:
            return self._busy[key].worker
        return self._booked.get(key)

    def _release(self, worker: str) -> None:
        """A slot stopped being booked or busy: a retiring slot goes away now."""
        self._retiring.discard(worker)
        self._free_at[worker] = time.monotonic()

    def _retire(self, count: int) -> None:
        """Drop `count` slots: free ones first, highest numbers first; others once free."""
        free = set(self._free_slots())
        by_preference = sorted(self._slots, key=lambda w: (w not in free, -_slot_number(w)))
        for worker in by_preference[:count]:
            self._slots.remove(worker)
            if worker not in free:
                self._retiring.add(worker)

    def _add_slot(self) -> None:
        """Bring back a retiring slot if there is one, else add the lowest unused name."""
        if self._retiring:
            worker = min(self._retiring, key=_slot_number)
            self._retiring.remove(worker)
        else:
            used = {_slot_number(w) for w in self._slots} | {
                _slot_number(w) for w in self._busy_or_booked_workers()
            }
            number = next(n for n in range(1, len(used) + 2) if n not in used)
            worker = f"{self._site}/w{number}"
        self._free_at[worker] = time.monotonic()
        self._slots.append(worker)
        self._slots.sort(key=_slot_number)


def _new_progress_file(directory: Path | None, log: EventLog) -> ProgressFile | None:
    try:
        return ProgressFile(directory)
    except OSError as error:  # no room in the temporary directory: stdout reports still work
        log.warning("no progress file for the step", error=error)
        return None


def _slot_number(worker: str) -> int:
    return int(worker.rsplit("/w", 1)[1])


def _describe(execution: Execution, now: float) -> dict[str, Any]:
    job_id, step = execution.key
    return {
        "job_id": job_id,
        "step": step,
        "epoch": execution.epoch,
        "worker": execution.worker,
        "seconds": round(now - execution.started_at, 1),
    }


def _crashed_result(execution: Execution, error: Exception) -> StepResult:
    return _not_run(f"worker error: {type(error).__name__}: {error}",
                    time.monotonic() - execution.started_at)


def _not_run(reason: str, exec_time: float, *, cancelled: bool = False) -> StepResult:
    """A result for a step whose command never ran to an exit code."""
    now = utc_now()
    return StepResult(ok=False, used_alt=False, exit_code=None, attempts=0,
                      exec_time=exec_time, start_time=now, finish_time=now,
                      stdout="", stderr="", reason=reason, cancelled=cancelled)


def kill_orphans(site: str, couch: str) -> list[int]:
    """Kill the step process groups a previous daemon of this site left behind.

    A daemon killed with SIGKILL cannot stop its steps, which live in process
    groups of their own; its successor would run them again next to the old
    ones. Steps carry JOBDIST_SITE and JOBDIST_COUCH in their environment, so at
    start-up, before it runs anything, a daemon finds and kills them.
    """
    marker = {f"JOBDIST_SITE={site}".encode(), f"JOBDIST_COUCH={couch}".encode()}
    groups: set[int] = set()
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            variables = set(environ.read_bytes().split(b"\0"))
            stat = (environ.parent / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone, or not ours to read
        if marker <= variables and stat[0] not in ("Z", "X"):
            groups.add(int(stat[2]))
    for pgid in groups:
        signal_group(pgid, signal.SIGKILL)
        EventLog("jobdist.workers", site=site).warning(
            "killed orphaned step process group", pgid=pgid)
    return sorted(groups)
