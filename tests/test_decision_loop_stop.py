"""The coordinator's decision loop stops when cancelled, even when the
cancellation arrives just as a wake-up completes (Python 3.11's
``asyncio.wait_for`` swallowed that one, and the coordinator's shutdown then
waited for the loop for ever)."""

from __future__ import annotations

import asyncio
import time

import pytest

from fthsdp.coordinator.config import CoordinatorConfig
from fthsdp.coordinator.engine.decision_loop import DecisionLoop


def _loop() -> DecisionLoop:
    # No jobs: the loop only waits for its wake-ups and ticks.
    return DecisionLoop(CoordinatorConfig().tick_interval, jobs={}, metrics=None, lag=None,  # type: ignore[arg-type]
                        clock=time.monotonic, wall=time.time)


@pytest.mark.parametrize("turns", range(6))
def test_a_cancel_as_the_wake_up_completes_stops_the_loop(turns):
    """``turns``: event-loop turns between the wake-up and the cancel, so that
    one of them lands the cancel in the same turn as the wake-up's completion."""

    async def scenario() -> None:
        loop = _loop()
        task = asyncio.create_task(loop.run())
        await asyncio.sleep(0)  # the loop waits for a wake-up
        loop.wake()
        for _ in range(turns):
            await asyncio.sleep(0)
        task.cancel()
        done, _ = await asyncio.wait([task], timeout=5)
        assert done, "the decision loop went on after it was cancelled"

    asyncio.run(scenario())


def test_a_stopped_loop_ends_at_its_next_wake_up():
    async def scenario() -> None:
        loop = _loop()
        task = asyncio.create_task(loop.run())
        await asyncio.sleep(0)
        loop.stopped = True
        loop.wake()
        await asyncio.wait_for(task, timeout=5)

    asyncio.run(scenario())
