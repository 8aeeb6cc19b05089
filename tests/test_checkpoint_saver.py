"""The background saver: a failed write is one error line and training goes on; old checkpoints are pruned."""

from __future__ import annotations

import errno
import logging
import threading
import warnings

import pytest
import torch

from fthsdp.agent.training.checkpoint import layout
from fthsdp.agent.training.checkpoint import saver as saver_module
from fthsdp.agent.training.checkpoint.saver import Saver
from fthsdp.agent.training.checkpoint.seal import skipped_shares
from fthsdp.agent.training.checkpoint.share import ShareSpec
from fthsdp.core.every import Every
from tests.harness.waiting import wait_until

JOB = "job"


def capture(seed: int = 0) -> dict:
    torch.manual_seed(seed)
    model = torch.nn.Linear(32, 32)
    return {"model": model.state_dict(), "optimizer": {"state": {}, "param_groups": []}, "extra": {},
            "rng": {"cpu": torch.get_rng_state()}}


def spec(step: int) -> ShareSpec:
    return ShareSpec(JOB, step, 99, 1, 0, 1, 0, 1)


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def sealed_steps(root) -> list[int]:
    return [s for s in layout.steps_in(root, JOB)
            if (layout.step_folder(root, JOB, s) / layout.CHECKPOINT_RECORD).exists()]


def test_a_timed_interval_asks_once_the_time_since_the_last_save_has_passed(tmp_path):
    saver = Saver(tmp_path, JOB, every=Every(seconds=60), keep=2, seal_timeout=10, on_sealed=lambda s: None,
                  now=100.0)
    assert not saver.due(60)  # no step is a checkpoint step by count
    assert [saver.clock_ran_out(t) for t in (100.0, 159.9, 160.0)] == [False, False, True]
    assert saver.save(capture(), spec(7), "", now=170.0)  # the members agreed on step 7, late for this one
    assert not saver.clock_ran_out(229.9) and saver.clock_ran_out(230.0)
    saver.close(10)
    by_count = Saver(tmp_path, JOB, every=Every(steps=10), keep=2, seal_timeout=10, on_sealed=lambda s: None,
                     now=0.0)
    assert not by_count.clock_ran_out(1e9)


def test_only_the_newest_complete_checkpoints_are_kept(tmp_path):
    sealed = []
    saver = Saver(tmp_path, JOB, every=Every(steps=10), keep=2, seal_timeout=10, on_sealed=sealed.append, now=0.0)
    assert [saver.due(s) for s in (0, 5, 10, 20)] == [False, False, True, True]
    for step in (10, 20, 30):
        assert saver.save(capture(), spec(step), "", now=0.0)
        saver.close(30)
    assert [s.step for s in sealed] == [10, 20, 30]
    assert sealed_steps(tmp_path) == [20, 30]


def test_a_failed_write_is_one_error_line_and_the_next_checkpoint_is_tried(tmp_path, monkeypatch, caplog):
    sealed = []
    saver = Saver(tmp_path, JOB, every=Every(steps=10), keep=3, seal_timeout=10, on_sealed=sealed.append, now=0.0)
    real = saver_module.write

    def full_disk(staged, folder, checksum=""):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(saver_module, "write", full_disk)
    with caplog.at_level(logging.ERROR, "fthsdp.agent.checkpoint"):
        assert saver.save(capture(), spec(10), "", now=0.0)
        saver.close(30)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == ["checkpoint of step 10: this replica's share was not written ([Errno 28] No space left on "
                      "device); the checkpoint stays incomplete and is never used"]
    assert sealed == [] and sealed_steps(tmp_path) == []
    monkeypatch.setattr(saver_module, "write", real)
    assert saver.save(capture(), spec(20), "", now=0.0)
    saver.close(30)
    assert [s.step for s in sealed] == [20]


def test_a_save_while_the_last_one_still_writes_is_skipped_not_waited_for(tmp_path, monkeypatch, caplog):
    release = threading.Event()
    real = saver_module.write

    def slow(staged, folder, checksum=""):
        release.wait(30)  # the storage is slow: this write outlasts the next checkpoint step
        return real(staged, folder, checksum)

    monkeypatch.setattr(saver_module, "write", slow)
    sealed = []
    saver = Saver(tmp_path, JOB, every=Every(steps=10), keep=3, seal_timeout=10, on_sealed=sealed.append, now=0.0)
    assert saver.save(capture(), spec(10), "", now=0.0)
    with caplog.at_level(logging.WARNING, "fthsdp.agent.checkpoint"):
        assert not saver.save(capture(), spec(20), "", now=0.0)
    assert "checkpoint of step 20 skipped: the one before is still being written" in caplog.text
    release.set()
    saver.close(30)
    assert [s.step for s in sealed] == [10]


