"""Load a complete checkpoint into this rank's state.

Each rank reads only what its state needs (with FSDP2, the chunks that
overlap its shards), and checks every byte it reads against the checksums
in ``checkpoint.json`` as DCP reads it, before DCP parses it
(fthsdp/agent/training/checkpoint/digests.py). DCP reads into the state's
own tensors where they have the stored shape and dtype (as a plain
``dcp.load`` of ``model.state_dict()`` does): no second copy of the state
in memory. So a checkpoint refused before DCP reads (a record, a share of
another quorum, a ``.metadata``) leaves the state as it was, and one
refused while DCP reads (a block that differs) raises ``PartlyLoaded``:
the state is then to be replaced whole (the checkpoint before, a peer's
snapshot) before it trains. Tensors are read by torch.distributed.checkpoint
itself, so any checkpoint DCP can read at this world size is readable here,
whatever the number of replicas that wrote it.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from fthsdp.agent.training.checkpoint import dcp_metadata, digests, layout
from fthsdp.agent.training.checkpoint.errors import CheckpointError, PartlyLoaded
from fthsdp.agent.training.checkpoint.seal import verify_files, verify_shares
from fthsdp.agent.training.checkpoint.share import per_rank
from fthsdp.agent.training.state.codec import StateCodecError, flatten_named, is_dtensor, local, unflatten

_OPTIMIZER_STATE = re.compile(r"^optimizer\.state\.(\d+)\.")


def load(folder: Path, record: dict, *, rank: int, current: dict, params: list[torch.Tensor] | None = None) -> dict:
    """The checkpoint's state for this rank, shaped as ``TrainState.capture()``
    (``current``: this rank's own capture, whose sharding the result takes;
    ``params``: the optimizer's parameters in its order, whose sharding an
    optimizer state the current optimizer does not hold yet takes, as it
    would once created)."""
    skeleton = record["skeletons"].get(str(rank))
    rank_in_checkpoint = rank
    if skeleton is None:  # restored with more ranks per group than saved: the rest take rank 0's structure
        skeleton, rank_in_checkpoint = record["skeletons"]["0"], 0
    try:
        metadata_path = folder / layout.DCP_METADATA
        metadata_bytes = metadata_path.read_bytes()
        metadata = dcp_metadata.parse(metadata_bytes, record["files"][layout.DCP_METADATA]["sha256"], metadata_path)
    except (KeyError, OSError, dcp_metadata.MetadataError) as e:
        raise CheckpointError(f"{folder}: {e}") from e
    _, own, _ = flatten_named(per_rank(current, rank_in_checkpoint))
    names = _names(skeleton)
    dest: dict[str, torch.Tensor] = {}
    for name in names:
        stored = metadata.state_dict_metadata.get(name)
        if not isinstance(stored, TensorStorageMetadata):
            raise CheckpointError(f"{folder}: the checkpoint lacks tensor {name!r}")
        mine = own.get(name)
        match = _OPTIMIZER_STATE.match(name)
        if mine is None and match and params is not None and int(match.group(1)) < len(params):
            param = params[int(match.group(1))]
            if tuple(param.shape) == tuple(stored.size):
                mine = param  # a state the optimizer makes on its first step, sharded as its parameter
        if name in own and _fits(own[name], stored):
            dest[name] = own[name]  # in place: DCP reads into this rank's own tensor (its shard, with FSDP2)
        elif mine is not None and is_dtensor(mine):
            dest[name] = torch.empty_like(mine, dtype=stored.properties.dtype)  # this rank's shard
        else:
            dest[name] = torch.empty(stored.size, dtype=stored.properties.dtype)
    verify_shares(folder, record)
    read = sorted(_files_read(metadata, dest))
    unknown = [name for name in read if name not in record["files"]]
    if unknown:
        raise CheckpointError(f"{folder / unknown[0]} is not part of the checkpoint")
    # A share written before block digests lists one SHA-256 per file: checked whole, before DCP reads it.
    verify_files(folder, record, [name for name in read if not digests.has_blocks(record["files"][name])])
    warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
    refused = PartlyLoaded if any(dest[name] is own.get(name) for name in dest) else CheckpointError
    reader = dcp.FileSystemReader(str(folder))
    reader.fs = fs = digests.VerifyingFileSystem(folder, record["files"], metadata_bytes)
    try:
        dcp.load(dest, storage_reader=reader, no_dist=True)
    except (Exception, dcp.CheckpointException) as e:  # DCP's own wraps the cause; it is a BaseException
        if fs.corrupt is not None:
            raise refused(str(fs.corrupt)) from e
        raise refused(f"{folder}: could not be read: {e}") from e
    finally:
        fs.close()
    try:
        state = unflatten(skeleton, {name: local(t) for name, t in dest.items()})
    except StateCodecError as e:
        raise refused(f"{folder}: {e}") from e
    assert isinstance(state, dict)
    if "rng" in state:
        state["rng"] = state["rng"][f"rank{rank_in_checkpoint}"]
    return state


def _fits(mine: torch.Tensor, stored: TensorStorageMetadata) -> bool:
    """Whether DCP can read the stored tensor straight into ``mine`` (a tensor of the live state)."""
    return tuple(mine.shape) == tuple(stored.size) and mine.dtype == stored.properties.dtype


def _names(skeleton: str) -> list[str]:
    """The tensor names a skeleton refers to."""
    import json

    out: list[str] = []

    def walk(x: object) -> None:
        if isinstance(x, dict):
            if "$k" in x and isinstance(x["$k"], str):
                out.append(x["$k"])
                return
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk(json.loads(skeleton))
    return out


def _files_read(metadata, dest: dict[str, torch.Tensor]) -> set[str]:
    """The files whose chunks overlap what this rank loads."""
    wanted: dict[str, list[tuple[tuple[int, ...], tuple[int, ...]]]] = {}
    for name, t in dest.items():
        if is_dtensor(t):
            wanted[name] = [(tuple(c.offsets), tuple(c.sizes)) for c in t.__create_chunk_list__()]
        else:
            wanted[name] = [((0,) * t.dim(), tuple(t.shape))]
    files = set()
    for index, info in metadata.storage_data.items():
        boxes = wanted.get(index.fqn)
        if boxes is None:
            continue
        stored = metadata.state_dict_metadata[index.fqn]
        chunk = stored.chunks[index.index] if index.index is not None else None
        if chunk is None or any(_overlap(tuple(chunk.offsets), tuple(chunk.sizes), *box) for box in boxes):
            files.add(info.relative_path)
    return files


def _overlap(a_off, a_size, b_off, b_size) -> bool:
    return all(ao < bo + bs and bo < ao + as_ for ao, as_, bo, bs in zip(a_off, a_size, b_off, b_size, strict=True))


def newest_complete(root: Path, job: str, structure: int) -> list[tuple[int, Path]]:
    """This job's checkpoints under ``root`` that have a record, newest first (not yet checked further)."""
    out = []
    for slot in reversed(layout.slots_in(root, job)):
        folder = layout.slot_folder(root, job, slot)
        if (folder / layout.CHECKPOINT_RECORD).exists():
            out.append((slot.step, folder))
    return out
