"""When the relay sends its host's ping batch (fthsdp/agent/node/relay/pings.py ``batch_due``).

Ranks ping at phases of their own; a batch per ping window would send
several batches per interval per host. Table-driven on the pure rule, then
in process: ranks pinging every 0.4 s at spread phases make about one
batch per interval, with every rank's latest ping in it, and a rank's
first and last pings are not held.
"""

from __future__ import annotations

import asyncio

import pytest

from fthsdp.agent.node.relay.pings import HOLD_CAP, Pinger, batch_due
from fthsdp.protos.v1 import coordinator_pb2 as pb

A, B, C = ("r0", "i", 1), ("r0", "i", 2), ("r0", "i", 3)
W = 0.2


@pytest.mark.parametrize("pending, expected, urgent, gaps, now, due_in", [
    pytest.param({}, set(), False, {}, 10.0, float("inf"), id="nothing-pending"),
    pytest.param({A: 10.0}, {A, B}, False, {A: 1.0, B: 1.0}, 10.0, 1.0, id="waits-for-the-others-up-to-a-gap"),
    pytest.param({A: 10.0, B: 10.5}, {A, B}, False, {A: 1.0, B: 1.0}, 10.5, -0.3, id="every-rank-in: now"),
    pytest.param({A: 10.0}, {A, B}, False, {A: 1.0, B: 5.0}, 10.0, 1.0, id="the-shortest-gap"),
    pytest.param({A: 10.0}, {A, B}, True, {A: 1.0, B: 5.0}, 10.0, W, id="a-first-or-last-ping-goes-after-the-window"),
    pytest.param({A: 10.0}, {A}, False, {}, 10.1, W - 0.1, id="one-rank-alone: the-window"),
    pytest.param({A: 10.0}, {A, B}, False, {}, 10.0, W, id="no-gap-seen-yet: the-window"),
    pytest.param({A: 10.0}, {A, B}, False, {A: 1000.0, B: 1000.0}, 10.0, HOLD_CAP, id="capped"),
    pytest.param({A: 10.0, C: 10.2}, {A, B}, False, {A: 1.0, B: 1.0}, 10.2, 0.8, id="an-unknown-rank-no-matter"),
])
def test_batch_due(pending, expected, urgent, gaps, now, due_in):
    assert batch_due(pending, expected, urgent, gaps, now, W) == pytest.approx(due_in)


def ping(rank: int, **fields) -> pb.HeartbeatRequest:
    return pb.HeartbeatRequest(job="default", replica_id="r0", shard_rank=rank, incarnation="i", **fields)


def test_ranks_at_spread_phases_make_about_one_batch_per_interval():
    interval, ranks, rounds = 0.4, 7, 8

    async def scenario() -> list[pb.PingBatch]:
        pinger = Pinger(upstream=None, window=0.05)  # type: ignore[arg-type] - batches only, nothing sent
        batches: list[pb.PingBatch] = []

        async def collect() -> None:
            async for raw in pinger._batches():
                batches.append(pb.PingBatch.FromString(raw))

        async def rank(k: int) -> None:
            await asyncio.sleep(interval * k / ranks)  # its own phase
            for step in range(rounds):
                pinger._put(ping(k, step=step))
                await asyncio.sleep(interval)  # the rank's pace, not a synchronisation

        collector = asyncio.create_task(collect())
        await asyncio.gather(*(rank(k) for k in range(1, ranks + 1)))
        await asyncio.sleep(2 * interval)
        collector.cancel()
        return batches

    batches = asyncio.run(scenario())
    sizes = [len(b.pings) for b in batches]
    # The first pings of each rank go at once (a new rank); after that, one batch per interval with every rank.
    assert sum(sizes) >= ranks * (rounds - 1) and len(batches) <= rounds + ranks + 2, sizes
    assert sizes.count(ranks) >= rounds - 3, sizes


def test_a_ranks_last_ping_is_not_held():
    async def scenario() -> float:
        pinger = Pinger(upstream=None, window=0.05)  # type: ignore[arg-type]
        loop = asyncio.get_running_loop()
        batches = pinger._batches()
        pinger._put(ping(1))
        pinger._put(ping(2))
        await anext(batches)  # both known now; each was seen pinging every 10 s:
        pinger._gaps = {("r0", "i", 1): 10.0, ("r0", "i", 2): 10.0}
        pinger._put(ping(1, left=True))  # rank 1's group leaves: its last ping
        began = loop.time()
        await anext(batches)
        return loop.time() - began

    assert asyncio.run(scenario()) < 1.0
