"""What a replica tells the coordinator, published whole (fthsdp/agent/training/session/report.py)."""

from __future__ import annotations

import threading

import pytest

from fthsdp.agent.training.session.report import ReplicaReport, Reporting
from fthsdp.protos.v1 import coordinator_pb2 as pb


def test_a_reader_never_sees_half_of_a_publication():
    """The heartbeat thread reads the report while the training thread publishes:
    the step and the checksum's step published together are always read together."""
    reporting = Reporting()
    reporting.publish(state_checksum="c0")
    stop = threading.Event()
    torn: list[ReplicaReport] = []

    def read() -> None:
        while not stop.is_set():
            r = reporting.current
            if r.step != r.checksum_step or r.state_checksum != f"c{r.step}":
                torn.append(r)

    readers = [threading.Thread(target=read) for _ in range(2)]
    for t in readers:
        t.start()
    for step in range(1, 20000):
        reporting.publish(step=step, checksum_step=step, state_checksum=f"c{step}")
    stop.set()
    for t in readers:
        t.join()
    assert not torn, torn[:3]
    assert reporting.current.step == 19999


def test_a_published_report_is_never_changed_afterwards():
    reporting = Reporting(step=3)
    before = reporting.current
    reporting.publish(step=4, ready=True)
    assert (before.step, before.ready) == (3, False)
    assert (reporting.current.step, reporting.current.ready) == (4, True)
    with pytest.raises(AttributeError):
        before.step = 5  # type: ignore[misc]


@pytest.mark.parametrize("change, wakes", [
    ({"step": 7}, False),  # the next heartbeat carries it
    ({"catch_up_progress": (10, 100)}, False),
    ({"ready": True}, True),  # the coordinator admits no replica before it hears it
    ({"catching_up": True}, True),
    ({"wait_for_replicas": 3}, True),
    ({"ready": False}, False),  # no change: nothing to say at once
])
def test_what_the_coordinator_hears_at_once(change, wakes):
    reporting = Reporting()
    reporting.publish(**change)
    assert reporting.beat_now.is_set() is wakes


def test_checkpoints_sealed_and_refused_are_sent_at_once_every_time():
    reporting = Reporting()
    reporting.report_checkpoint(pb.CheckpointRecord(step=10, digest="d"))
    assert reporting.beat_now.is_set() and reporting.current.checkpoint.step == 10
    reporting.beat_now.clear()
    reporting.refuse_checkpoint("d", "bad digest")
    reporting.beat_now.clear()
    reporting.refuse_checkpoint("d", "bad digest")  # the same one again, after another try
    assert reporting.beat_now.is_set() and reporting.current.refused_checkpoint == ("d", "bad digest")


def test_recent_checksums_carry_their_steps_inputs():
    class Recent(dict):
        inputs = {8: '{"lr":0.1}'}

    report = ReplicaReport(recent_checksums=Recent({8: "a", 4: "b"}))
    assert [(c.step, c.checksum, c.inputs) for c in report.recent()] == [(8, "a", '{"lr":0.1}'), (4, "b", "")]
