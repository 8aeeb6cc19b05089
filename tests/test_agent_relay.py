"""The agent's local relay (fthsdp/agent/node/relay/): its ranks reach the
coordinator through it, over one connection per host.

In process, against a real coordinator on port 0: calls forwarded as they
are, a replica's Watch opened once upstream however many local watchers
follow it, each of them handed every event in order; the job token checked;
the next coordinator tried while one is unreachable; a stream the
coordinator ends ends every local watcher of it. With real processes: two
agents of two ranks training, and the coordinator's TCP peers are the two
agents, one connection each.
"""

from __future__ import annotations

import asyncio
import queue
import re
import subprocess
import threading
from types import SimpleNamespace

import grpc
import pytest

from fthsdp.agent.node.launch import free_port
from fthsdp.agent.node.relay.pings import Pinger
from fthsdp.agent.node.relay.server import LocalRelay
from fthsdp.client import CoordinatorClient
from fthsdp.coordinator.config import CoordinatorConfig
from fthsdp.core.errors import RequestRejected
from fthsdp.protos.v1 import coordinator_pb2 as pb
from tests.harness.ending import end_started
from tests.harness.hsdp import hsdp_agent
from tests.harness.inprocess import JOB_TOKEN, InProcessCoordinator
from tests.harness.processes import CoordinatorProcess
from tests.harness.waiting import wait_until

DEADLINE = 30.0


@pytest.fixture
def coordinator(tmp_path):
    token = tmp_path / "token"
    token.write_text(JOB_TOKEN)
    c = InProcessCoordinator(CoordinatorConfig(bind="127.0.0.1:0", min_replicas=1, join_settle=0.0,
                                               token_file=str(token), heartbeat_timeout=60.0))
    yield c
    c.close()


class Follower:
    """One local watcher of ``replica_id`` through the relay, on a thread: the events it was handed, in order."""

    def __init__(self, relay: LocalRelay, replica_id: str, **fields) -> None:
        self.client = CoordinatorClient([relay.address], token=JOB_TOKEN)
        self.call = self.client.stub(relay.address).Watch(pb.WatchRequest(job="default", replica_id=replica_id,
                                                                          **fields), metadata=self.client.metadata)
        self.events: queue.Queue = queue.Queue()
        self.ended: grpc.StatusCode | None = None
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for event in self.call:
                self.events.put(event)
        except grpc.RpcError as e:
            self.ended = e.code()
        else:
            self.ended = grpc.StatusCode.OK

    def next_quorum(self, quorum_id: int) -> pb.WatchEvent:
        """The first event handed to it of quorum ``quorum_id`` or later."""
        while True:
            event = self.events.get(timeout=DEADLINE)
            if event.quorum.id >= quorum_id:
                return event

    def close(self) -> None:
        self.call.cancel()
        self.client.close()


def register(client: CoordinatorClient, rid: str) -> str:
    session = client.call("Register", pb.RegisterRequest(job="default", replica_id=rid, address=f"{rid}:1",
                                                         world_size=1, agent_ids=[f"agent-of-{rid}"])).session_id
    client.call("Heartbeat", pb.HeartbeatRequest(job="default", replica_id=rid, session_id=session))
    return session


def test_a_replicas_watch_is_one_upstream_stream_whatever_its_local_watchers(coordinator):
    """Three watchers of r0 (its ranks and its agent's hang watch), one
    upstream stream; each is handed the quorum forming, then r1's admission,
    in order; a watcher that comes later is handed the latest event at once;
    the upstream stream closes when the last watcher goes."""
    with LocalRelay([coordinator.address], JOB_TOKEN, None) as relay:
        client = CoordinatorClient([relay.address], token=JOB_TOKEN)
        register(client, "r0")
        followers = [Follower(relay, "r0") for _ in range(3)]
        firsts = [f.next_quorum(1) for f in followers]
        assert {e.quorum.id for e in firsts} == {1} and all(e.HasField("place") for e in firsts), firsts
        register(client, "r1")
        seconds = [f.next_quorum(2) for f in followers]
        assert len({e.SerializeToString() for e in seconds}) == 1, "every watcher is handed the same event"
        late = Follower(relay, "r0")
        assert late.next_quorum(2).quorum.id == seconds[0].quorum.id
        assert relay.fanout is not None and (relay.fanout.opened, relay.fanout.open) == (1, 1)
        # The member list (each stream's own differences) is not shared: a stream of its own.
        listing = Follower(relay, "", member_list=True)
        assert len(listing.next_quorum(2).quorum.members) == 2
        assert relay.fanout.opened == 1
        for f in [*followers, late, listing]:
            f.close()
        wait_until(lambda: relay.fanout.open == 0, DEADLINE, message="the upstream stream closed after the last "
                                                                     "local watcher went")
        client.close()