def test_a_seal_waiting_for_a_lost_members_share_gives_up_at_the_next_checkpoint(tmp_path, caplog):
    sealed = []
    saver = Saver(tmp_path, JOB, every=Every(steps=10), keep=3, seal_timeout=600, on_sealed=sealed.append, now=0.0)
    two = ShareSpec(JOB, 10, 99, 1, 0, 2, 0, 1)  # share 0 of 2: share 1's member was lost
    assert saver.save(capture(), two, "", now=0.0)
    folder = layout.step_folder(tmp_path, JOB, 10)
    wait_until(lambda: (folder / "share-0-rank-0" / layout.SHARE_RECORD).exists(), 30, message="share 0 written")
    with caplog.at_level(logging.WARNING, "fthsdp.agent.checkpoint"):
        assert saver.save(capture(), spec(20), "", now=0.0)  # does not wait the seal timeout
        saver.close(30)
    assert "checkpoint of step 10 is incomplete: share-1-rank-0 not written" in caplog.text
    assert [s.step for s in sealed] == [20]
    assert sealed_steps(tmp_path) == [20] and 10 not in layout.steps_in(tmp_path, JOB)  # pruned


def test_a_member_that_skips_says_so_and_the_sealer_gives_up_at_once(tmp_path, monkeypatch, caplog):
    """Two members: share 1's previous save is still being written when the
    checkpoint step comes, so it skips; share 0's sealer must not wait its
    seal timeout (600 s here) for it, or every member's exit waits with it."""
    release = threading.Event()
    real = saver_module.write

    def slow(staged, folder, checksum=""):
        release.wait(30)
        return real(staged, folder, checksum)

    first = Saver(tmp_path, JOB, every=Every(steps=10), keep=3, seal_timeout=600, on_sealed=lambda s: None, now=0.0)
    second = Saver(tmp_path, JOB, every=Every(steps=10), keep=3, seal_timeout=600, on_sealed=lambda s: None, now=0.0)
    share = [ShareSpec(JOB, 20, 99, 5, i, 2, 0, 1) for i in range(2)]
    monkeypatch.setattr(saver_module, "write", slow)
    assert second.save(capture(), ShareSpec(JOB, 10, 99, 5, 1, 2, 0, 1), "", now=0.0)  # still writing step 10
    monkeypatch.setattr(saver_module, "write", real)
    with caplog.at_level(logging.WARNING, "fthsdp.agent.checkpoint"):
        assert not second.save(capture(), share[1], "", now=0.0)
        assert first.save(capture(), share[0], "", now=0.0)
        first.close(60)  # the seal gave up at once: close() does not wait for it
        assert first._thread is not None and not first._thread.is_alive()
    assert "checkpoint of step 20 is incomplete: share-1-rank-0 skipped it" in caplog.text
    assert 20 not in sealed_steps(tmp_path)
    release.set()
    second.close(30)


def test_a_skip_left_by_an_earlier_attempt_at_the_step_is_not_this_one(tmp_path):
    folder = layout.step_folder(tmp_path, JOB, 20)
    (folder / "share-1-rank-0").mkdir(parents=True)
    layout.write_record(folder / "share-1-rank-0" / layout.SKIPPED_RECORD,
                        {"format": layout.FORMAT, "quorum_id": 4, "step": 20})
    assert skipped_shares(folder, 2, 1, quorum_id=5) == []
    assert skipped_shares(folder, 2, 1, quorum_id=4) == ["share-1-rank-0"]


def test_a_checksum_still_being_computed_is_waited_for_by_the_writer_alone(tmp_path):
    """The training thread hands the saver how to get the state's checksum
    (computed off the step: step/background_checksum.py); ``save`` returns
    at once and the share's record carries the checksum once computed."""
    sealed = []
    saver = Saver(tmp_path, JOB, every=Every(steps=10), keep=3, seal_timeout=10, on_sealed=sealed.append, now=0.0)
    computed = threading.Event()

    def checksum() -> str:
        computed.wait(10)
        return "0badcafe"

    assert saver.save(capture(), spec(10), checksum, now=0.0)  # returns while the checksum is not there
    assert not sealed
    computed.set()
    saver.close(30)
    assert [(s.step, s.state_checksum) for s in sealed] == [(10, "0badcafe")]


def test_a_checksum_that_failed_leaves_that_checkpoint_incomplete_in_one_error_line(tmp_path, caplog):
    sealed = []
    saver = Saver(tmp_path, JOB, every=Every(steps=10), keep=3, seal_timeout=10, on_sealed=sealed.append, now=0.0)

    def lost() -> str:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    with caplog.at_level(logging.ERROR, "fthsdp.agent.checkpoint"):
        assert saver.save(capture(), spec(10), lost, now=0.0)
        saver.close(30)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "illegal memory access" in errors[0] and sealed == []
    assert saver.save(capture(), spec(20), "", now=0.0)  # the next one is tried as usual
    saver.close(30)
    assert [s.step for s in sealed] == [20]


def test_staging_reuses_its_host_buffers_and_holds_the_newest_state():
    from fthsdp.agent.training.checkpoint.share import StagingBuffers, stage

    buffers = StagingBuffers()
    first = stage(capture(0), spec(10), buffers)
    pointers = {name: p.data.data_ptr() for name, p in first.pieces.items()}
    later = capture(1)
    second = stage(later, spec(20), buffers)
    assert {name: p.data.data_ptr() for name, p in second.pieces.items()} == pointers  # no new memory
    assert torch.equal(second.pieces["model.weight"].data, later["model"]["weight"])
    assert not torch.equal(second.pieces["model.weight"].data, capture(0)["model"]["weight"])
    fewer = stage(later, ShareSpec(JOB, 30, 99, 1, 1, 2, 0, 1), buffers)  # share 1 of 2: other rows
    assert set(fewer.pieces) <= set(pointers)
