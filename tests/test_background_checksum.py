"""The periodic checksum computed off the training thread
(fthsdp/agent/training/step/background_checksum.py), in-process: it equals the
one computed at the boundary though the next forward pass changes the
buffers meanwhile, it is reported and logged when settled, and a failure
reaches the training thread."""

from __future__ import annotations

import json
import threading

import pytest
import torch

from fthsdp.agent.training.catchup.grad_log import GradientLog
from fthsdp.agent.training.state.train_state import TrainState
from fthsdp.agent.training.step.background_checksum import PeriodicChecksums
from fthsdp.protos.v1 import catchup_pb2 as cpb


class Counter:
    """A registered object whose state the loop changes every step (a data loader's position)."""

    def __init__(self) -> None:
        self.n = 0

    def state_dict(self) -> dict:
        return {"n": self.n}

    def load_state_dict(self, state: dict) -> None:
        self.n = state["n"]


def trained_state() -> tuple[TrainState, torch.nn.Module, Counter]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    opt.zero_grad()
    counter = Counter()
    return TrainState(model, opt, {"loader": counter}), model, counter


def test_the_checksum_later_is_the_one_at_the_boundary_though_the_next_forward_pass_runs():
    state, model, counter = trained_state()
    at_boundary = state.part_checksums()
    later = state.part_checksums_later()
    model(torch.randn(4, 8) * 5)  # the next step's forward pass: new batch-norm statistics
    counter.n += 1
    assert state.part_checksums() != at_boundary  # what the forward pass changed is in the checksum
    assert later() == at_boundary


def test_a_settled_checksum_is_reported_and_written_into_the_logs_entry():
    state, _, _ = trained_state()
    published: list[dict] = []
    log = GradientLog()
    log.append(cpb.LogEntry(step=9), torch.zeros(4), 2, 5)
    checksums = PeriodicChecksums(10, lambda **kw: published.append(kw), log)
    expected = {k: f"{v:08x}" for k, v in state.part_checksums().items()}
    checksums.start(10, 9, "[]", state.part_checksums_later())
    checksums.settle()
    assert [p["checksum_step"] for p in published] == [10]
    entry = log.read(9, 1 << 20)[0][0].entry
    assert entry.checksum_after == published[0]["state_checksum"]
    assert json.loads(entry.part_checksums_json) == expected
    assert published[0]["recent_checksums"] == {10: entry.checksum_after}
    checksums.settle()  # nothing in flight: nothing more reported
    assert len(published) == 1


def test_starting_the_next_settles_the_one_in_flight_first():
    state, _, _ = trained_state()
    published: list[int] = []
    checksums = PeriodicChecksums(1, lambda **kw: published.append(kw["checksum_step"]), GradientLog())
    for step in (1, 2, 3):
        checksums.start(step, step - 1, "", state.part_checksums_later())
    checksums.settle()
    assert published == [1, 2, 3]


def test_a_failure_in_the_background_is_raised_where_it_is_settled():
    release = threading.Event()

    def broken() -> dict[str, int]:
        release.wait(10)
        raise RuntimeError("device lost")

    checksums = PeriodicChecksums(1, lambda **kw: None, GradientLog())
    checksums.start(1, 0, "", broken)
    release.set()
    with pytest.raises(RuntimeError, match="device lost"):
        checksums.settle()
