"""Names, JSON records and checksums of a checkpoint on disk (no torch here).

Every record is JSON written to a temporary name, flushed to disk and
renamed into place, so a reader sees a whole record or none.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import NamedTuple

FORMAT = 1
"""The version of fthsdp's records; a reader refuses any other."""
CHECKPOINT_RECORD = "checkpoint.json"
SHARE_RECORD = "share.json"
SKIPPED_RECORD = "skipped.json"
"""In a share's folder instead of its files: that member skipped the
checkpoint (its previous save was still being written), so the sealer stops
waiting for the share at once."""
DCP_METADATA = ".metadata"
_STEP = re.compile(r"^step-(\d{10})(?:-g(\d+))?$")
_HASH_PIECE = 1 << 22


class Slot(NamedTuple):
    """Where a checkpoint sits among the job's: its lineage, then its step."""

    generation: int
    step: int


def step_folder(root: Path, job: str, step: int, generation: int = 0) -> Path:
    """A checkpoint's folder. Each lineage of the job (a restore or a
    give-up begins the next: ``Quorum.generation``) has folders of its own,
    so that a quorum cut from the coordinator that trained on never writes
    into a folder of the lineage that replaced it."""
    return root / job / (f"step-{step:010d}-g{generation}" if generation else f"step-{step:010d}")


def share_folder_name(share: int, rank: int) -> str:
    return f"share-{share}-rank-{rank}"


def slots_in(root: Path, job: str) -> list[Slot]:
    """Every checkpoint folder of the job (complete or not), of every lineage, oldest first."""
    folder = root / job
    if not folder.is_dir():
        return []
    return sorted(Slot(int(m.group(2) or 0), int(m.group(1))) for p in folder.iterdir()
                  if (m := _STEP.match(p.name)) and p.is_dir())


def slot_folder(root: Path, job: str, slot: Slot) -> Path:
    return step_folder(root, job, slot.step, slot.generation)


def steps_in(root: Path, job: str, generation: int = 0) -> list[int]:
    """The steps of one lineage that have a checkpoint folder (complete or not), oldest first."""
    return [s.step for s in slots_in(root, job) if s.generation == generation]


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while piece := f.read(_HASH_PIECE):
            digest.update(piece)
    return digest.hexdigest()


def describe_files(folder: Path, names: list[str]) -> dict[str, dict[str, object]]:
    """``{name: {"bytes": n, "sha256": hex}}`` of files in ``folder``."""
    return {name: {"bytes": (folder / name).stat().st_size, "sha256": sha256_file(folder / name)} for name in names}


def write_record(path: Path, record: dict) -> None:
    """Write ``record`` as JSON, atomically and durably."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(record, f, separators=(",", ":"), sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    sync_folder(path.parent)


def read_record(path: Path) -> dict:
    """A record written by ``write_record``; ValueError if it is not one of this format."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path} is not readable: {e}") from e
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise ValueError(f"{path} is not an fthsdp checkpoint record of format {FORMAT}")
    return record


def sync_folder(folder: Path) -> None:
    """Make a rename in ``folder`` durable."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
