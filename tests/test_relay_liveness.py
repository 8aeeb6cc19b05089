"""A rank's liveness judged on its host (fthsdp/agent/node/relay/liveness.py).

Table-driven on the pure ``Liveness`` (times passed in); in process through
a real relay and coordinator: pings for the relay alone never reach the
coordinator, a rank whose pings stop while its stream stays open is
reported silent once, a rank that closes its stream or says it left is not;
the coordinator refuses a ping meant for the relay alone.
"""

from __future__ import annotations

import time

import grpc
import pytest

from fthsdp.agent.node.relay.liveness import Liveness
from fthsdp.agent.node.relay.server import LocalRelay
from fthsdp.client import CoordinatorClient
from fthsdp.coordinator.config import CoordinatorConfig
from fthsdp.core.errors import RequestRejected
from fthsdp.protos.v1 import coordinator_pb2 as pb
from tests.harness.inprocess import JOB_TOKEN, InProcessCoordinator
from tests.harness.waiting import wait_until
from tests.test_agent_relay import Pinging

DEADLINE = 30.0
A, B = ("r0", "inc-1", 1), ("r0", "inc-1", 2)


@pytest.mark.parametrize("events, now, silent", [
    pytest.param([("opened", A, 0.0)], 2.9, [], id="within-the-limit"),
    pytest.param([("opened", A, 0.0)], 3.0, [A], id="opened-and-never-pinged"),
    pytest.param([("opened", A, 0.0), ("heard", A, 2.0)], 4.5, [], id="a-ping-restarts-the-count"),
    pytest.param([("opened", A, 0.0), ("heard", A, 2.0)], 5.0, [A], id="silent-since-its-last-ping"),
    pytest.param([("opened", A, 0.0), ("closed", A, 1.0)], 10.0, [], id="closed-its-stream"),
    pytest.param([("opened", A, 0.0), ("forget", A, 1.0)], 10.0, [], id="said-it-left"),
    pytest.param([("heard", A, 0.0)], 10.0, [], id="a-ping-without-a-stream-is-not-followed"),
    pytest.param([("opened", A, 0.0), ("opened", A, 0.5), ("closed", A, 1.0)], 3.5, [A],
                 id="followed-while-one-of-its-streams-is-open"),
    pytest.param([("opened", A, 0.0), ("opened", B, 0.0), ("heard", B, 2.5)], 3.0, [A], id="only-the-silent-one"),
])
def test_liveness(events, now, silent):
    live = Liveness(limit=3.0)
    for what, key, at in events:
        getattr(live, what)(key, at) if what in ("opened", "heard") else getattr(live, what)(key)
    got = live.silent(now)
    assert [(s.replica_id, s.incarnation, s.shard_rank) for s in got] == silent
    later = {(s.replica_id, s.incarnation, s.shard_rank) for s in live.silent(now + 100)}
    assert not later & set(silent)  # each reported once


def test_a_silent_rank_is_reported_once_with_how_long():
    live = Liveness(limit=3.0)
    live.opened(A, 0.0)
    live.heard(A, 1.0)
    (s,) = live.silent(4.5)
    assert s.silent_for == pytest.approx(3.5) and "no ping for 3.5s" in s.reason() and "rank 1 of r0" in s.reason()
    assert live.silent(9.0) == [] and live.followed() == 0


def test_a_limit_within_the_ping_period_is_refused():
    with pytest.raises(ValueError, match="longer than the ping period"):
        Liveness(limit=1.0)


@pytest.fixture
def coordinator(tmp_path):
    token = tmp_path / "token"
    token.write_text(JOB_TOKEN)
    c = InProcessCoordinator(CoordinatorConfig(bind="127.0.0.1:0", min_replicas=1, join_settle=0.0,
                                               token_file=str(token), heartbeat_timeout=60.0))
    yield c
    c.close()


def test_a_rank_that_stops_pinging_its_relay_is_reported_silent_and_its_local_pings_go_no_further(coordinator):
    runtime = coordinator.running.runtime
    with LocalRelay([coordinator.address], JOB_TOKEN, None, rank_silence=1.5) as relay:
        with CoordinatorClient([relay.address], token=JOB_TOKEN) as client:
            client.call("Register", pb.RegisterRequest(job="default", replica_id="r0", address="r0:1", world_size=4,
                                                       agent_ids=["agent-of-r0"], incarnation="inc-1"))
        stops = Pinging(relay, shard_rank=1, local_only=True)
        goes_on = Pinging(relay, shard_rank=2, local_only=True)
        leaves = Pinging(relay, shard_rank=3, local_only=True)
        try:
            for rank in (stops, goes_on, leaves):
                rank.send()
            leaves.send(local_only=False, left=True)  # its group leaves cleanly: it pings no more
            wait_until(lambda: relay.pinger.pings >= 1, DEADLINE, message="rank 3's last ping forwarded")
            end = time.monotonic() + 1.0  # two of the limit's pings from rank 2, none from rank 1
            while time.monotonic() < end:
                goes_on.send()
                assert relay.silent() is None
                time.sleep(0.25)  # the rank's own pace (1 s under the agent), not a synchronisation
            found: list = []

            def reported() -> bool:
                goes_on.send()
                silence = relay.silent()
                if silence is not None:
                    found.append(silence)
                return bool(found)
            wait_until(reported, DEADLINE, interval=0.25, message="rank 1 reported silent")
            assert (found[0].replica_id, found[0].shard_rank, found[0].incarnation) == ("r0", 1, "inc-1")
            assert found[0].silent_for >= 1.5
            assert relay.silent() is None  # once, and rank 2 (pinging) and rank 3 (left) not at all
            # Only rank 3's last ping went upstream: the local ones stayed on the host.
            assert relay.pinger.pings == 1
            entry = runtime.jobs["default"].state.replicas["r0"]
            assert 3 in entry.incarnation.ranks_left and 1 not in runtime.jobs["default"].state.progress.reports.get(
                "r0", {})
            assert all(rank.ended is None for rank in (stops, goes_on))
        finally:
            for rank in (stops, goes_on, leaves):
                rank.close()


def test_a_closed_stream_is_not_silence(coordinator):
    with LocalRelay([coordinator.address], JOB_TOKEN, None, rank_silence=1.5) as relay:
        rank = Pinging(relay, shard_rank=1, local_only=True)
        rank.send()
        wait_until(lambda: relay.pinger.liveness.followed() == 1, DEADLINE, message="rank 1 followed")
        rank.close()
        wait_until(lambda: relay.pinger.liveness.followed() == 0, DEADLINE, message="rank 1 no longer followed")
        assert relay.silent() is None


def test_the_coordinator_refuses_a_ping_meant_for_the_relay_alone(coordinator):
    with CoordinatorClient([coordinator.address], token=JOB_TOKEN) as client:
        with pytest.raises(RequestRejected) as e:
            client.call("Heartbeat", pb.HeartbeatRequest(job="default", replica_id="r0", shard_rank=1,
                                                         incarnation="inc-1", local_only=True))
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and "relay alone" in str(e.value)
