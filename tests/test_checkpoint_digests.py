"""A share's files hashed in blocks as DCP writes them, and checked block by block as DCP reads them.

Real DCP files on disk (the state of tests/test_checkpoint_files.py); the
streams are also driven directly, with blocks of a few bytes, so that reads
cross block edges in every way.
"""

from __future__ import annotations

import json
import random
import warnings
import zlib
from pathlib import Path

import pytest
import torch
import xxhash

from fthsdp.agent.training.checkpoint import digests, layout
from fthsdp.agent.training.checkpoint.errors import CheckpointError
from fthsdp.agent.training.checkpoint.restore import load
from fthsdp.agent.training.checkpoint.seal import read_checkpoint, seal, verify_files
from tests.test_checkpoint_files import JOB, STEP, STRUCTURE, fresh, trained, write_checkpoint


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _sealed(tmp_path: Path, shares: int = 2):
    source = trained()
    folder = write_checkpoint(tmp_path, source, shares)
    sealed = seal(folder, job=JOB, step=STEP, structure=STRUCTURE, shares=shares, ranks=1)
    return source, folder, read_checkpoint(folder, job=JOB, structure=STRUCTURE, digest=sealed.digest)


def test_each_data_file_lists_the_digests_of_its_blocks_as_written(tmp_path):
    _, folder, record = _sealed(tmp_path)
    data = {name: info for name, info in record["files"].items() if name.endswith(".distcp")}
    assert len(data) == 2
    for name, info in data.items():
        raw = (folder / name).read_bytes()
        block = info["block_bytes"]
        assert info["bytes"] == len(raw) and info["block_digest"] == "xxh3"
        assert info["blocks"] == [xxhash.xxh3_64_hexdigest(raw[i:i + block]) for i in range(0, len(raw), block)]
    assert "sha256" in record["files"][layout.DCP_METADATA]  # unpickled: keeps its SHA-256
    verify_files(folder, record)


def _write(path: Path, payload: bytes, pieces: list[int]) -> dict:
    fs = digests.DigestingFileSystem()
    with fs.create_stream(path, "wb") as stream:
        at = 0
        for n in pieces:
            stream.write(payload[at : at + n])
            at += n
        stream.write(payload[at:])
    return fs.written[path.name]


