"""The replay contract's pure parts (fthsdp/agent/training/state/train_state.py), without processes."""

from __future__ import annotations

import zlib

import pytest
import torch

from fthsdp.agent.training.state.checksum import HASHES, model_items, tensor_bytes
from fthsdp.agent.training.state.codec import StateCodecError
from fthsdp.agent.training.state.train_state import (
    SMALL_STATE_BYTES,
    TrainState,
    combine,
    decode_blob,
    encode_blob,
    explain_mismatch,
)


class Counter:
    def __init__(self, n: int = 0) -> None:
        self.n = n

    def state_dict(self) -> dict:
        return {"n": self.n, "t": torch.tensor([self.n], dtype=torch.int64)}

    def load_state_dict(self, state: dict) -> None:
        self.n = state["n"]


def make(extra=None, seed: int = 0) -> TrainState:
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return TrainState(model, optimizer, extra)


@pytest.mark.parametrize(
    "state",
    [
        {},
        {"a": 1, "b": [1.5, float("inf"), None, "x"], "c": (1, 2)},
        {"t": torch.arange(6, dtype=torch.float32).reshape(2, 3), 3: torch.tensor(7, dtype=torch.bfloat16)},
        {"empty": torch.empty(0)},
    ],
)
def test_a_blob_round_trips_exactly(state):
    back = decode_blob(encode_blob(state))
    assert set(back) == set(state)
    for k, v in state.items():
        if isinstance(v, torch.Tensor):
            assert back[k].dtype == v.dtype and back[k].shape == v.shape and torch.equal(back[k], v)
        else:
            assert back[k] == v


def test_a_blob_is_a_copy():
    t = torch.zeros(3)
    blob = encode_blob({"t": t})
    t += 1
    assert torch.equal(decode_blob(blob)["t"], torch.zeros(3))


@pytest.mark.parametrize(
    "extra, says",
    [
        ({"model": Counter()}, "a name other than"),
        ({"": Counter()}, "a name other than"),
        ({"x": object()}, r"no state_dict\(\)/load_state_dict\(\)"),
    ],
)
def test_registering_something_unusable_is_a_clear_error(extra, says):
    with pytest.raises(StateCodecError, match=says):
        make(extra)


def test_inputs_carry_hyperparameters_and_small_state_and_restore_them():
    counter = Counter(5)
    state = make({"counter": counter})
    state.optimizer.param_groups[0]["lr"] = 0.5
    entry = state.inputs(step=7)
    assert entry.step == 7
    counter.n = 99
    state.optimizer.param_groups[0]["lr"] = 0.1
    state.apply_inputs(entry)
    assert counter.n == 5 and state.optimizer.param_groups[0]["lr"] == 0.5


def test_large_registered_state_is_not_recorded_but_known():
    big = torch.nn.Linear(512, 256)  # 512 KiB of weights
    assert sum(p.numel() * 4 for p in big.parameters()) > SMALL_STATE_BYTES
    state = make({"ema": big, "counter": Counter(1)})
    assert state.unrecorded == {"ema"}
    small = decode_blob(state.inputs(0).inputs)
    assert set(small) == {"counter"}
    assert set(decode_blob(state.inputs(1).inputs)) == {"counter"}  # known large from then on
    # Not recorded per step, but it travels in every snapshot.
    assert set(state.capture()["extra"]) == {"ema", "counter"}


def test_a_snapshot_carries_the_registered_state():
    src = make({"counter": Counter(3)}, seed=1)
    dst_counter = Counter()
    dst = make({"counter": dst_counter}, seed=2)
    dst.load(src.capture())
    assert dst_counter.n == 3
    assert dst.part_checksums() == src.part_checksums()


def test_a_snapshot_from_a_replica_registering_other_state_is_refused():
    src = make({"counter": Counter(3)})
    dst = make({"other": Counter()})
    with pytest.raises(StateCodecError, match="pass the same state="):
        dst.load(src.capture())


def test_part_checksums_tell_the_parts_apart():
    a, b = make({"counter": Counter(1)}), make({"counter": Counter(1)})
    assert a.part_checksums() == b.part_checksums()
    b.extra["counter"].n = 2
    diff = {k for k in a.part_checksums() if a.part_checksums()[k] != b.part_checksums()[k]}
    assert diff == {"counter"}
    b.optimizer.param_groups[0]["lr"] = 9.0  # a wrong learning rate is a different optimizer state
    diff = {k for k in a.part_checksums() if a.part_checksums()[k] != b.part_checksums()[k]}
    assert diff == {"counter", "optimizer"}
    assert combine(a.part_checksums()) != combine(b.part_checksums())


@pytest.mark.parametrize("kind", HASHES)
def test_each_hash_tells_the_parts_apart_and_crc32_is_what_checkpoints_recorded_before(kind):
    """The CRC-32 kind is zlib's CRC-32 chained over the items, as the checksum was before XXH3, so a
    checkpoint written then is checked against what it recorded (fthsdp/agent/training/checkpoint/restoring.py)."""
    a, b = make({"counter": Counter(1)}), make({"counter": Counter(1)})
    assert a.part_checksums(kind) == b.part_checksums(kind)
    b.extra["counter"].n = 2
    assert a.part_checksums(kind)["counter"] != b.part_checksums(kind)["counter"]
    crc = 0
    for item in model_items(a.model):
        crc = zlib.crc32(item if isinstance(item, bytes) else tensor_bytes(item), crc)
    assert (a.part_checksums(kind)["model"] == crc) == (kind == "crc32")


def test_an_unknown_hash_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown checksum kind 'md5'"):
        make({}).part_checksums("md5")


@pytest.mark.parametrize(
    "mine, theirs, unrecorded, says",
    [
        ({"model": "1", "optimizer": "2"}, {"model": "9", "optimizer": "2"}, set(), "model: replaying update()"),
        ({"model": "1", "ema": "2"}, {"model": "1", "ema": "3"}, {"ema"}, "'ema': its state is larger than"),
        ({"model": "1", "sched": "2"}, {"model": "1", "sched": "3"}, set(), "does its load_state_dict() restore"),
        ({"model": "1", "x": "2"}, {"model": "1"}, set(), "'x': registered on one replica only"),
    ],
)
def test_a_mismatch_is_explained_part_by_part(mine, theirs, unrecorded, says):
    text = explain_mismatch(mine, theirs, 12, unrecorded)
    assert text.startswith("after step 12 this replica's state differs from the source's in ")
    assert says in text
