"""Waking the training thread when a collective completes, without a sleep-poll.

FTAR never blocks in ``work.wait()`` itself: a gloo collective whose peer
died blocks there until the group's timeout, and ``abort()`` does not
unblock it (docs/measurements.md), while a newer quorum must be seen within
a millisecond (fthsdp/agent/training/ftar/groups.py). So the training
thread waits on the quorum view's condition, which every push notifies, and
a thread of its own blocks in ``work.wait()`` (the GIL released) and
notifies the same condition when it returns. The training thread then wakes
within microseconds of the completion, as DDP's would, instead of at the
next poll (20 us doubling to 1 ms).

One collective at a time: the training thread waits for its collectives one
by one. While the waiter is still inside an earlier one that was abandoned
(it completes only at that group's timeout), a new wait is not handed to it:
``watch`` returns None and that wait polls, as before.

The thread waits in slices (``wait(timeout)`` raises when a slice ends
before the collective, and changes nothing), so that ``close`` ends it
within a slice: a thread still inside gloo's wait when the interpreter
exits, and whose collective then fails, aborts the process
(QuorumGroups.release says the same of an abandoned build).

CPU collectives only (gloo). A NCCL work's ``wait()`` returns at once and
makes the calling thread's current stream wait for it, which would order the
device's default stream behind the all-reduce; its ``is_completed()`` reads
the device's event, and is polled.
"""

from __future__ import annotations

import datetime
import queue
import threading
import time

SLICE = datetime.timedelta(milliseconds=50)
"""How long one ``wait()`` of the waiter thread lasts before it looks whether it must end."""

IDLE_S = 2.0
"""A waiter thread handed nothing for this long ends (the next wait starts another): a process
that builds many QuorumGroups, or stops training, is not left with threads that wait for nothing."""


class Watch:
    """One collective handed to the waiter; ``returned`` once its ``wait()`` returned (or raised)."""

    def __init__(self, work: object) -> None:
        self.work = work
        self.returned = False


class CompletionWaiter:
    def __init__(self, cond: threading.Condition) -> None:
        """``cond``: what the training thread waits on (QuorumView.cond, notified by every push)."""
        self._cond = cond
        self._handed: queue.SimpleQueue[Watch] = queue.SimpleQueue()
        self._last: Watch | None = None
        self._lock = threading.Lock()
        """Orders a hand-over against the thread's ending when idle."""
        self._running = False
        self._thread: threading.Thread | None = None
        self._closed = threading.Event()

    def watch(self, work) -> Watch | None:
        """Hand ``work`` to the waiter thread; None while it is inside an earlier collective not completed."""
        last = self._last
        if last is not None and not last.returned and not last.work.is_completed():  # type: ignore[attr-defined]
            return None
        if self._closed.is_set():
            return None
        self._last = Watch(work)
        with self._lock:
            self._handed.put(self._last)
            if not self._running:
                self._running = True
                self._thread = threading.Thread(target=self._run, name="fthsdp-collective-waiter", daemon=True)
                self._thread.start()
        return self._last

    def wait(self, watch: Watch, timeout: float) -> None:
        """Until ``watch``'s collective returned, a push came, or ``timeout`` seconds passed."""
        with self._cond:
            if not watch.returned:
                self._cond.wait(timeout)

    def close(self, timeout: float = 1.0) -> None:
        """End the thread, within a slice of its wait (at the process's exit: QuorumGroups.release)."""
        self._closed.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def _run(self) -> None:
        while not self._closed.is_set():
            try:
                watch = self._handed.get(timeout=IDLE_S)
            except queue.Empty:
                with self._lock:
                    if self._handed.empty():
                        self._running = False
                        return
                continue
            if not self._await(watch.work):
                break
            with self._cond:
                watch.returned = True
                self._cond.notify_all()
        with self._lock:
            self._running = False

    def _await(self, work) -> bool:
        """Until ``work`` completes, or its ``wait`` fails other than by the
        slice ending (True: the training thread polls from then on), or the
        waiter is closed (False)."""
        while not self._closed.is_set():
            began = time.monotonic()
            try:
                work.wait(SLICE)
                return True
            except Exception:  # noqa: BLE001 - a slice ended, or the collective failed (the training thread raises it)
                if work.is_completed() or time.monotonic() - began < SLICE.total_seconds() / 2:
                    return True
        return False
