"""The log line format (jobdist/logs.py): one line an event, fields that split back."""

from __future__ import annotations

import logging

import pytest

from jobdist.logs import EventLog


def test_a_value_with_a_newline_or_an_escape_stays_on_its_line_quoted(
        caplog: pytest.LogCaptureFixture) -> None:
    log = EventLog("jobdist.test", site="reg_a")
    with caplog.at_level(logging.INFO, "jobdist.test"):
        log.info("write failed", job="job-1", step=0,
                 error="HTTP 500\nTraceback: boom", command="printf '\x1b[2J'", plain="x=1")
    assert caplog.messages == [
        "write failed job=job-1 step=0 site=reg_a error='HTTP 500\\nTraceback: boom' "
        "command=\"printf '\\x1b[2J'\" plain='x=1'"]


def test_an_escape_alone_is_quoted_too(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, "jobdist.test"):
        EventLog("jobdist.test", site="reg_a").info("command refused", command="\x1b[2J")
    assert caplog.messages == ["command refused site=reg_a command='\\x1b[2J'"]
