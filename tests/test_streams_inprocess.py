"""The coordinator's Watch, Session and Host streams in process, on fakes
(tests/harness/inprocess.py): a runtime on the memory store and a fake
clock, requests fed through a queue, no gRPC server and no other process.
A quorum change reaches each stream once; a notify with nothing changed
sends nothing; a stream closed mid-push counts as its replica disconnected
and holds nobody up; a Session's events come in order and a forged request
ends it; a Host stream's hello, join, twin and close.

``once`` below: after the changes a test drives, a last change every stream
must be sent (a new quorum) closes each stream's list; an event sent twice,
or for nothing, would sit before it."""

from __future__ import annotations

import asyncio
import logging

import pytest

from fthsdp.coordinator.engine.broadcast import Broadcast
from fthsdp.coordinator.hosts import stream as host_stream
from fthsdp.coordinator.hosts.status import group_statuses
from fthsdp.coordinator.serving import session_stream
from fthsdp.core.auth import PermissionDenied
from fthsdp.core.errors import InvalidRequest
from fthsdp.protos.v1 import coordinator_pb2 as pb
from tests.harness.inprocess import (
    DEADLINE,
    Collector,
    Requests,
    leading_runtime,
    register_request,
    registered,
)
from tests.harness.jobs import agent_of

IDS = ("r0", "r1", "r2", "r3", "r4")


def decode_watch(raw: bytes) -> pb.WatchEvent:
    assert isinstance(raw, bytes), raw
    return pb.WatchEvent.FromString(raw)


def quorum_ids(events: list[pb.WatchEvent]) -> list[int]:
    return [e.quorum.id for e in events]


def no_errors(caplog) -> None:
    bad = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert not bad, [r.getMessage() for r in bad]


async def watchers(runtime, sessions: dict[str, str], member_list: bool = False) -> dict[str, Collector]:
    """A Watch stream for each replica (with its session) and one observer
    (no replica: it is sent the member list), each read by a Collector, each
    past its first event."""
    streams = {rid: runtime.watch(pb.WatchRequest(job="default", replica_id=rid, session_id=session,
                                                  member_list=member_list))
               for rid, session in sessions.items()}
    streams["observer"] = runtime.watch(pb.WatchRequest(job="default"))
    collectors = {name: Collector(stream, decode_watch) for name, stream in streams.items()}
    for collector in collectors.values():
        await collector.until(1)
    return collectors


async def close_all(collectors: dict[str, Collector]) -> None:
    for collector in collectors.values():
        collector.task.cancel()
        await asyncio.gather(collector.task, return_exceptions=True)
        await collector.stream.aclose()


async def join_and_decide(runtime, clock, rid: str = "r5") -> None:
    """``rid`` registers and the next quorum admits it, once arrivals settled:
    a change every stream is sent, and none of the watchers' own fields
    changes before it does (a member leaving would: its place goes with its entry)."""
    job = runtime.jobs["default"]
    await registered(runtime, rid)
    clock.t += 0.5  # past the join settle
    await runtime.evaluate(job)
    assert rid in job.state.quorum.member_ids, job.state.reason


def probe(runtime, rid: str) -> Collector:
    """A stream of ``rid``'s that follows only (no session), opened after the
    others: the loop wakes waiters in the order they came, so once a fault
    injected for ``rid`` reached it, every stream opened before it was woken
    and has answered."""
    return Collector(runtime.watch(pb.WatchRequest(job="default", replica_id=rid)), decode_watch)


def snapshot(collectors: dict[str, Collector]) -> dict[str, list]:
    return {name: list(c.items) for name, c in collectors.items()}


# ----- Watch ---------------------------------------------------------------------------


