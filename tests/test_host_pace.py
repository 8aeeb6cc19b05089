"""Host heartbeats in the coordinator's pace (issue 50), in process: host
streams count as heartbeat senders, a new interval is pushed to every
connected host once, and a closed stream is no sender any more."""

from __future__ import annotations

import asyncio

from fthsdp.coordinator.hosts import stream as host_stream
from fthsdp.protos.v1 import coordinator_pb2 as pb
from tests.harness.inprocess import Collector, Requests, leading_runtime, register_request
from tests.test_streams_inprocess import Checked


def group_hello(host_id: str) -> pb.HostRequest:
    """A hello of one host of group r1, of 4 hosts."""
    return pb.HostRequest(hello=pb.HostHello(host_id=host_id, replica_id="r1", replica_rank=1, num_replicas=2,
                                             nnodes=4, nproc=1, incarnation=f"agent-{host_id}",
                                             address=f"10.0.0.{ord(host_id[0]) - 96}"))


def test_host_heartbeats_count_in_the_budget_and_a_new_pace_is_pushed_to_every_host():
    """Two replicas of 2 ranks started by agents (their rank 0s: 2 senders; the
    others ping in batches) and three hosts' streams, against a budget of 4
    heartbeats a second: 5 senders stretch the interval; a host
    that says hello later is welcomed at the stretched pace, and every host
    connected is pushed the new interval once when it changes."""

    async def scenario():
        runtime, clock = leading_runtime(heartbeat_interval=0.5, heartbeat_timeout=3.0, heartbeat_budget=4.0)
        job = runtime.jobs["default"]
        for rid in ("r0", "r1"):
            await runtime.register(register_request(rid, world_size=2))
        streams = {h: Collector(host_stream.serve(runtime, Requests(group_hello(h)), Checked()))
                   for h in ("a", "b", "c")}
        welcomes = [(await s.until(1))[0].welcome.heartbeat_interval for s in streams.values()]
        assert job.hosts.streams == 3
        clock.t = 0.5
        await runtime.evaluate(job)
        paced = job.pacer.current.interval
        pushed = {h: [p.heartbeat_interval for p in (await s.until(2))[1:]] for h, s in streams.items()}
        late = Collector(host_stream.serve(runtime, Requests(group_hello("d")), Checked()))
        late_welcome = (await late.until(1))[0].welcome.heartbeat_interval
        assert job.hosts.streams == 4
        for s in [*streams.values(), late]:
            s.task.cancel()
        return welcomes, paced, pushed, late_welcome

    welcomes, paced, pushed, late_welcome = asyncio.run(scenario())
    assert welcomes == [0.5, 0.5, 0.5]  # before the loop decided: the configured pace
    assert paced > 0.5, "2 rank 0s and 3 hosts are 5 senders: past a budget of 4 a second"
    assert pushed == {"a": [paced], "b": [paced], "c": [paced]}
    assert late_welcome == paced


def test_a_host_stream_that_closes_is_no_sender_any_more():
    from tests.harness.hosts import Hosts

    h = Hosts()
    for host_id in ("a", "b"):
        h.hello(host_id)
    assert h.table.streams == 2
    h.table.closed("a", h.connection["a"], 1.0)
    assert h.table.streams == 1
    h.table.pace(3.0)
    assert h.last("b", "heartbeat_interval") == ("heartbeat_interval", 3.0)
    assert h.last("a", "heartbeat_interval") is None
