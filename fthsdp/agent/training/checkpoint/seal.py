"""Make one checkpoint of the shares its replicas wrote, and check one before use.

Sealing runs once per checkpoint, on the lowest writing replica's rank 0,
after every share's ``share.json`` exists. It reads only the small files:
each share's record and DCP ``.metadata`` (checked against the record),
merges the latter into the checkpoint's ``.metadata``, and writes
``checkpoint.json`` last, with every file's checksum. A checkpoint without
``checkpoint.json`` is incomplete and never used.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from pathlib import Path

from fthsdp.agent.training.checkpoint import dcp_metadata, digests, layout
from fthsdp.agent.training.checkpoint.errors import CheckpointError


@dataclass(frozen=True)
class Sealed:
    step: int
    folder: Path
    quorum_id: int
    shares: int
    state_checksum: str
    digest: str
    """The sha256 of its ``checkpoint.json``: what the coordinator records."""
    nbytes: int
    generation: int = 0
    """The job's lineage that wrote it."""


def missing_shares(folder: Path, shares: int, ranks: int, quorum_id: int | None = None) -> list[str]:
    """The share folders whose ``share.json`` is not written yet; with
    ``quorum_id``, also those written by a member that committed the step in
    another quorum (an earlier attempt at the step, before a restore, say):
    this checkpoint's member has not written its share yet."""
    return [name for s in range(shares) for r in range(ranks)
            if not _written_in(folder / (name := layout.share_folder_name(s, r)) / layout.SHARE_RECORD, quorum_id)]


def _written_in(record: Path, quorum_id: int | None) -> bool:
    if not record.exists():
        return False
    if quorum_id is None:
        return True
    try:
        return layout.read_record(record).get("quorum_id") == quorum_id
    except ValueError:
        return False  # half-written or foreign: wait for the member's own


def skipped_shares(folder: Path, shares: int, ranks: int, quorum_id: int) -> list[str]:
    """The share folders whose member skipped this checkpoint (``layout.SKIPPED_RECORD``
    of the quorum that committed it: not one left by an earlier attempt at the step)."""
    skipped = []
    for s in range(shares):
        for r in range(ranks):
            path = folder / (name := layout.share_folder_name(s, r)) / layout.SKIPPED_RECORD
            try:
                if path.exists() and layout.read_record(path).get("quorum_id") == quorum_id:
                    skipped.append(name)
            except ValueError:
                continue  # half-written or foreign: the seal timeout still applies
    return skipped


def seal(folder: Path, *, job: str, step: int, structure: int, shares: int, ranks: int,
         quorum_id: int | None = None, generation: int = 0) -> Sealed:
    """Merge the ``shares`` x ``ranks`` shares under ``folder`` into one checkpoint.

    Every share must come from a member that committed the step by one
    decision: the same quorum (``quorum_id``, when given, or one for all
    shares; fthsdp/agent/training/ftar/vote.py) and the same state checksum. Shares of
    members that decided differently are never merged."""
    records: dict[str, dict] = {}
    parts = {}
    for s in range(shares):
        for r in range(ranks):
            name = layout.share_folder_name(s, r)
            try:
                record = layout.read_record(folder / name / layout.SHARE_RECORD)
            except ValueError as e:
                raise CheckpointError(f"checkpoint of step {step}: share {name}: {e}") from e
            expected = {"job": job, "step": step, "structure": structure, "share": s, "shares": shares, "rank": r,
                        "ranks": ranks, "generation": generation}
            wrong = {k: record.get(k, 0) for k, v in expected.items() if record.get(k, 0) != v}
            if wrong:
                raise CheckpointError(f"checkpoint of step {step}: share {name} is of another checkpoint ({wrong})")
            if quorum_id is not None and record.get("quorum_id") != quorum_id:
                raise CheckpointError(f"checkpoint of step {step}: share {name} was written by a member that "
                                      f"committed the step in quorum {record.get('quorum_id')}, this checkpoint's "
                                      f"in quorum {quorum_id}: the members decided the step differently")
            meta = record["files"].get(layout.DCP_METADATA)
            if meta is None:
                raise CheckpointError(f"checkpoint of step {step}: share {name} has no DCP metadata")
            try:
                parts[name] = dcp_metadata.read(folder / name / layout.DCP_METADATA, meta["sha256"])
            except (OSError, dcp_metadata.MetadataError) as e:
                raise CheckpointError(f"checkpoint of step {step}: share {name}: {e}") from e
            records[name] = record
    skeletons: dict[str, str] = {}
    planner_data: dict[str, tuple] = {}
    for name, record in records.items():
        rank = str(record["rank"])
        if skeletons.setdefault(rank, record["skeleton"]) != record["skeleton"]:
            raise CheckpointError(f"checkpoint of step {step}: the replicas' states differ in structure ({name})")
        planner_data.update({k: tuple(v) for k, v in record["paths"].items()})
    try:
        merged = dcp_metadata.merge(parts, planner_data)
    except dcp_metadata.MetadataError as e:
        raise CheckpointError(f"checkpoint of step {step}: {e}") from e
    dcp_metadata.write(folder / layout.DCP_METADATA, merged)
    files = {f"{name}/{file}": info for name, record in records.items() for file, info in record["files"].items()}
    files.update(layout.describe_files(folder, [layout.DCP_METADATA]))
    first = next(iter(records.values()))
    quorums = {int(r.get("quorum_id") or 0) for r in records.values()}
    if len(quorums) != 1:
        raise CheckpointError(f"checkpoint of step {step}: its shares were written by members that committed the "
                              f"step in different quorums ({sorted(quorums)})")
    if len({(r.get("state_checksum", ""), r.get("state_checksum_kind", "crc32")) for r in records.values()}) != 1:
        raise CheckpointError(f"checkpoint of step {step}: the shares report different state checksums")
    checkpoint = {
        "format": layout.FORMAT, "job": job, "step": step, "structure": structure,
        "quorum_id": first["quorum_id"], "state_checksum": first.get("state_checksum", ""),
        "state_checksum_kind": first.get("state_checksum_kind", "crc32"), "shares": shares,
        "ranks": ranks, "generation": generation, "skeletons": skeletons,
        "files": files, "sealed_unix": time.time(),
    }
    layout.write_record(folder / layout.CHECKPOINT_RECORD, checkpoint)
    digest = layout.sha256_file(folder / layout.CHECKPOINT_RECORD)
    nbytes = sum(int(f["bytes"]) for f in files.values())
    return Sealed(step, folder, first["quorum_id"], shares, checkpoint["state_checksum"], digest, nbytes, generation)