def test_a_quorum_change_reaches_each_watch_stream_once(caplog):
    """Five replicas watching and an observer: the quorum forming is one event
    on each stream, the next quorum (r5 admitted) one more; the observer's
    carries the member list, then the difference; a replica's its place only."""

    async def scenario():
        runtime, clock = leading_runtime()
        job = runtime.jobs["default"]
        sessions = await registered(runtime, *IDS)
        collectors = await watchers(runtime, sessions)
        assert {name: quorum_ids(c.items) for name, c in collectors.items()} == dict.fromkeys(collectors, [0])
        clock.t = 0.5
        await runtime.evaluate(job)
        assert job.state.quorum.member_ids == IDS, job.state.reason
        for collector in collectors.values():
            await collector.until(2)
        clock.t = 1.0
        await join_and_decide(runtime, clock)  # closes every stream's list: ``once``
        for collector in collectors.values():
            await collector.until(3)
        events = snapshot(collectors)
        await close_all(collectors)
        return events

    with caplog.at_level(logging.INFO, logger="fthsdp.coordinator"):
        events = asyncio.run(scenario())
    assert {name: quorum_ids(e) for name, e in events.items()} == dict.fromkeys(events, [0, 1, 2])
    for rid in IDS:
        formed = events[rid][1]
        assert not formed.quorum.members and formed.quorum.member_count == 5  # a replica: no list
        assert formed.HasField("place") and formed.place.rank == IDS.index(rid)
    observer = events["observer"]
    assert [m.replica_id for m in observer[1].quorum.members] == list(IDS)  # the whole list once,
    assert observer[2].delta.base_id == 1 and [m.replica_id for m in observer[2].delta.added] == ["r5"]  # a delta
    assert [e.quorum.member_count for e in events["r0"]] == [0, 5, 6]
    no_errors(caplog)


def test_a_notify_with_nothing_changed_for_a_replica_sends_it_nothing():
    """An agent's report wakes no watcher (nothing they are sent comes from
    it); a wake-up with nothing changed changes nobody's event; a fault
    injected for r0 changes r0's only: r0's stream is sent it, once, and no
    other stream anything."""

    async def scenario():
        runtime, clock = leading_runtime()
        job = runtime.jobs["default"]
        sessions = await registered(runtime, *IDS)
        clock.t = 0.5
        await runtime.evaluate(job)
        collectors = await watchers(runtime, sessions)
        await close_all({"observer": collectors.pop("observer")})  # it holds the member list: see the next test
        collectors["probe"] = last = probe(runtime, "r0")
        await last.until(1)
        generation = job.changes.generation
        for _ in range(3):
            runtime.agent_event(pb.AgentEventRequest(job="default", replica_id="r1", agent_id=agent_of("r1"),
                                                     state=pb.AGENT_STATE_RUNNING))
        assert job.changes.generation == generation, "an agent's report woke the watchers"
        for _ in range(3):
            job.notify()  # a wake-up for something none of them is sent
        runtime.inject(pb.InjectRequest(job="default", replica_id="r0", kind=pb.FAULT_KIND_HANG), "")
        assert job.changes.generation == generation + 4  # every watcher was woken four times
        await last.until(2)  # ... and every stream answered
        clock.t = 1.0
        await join_and_decide(runtime, clock)
        for collector in collectors.values():
            await collector.until(2)
        await collectors["r0"].until(3)
        events = snapshot(collectors)
        await close_all(collectors)
        return events

    events = asyncio.run(scenario())
    del events["probe"]
    r0 = events.pop("r0")
    assert quorum_ids(r0) == [1, 1, 2] and [len(e.injections) for e in r0] == [0, 1, 1]
    assert {rid: quorum_ids(e) for rid, e in events.items()} == dict.fromkeys(events, [1, 2])


@pytest.mark.parametrize("who", ["observer", "r0 with member_list"])
def test_a_notify_with_nothing_changed_sends_a_member_list_watcher_nothing(who):
    async def scenario():
        runtime, clock = leading_runtime()
        job = runtime.jobs["default"]
        sessions = await registered(runtime, *IDS)
        clock.t = 0.5
        await runtime.evaluate(job)
        collectors = await watchers(runtime, sessions, member_list=True)
        collector = collectors["observer" if who == "observer" else "r0"]
        assert collector.items[0].quorum.members  # the whole list, once
        collectors["probe"] = last = probe(runtime, "r1")
        await last.until(1)
        runtime.inject(pb.InjectRequest(job="default", replica_id="r1", kind=pb.FAULT_KIND_HANG), "")  # not theirs
        await last.until(2)
        clock.t = 1.0
        await join_and_decide(runtime, clock)
        await collector.until(2)
        events = list(collector.items)
        await close_all(collectors)
        return events

    events = asyncio.run(scenario())
    assert quorum_ids(events) == [1, 2], [(e.quorum.id, e.HasField("delta")) for e in events]


