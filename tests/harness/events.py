"""The structured log of a coordinator or agent started with
``--log-format json`` (fthsdp/core/log_format.py), read by tests.

A test asserts on an event's fields (``"event": "rendezvous"``, ``group``,
``round``, ...) rather than on its message: the words may change, the
fields are what a log shipper indexes. ``JsonLog`` reads the file
incrementally (other processes append to it); every record gets ``t``,
its time as a Unix timestamp, comparable with ``time.time()`` and with the
step lines' ``time``.

A field given to ``find_event``, ``wait_event`` or ``events_named`` matches
by equality, or, given a callable, when the callable returns true for the
field's value (``None`` if the record lacks it)::

    log.wait_event("rendezvous", 90, group="r1", action="complete", round=2)
    log.events_named("host_failed", host="h-a", reason=lambda r: "SIGTERM" in r)
"""

from __future__ import annotations

import contextlib
import datetime
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fthsdp.demo.record import json_objects
from tests.harness.waiting import wait_until

TAKEN_OUT = ("hang", "straggler", "unreachable", "checksum_mismatch")
"""The coordinator's events that take a replica out: each is logged as "replica X taken out: ...", a checksum
mismatch as "... it is taken out and must catch up" (or its agent gives up)."""


def matches(record: dict, name: str, since: float, fields: dict[str, Any]) -> bool:
    if record.get("event") != name or record["t"] < since:
        return False
    for key, want in fields.items():
        value = record.get(key)
        if not (want(value) if callable(want) else value == want):
            return False
    return True


class JsonLog:
    """The JSON lines of a --log-format json log; lines that are not a
    log record (a rank's own output passed through an agent, a supervisor's
    note) are skipped."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._records: list[dict] = []

    def events(self) -> list[dict]:
        """Every record so far (with an ``event`` or not), oldest first."""
        with contextlib.suppress(FileNotFoundError), open(self.path, "rb") as f:
            f.seek(self._offset)
            data = f.read()
            end = data.rfind(b"\n")  # a line still being written is read next time, whole
            if end >= 0:
                self._offset += end + 1
                for line in data[:end + 1].decode(errors="replace").splitlines():
                    # A record may follow text a rank left without its newline (the ranks share the
                    # agent's stderr: one SIGKILLed mid-line, a progress bar): json_objects finds it there.
                    for record in json_objects(line):
                        self._add(record)
        return self._records

    def _add(self, record: dict) -> None:
        if isinstance(record.get("time"), str) and "message" in record and "logger" in record:
            record["t"] = datetime.datetime.fromisoformat(record["time"]).timestamp()
            self._records.append(record)

    # ----- by event name and fields -------------------------------------------------------

    def events_named(self, name: str, since: float = 0.0, **fields: Any) -> list[dict]:
        """The records of event ``name`` at or after ``since`` whose fields match, oldest first."""
        return [r for r in self.events() if matches(r, name, since, fields)]

    def find_event(self, name: str, since: float = 0.0, **fields: Any) -> dict | None:
        """The first record of event ``name`` whose fields match, or None."""
        return next(iter(self.events_named(name, since, **fields)), None)

    def wait_event(self, name: str, timeout: float, since: float = 0.0, **fields: Any) -> dict:
        """The first record of event ``name`` whose fields match, waited for
        up to ``timeout`` seconds (AssertionError with the log's tail then)."""
        found: list[dict | None] = [None]

        def seen() -> bool:
            found[0] = self.find_event(name, since, **fields)
            return found[0] is not None

        shown = {k: ("<predicate>" if callable(v) else v) for k, v in fields.items()}
        wait_until(seen, timeout, interval=0.05,
                   message=f"{self.path.name}: event {name!r} with {shown} (after {since:.3f}); "
                           f"its tail:\n{self.tail()}")
        assert found[0] is not None
        return found[0]

    def taken_out(self, *replicas: str) -> list[dict]:
        """The coordinator's verdicts (``TAKEN_OUT``) on any of ``replicas``, on any replica if none is named."""
        return [r for r in self.events()
                if r.get("event") in TAKEN_OUT and (not replicas or r.get("replica") in replicas)]

    # ----- by message text (what has no event) ------------------------------------------

    def find(self, pattern: str, since: float = 0.0) -> tuple[dict, re.Match] | None:
        for record in self.events():
            if record["t"] >= since and (m := re.search(pattern, record["message"])):
                return record, m
        return None

    def wait(self, pattern: str, timeout: float, since: float = 0.0) -> tuple[dict, re.Match]:
        found: list = []
        wait_until(lambda: found.append(self.find(pattern, since)) or found[-1], timeout, interval=0.05,
                   message=f"{self.path.name}: a line matching {pattern!r} (after {since:.3f})")
        return found[-1]

    def tail(self, n: int = 30) -> str:
        with contextlib.suppress(FileNotFoundError):
            return "\n".join(self.path.read_text(errors="replace").splitlines()[-n:])
        return ""


def has(text: str) -> Callable[[object], bool]:
    """A field matcher: the field is a string containing ``text``."""
    return lambda value: isinstance(value, str) and text in value


def like(pattern: str) -> Callable[[object], bool]:
    """A field matcher: the field is a string in which ``pattern`` is found (re.search)."""
    return lambda value: isinstance(value, str) and re.search(pattern, value) is not None
