"""A step command's output: the tails of its stdout and stderr, and its progress reports.

`Output` keeps only the last OUTPUT_TAIL_BYTES of each stream, read by the thread that
waits for the command's exit. A step reports progress with a stdout line
`JOBDIST_PROGRESS 0.4 copying volume 3` (`ProgressScanner`) or by writing such a line to
$JOBDIST_PROGRESS_FILE (`ProgressFile`).
"""

from __future__ import annotations

import contextlib
import os
import select
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

from .clock import utc_now
from .javascript_json import text_length
from .logs import EventLog
from .model import Progress
from .validation import MAX_PROGRESS_MESSAGE

OUTPUT_TAIL_BYTES = 4096
_READ_CHUNK = 65536
UTF8_CONTINUATION_BYTES = bytes(range(0x80, 0xC0))  # 10xxxxxx: inside a character

ProgressCallback = Callable[[Progress], None]
PROGRESS_MARK = b"JOBDIST_PROGRESS"  # a stdout line `JOBDIST_PROGRESS 0.4 copying volume 3`
MAX_PROGRESS_LINE = 1024  # bytes: a longer line is no progress report, and is not kept


def parse_progress(line: str) -> Progress | None:
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


class ProgressScanner:
    """Finds progress reports in a stream that arrives in chunks of any size; `log`
    is the step's (step_run.step_log)."""

    def __init__(self, report: ProgressCallback, log: EventLog) -> None:
        self._report = report
        self._log = log
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
            self._log.exception("the progress callback failed")


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

    def poll(self) -> Progress | None:
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
    """One output pipe's last OUTPUT_TAIL_BYTES (each chunk handed to `scanner` too)."""

    def __init__(self, stream: IO[bytes], scanner: ProgressScanner | None = None) -> None:
        self.stream = stream
        self._scanner = scanner
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
            if len(self._tail) > OUTPUT_TAIL_BYTES:
                del self._tail[:-OUTPUT_TAIL_BYTES]
                self._truncated = True
        if self._scanner is not None:
            self._scanner.feed(chunk)

    def text(self) -> str:
        """The tail decoded as UTF-8; undecodable bytes and NULs become U+FFFD."""
        with self._lock:
            data = bytes(self._tail)
            if self._truncated:  # the cut may have split a character: drop its rest
                data = data[:3].lstrip(UTF8_CONTINUATION_BYTES) + data[3:]
        return data.decode("utf-8", errors="replace").replace("\x00", "\ufffd")


class Output:
    """A command's stdout and stderr, read by the thread that waits for its exit.

    Two reader threads an attempt cost a short step more CPU than everything else the
    daemon does to run it (0.46 -> 0.25 ms a `true` step). A pipe still held open once
    the process group is gone (a process that left the group) is read on by a thread
    of its own, as a pipe must be until EOF, or that process would block or die on it.
    """

    def __init__(self, stdout: IO[bytes], stderr: IO[bytes],
                 scanner: ProgressScanner | None = None) -> None:
        self.stdout = _Tail(stdout, scanner)
        self.stderr = _Tail(stderr)
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
        while self._open():
            self.read_for(60.0)


def _readable(fds: list[int], seconds: float) -> list[int]:
    """The descriptors of `fds` ready to read (or at EOF) within `seconds`. poll, not
    select: select refuses descriptors numbered 1024 and above."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    return [fd for fd, _ in poller.poll(max(0.0, seconds) * 1000)]
