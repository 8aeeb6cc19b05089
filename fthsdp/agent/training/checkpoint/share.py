"""One replica's share of a checkpoint: staged at a step boundary, written in the background.

``stage`` runs on the training thread at the boundary: it copies this
rank's share of the state (about 1/R of its bytes, R the replicas writing)
to host memory, so the next update can change the state meanwhile.
``write`` then runs on the saver's thread: a torch.distributed.checkpoint
save of those pieces, in a process of its own (``no_dist``: the replicas
live in separate worlds, so DCP's own spreading of duplicate writes cannot
apply), and a ``share.json`` with a checksum of every file it wrote: the
data files' CRC-32 per 4 MiB block, computed as DCP writes them
(fthsdp/agent/training/checkpoint/digests.py).

Which tensors this rank writes: with FSDP2 each rank of a replica group
holds a shard of every parameter and optimizer state (a DTensor sharded on
each mesh dimension), and writes its part of that shard; a tensor every rank
of the group holds whole is written by rank 0 only. The random-number
state is each rank's own and is named by rank (``rng.rank<k>``).
"""

from __future__ import annotations

import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import create_default_global_save_plan
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, Metadata, MetadataIndex, TensorProperties
from torch.distributed.checkpoint.planner import (
    SavePlan,
    SavePlanner,
    TensorWriteData,
    WriteItem,
    WriteItemType,
)

from fthsdp.agent.training.checkpoint import digests, layout
from fthsdp.agent.training.checkpoint.split import Item, split
from fthsdp.agent.training.state.checksum import STATE_HASH
from fthsdp.agent.training.state.codec import flatten_named, is_dtensor, local


@dataclass(frozen=True)
class ShareSpec:
    """Which share this is, of which checkpoint."""

    job: str
    step: int
    structure: int
    """The model's structure hash: a restore refuses a checkpoint of another model."""
    quorum_id: int
    share: int
    """This replica's index among the ``shares`` replicas that write the checkpoint."""
    shares: int
    rank: int
    """This process's rank in its replica group."""
    ranks: int
    generation: int = 0
    """The job's lineage (``Quorum.generation``): its folders are that lineage's (layout.step_folder)."""


@dataclass(frozen=True)
class _Piece:
    data: torch.Tensor
    """A host copy of the rows this share writes."""
    offsets: torch.Size
    """Where they start in the whole tensor."""
    size: torch.Size
    """The whole tensor's size."""


@dataclass(frozen=True)
class StagedShare:
    spec: ShareSpec
    skeleton: str
    """This rank's state as JSON, tensors by name (fthsdp/agent/training/state/codec.py)."""
    paths: dict[str, list[str | int]]
    """Every tensor name of this rank's state, and its path in the state."""
    pieces: dict[str, _Piece]

    @property
    def nbytes(self) -> int:
        return sum(p.data.numel() * p.data.element_size() for p in self.pieces.values())


def per_rank(state: dict, rank: int) -> dict:
    """The state with what is each rank's own (the random-number state) named by rank."""
    if "rng" not in state:
        return state
    return {**state, "rng": {f"rank{rank}": state["rng"]}}


class StagingBuffers:
    """The host memory a rank's shares are staged into, kept from one
    checkpoint to the next. Fresh memory costs its page faults on the first
    write, several times the copy itself (a 100 MB share: about 100 ms fresh,
    13 ms reused, on this project's CPU machine), and CUDA tensors copy to
    pinned memory faster than to pageable. A buffer is reused only once the
    share staged in it has been written: the saver stages a checkpoint only
    when no write is in flight (fthsdp/agent/training/checkpoint/saver.py).
    They hold this rank's share of the state on the host (about 1/R of its
    state) between checkpoints."""

    def __init__(self) -> None:
        self._by_name: dict[str, torch.Tensor] = {}

    def copy(self, name: str, source: torch.Tensor) -> torch.Tensor:
        """A host copy of ``source`` in the buffer kept for ``name`` (a new one when its shape or dtype changed)."""
        buf = self._by_name.get(name)
        if buf is None or buf.shape != source.shape or buf.dtype != source.dtype:
            buf = torch.empty(source.shape, dtype=source.dtype, device="cpu",
                              pin_memory=source.is_cuda and torch.cuda.is_available())
            self._by_name[name] = buf
        buf.copy_(source, non_blocking=source.is_cuda)
        return buf

    def keep_only(self, names: set[str]) -> None:
        """Let go of the buffers of tensors this rank no longer writes (the split among the replicas changed)."""
        for name in set(self._by_name) - names:
            del self._by_name[name]