def test_a_call_without_the_job_token_is_refused_by_the_relay(coordinator):
    with LocalRelay([coordinator.address], JOB_TOKEN, None) as relay:
        with CoordinatorClient([relay.address], token="another-token-0123456789") as client:
            with pytest.raises(RequestRejected, match="wrong job token") as e:
                client.call("Status", pb.StatusRequest(job="default"))
            assert e.value.code == grpc.StatusCode.UNAUTHENTICATED


def test_an_operators_call_is_not_forwarded(coordinator):
    with LocalRelay([coordinator.address], JOB_TOKEN, None) as relay:
        with CoordinatorClient([relay.address], token=JOB_TOKEN) as client:
            with pytest.raises(RequestRejected) as e:
                client.call("Drain", pb.DrainRequest(job="default", replica_id="r0"))
            assert e.value.code == grpc.StatusCode.UNIMPLEMENTED


def test_a_call_goes_to_the_next_coordinator_while_one_is_unreachable(coordinator):
    unreachable = f"127.0.0.1:{free_port()}"
    with LocalRelay([unreachable, coordinator.address], JOB_TOKEN, None) as relay:
        with CoordinatorClient([relay.address], token=JOB_TOKEN, timeout=10.0) as client:
            assert client.call("Status", pb.StatusRequest(job="default")).job == "default"
            assert client.call("Status", pb.StatusRequest(job="default")).job == "default"


def test_a_stream_the_coordinator_ends_ends_every_local_watcher(tmp_path):
    """The coordinator stops: both watchers of r0 end UNAVAILABLE (and reopen, as a rank's watch does)."""
    token = tmp_path / "token"
    token.write_text(JOB_TOKEN)
    c = InProcessCoordinator(CoordinatorConfig(bind="127.0.0.1:0", min_replicas=1, join_settle=0.0,
                                               token_file=str(token), heartbeat_timeout=60.0))
    try:
        with LocalRelay([c.address], JOB_TOKEN, None) as relay:
            with CoordinatorClient([relay.address], token=JOB_TOKEN) as client:
                register(client, "r0")
            followers = [Follower(relay, "r0") for _ in range(2)]
            for f in followers:
                f.next_quorum(1)
            c.close()
            c = None
            wait_until(lambda: all(f.ended is not None for f in followers), DEADLINE,
                       message="both local watchers ended")
            assert {f.ended for f in followers} == {grpc.StatusCode.UNAVAILABLE}
            for f in followers:
                f.close()
    finally:
        if c is not None:
            c.close()


# ----- with processes ----------------------------------------------------------------


def coordinator_peers(port: int) -> dict[int, int]:
    """The processes with a TCP connection to the coordinator's ``port``: pid -> connections."""
    out = subprocess.run(["ss", "-Htnp", "state", "established", f"( dport = :{port} )"], capture_output=True,
                         text=True, check=True).stdout
    peers: dict[int, int] = {}
    for line in out.splitlines():
        for pid in re.findall(r"pid=(\d+)", line):
            peers[int(pid)] = peers.get(int(pid), 0) + 1
    return peers


def training_ranks(agent) -> set[int]:
    """The pids of ``agent``'s two ranks, read from its lines until it has trained a few steps."""
    pids: set[int] = set()
    agent.read_until(lambda line: (pids.add(line["pid"]) if "pid" in line and "rank" in line else None)
                     or (len(pids) == 2 and line.get("step", 0) >= 5))
    return pids


