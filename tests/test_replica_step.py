"""What one replica's step decides, in-process: a Manager against an in-process coordinator.

The real-process tests train many replicas and kill them; these check, in a
second or two each, what a single member's step does at its boundaries: a
SIGTERM drains it at the next one (and the script exits 0), the report its
heartbeats send carries the checksum of the boundaries that compute one,
and its place in the next step's average.
"""

from __future__ import annotations

import os
import signal

import pytest
import torch

from fthsdp.agent import outcome
from fthsdp.agent.training.manager import Manager, ManagerConfig
from fthsdp.agent.training.session.participation import Participation
from fthsdp.coordinator.config import CoordinatorConfig
from tests.harness.inprocess import InProcessCoordinator


@pytest.fixture
def coordinator():
    c = InProcessCoordinator(CoordinatorConfig(bind="127.0.0.1:0"))
    yield c
    c.close()


def member(coordinator, tmp_path, **config) -> tuple[Manager, torch.nn.Module, str]:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    out = str(tmp_path / "outcome.json")
    cfg = ManagerConfig((coordinator.address,), "r0", timeout=20.0, outcome_file=out, **config)
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
