"""What one replica's step decides, in-process: a Manager against an in-process coordinator.

The real-process tests train many replicas and kill them; these check, in a
second or two each, what a single member's step does at its boundaries: a
SIGTERM drains it at the next one (and the script exits 0), the report its
heartbeats send carries the checksum of the boundaries that compute one,
a checkpoint is written at the boundaries it is due, a replica arriving
after the job finished leaves at once, and its place in the next step's
average. Every way a join ends is in tests/test_join_ends.py.
"""

from __future__ import annotations

import os
import signal

import pytest
import torch

from fthsdp.agent import outcome
from fthsdp.agent.training.checkpoint import layout
from fthsdp.agent.training.manager import Manager, ManagerConfig
from fthsdp.agent.training.session.lifecycle import Ending
from fthsdp.agent.training.session.participation import Participation
from fthsdp.agent.training.step.replica_step import leave_reason
from fthsdp.coordinator.config import CoordinatorConfig
from tests.harness.inprocess import InProcessCoordinator
from tests.harness.waiting import wait_until


@pytest.fixture
def coordinator():
    c = InProcessCoordinator(CoordinatorConfig(bind="127.0.0.1:0"))
    yield c
    c.close()


def member(coordinator, tmp_path, replica_id: str = "r0", **config) -> tuple[Manager, torch.nn.Module, str]:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    out = str(tmp_path / f"outcome-{replica_id}.json")
    cfg = ManagerConfig((coordinator.address,), replica_id, timeout=20.0, outcome_file=out, **config)
    ft = Manager(model, torch.optim.SGD(model.parameters(), lr=0.1), cfg)
    ft.start(admission_timeout=30.0)
    return ft, model, out


def train(ft: Manager, model: torch.nn.Module) -> bool:
    model(torch.ones(2, 4)).sum().backward()
    ft.allreduce_gradients()
    return ft.commit()


def test_a_replica_up_to_date_joins_without_catching_up_and_counts_alone(coordinator, tmp_path):
    ft, model, _ = member(coordinator, tmp_path)
    try:
        assert ft.catch_up is None and ft.step == 0
        assert ft.participation() == Participation(0, 1)
        assert train(ft, model) and ft.step == 1
        assert ft.participation() == Participation(0, 1)
    finally:
        ft.close()


def test_sigterm_drains_at_the_next_step_boundary(coordinator, tmp_path):
    ft, model, out = member(coordinator, tmp_path)
    assert train(ft, model) and train(ft, model)
    os.kill(os.getpid(), signal.SIGTERM)  # as `fthsdp agent` drains its ranks
    assert not ft.stopped, "a drain waits for the step boundary"
    assert train(ft, model), "the step in flight is committed"
    assert ft.stopped and ft.step == 3
    assert not train(ft, model), "nothing is committed once drained"
    ft.close()
    said = outcome.read(out)
    assert said is not None and said.ending == "drained" and "drained after step 3 (asked by SIGTERM)" in said.detail


def test_the_checksum_is_reported_at_the_boundaries_that_compute_it(coordinator, tmp_path):
    ft, model, _ = member(coordinator, tmp_path, checksum_every=2)
    try:
        assert train(ft, model) and ft.checksum == ""
        assert train(ft, model)
        first = ft.checksum
        assert first, "step 2's boundary computes one"
        assert train(ft, model) and ft.checksum == first, "step 3's does not"
        assert train(ft, model) and ft.checksum not in ("", first), "step 4's state is another"
    finally:
        ft.close()


def sealed_steps(root) -> list[int]:
    """The steps of the job's checkpoints that are complete (their record written last, by the sealer)."""
    return [s for s in layout.steps_in(root, "default")
            if (layout.step_folder(root, "default", s) / layout.CHECKPOINT_RECORD).exists()]


def test_a_checkpoint_is_written_at_the_boundaries_it_is_due(coordinator, tmp_path):
    root = tmp_path / "ckpt"
    ft, model, _ = member(coordinator, tmp_path, checkpoint_dir=str(root), checkpoint_every=2)
    try:
        assert train(ft, model) and not layout.steps_in(root, "default"), "step 1's boundary saves nothing"
        assert train(ft, model) and train(ft, model)
        wait_until(lambda: sealed_steps(root), 30, message="the checkpoint of step 2 sealed")
        assert sealed_steps(root) == [2] and layout.steps_in(root, "default") == [2], "step 3's boundary saves none"
    finally:
        ft.close()


def test_a_replica_that_arrives_after_the_job_finished_leaves_at_once(coordinator, tmp_path):
    ft, model, _ = member(coordinator, tmp_path)
    assert train(ft, model) and train(ft, model)
    ft.close()  # the script's loop ended: the job's only member finished
    late, late_model, out = member(coordinator, tmp_path, replica_id="r1")
    assert late.stopped and not train(late, late_model), "nothing is left to train"
    late.close()
    said = outcome.read(out)
    assert said is not None and said.ending == "job finished" and said.detail == "job default finished at step 2"


@pytest.mark.parametrize(("ending", "detail", "recorded"), [
    (Ending.FINISHED, "finished", "finished"),
    (Ending.FAILED, "failed: ValueError: nan loss", "failed: ValueError: nan loss"),
    (Ending.DRAINED, "drained after step 3 (asked by SIGTERM)", "drained after step 3 (asked by SIGTERM)"),
    (Ending.DRAINED, "the quorum went on without it", "drained: the quorum went on without it"),
    (Ending.EVICTED, "taken out as hung", "evicted: taken out as hung"),
])
def test_what_the_coordinator_records_when_a_replica_leaves(ending, detail, recorded):
    assert leave_reason(ending, detail) == recorded