def test_the_decision_loop_pushes_each_quorum_once_to_each_stream():
    """As the coordinator runs: start() loads the job and starts the decision
    loop; replicas beating, ready, wake it; each quorum reaches each stream once."""

    async def scenario():
        runtime, clock = leading_runtime()
        job = runtime.jobs["default"]
        collectors: dict[str, Collector] = {}
        await runtime.start()
        try:
            # Registered, not beating: nobody is admitted until all of them beat, at once (no tick between).
            sessions = {rid: (await runtime.register(register_request(rid))).session_id for rid in IDS}
            collectors = {rid: Collector(runtime.watch(pb.WatchRequest(job="default", replica_id=rid,
                                                                       session_id=session)), decode_watch)
                          for rid, session in sessions.items()}
            for collector in collectors.values():
                await collector.until(1)
            clock.t = 0.5
            for rid, session in sessions.items():  # beating and ready: the loop is woken
                runtime.heartbeat(pb.HeartbeatRequest(job="default", replica_id=rid, session_id=session, ready=True))
            for collector in collectors.values():
                await collector.until(2)
            assert job.state.quorum.member_ids == IDS
            clock.t = 1.0
            r5 = (await runtime.register(register_request("r5"))).session_id
            runtime.heartbeat(pb.HeartbeatRequest(job="default", replica_id="r5", session_id=r5, ready=True))
            clock.t = 1.5  # before the loop decides: past the join settle
            for collector in collectors.values():
                await collector.until(3)
            events = snapshot(collectors)
        finally:
            await runtime.stop()  # no decision after this: closing the streams below changes no quorum
        await close_all(collectors)
        return events

    events = asyncio.run(scenario())
    assert {rid: quorum_ids(e) for rid, e in events.items()} == dict.fromkeys(IDS, [0, 1, 2])
    assert [e.quorum.member_count for e in events["r0"]] == [0, 5, 6]


def test_a_stream_closed_mid_push_counts_as_disconnected_and_holds_nobody_up(caplog):
    """A quorum change is being pushed, a waiter a turn of the loop, when
    r2's stream is cancelled (as gRPC cancels a call whose client went) and
    r3's, whose reader was slow and still holds its last event, is closed:
    the other four streams are sent the change, nothing raises, r2 and r3
    count as disconnected, and the next quorum leaves them out."""

    async def scenario():
        runtime, clock = leading_runtime()
        job = runtime.jobs["default"]
        job.changes = Broadcast(batch=1)  # the push spans a turn of the loop per waiter
        sessions = await registered(runtime, *IDS)
        clock.t = 0.5
        await runtime.evaluate(job)
        slow = runtime.watch(pb.WatchRequest(job="default", replica_id="r3", session_id=sessions["r3"]))
        assert decode_watch(await asyncio.wait_for(anext(slow), DEADLINE)).quorum.id == 1  # and reads no further
        collectors = await watchers(runtime, {rid: sessions[rid] for rid in ("r0", "r1", "r4", "r2")})
        clock.t = 1.0
        await runtime.leave(pb.LeaveRequest(job="default", replica_id="r4", session_id=sessions["r4"]))
        await runtime.evaluate(job)  # quorum 2 (r0..r3); its push has begun, nobody released yet
        assert job.state.quorum.member_ids == ("r0", "r1", "r2", "r3")
        gone = collectors.pop("r2")
        gone.task.cancel()
        await slow.aclose()
        await asyncio.gather(gone.task, return_exceptions=True)
        await gone.stream.aclose()  # as the servicer does after the call ends
        for collector in collectors.values():
            await collector.until(2)
        entries = {rid: (job.state.replicas[rid].incarnation.open_watches,
                         job.state.replicas[rid].incarnation.disconnected_at) for rid in ("r2", "r3")}
        clock.t = 1.5
        await runtime.evaluate(job)
        for collector in collectors.values():
            await collector.until(3)
        await close_all(collectors)
        errors = {name: c.error for name, c in collectors.items() if c.error is not None}
        return entries, gone, job.state.quorum.member_ids, {n: list(c.items) for n, c in collectors.items()}, errors

    with caplog.at_level(logging.INFO, logger="fthsdp.coordinator"):
        entries, gone, members, events, errors = asyncio.run(scenario())
    assert entries == {"r2": (0, 1.0), "r3": (0, 1.0)}
    assert gone.task.cancelled() and gone.error is None and quorum_ids(gone.items) == [1]  # it went before its turn
    assert members == ("r0", "r1")
    assert {name: quorum_ids(e) for name, e in events.items()} == dict.fromkeys(events, [1, 2, 3])
    assert not errors
    no_errors(caplog)


# ----- Session -------------------------------------------------------------------------


def decode_session(item) -> pb.SessionEvent | Exception:
    return item if isinstance(item, Exception) else pb.SessionEvent.FromString(item)


def heartbeat(**fields) -> pb.SessionRequest:
    return pb.SessionRequest(heartbeat=pb.HeartbeatRequest(**fields))


class Checked:
    """The ``check`` a Session or Host stream is served with: records what it was shown."""

    def __init__(self) -> None:
        self.seen: list = []

    def __call__(self, request) -> None:
        self.seen.append(request)


