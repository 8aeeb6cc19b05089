"""After a coordinator restart, a member listed in a new quorum before its
rank 0 reconnects: its other ranks wait for their place, never count
themselves out (a CI failure of tests/test_group_hosts.py: r1 failed while
the coordinator was down, quorum 3 = [r0] was formed before r0's rank 0 came
back, and r0's rank 1, pushed quorum 3 without a place, took itself as
evicted; r0 failed with it and the state was lost).

In process, on the memory store: the push says ``place_withheld``; the
rank's ``QuorumView`` does not take that quorum as pushed (its eviction
watch and FTAR see no eviction); rank 0 registering again wakes that
replica's watchers alone, and they get the place at once.
"""

from __future__ import annotations

import asyncio

from fthsdp.agent.training.quorum_view import QuorumView
from fthsdp.protos.v1 import coordinator_pb2 as pb
from tests.test_reconnect_grace import CONFIG, Clock, trained_then_restarted


async def next_event(stream, timeout: float = 5.0) -> pb.WatchEvent:
    return pb.WatchEvent.FromString(await asyncio.wait_for(anext(stream), timeout))


def test_a_member_not_back_is_pushed_its_quorum_with_the_place_withheld_then_the_place_once_it_registers():
    async def scenario():
        clock = Clock()
        runtime, qid = await trained_then_restarted(clock)  # r0, r1, r2 in quorum qid; the coordinator restarted
        job = runtime.jobs["default"]
        observer = runtime.watch(pb.WatchRequest(job="default", replica_id="r0"))  # r0's rank 1, through its relay
        other = runtime.watch(pb.WatchRequest(job="default", replica_id="r2"))
        first = await next_event(observer)
        assert first.quorum.id == qid and first.place_withheld and not first.HasField("place")
        await next_event(other)
        # r1's agent reports it failed: a quorum without it, r0 and r2 listed though not back yet.
        runtime.agent_event(pb.AgentEventRequest(job="default", replica_id="r1", state=pb.AGENT_STATE_FAILED,
                                                 agent_id="agent-of-r1"))
        clock.t += 1.0
        await runtime.evaluate(job)
        assert job.state.quorum.member_ids == ("r0", "r2"), job.state.reason
        event = await next_event(observer)
        assert event.quorum.id > qid and event.place_withheld and not event.HasField("place")
        view = QuorumView("r0")
        view.update(first)
        view.update(event)
        assert view.quorum is None or view.quorum.id != event.quorum.id  # not taken as pushed: nobody is evicted
        await next_event(other)
        # r0's rank 0 comes back, saying it trains in quorum qid: its watchers, and only they, get the place.
        req = pb.RegisterRequest(job="default", replica_id="r0", address="r0:1", world_size=2, quorum_id=qid,
                                 step=40, agent_ids=["agent-of-r0"])
        everyone = job.changes.generation
        await runtime.register(req)
        assert job.changes.generation == everyone  # the job's other watchers are not woken
        placed = await next_event(observer)
        assert placed.quorum.id == event.quorum.id and placed.HasField("place") and not placed.place_withheld
        view.update(placed)
        assert view.quorum.id == event.quorum.id and view.includes_me(view.quorum)
        await observer.aclose()
        await other.aclose()

    assert CONFIG.min_replicas == 1
    asyncio.run(scenario())
