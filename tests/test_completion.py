"""The waiter thread that wakes FTAR's waits when a collective completes
(fthsdp/agent/training/ftar/completion.py), in-process with works whose
completion the test controls."""

from __future__ import annotations

import datetime
import threading
import time

from fthsdp.agent.training.ftar import completion
from fthsdp.agent.training.ftar.completion import CompletionWaiter
from tests.harness.waiting import wait_until


class Work:
    """A collective that completes when the test says so; ``wait()`` blocks until then or its timeout, as gloo's."""

    def __init__(self) -> None:
        self.done = threading.Event()

    def is_completed(self) -> bool:
        return self.done.is_set()

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        if not self.done.wait(30 if timeout is None else timeout.total_seconds()):
            raise RuntimeError("Operation timed out!")  # as c10d's Work.wait does, the work left as it was
        return True


def test_a_completion_wakes_the_waiting_thread_and_a_stuck_one_is_not_handed_more(monkeypatch):
    monkeypatch.setattr(completion, "IDLE_S", 0.05)
    cond = threading.Condition()
    waiter = CompletionWaiter(cond)
    stuck = Work()
    first = waiter.watch(stuck)
    assert first is not None and not first.returned
    assert waiter.watch(Work()) is None  # the thread is inside a collective not completed: poll instead
    woken = threading.Event()

    def training_thread() -> None:
        waiter.wait(first, timeout=30)
        woken.set()

    t = threading.Thread(target=training_thread)
    t.start()
    stuck.done.set()
    assert woken.wait(10) and first.returned
    t.join(10)
    again = Work()
    second = waiter.watch(again)  # the earlier one completed: handed over
    assert second is not None
    again.done.set()
    wait_until(lambda: second.returned, 10, message="the second collective's return")


def test_an_idle_waiter_thread_ends_and_the_next_watch_starts_another(monkeypatch):
    monkeypatch.setattr(completion, "IDLE_S", 0.05)
    waiter = CompletionWaiter(threading.Condition())
    work = Work()
    work.done.set()
    watch = waiter.watch(work)
    assert watch is not None
    wait_until(lambda: watch.returned, 10, message="the collective's return")
    wait_until(lambda: not waiter._running, 10, message="the idle thread's end")  # noqa: SLF001 - what the test checks
    later = Work()
    later.done.set()
    again = waiter.watch(later)
    assert again is not None
    wait_until(lambda: again.returned, 10, message="a new thread's return")


def test_a_closed_waiter_leaves_a_collective_that_never_completes_within_a_slice():
    waiter = CompletionWaiter(threading.Condition())
    never = Work()
    assert waiter.watch(never) is not None
    wait_until(lambda: waiter._thread is not None and waiter._thread.is_alive(), 10,  # noqa: SLF001
               message="the waiter thread")
    began = time.monotonic()
    waiter.close()
    assert not waiter._thread.is_alive() and time.monotonic() - began < 1.0  # noqa: SLF001
    assert waiter.watch(Work()) is None  # closed: the training thread polls
