"""A replica group's restore from a checkpoint: every rank its part, and what a refusal leaves.

In process: a fake state, and a replica group whose other ranks' answers
are given (fthsdp/agent/training/checkpoint/restoring.py agrees over it).
"""

from __future__ import annotations

import pytest

from fthsdp.agent.training.checkpoint.errors import CheckpointError, PartlyLoaded
from fthsdp.agent.training.checkpoint.restoring import restore_group, resume_newest
from fthsdp.agent.training.session.replica_group import ReplicaGroup
from fthsdp.agent.training.state.checksum import STATE_HASH


class Group(ReplicaGroup):
    """Rank 0 of a group whose other ranks answered ``others`` (one list of values per collective)."""

    def __init__(self, *others: list[int]) -> None:
        super().__init__(0, 1, timeout=1.0)  # one rank: no process group
        self.size = 2 if others else 1
        self._others = list(others)

    def min(self, *values: int) -> list[int]:
        theirs = self._others.pop(0) if self._others else list(values)
        return [min(a, b) for a, b in zip(values, theirs, strict=True)]


class State:
    """What a checkpoint is loaded into: ``outcome`` says how each restore ends."""

    def __init__(self, *outcomes: str, checksum: str = "c") -> None:
        self.outcomes = list(outcomes)
        self.step = 0
        self.checksum = checksum
        self.tried: list[str] = []
        self.kinds: list[str] = []
        """The hash each checksum was asked in."""
        self.recorded = "c"

    def restore(self, path: str, digest: str, rank: int) -> str:
        self.tried.append(path)
        outcome = self.outcomes.pop(0)
        if outcome == "refused":
            raise CheckpointError(f"{path}: not this job's")
        if outcome == "in part":
            raise PartlyLoaded(f"{path}: block 3 differs")
        self.step = int(path.rsplit("-", 1)[1])
        return self.recorded

    def state_checksum(self, group: ReplicaGroup, kind: str = STATE_HASH) -> str:
        self.kinds.append(kind)
        return self.checksum


@pytest.mark.parametrize("mine, theirs, refused", [
    ("loaded", None, None),
    ("refused", None, CheckpointError),
    ("in part", None, PartlyLoaded),
    # The other rank's (ok, untouched): it refused before it read (0, 1), after part of it loaded (0, 0), or
    # loaded whole (1, 0). Any rank whose state was written into makes a refusal PartlyLoaded for the group.
    ("loaded", [0, 1], PartlyLoaded),
    ("loaded", [0, 0], PartlyLoaded),
    ("refused", [0, 1], CheckpointError),
    ("refused", [0, 0], PartlyLoaded),
    ("refused", [1, 0], PartlyLoaded),
    ("in part", [0, 1], PartlyLoaded),
])
def test_a_refusal_says_whether_any_rank_state_was_written_into(mine, theirs, refused):
    group = Group(theirs) if theirs else Group()
    state = State(mine)
    if refused is None:
        restore_group(state, group, "/ckpt/step-40")
        assert state.step == 40
        return
    with pytest.raises(refused) as raised:
        restore_group(state, group, "/ckpt/step-40")
    if refused is CheckpointError:
        assert not isinstance(raised.value, PartlyLoaded)


def test_a_loaded_state_whose_checksum_differs_is_partly_loaded():
    with pytest.raises(PartlyLoaded, match="checksum x differs from the one recorded at its step, c"):
        restore_group(State("loaded", checksum="x"), Group(), "/ckpt/step-40")


def test_resume_goes_back_past_a_checkpoint_refused_in_part(tmp_path):
    for step in (10, 20, 30):
        folder = tmp_path / "job" / f"step-{step:010d}"
        folder.mkdir(parents=True)
        (folder / "checkpoint.json").write_text("{}")
    state = State("in part", "refused", "loaded")
    assert resume_newest(state, Group(), tmp_path, "job", 1, job_is_new=lambda: True) == 10
    assert [p.rsplit("/", 1)[1] for p in state.tried] == ["step-0000000030", "step-0000000020", "step-0000000010"]


def test_resume_with_none_loadable_fails_with_a_line_naming_how_many(tmp_path):
    for step in (10, 20):
        folder = tmp_path / "job" / f"step-{step:010d}"
        folder.mkdir(parents=True)
        (folder / "checkpoint.json").write_text("{}")
    with pytest.raises(CheckpointError, match="none of the 2 checkpoints of job job"):
        resume_newest(State("in part", "refused"), Group(), tmp_path, "job", 1, job_is_new=lambda: True)


@pytest.mark.parametrize("recorded, kind", [("c", STATE_HASH), (f"{STATE_HASH}:c", STATE_HASH), ("crc32:c", "crc32")])
def test_the_loaded_state_is_checked_in_the_hash_its_checkpoint_recorded(recorded, kind):
    """A checkpoint written before XXH3 recorded a CRC-32 checksum (restore returns it as ``crc32:hex``)."""
    state = State("loaded")
    state.recorded = recorded
    restore_group(state, Group(), "/ckpt/step-40")
    assert state.kinds == [kind]


def test_a_checksum_of_an_unknown_kind_is_refused():
    state = State("loaded")
    state.recorded = "md4:c"
    with pytest.raises(PartlyLoaded, match="unknown kind 'md4'"):
        restore_group(state, Group(), "/ckpt/step-40")
