"""A checkpoint written 1/R per replica: readable by plain DCP, restored exactly, refused when wrong.

Real torch.distributed.checkpoint files on disk; the R replicas' states are
identical copies made here, as the replicas of a quorum hold them.
"""

from __future__ import annotations

import json
import pickle
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from fthsdp.agent.training.checkpoint import layout
from fthsdp.agent.training.checkpoint.errors import CheckpointError, PartlyLoaded
from fthsdp.agent.training.checkpoint.restore import load
from fthsdp.agent.training.checkpoint.seal import missing_shares, read_checkpoint, seal
from fthsdp.agent.training.checkpoint.share import ShareSpec, stage, write
from fthsdp.agent.training.state.train_state import TrainState

JOB, STEP, STRUCTURE = "job-a", 40, 1234


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(50, 16)
        self.norm = torch.nn.LayerNorm(16)
        self.head = torch.nn.Linear(16, 50)

    def forward(self, x):
        return self.head(self.norm(self.emb(x)))


def trained(steps: int = 3, seed: int = 0) -> TrainState:
    torch.manual_seed(seed)
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1 / (1 + s))
    for _ in range(steps):
        model(torch.randint(0, 50, (4, 8))).sum().backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
    return TrainState(model, optimizer, {"scheduler": scheduler})


def fresh() -> TrainState:
    torch.manual_seed(99)
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1 / (1 + s))
    return TrainState(model, optimizer, {"scheduler": scheduler})


def write_checkpoint(root: Path, state: TrainState, shares: int, step: int = STEP, skip: int | None = None) -> Path:
    folder = layout.step_folder(root, JOB, step)
    for share in range(shares):
        if share != skip:
            write(stage(state.capture(), ShareSpec(JOB, step, STRUCTURE, 7, share, shares, 0, 1)), folder)
    return folder


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


@pytest.mark.parametrize("shares", [1, 2, 3, 5])
def test_shares_split_the_bytes_and_restore_exactly(tmp_path, shares):
    source = trained()
    staged = [stage(source.capture(), ShareSpec(JOB, STEP, STRUCTURE, 7, s, shares, 0, 1)) for s in range(shares)]
    sizes = [s.nbytes for s in staged]
    # Each replica copies out and writes about 1/R of the bytes.
    assert max(sizes) - min(sizes) <= 50 * 16 * 4, sizes  # within one row of the largest tensors
    folder = write_checkpoint(tmp_path, source, shares)
    sealed = seal(folder, job=JOB, step=STEP, structure=STRUCTURE, shares=shares, ranks=1)
    record = read_checkpoint(folder, job=JOB, structure=STRUCTURE, digest=sealed.digest)
    target = fresh()
    assert target.part_checksums() != source.part_checksums()
    target.load(load(folder, record, rank=0, current=target.capture()))
    assert target.part_checksums() == source.part_checksums()
    assert target.optimizer.param_groups[0]["lr"] == source.optimizer.param_groups[0]["lr"]


def test_plain_dcp_reads_it_without_fthsdp(tmp_path):
    source = trained()
    folder = write_checkpoint(tmp_path, source, 3)
    seal(folder, job=JOB, step=STEP, structure=STRUCTURE, shares=3, ranks=1)
    model = Net()
    state = {"model": model.state_dict()}
    dcp.load(state, checkpoint_id=str(folder))
    for name, value in source.model.state_dict().items():
        assert torch.equal(state["model"][name], value), name
    out = tmp_path / "converted.pt"
    dcp_to_torch_save(str(folder), str(out))
    converted = torch.load(out, weights_only=True)
    assert torch.equal(converted["model"]["head.weight"], source.model.head.weight)


def test_a_missing_share_leaves_it_incomplete(tmp_path):
    folder = write_checkpoint(tmp_path, trained(), 3, skip=1)
    assert missing_shares(folder, 3, 1) == ["share-1-rank-0"]
    with pytest.raises(CheckpointError, match="share share-1-rank-0"):
        seal(folder, job=JOB, step=STEP, structure=STRUCTURE, shares=3, ranks=1)
    with pytest.raises(CheckpointError, match="not a complete checkpoint"):
        read_checkpoint(folder, job=JOB, structure=STRUCTURE)


def test_a_corrupt_share_is_refused_and_said_to_have_replaced_the_state_in_part(tmp_path):
    """DCP reads into the state's own tensors; a block that differs is found
    while it reads, after other shares' tensors landed: PartlyLoaded, so the
    caller replaces the state whole before it trains (tests/test_join_ends.py)."""
    source = trained()
    folder = write_checkpoint(tmp_path, source, 2)
    sealed = seal(folder, job=JOB, step=STEP, structure=STRUCTURE, shares=2, ranks=1)
    record = read_checkpoint(folder, job=JOB, structure=STRUCTURE, digest=sealed.digest)
    data = folder / "share-1-rank-0" / "__0_0.distcp"
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    data.write_bytes(bytes(raw))
    target = fresh()
    with pytest.raises(PartlyLoaded, match="share-1-rank-0/__0_0.distcp is corrupt"):
        load(folder, record, rank=0, current=target.capture())