@pytest.mark.parametrize("seed", range(5))
def test_reads_at_any_offset_and_length_return_the_bytes_written(tmp_path, monkeypatch, seed):
    monkeypatch.setattr(digests, "BLOCK", 7)
    rng = random.Random(seed)
    payload = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300)))
    path = tmp_path / "f.distcp"
    info = _write(path, payload, [rng.randrange(0, 20) for _ in range(10)])
    assert info["bytes"] == len(payload) and len(info["blocks"]) == -(-len(payload) // 7)
    fs = digests.VerifyingFileSystem(tmp_path, {"f.distcp": info})
    try:
        with fs.create_stream(path, "rb") as stream:
            for _ in range(40):
                start = rng.randrange(0, len(payload) + 3)
                n = rng.randrange(0, 40)
                stream.seek(start)
                assert stream.read(n) == payload[start : start + n]
                assert stream.tell() == min(start + n, max(start, len(payload)))
            stream.seek(-5, 2)
            assert stream.read() == payload[-5:]
    finally:
        fs.close()


def test_a_changed_block_is_never_served(tmp_path, monkeypatch):
    monkeypatch.setattr(digests, "BLOCK", 8)
    payload = bytes(range(64))
    path = tmp_path / "f.distcp"
    info = _write(path, payload, [3, 20])
    raw = bytearray(payload)
    raw[42] ^= 1  # block 5
    path.write_bytes(bytes(raw))
    fs = digests.VerifyingFileSystem(tmp_path, {"f.distcp": info})
    try:
        with fs.create_stream(path, "rb") as stream:
            assert stream.read(40) == payload[:40]  # the blocks before it are good
            with pytest.raises(digests.CorruptFile, match="f.distcp is corrupt"):
                stream.read(1)
    finally:
        fs.close()
    assert fs.corrupt is not None


def test_a_truncated_share_is_refused_and_nothing_loaded(tmp_path):
    _, folder, record = _sealed(tmp_path)
    data = folder / "share-0-rank-0" / "__0_0.distcp"
    data.write_bytes(data.read_bytes()[:-3])
    target = fresh()
    before = target.part_checksums()
    with pytest.raises(CheckpointError, match="share-0-rank-0/__0_0.distcp is corrupt"):
        load(folder, record, rank=0, current=target.capture())
    assert target.part_checksums() == before


def test_a_flipped_byte_in_any_block_is_refused(tmp_path):
    source, folder, record = _sealed(tmp_path, shares=1)
    data = folder / "share-0-rank-0" / "__0_0.distcp"
    good = data.read_bytes()
    for at in (0, len(good) // 3, len(good) - 1):
        raw = bytearray(good)
        raw[at] ^= 0x10
        data.write_bytes(bytes(raw))
        with pytest.raises(CheckpointError, match="is corrupt"):
            load(folder, record, rank=0, current=fresh().capture())
    data.write_bytes(good)
    target = fresh()
    target.load(load(folder, record, rank=0, current=target.capture()))
    assert target.part_checksums() == source.part_checksums()


def _as_written_before(folder: Path, share: str, how: str) -> None:
    """Rewrite a share's record as an earlier version wrote it: one SHA-256 per
    file (before session 39), or a CRC-32 per block (sessions 39-40)."""
    path = folder / share / layout.SHARE_RECORD
    record = json.loads(path.read_text())
    if how == "sha256 per file":
        record["files"] = layout.describe_files(folder / share, sorted(record["files"]))
    else:
        for name, info in record["files"].items():
            if info.get("block_digest"):
                raw = (folder / share / name).read_bytes()
                block = info["block_bytes"]
                info["block_digest"] = "crc32"
                info["blocks"] = [f"{zlib.crc32(raw[i:i + block]):08x}" for i in range(0, len(raw), block)]
    layout.write_record(path, record)


@pytest.mark.parametrize("how", ["sha256 per file", "crc32 per block"])
def test_a_checkpoint_written_by_an_earlier_version_still_restores_and_is_checked(tmp_path, how):
    """Shares of the earlier record formats: one SHA-256 per file (checked whole before DCP
    reads), or a CRC-32 per block (with a CRC-32 state checksum, which
    ``restoring.restore_group`` checks in CRC-32: tests/test_restoring.py)."""
    source = trained()
    folder = write_checkpoint(tmp_path, source, 2)
    for share in ("share-0-rank-0", "share-1-rank-0"):
        _as_written_before(folder, share, how)
    sealed = seal(folder, job=JOB, step=STEP, structure=STRUCTURE, shares=2, ranks=1)
    record = read_checkpoint(folder, job=JOB, structure=STRUCTURE, digest=sealed.digest)
    kinds = {info.get("block_digest", "sha256" if "sha256" in info else "") for info in record["files"].values()}
    assert kinds == ({"sha256"} if how == "sha256 per file" else {"crc32", "sha256"}), kinds  # .metadata: sha256
    target = fresh()
    target.load(load(folder, record, rank=0, current=target.capture()))
    assert target.part_checksums() == source.part_checksums()
    data = folder / "share-1-rank-0" / "__0_0.distcp"
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    data.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match="share-1-rank-0/__0_0.distcp is corrupt"):
        load(folder, record, rank=0, current=fresh().capture())


def test_an_unknown_block_digest_is_refused_with_its_name(tmp_path):
    _, folder, record = _sealed(tmp_path, shares=1)
    record["files"]["share-0-rank-0/__0_0.distcp"]["block_digest"] = "md4"
    with pytest.raises(CheckpointError, match="unknown block digest 'md4'"):
        load(folder, record, rank=0, current=fresh().capture())


def test_a_failed_dcp_write_is_an_os_error_not_a_base_exception(tmp_path, monkeypatch):
    """DCP wraps a writer's failure in CheckpointException, a BaseException the saver would not catch."""
    from fthsdp.agent.training.checkpoint.share import ShareSpec, stage, write

    def full(self, b):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(digests._DigestingStream, "write", full)
    staged = stage(trained().capture(), ShareSpec(JOB, STEP, STRUCTURE, 7, 0, 1, 0, 1))
    with pytest.raises(OSError, match="No space left on device"):
        write(staged, layout.step_folder(tmp_path, JOB, STEP))
    assert torch.is_tensor(next(iter(staged.pieces.values())).data)