def test_a_session_sends_registered_then_watch_events_and_acks_only_for_heartbeats_that_ask():
    async def scenario():
        runtime, clock = leading_runtime()
        job = runtime.jobs["default"]
        requests, check = Requests(pb.SessionRequest(register=register_request("r0"))), Checked()
        session = Collector(session_stream.serve(runtime, requests, check), decode_session)
        registered_event, first_watch = await session.until(2)
        clock.t = 0.2
        for seq in (1, 2, 3, 4):  # r0's heartbeats (no replica id or session: the stream's)
            requests.send(heartbeat(step=seq, lease_seq=seq, ack=seq % 2 == 0))
        await session.until(4)
        clock.t = 0.5
        await runtime.evaluate(job)
        await session.until(5)
        entry = job.state.replicas["r0"].incarnation
        recorded = (entry.step, entry.open_watches, entry.disconnected_at)
        requests.close()  # the replica closed its side: the session ends
        await session.ended()
        return (session.items, registered_event.registered.session_id, recorded, len(check.seen),
                job.state.replicas["r0"].incarnation)

    items, session_id, recorded, checked, entry = asyncio.run(scenario())
    assert [e.WhichOneof("message") for e in items] == ["registered", "watch", "ack", "ack", "watch"]
    assert items[0].registered.session_id == session_id and items[0].registered.leader == "coord:1"
    assert items[1].watch.quorum.id == 0 and items[1].watch.leader == "coord:1"
    assert [e.ack.lease_seq for e in items[2:4]] == [2, 4]  # the heartbeats that asked, in order
    assert items[4].watch.quorum.id == 1 and items[4].watch.HasField("place") and items[4].watch.place.rank == 0
    assert recorded == (4, 1, None)  # every heartbeat recorded; the stream's watch keeps r0 connected
    assert checked == 5  # every request shown to ``check``
    assert (entry.open_watches, entry.disconnected_at) == (0, 0.5)  # the session's end: r0's stream closed


@pytest.mark.parametrize("forged, says", [
    (heartbeat(replica_id="r9", step=3), "this Session is replica 'r0''s, not 'r9''s"),
    (heartbeat(job="other", step=3), "this Session is in job 'default', not 'other'"),
    (pb.SessionRequest(register=register_request("r9")), "a Session carries heartbeats only"),
])
def test_a_forged_request_ends_the_session_with_the_error_and_records_nothing(forged, says):
    """A second request that is not r0's heartbeat: the error is the
    stream's last item (the servicer maps it to a status), r9 is not
    recorded, r0's heartbeats before it are, and r0's watch is closed."""

    async def scenario():
        runtime, clock = leading_runtime()
        job = runtime.jobs["default"]
        requests = Requests(pb.SessionRequest(register=register_request("r0")))
        session = Collector(session_stream.serve(runtime, requests, Checked()), decode_session)
        await session.until(2)
        clock.t = 0.2
        requests.send(heartbeat(step=1, ack=True))
        await session.until(3)
        clock.t = 0.3
        requests.send(forged)
        requests.send(heartbeat(step=2, ack=True))  # after the stream ended: never read
        await session.ended()
        entry = job.state.replicas["r0"].incarnation
        return session.items, session.error, set(job.state.replicas), (entry.step, entry.disconnected_at)

    items, error, replicas, r0 = asyncio.run(scenario())
    assert [type(i).__name__ if isinstance(i, Exception) else i.WhichOneof("message") for i in items] == [
        "registered", "watch", "ack", "InvalidRequest"]
    assert says in str(items[-1]) and error is None
    assert replicas == {"r0"} and r0 == (1, 0.3)


def test_a_session_that_does_not_start_with_a_register_is_refused_and_records_nothing():
    async def scenario():
        runtime, _ = leading_runtime()
        stream = session_stream.serve(runtime, Requests(heartbeat(replica_id="r0", step=1)), Checked())
        with pytest.raises(InvalidRequest, match="a Session starts with a register request"):
            await asyncio.wait_for(anext(stream), DEADLINE)
        return runtime.jobs["default"].state.replicas

    assert not asyncio.run(scenario())


# ----- Host ----------------------------------------------------------------------------


def hello(host_id: str, incarnation: str, **fields) -> pb.HostRequest:
    return pb.HostRequest(hello=pb.HostHello(host_id=host_id, replica_id="r1", replica_rank=1, num_replicas=2,
                                             nnodes=2, nproc=1, incarnation=incarnation,
                                             address=f"10.0.0.{ord(host_id[0]) - 96}", **fields))