def test_ranks_under_the_agent_hold_no_connection_to_the_coordinator(tmp_path):
    """Two replicas of two ranks each, training: the coordinator's peers are
    the two agents, one TCP connection each; none is a rank."""
    c = CoordinatorProcess(tmp_path, "--min-replicas", "2").start()
    agents = []
    try:
        agents = [hsdp_agent(tmp_path, c.address, k, "--steps", "400").start() for k in range(2)]
        ranks = {a.replica_id: training_ranks(a) for a in agents}
        expected = {a.proc.pid: 1 for a in agents}
        wait_until(lambda: coordinator_peers(c.port) == expected, DEADLINE,
                   message=f"one connection per agent {expected} (ranks: {ranks})")
        assert not set(coordinator_peers(c.port)) & set().union(*ranks.values())
    finally:
        end_started()  # everything it started, killed at once (tests/harness/ending.py)


# ----- the ranks' pings, coalesced --------------------------------------------------------


def ping(shard_rank: int, age: float = 0.0, replica_id: str = "r0", incarnation: str = "inc-1",
         step: int = 3, **fields) -> pb.HeartbeatRequest:
    return pb.HeartbeatRequest(job="default", replica_id=replica_id, shard_rank=shard_rank, step=step,
                               incarnation=incarnation, progress=pb.Progress(phase=pb.PHASE_COMPUTE,
                                                                             phase_age_s=age, step=step), **fields)


def test_a_batch_holds_each_ranks_latest_ping_with_the_wait_added_to_its_phase_age():
    async def scenario() -> pb.PingBatch:
        pinger = Pinger(upstream=SimpleNamespace(secure=False), window=0.05)  # type: ignore[arg-type] - batches only
        pinger._put(ping(1, age=1.0, step=3))
        pinger._put(ping(2, age=0.0, step=3))
        pinger._put(ping(1, age=1.5, step=4))  # rank 1's later ping replaces its first
        return pb.PingBatch.FromString(await anext(pinger._batches()))

    batch = asyncio.run(scenario())
    got = {p.shard_rank: (p.step, p.progress.phase_age_s) for p in batch.pings}
    assert set(got) == {1, 2} and got[1][0] == 4
    assert 1.55 <= got[1][1] < 2.5 and 0.05 <= got[2][1] < 1.0, got  # waited the window, at least


class Pinging:
    """One rank's local ping stream through the relay, on a thread: its pings, its end status."""

    def __init__(self, relay: LocalRelay, **fields) -> None:
        self.client = CoordinatorClient([relay.address], token=JOB_TOKEN)
        self.out: queue.Queue = queue.Queue()
        self.call = self.client.stub(relay.address).HeartbeatStream(iter(self.out.get, None),
                                                                    metadata=self.client.metadata)
        self.fields = fields
        self.ended: grpc.StatusCode | None = None
        self.details = ""
        threading.Thread(target=self._read, daemon=True).start()

    def send(self, **more) -> None:
        self.out.put(ping(**{**self.fields, **more}))

    def _read(self) -> None:
        try:
            for _ in self.call:
                pass
            self.ended = grpc.StatusCode.OK
        except grpc.RpcError as e:
            self.ended, self.details = e.code(), e.details()

    def close(self) -> None:
        self.out.put(None)
        self.call.cancel()
        self.client.close()


