"""The agent's Host stream (fthsdp/agent/node/host_link.py): paced by the
coordinator, reconnecting with jitter.

Against a real coordinator on port 0 whose heartbeat budget two hosts
exceed: each link heartbeats at the interval it is pushed, and the push
does not reach the agent's round (its inbox). The back-off between tries is
spread between half the delay and all of it.
"""

from __future__ import annotations

import queue

import pytest

from fthsdp.agent.node.host_link import HostLink, backoff
from fthsdp.coordinator.config import CoordinatorConfig
from fthsdp.protos.v1 import coordinator_pb2 as pb
from tests.harness.inprocess import InProcessCoordinator
from tests.harness.waiting import wait_until


@pytest.mark.parametrize("draw, wait", [(0.0, 0.5), (0.5, 0.75), (1.0, 1.0)])
def test_the_back_off_is_between_half_the_delay_and_all_of_it(draw, wait):
    assert backoff(1.0, lambda: draw) == pytest.approx(wait)


def test_a_host_heartbeats_at_the_pace_the_coordinator_pushes():
    coordinator = InProcessCoordinator(CoordinatorConfig(bind="127.0.0.1:0", heartbeat_interval=0.2,
                                                         heartbeat_timeout=2.0, heartbeat_budget=1.0))
    links: list[HostLink] = []
    try:
        for host_id in ("a", "b"):
            def hello(host_id=host_id) -> pb.HostHello:
                return pb.HostHello(job="default", host_id=host_id, replica_id="r1", replica_rank=1, num_replicas=2,
                                    nnodes=2, nproc=1, incarnation=f"agent-{host_id}", address="127.0.0.1")
            links.append(HostLink([coordinator.address], "", None, hello, queue.Queue()))
        # Two hosts against a budget of one heartbeat a second: the interval stretches to 2 s (the links
        # start at 1 s, until a welcome names the coordinator's).
        wait_until(lambda: all(link._beat >= 2.0 for link in links), 30,
                   message="both links pushed the stretched interval")
        kinds = [link.inbox.get_nowait().WhichOneof("message") for link in links for _ in range(link.inbox.qsize())]
        assert "heartbeat_interval" not in kinds and "welcome" in kinds, kinds
    finally:
        for link in links:
            link.close()
        coordinator.close()
