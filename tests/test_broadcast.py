"""Waking many waiters a batch per turn of the event loop (fthsdp/coordinator/engine/broadcast.py)."""

from __future__ import annotations

import asyncio

import pytest

from fthsdp.coordinator.engine.broadcast import Broadcast


def test_every_waiter_wakes_and_others_run_between_batches():
    """1,000 waiters in batches of 100: all wake, and a task that wants the
    loop after the notify runs before the last batch is released."""

    async def main():
        b = Broadcast(batch=100)
        order: list[str] = []

        async def waiter(i: int) -> None:
            await b.wait(b.generation)
            order.append(f"w{i}")

        async def bystander() -> None:
            order.append("bystander")

        tasks = [asyncio.create_task(waiter(i)) for i in range(1000)]
        await asyncio.sleep(0)  # every waiter is now waiting
        b.notify()
        asyncio.get_running_loop().call_soon(lambda: asyncio.ensure_future(bystander()))
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=10)
        return order

    order = asyncio.run(main())
    woken = [x for x in order if x != "bystander"]
    assert sorted(woken) == sorted(f"w{i}" for i in range(1000))
    assert "bystander" in order and order.index("bystander") < len(order) - 100


def test_a_change_between_reading_and_waiting_is_not_lost():
    async def main():
        b = Broadcast()
        seen = b.generation
        b.notify()  # came after the waiter read the state, before it waited
        await asyncio.wait_for(b.wait(seen), timeout=1)  # returns at once
        return b.generation

    assert asyncio.run(main()) == 1


def test_a_cancelled_waiter_does_not_break_the_others():
    async def main():
        b = Broadcast(batch=2)
        gone = asyncio.create_task(b.wait(0))
        stays = [asyncio.create_task(b.wait(0)) for _ in range(5)]
        await asyncio.sleep(0)
        gone.cancel()
        b.notify()
        await asyncio.wait_for(asyncio.gather(*stays), timeout=5)
        return gone.cancelled()

    assert asyncio.run(main())


def test_waiters_after_a_notify_wait_for_the_next():
    async def main():
        b = Broadcast()
        b.notify()
        late = asyncio.create_task(b.wait(b.generation))
        for _ in range(10):  # ten turns of the loop: nothing wakes it
            await asyncio.sleep(0)
        first = late.done()
        b.notify()
        await asyncio.wait_for(late, timeout=1)
        return first

    assert asyncio.run(main()) is False


def test_batch_must_be_positive():
    with pytest.raises(ValueError, match="at least 1"):
        Broadcast(batch=0)


def test_one_future_waits_on_two_broadcasts_and_the_first_to_fire_resolves_it():
    async def scenario():
        job, own = Broadcast(batch=2), Broadcast(batch=2)
        loop = asyncio.get_running_loop()
        woken = loop.create_future()
        job.add(job.generation, woken)
        own.add(own.generation, woken)
        own.notify()
        await asyncio.wait_for(woken, 1.0)
        job.notify()  # the same future, done already: nothing more happens
        # A future added after a notify it did not see resolves at once.
        late = loop.create_future()
        job.add(0, late)
        assert late.done()
        # Futures another broadcast resolved are not kept past a batch's worth.
        for _ in range(10):
            f = loop.create_future()
            job.add(job.generation, f)
            f.set_result(None)
        assert len(job._waiters) <= job.batch + 1
    asyncio.run(scenario())


def test_thousands_of_waiters_are_kept_without_a_pass_over_all_of_them_at_every_add():
    """A new leader's reconnecting hosts add thousands of waiters between two changes: the list is
    compacted once it doubled (amortised constant work an add), it holds no more than twice the live
    waiters, and every live one wakes at the next notify."""
    async def scenario():
        job = Broadcast(batch=4)
        loop = asyncio.get_running_loop()
        live, passes = [], 0
        for k in range(4000):
            f = loop.create_future()
            before = job._waiters
            job.add(job.generation, f)
            passes += job._waiters is not before  # a compaction builds a new list
            if k % 2:
                f.set_result(None)  # resolved by another broadcast the stream also waits on
            else:
                live.append(f)
            assert len(job._waiters) <= 2 * (len(live) + 1) + job.batch
        assert passes <= 20, f"{passes} passes over the waiters for 4,000 adds"  # logarithmic: 17
        job.notify()
        await asyncio.wait_for(asyncio.gather(*live), 5.0)
    asyncio.run(scenario())
