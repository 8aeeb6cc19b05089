"""The ranks of one group ping at the same phase of each heartbeat interval (on
the hosts' shared wall clock), so that their node agent's relay sends their
pings of an interval upstream as one batch, and the group's host 0 its hosts'
(fthsdp/agent/node/relay/tree.py) (fthsdp/core/relay_address.py ``ping_phase``, ``until_next_ping``;
fthsdp/agent/training/session/observer.py): the pure timing table-tested, then
three real Observers started at different moments behind a real relay."""

from __future__ import annotations

import time

import pytest

from fthsdp.agent.node.relay.server import LocalRelay
from fthsdp.agent.training.quorum_view import QuorumView
from fthsdp.agent.training.session.observer import Observer
from fthsdp.client import CoordinatorClient
from fthsdp.coordinator.config import CoordinatorConfig
from fthsdp.core.relay_address import ping_phase, until_next_ping
from fthsdp.protos.v1 import coordinator_pb2 as pb
from tests.harness.inprocess import JOB_TOKEN, InProcessCoordinator
from tests.harness.waiting import wait_until


@pytest.mark.parametrize(("now", "interval", "phase", "expected"), [
    pytest.param(10.0, 1.0, 0.25, 0.25, id="before this interval's phase: at it"),
    pytest.param(10.25, 1.0, 0.25, 1.0, id="at the phase: a whole interval later, never at once"),
    pytest.param(10.3, 1.0, 0.25, 0.95, id="just past it: the next interval's"),
    pytest.param(0.1, 2.0, 0.0, 1.9, id="phase 0: the next multiple of the interval"),
    pytest.param(7.0, 5.25, 0.5, 0.875, id="a stretched interval: 5.25 * 2 - 7 + 2.625 - 5.25"),
])
def test_the_next_ping_is_at_the_hosts_phase_of_the_interval(now, interval, phase, expected):
    assert until_next_ping(now, interval, phase) == pytest.approx(expected)


def test_ranks_that_read_the_clock_at_different_moments_ping_at_the_same_instants():
    phase = ping_phase("default/r7")
    instants = [t + until_next_ping(t, 0.6, phase) for t in (3.01, 3.2, 3.37, 3.55, 9.9)]
    assert {round(i % 0.6, 6) % 0.6 for i in instants} == {round(phase * 0.6, 6)}


def test_the_phase_is_the_groups_own_and_spread_across_groups():
    phases = [ping_phase(f"default/group-{k}") for k in range(1000)]
    assert all(0.0 <= p < 1.0 for p in phases)
    assert ping_phase("default/group-7") == phases[7]
    # Spread: every tenth of the interval holds some 100 groups' pings, none a crowd.
    counts = [sum(int(p * 10) == k for p in phases) for k in range(10)]
    assert max(counts) < 150 and min(counts) > 50, counts


def test_ranks_started_apart_send_one_batch_an_interval_through_their_relay(tmp_path):
    """Three ranks' Observers start 0.25 s apart, with a 0.6 s interval: each on
    its own clock their pings of one interval would fall in two of the relay's
    0.2 s windows; at the host's phase they fall in one."""
    token = tmp_path / "token"
    token.write_text(JOB_TOKEN)
    coordinator = InProcessCoordinator(CoordinatorConfig(
        bind="127.0.0.1:0", min_replicas=1, join_settle=0.0, token_file=str(token), heartbeat_interval=0.6,
        heartbeat_timeout=60.0))
    observers: list[Observer] = []
    try:
        with LocalRelay([coordinator.address], JOB_TOKEN, None) as relay:
            with CoordinatorClient([relay.address], token=JOB_TOKEN) as client:
                client.call("Register", pb.RegisterRequest(job="default", replica_id="r0", address="r0:1",
                                                           world_size=4, agent_ids=["agent-of-r0"],
                                                           incarnation="inc-1"))
            for rank in (1, 2, 3):
                if observers:  # the next rank starts 0.25 s after the one before it pinged first
                    first = relay.pinger.pings
                    wait_until(lambda f=first: relay.pinger.pings > f, 10.0, message="the rank before pinged")
                    then = time.monotonic()
                    wait_until(lambda t=then: time.monotonic() >= t + 0.25, 10.0, message="0.25 s passed")
                observer = Observer(CoordinatorClient([relay.address], token=JOB_TOKEN), "default", "r0", rank,
                                    QuorumView("r0"), incarnation="inc-1")
                observer.start()
                observers.append(observer)
            # Every rank has had its interval from a push; count from then.
            wait_until(lambda: all(o.view.latest is not None for o in observers), 10.0, message="pushes")
            wait_until(lambda: relay.pinger.pings >= 6, 10.0, message="pings")
            pings0, batches0 = relay.pinger.pings, relay.pinger.batches
            wait_until(lambda: relay.pinger.pings - pings0 >= 30, 30.0, message="ten intervals of pings")
            pings, batches = relay.pinger.pings - pings0, relay.pinger.batches - batches0
    finally:
        for observer in observers:
            observer.close()
        coordinator.close()
    intervals = pings / 3
    # One batch an interval (a late wake-up on a loaded machine may split one); two each without the phase.
    assert batches < 1.5 * intervals, (batches, pings)