def read_checkpoint(folder: Path, *, job: str, structure: int, digest: str = "") -> dict:
    """The record of a complete checkpoint of this job and model; CheckpointError otherwise.
    ``digest``: the checksum the coordinator recorded for it ("" to take any)."""
    path = folder / layout.CHECKPOINT_RECORD
    if not path.exists():
        raise CheckpointError(f"{folder} is not a complete checkpoint (no {layout.CHECKPOINT_RECORD})")
    data = path.read_bytes()
    if digest and hashlib.sha256(data).hexdigest() != digest:
        raise CheckpointError(f"{path} is not the checkpoint recorded (its checksum differs)")
    try:
        record = layout.read_record(path)
    except ValueError as e:
        raise CheckpointError(str(e)) from e
    if record.get("job") != job:
        raise CheckpointError(f"{folder} is a checkpoint of job {record.get('job')!r}, not {job!r}")
    if record.get("structure") != structure:
        raise CheckpointError(f"{folder} is a checkpoint of another model (structure {record.get('structure')}, "
                              f"this model's {structure})")
    return record


def verify_shares(folder: Path, record: dict) -> None:
    """Check that every share under ``folder`` belongs to its checkpoint
    (``record``): written for its job, step, quorum and lineage, with its
    state checksum. A share written over it later (by a quorum that trained
    on, cut from the coordinator) is refused, never loaded."""
    want = {k: record.get(k, 0) for k in ("job", "step", "quorum_id", "generation", "state_checksum")}
    for s in range(int(record.get("shares", 0))):
        for r in range(int(record.get("ranks", 0))):
            name = layout.share_folder_name(s, r)
            try:
                share = layout.read_record(folder / name / layout.SHARE_RECORD)
            except ValueError as e:
                raise CheckpointError(f"{folder}: share {name}: {e}") from e
            wrong = {k: share.get(k, 0) for k, v in want.items() if share.get(k, 0) != v}
            if wrong:
                raise CheckpointError(f"{folder}: share {name} is not this checkpoint's ({wrong}, the checkpoint's "
                                      f"{ {k: want[k] for k in wrong} })")


def verify_files(folder: Path, record: dict, names: list[str] | None = None) -> None:
    """Check the files ``names`` (default: all) against their recorded size and checksum
    (a restore checks the files it reads as it reads them, fthsdp/agent/training/checkpoint/digests.py)."""
    files = record["files"]
    for name in names if names is not None else list(files):
        info = files.get(name)
        path = folder / name
        if info is None:
            raise CheckpointError(f"{path} is not part of the checkpoint")
        if not path.exists():
            raise CheckpointError(f"{path} is missing")
        if path.stat().st_size != info["bytes"] or not _matches(path, info):
            raise CheckpointError(f"{path} is corrupt (its size or checksum differs from the recorded one)")


def _matches(path: Path, info: dict) -> bool:
    """Whether the file's bytes have the recorded checksum: one SHA-256, or one per block."""
    if "sha256" in info:
        return layout.sha256_file(path) == info["sha256"]
    block, want = int(info["block_bytes"]), list(info["blocks"])
    got = []
    with open(path, "rb") as f:
        while piece := f.read(block):
            got.append(digests.block_digests(piece, str(info.get("block_digest"))))
    return got == want