def kinds(pushes: list) -> list[str]:
    return [p.WhichOneof("message") if isinstance(p, pb.HostPush) else type(p).__name__ for p in pushes]


def test_the_host_stream_welcomes_completes_refuses_a_twin_and_a_closed_stream_is_a_lost_host(caplog):
    async def scenario():
        runtime, clock = leading_runtime(heartbeat_interval=0.2, heartbeat_timeout=2.0)
        table = runtime.jobs["default"].hosts
        a_requests, b_requests = Requests(hello("a", "agent-a")), Requests(hello("b", "agent-b"))
        a = Collector(host_stream.serve(runtime, a_requests, Checked()))
        b = Collector(host_stream.serve(runtime, b_requests, Checked()))
        welcome_a, welcome_b = (await a.until(1))[0], (await b.until(1))[0]
        clock.t = 1.0
        a_requests.send(pb.HostRequest(join=pb.HostJoin(round=1, store="10.0.0.1:7001")))
        b_requests.send(pb.HostRequest(join=pb.HostJoin(round=1, store="10.0.0.2:7001")))
        await a.until(3)
        await b.until(3)
        before = group_statuses(table, clock())

        twin = host_stream.serve(runtime, Requests(hello("b", "another-agent")), Checked())
        with caplog.at_level(logging.WARNING, logger="fthsdp.coordinator"):
            with pytest.raises(PermissionDenied) as refused:
                await asyncio.wait_for(anext(twin), DEADLINE)
        after = group_statuses(table, clock())

        clock.t = 2.0
        a_requests.close()  # a's agent is gone without a leave
        await a.ended()
        lost = {h.host_id: h.state for h in group_statuses(table, clock())[0].hosts}
        b_requests.close()
        await b.ended()
        return welcome_a, welcome_b, a, b, before, after, str(refused.value), lost

    welcome_a, welcome_b, a, b, before, after, refused, lost = asyncio.run(scenario())
    assert (welcome_a.welcome.host_id, welcome_a.welcome.round, welcome_b.welcome.heartbeat_interval) == (
        "a", 1, pytest.approx(0.2))
    assert kinds(a.items) == ["welcome", "joined", "complete"]  # and nothing after its stream closed
    assert kinds(b.items) == ["welcome", "joined", "complete", "ended"]  # a lost: round 1 is over for b too
    assert (a.items[2].complete.node_rank, b.items[2].complete.node_rank, b.items[2].complete.store) == (
        0, 1, "10.0.0.1:7001")
    assert "host id 'b' is taken: another agent with this host id is connected (from 10.0.0.2" in refused
    assert after == before and {h.state for h in after[0].hosts} == {"running"}  # the twin changed nothing
    assert sum(refused in r.getMessage() for r in caplog.records) == 1  # said once
    assert lost == {"a": "lost", "b": "gathering"}
    assert a.error is None and b.error is None


def test_a_host_stream_of_the_twin_is_refused_and_the_real_host_keeps_its_stream():
    """After the twin's refusal, what the table pushes to host b still reaches b's own stream."""

    async def scenario():
        runtime, clock = leading_runtime(heartbeat_interval=0.2, heartbeat_timeout=2.0)
        a_requests, b_requests = Requests(hello("a", "agent-a")), Requests(hello("b", "agent-b"))
        a = Collector(host_stream.serve(runtime, a_requests, Checked()))
        b = Collector(host_stream.serve(runtime, b_requests, Checked()))
        for host, requests, store in ((a, a_requests, "10.0.0.1:7001"), (b, b_requests, "10.0.0.2:7001")):
            await host.until(1)
            requests.send(pb.HostRequest(join=pb.HostJoin(round=1, store=store)))
        await a.until(3)
        await b.until(3)
        twin = host_stream.serve(runtime, Requests(hello("b", "another-agent")), Checked())
        with pytest.raises(PermissionDenied):
            await asyncio.wait_for(anext(twin), DEADLINE)
        clock.t = 1.0
        b_requests.send(pb.HostRequest(failure=pb.HostFailure(round=1, reason="local rank 0 exited")))
        await a.until(4)
        await b.until(4)
        for requests, host in ((a_requests, a), (b_requests, b)):
            requests.close()
            await host.ended()
        return a.items, b.items

    a_items, b_items = asyncio.run(scenario())
    assert kinds(a_items)[3] == "ended" and kinds(b_items)[3] == "ended"
    assert a_items[3].ended.round == 1 and "it reported a failure" in a_items[3].ended.reason