def test_loaded_in_place_into_the_state_own_tensors(tmp_path):
    source = trained()
    folder = write_checkpoint(tmp_path, source, 2)
    sealed = seal(folder, job=JOB, step=STEP, structure=STRUCTURE, shares=2, ranks=1)
    record = read_checkpoint(folder, job=JOB, structure=STRUCTURE, digest=sealed.digest)
    target = trained(seed=5)  # its optimizer has its state already: every tensor has a place
    weight = target.model.head.weight
    moment = target.optimizer.state[weight]["exp_avg"]
    state = load(folder, record, rank=0, current=target.capture())
    assert state["model"]["head.weight"].data_ptr() == weight.data_ptr()
    assert torch.equal(weight, source.model.head.weight)  # already, before TrainState.load
    target.load(state)
    assert target.optimizer.state[weight]["exp_avg"].data_ptr() == moment.data_ptr()
    assert target.part_checksums() == source.part_checksums()


def test_a_checkpoint_refused_before_dcp_reads_leaves_the_state_as_it_was(tmp_path):
    source = trained()
    folder = write_checkpoint(tmp_path, source, 2)
    sealed = seal(folder, job=JOB, step=STEP, structure=STRUCTURE, shares=2, ranks=1)
    record = read_checkpoint(folder, job=JOB, structure=STRUCTURE, digest=sealed.digest)
    record["files"].pop("share-1-rank-0/__0_0.distcp")
    target = fresh()
    before = target.part_checksums()
    with pytest.raises(CheckpointError, match="is not part of the checkpoint") as refused:
        load(folder, record, rank=0, current=target.capture())
    assert not isinstance(refused.value, PartlyLoaded)
    assert target.part_checksums() == before


def test_a_share_of_another_step_or_model_is_refused(tmp_path):
    source = trained()
    folder = layout.step_folder(tmp_path, JOB, STEP)
    write(stage(source.capture(), ShareSpec(JOB, STEP, STRUCTURE, 7, 0, 2, 0, 1)), folder)
    write(stage(source.capture(), ShareSpec(JOB, STEP + 1, STRUCTURE, 7, 1, 2, 0, 1)), folder)
    with pytest.raises(CheckpointError, match="share share-1-rank-0 is of another checkpoint"):
        seal(folder, job=JOB, step=STEP, structure=STRUCTURE, shares=2, ranks=1)


def test_a_checkpoint_of_another_job_model_or_record_is_refused(tmp_path):
    folder = write_checkpoint(tmp_path, trained(), 2)
    sealed = seal(folder, job=JOB, step=STEP, structure=STRUCTURE, shares=2, ranks=1)
    with pytest.raises(CheckpointError, match="of job 'job-a', not 'job-b'"):
        read_checkpoint(folder, job="job-b", structure=STRUCTURE)
    with pytest.raises(CheckpointError, match="of another model"):
        read_checkpoint(folder, job=JOB, structure=STRUCTURE + 1)
    with pytest.raises(CheckpointError, match="not the checkpoint recorded"):
        read_checkpoint(folder, job=JOB, structure=STRUCTURE, digest="0" * 64)
    assert read_checkpoint(folder, job=JOB, structure=STRUCTURE, digest=sealed.digest)["step"] == STEP


def test_shares_of_members_that_decided_the_step_differently_are_never_merged(tmp_path):
    """A member that committed step 40 in quorum 8 (say, split two ways after
    the others' vote) never seals with shares of quorum 7, even of an
    identical state; the sealer of quorum 7 waits for its own member's share."""
    source = trained()
    folder = layout.step_folder(tmp_path, JOB, STEP)
    write(stage(source.capture(), ShareSpec(JOB, STEP, STRUCTURE, 7, 0, 2, 0, 1)), folder)
    write(stage(source.capture(), ShareSpec(JOB, STEP, STRUCTURE, 8, 1, 2, 0, 1)), folder)
    assert missing_shares(folder, 2, 1, quorum_id=7) == ["share-1-rank-0"]
    assert missing_shares(folder, 2, 1) == []
    with pytest.raises(CheckpointError, match="in quorum 8, this checkpoint's in quorum 7: the members decided"):
        seal(folder, job=JOB, step=STEP, structure=STRUCTURE, shares=2, ranks=1, quorum_id=7)
    with pytest.raises(CheckpointError, match=r"different quorums \(\[7, 8\]\)"):
        seal(folder, job=JOB, step=STEP, structure=STRUCTURE, shares=2, ranks=1)
    write(stage(source.capture(), ShareSpec(JOB, STEP, STRUCTURE, 7, 1, 2, 0, 1)), folder)
    assert missing_shares(folder, 2, 1, quorum_id=7) == []
    assert seal(folder, job=JOB, step=STEP, structure=STRUCTURE, shares=2, ranks=1, quorum_id=7).quorum_id == 7