def stage(state: dict, spec: ShareSpec, buffers: StagingBuffers | None = None) -> StagedShare:
    """Copy this rank's share of ``state`` (``TrainState.capture()``) to host
    memory: into ``buffers`` when given (kept for the next checkpoint), else
    into new memory."""
    skeleton, tensors, paths = flatten_named(per_rank(state, spec.rank))
    written = {name: t for name, t in tensors.items() if _writes(name, t, spec.rank)}
    items = []
    for name, t in written.items():
        shard = local(t)
        rows = shard.shape[0] if shard.dim() else 1
        items.append(Item(name, rows, shard.numel() * shard.element_size() // rows if rows else 0))
    pieces = {}
    for piece in split(items, spec.shares)[spec.share]:
        t = written[piece.name]
        shard = local(t)
        base = _shard_offsets(t)
        source = shard.detach() if shard.dim() == 0 else shard.detach()[piece.start : piece.stop]
        offsets = torch.Size([]) if shard.dim() == 0 else torch.Size([base[0] + piece.start, *base[1:]])
        data = (buffers.copy(piece.name, source) if buffers is not None
                else source.to("cpu", copy=True).contiguous())
        pieces[piece.name] = _Piece(data, offsets, t.size())
    if buffers is not None:
        buffers.keep_only(set(pieces))
        if any(p.data.is_pinned() for p in pieces.values()):
            torch.cuda.current_stream().synchronize()  # the copies were queued; the writer reads them
    return StagedShare(spec, skeleton, {name: list(path) for name, path in paths.items()}, pieces)


def write(staged: StagedShare, checkpoint: Path, state_checksum: str = "") -> dict:
    """Write ``staged`` under the checkpoint's folder; returns its ``share.json``
    record. ``state_checksum``: the members' checksum of the whole state at
    the step ("" if none), which a restored replica checks its state against."""
    spec = staged.spec
    folder = checkpoint / layout.share_folder_name(spec.share, spec.rank)
    if folder.exists():
        shutil.rmtree(folder)  # a share of an earlier attempt at this step: never mixed with this one
    folder.mkdir(parents=True)
    warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
    writer = dcp.FileSystemWriter(str(folder), single_file_per_rank=True, sync_files=True, thread_count=1)
    writer.fs = digests.DigestingFileSystem()  # each data file hashed in blocks as it is written
    try:
        dcp.save({}, storage_writer=writer, planner=_SharePlanner(staged.pieces), no_dist=True)
    except dcp.CheckpointException as e:  # a BaseException, wrapping the cause (a full disk, a lost mount)
        raise OSError(f"{folder}: DCP could not write the share: {e}") from e
    names = sorted(p.name for p in folder.iterdir() if p.name != layout.SHARE_RECORD)
    unhashed = [name for name in names if name not in writer.fs.written or name == layout.DCP_METADATA]
    files = layout.describe_files(folder, unhashed)  # the small .metadata: one SHA-256, checked before unpickling
    files.update({name: digests.describe(writer.fs.written[name]) for name in names if name not in files})
    record = {
        "format": layout.FORMAT, "job": spec.job, "step": spec.step, "structure": spec.structure,
        "quorum_id": spec.quorum_id, "share": spec.share, "shares": spec.shares, "rank": spec.rank,
        "ranks": spec.ranks, "generation": spec.generation, "state_checksum": state_checksum,
        "state_checksum_kind": STATE_HASH,
        "skeleton": staged.skeleton, "paths": staged.paths,
        "files": files,
    }
    layout.write_record(folder / layout.SHARE_RECORD, record)
    return record


def _writes(name: str, t: torch.Tensor, rank: int) -> bool:
    """Whether this rank writes tensor ``name`` (see the module's docstring)."""
    if name.startswith("rng."):
        return True  # named by rank
    if is_dtensor(t):
        return all(p.is_shard() for p in t.placements) or rank == 0
    return rank == 0


def _shard_offsets(t: torch.Tensor) -> list[int]:
    """Where this rank's shard of ``t`` starts in the whole tensor."""
    if is_dtensor(t) and all(p.is_shard() for p in t.placements):
        chunks = t.__create_chunk_list__()  # DCP's own protocol for a DTensor's local chunk
        return list(chunks[0].offsets)
    return [0] * t.dim()


class _SharePlanner(SavePlanner):
    """Plans the pieces of one share as chunks of the whole tensors.

    DCP's default planner would check that the chunks cover each tensor; a
    share covers only its rows, so that check runs at sealing, on the merged
    metadata of every share (fthsdp/agent/training/checkpoint/seal.py)."""

    def __init__(self, pieces: dict[str, _Piece]) -> None:
        self._pieces = pieces
        self._plan = SavePlan([])

    def set_up_planner(self, state_dict, storage_meta=None, is_coordinator: bool = False) -> None:
        pass  # the pieces came with the planner

    def create_local_plan(self) -> SavePlan:
        items = [
            WriteItem(
                index=MetadataIndex(name, piece.offsets),
                type=WriteItemType.SHARD,
                tensor_data=TensorWriteData(
                    chunk=ChunkStorageMetadata(offsets=piece.offsets, sizes=piece.data.size()),
                    properties=TensorProperties.create_from_tensor(piece.data),
                    size=piece.size,
                ),
            )
            for name, piece in self._pieces.items()
        ]
        self._plan = SavePlan(items)
        return self._plan

    def create_global_plan(self, all_plans: list[SavePlan]) -> tuple[list[SavePlan], Metadata]:
        return create_default_global_save_plan(all_plans)

    def finish_plan(self, new_plan: SavePlan) -> SavePlan:
        self._plan = new_plan
        return new_plan

    def resolve_data(self, write_item: WriteItem) -> torch.Tensor:
        return self._pieces[write_item.index.fqn].data