def test_a_hosts_ranks_ping_as_one_stream_and_a_refused_ping_ends_its_ranks_stream_alone(coordinator):
    """r0 has 4 ranks: ranks 1-3 ping through the relay, each on its own local
    stream; the coordinator records each rank's ping, in fewer batches than
    pings, and counts the replica as two heartbeat senders (rank 0 and the
    host's batch). A ping of an ended incarnation is refused: that rank's
    stream ends with the status, the others go on."""
    runtime = coordinator.running.runtime
    with LocalRelay([coordinator.address], JOB_TOKEN, None) as relay:
        with CoordinatorClient([relay.address], token=JOB_TOKEN) as client:
            client.call("Register", pb.RegisterRequest(job="default", replica_id="r0", address="r0:1", world_size=4,
                                                       agent_ids=["agent-of-r0"], incarnation="inc-1"))
        ranks = {k: Pinging(relay, shard_rank=k) for k in (1, 2, 3)}
        stale = Pinging(relay, shard_rank=1, incarnation="inc-0")  # a rank of the incarnation before
        for round_ in range(3):
            for rank in ranks.values():
                rank.send(step=round_)
        entry = runtime.jobs["default"].state.replicas["r0"]
        wait_until(lambda: all(entry.incarnation.rank_heartbeats.get(k, 0) > 0 for k in (1, 2, 3))
                   and 3 in runtime.jobs["default"].state.progress.reports.get("r0", {}), DEADLINE,
                   message="every rank's ping recorded")
        # Its 4 ranks ping as its rank 0 and one host's batch: 2 heartbeat senders to the pace, not 4
        job = runtime.jobs["default"]
        assert job.state.senders() + job.ping_streams == 2
        stale.send()
        wait_until(lambda: stale.ended is not None, DEADLINE, message="the stale rank's stream ended")
        sent = relay.pinger.pings
        for rank in ranks.values():
            rank.send(step=9)
        wait_until(lambda: relay.pinger.pings >= sent + 3, DEADLINE, message="the others' pings still go")
        wait_until(lambda: all(runtime.jobs["default"].state.progress.reports["r0"][k].step == 9
                               for k in (1, 2, 3)), DEADLINE, message="the others' pings recorded")
        assert relay.pinger.batches < relay.pinger.pings
        assert all(rank.ended is None for rank in ranks.values())
        for rank in [*ranks.values(), stale]:
            rank.close()
    assert stale.ended in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION), (stale.ended,
                                                                                            stale.details)


def test_a_malformed_ping_in_a_batch_is_refused_alone_and_only_the_taken_ones_are_counted(coordinator):
    """A batch is checked ping by ping (each name once per batch): a ping naming a malformed replica id is
    answered INVALID_ARGUMENT; the others are recorded, and the heartbeat counter counts them alone."""
    runtime = coordinator.running.runtime
    with CoordinatorClient([coordinator.address], token=JOB_TOKEN) as client:
        client.call("Register", pb.RegisterRequest(job="default", replica_id="r0", address="r0:1", world_size=4,
                                                   agent_ids=["agent-of-r0"], incarnation="inc-1"))
        counted = heartbeats_counted(runtime)
        batch = pb.PingBatch(pings=[ping(1), ping(2, replica_id="bad id!"), ping(3), ping(2, replica_id="bad id!")])
        call = client.stub(coordinator.address).Pings(iter([batch]), metadata=client.metadata)
        refusals = list(call)
    assert [(r.replica_id, r.code) for r in refusals] == [("bad id!", grpc.StatusCode.INVALID_ARGUMENT.value[0])] * 2
    reports = runtime.jobs["default"].state.progress.reports["r0"]
    assert set(reports) == {1, 3}
    assert heartbeats_counted(runtime) - counted == 2


def heartbeats_counted(runtime) -> float:
    """fthsdp_heartbeats_total of the default job, as /metrics shows it."""
    for line in runtime.metrics.render().splitlines():
        if line.startswith('fthsdp_heartbeats_total{job="default"}'):
            return float(line.split()[-1])
    return 0.0


def test_the_relay_welcomes_its_clients_keepalive_pings(coordinator, monkeypatch):
    """The ranks' channels ping every 10 s, idle streams included: the relay's
    server must allow that (gRPC's default answers pings more often than
    every 5 minutes without data with GOAWAY too_many_pings, which ended
    the ranks' hang-watch streams every minute or two)."""
    from fthsdp.client import CHANNEL_OPTIONS, SERVER_KEEPALIVE

    made: list[dict] = []
    real = grpc.aio.server

    def server(*args, **kwargs):
        made.append(dict(kwargs.get("options") or ()))
        return real(*args, **kwargs)

    monkeypatch.setattr(grpc.aio, "server", server)
    with LocalRelay([coordinator.address], JOB_TOKEN, None):
        pass
    client = dict(CHANNEL_OPTIONS)
    assert made, "the relay built no gRPC server"
    for options in made:
        assert options.get("grpc.keepalive_permit_without_calls") == client["grpc.keepalive_permit_without_calls"] == 1
        assert options["grpc.http2.min_ping_interval_without_data_ms"] <= client["grpc.keepalive_time_ms"], options
    assert dict(SERVER_KEEPALIVE) == made[0]