def test_shares_whose_state_checksums_differ_are_never_merged(tmp_path):
    folder = layout.step_folder(tmp_path, JOB, STEP)
    state = trained()
    write(stage(state.capture(), ShareSpec(JOB, STEP, STRUCTURE, 7, 0, 2, 0, 1)), folder, "aaaa")
    write(stage(state.capture(), ShareSpec(JOB, STEP, STRUCTURE, 7, 1, 2, 0, 1)), folder, "bbbb")
    with pytest.raises(CheckpointError, match="different state checksums"):
        seal(folder, job=JOB, step=STEP, structure=STRUCTURE, shares=2, ranks=1, quorum_id=7)


def test_replicas_whose_states_differ_are_not_sealed_together(tmp_path):
    folder = layout.step_folder(tmp_path, JOB, STEP)
    write(stage(trained().capture(), ShareSpec(JOB, STEP, STRUCTURE, 7, 0, 2, 0, 1)), folder)
    other = trained()
    other.extra["scheduler"].step()  # a different last_epoch: the skeletons differ
    write(stage(other.capture(), ShareSpec(JOB, STEP, STRUCTURE, 7, 1, 2, 0, 1)), folder)
    with pytest.raises(CheckpointError, match="states differ"):
        seal(folder, job=JOB, step=STEP, structure=STRUCTURE, shares=2, ranks=1)


def test_a_metadata_that_would_run_code_is_never_unpickled(tmp_path):
    folder = write_checkpoint(tmp_path, trained(), 1)
    share = folder / "share-0-rank-0"

    class Evil:
        def __reduce__(self):
            return (print, ("ran",))

    (share / layout.DCP_METADATA).write_bytes(pickle.dumps(Evil()))
    record = json.loads((share / layout.SHARE_RECORD).read_text())
    record["files"][layout.DCP_METADATA] = layout.describe_files(share, [layout.DCP_METADATA])[layout.DCP_METADATA]
    layout.write_record(share / layout.SHARE_RECORD, record)  # even with a matching checksum
    with pytest.raises(CheckpointError, match="builtins.print"):
        seal(folder, job=JOB, step=STEP, structure=STRUCTURE, shares=1, ranks=1)


def test_a_share_written_over_by_a_quorum_that_trained_on_is_refused_at_restore(tmp_path):
    """Two lineages never write into one folder (layout.step_folder), and a
    restore checks every share's record against the checkpoint's anyway."""
    folder = write_checkpoint(tmp_path, trained(), 2)
    seal(folder, job=JOB, step=STEP, structure=STRUCTURE, shares=2, ranks=1, quorum_id=7)
    record = read_checkpoint(folder, job=JOB, structure=STRUCTURE)
    # A quorum cut from the coordinator trained on and wrote its share of the same step.
    write(stage(trained(steps=4).capture(), ShareSpec(JOB, STEP, STRUCTURE, 9, 1, 2, 0, 1)), folder)
    with pytest.raises(CheckpointError, match="share share-1-rank-0 is not this checkpoint's"):
        load(folder, record, rank=0, current=fresh().capture())


def test_each_lineage_writes_folders_of_its_own_and_seals_only_its_own_shares(tmp_path):
    state = trained()
    old, new = layout.step_folder(tmp_path, JOB, STEP), layout.step_folder(tmp_path, JOB, STEP, 2)
    assert old != new and new.name == f"step-{STEP:010d}-g2"
    write(stage(state.capture(), ShareSpec(JOB, STEP, STRUCTURE, 12, 0, 1, 0, 1, generation=2)), new)
    sealed = seal(new, job=JOB, step=STEP, structure=STRUCTURE, shares=1, ranks=1, quorum_id=12, generation=2)
    assert sealed.generation == 2 and read_checkpoint(new, job=JOB, structure=STRUCTURE)["generation"] == 2
    write(stage(state.capture(), ShareSpec(JOB, STEP, STRUCTURE, 12, 0, 1, 0, 1, generation=1)), old)
    with pytest.raises(CheckpointError, match="is of another checkpoint"):
        seal(old, job=JOB, step=STEP, structure=STRUCTURE, shares=1, ranks=1, quorum_id=12, generation=2)
    layout.step_folder(tmp_path, JOB, 90).mkdir(parents=True)
    assert layout.slots_in(tmp_path, JOB) == [(0, STEP), (0, 90), (2, STEP)], "a newer lineage's are the newest"
