"""A replica's state at a step boundary: captured without stalling training,
served from host memory, and loaded into a joiner.

What a snapshot holds (``capture_state``): the model's state dict (this
rank's shards under FSDP2), the optimizer's state dict, and the RNG states.
The step travels in the manifest; the data position is the step (batch
``(step, replica_rank)``, see fthsdp/agent/training/manager.py).

Capture does not stop the source's training. At a step boundary the tensors
are only *referenced*; the copy into one flat host buffer runs in the
background while the next step's forward and backward pass run, which read
the parameters and optimizer state but do not change them. The training
thread waits for the copy only before it next changes them, at the end of
``allreduce_gradients`` (just before ``optimizer.step()``), by which time the
copy is normally long done. On a GPU the copy goes to pinned host memory on
a side stream, and the training stream waits on an event instead of the host
(55 GB/s pinned device-to-host on an H200). Module buffers (batch-norm
statistics, which the forward pass changes) and RNG states are copied at the
boundary itself; they are small. Chunk digests (XXH3-64) are computed afterwards from
the host copy, off the training thread.
"""

from __future__ import annotations

import threading
import time

import torch

from fthsdp.agent.training.state.checksum import digest64
from fthsdp.agent.training.state.codec import (
    StateCodecError,
    dtype_from_name,
    dtype_name,
    flatten,
    is_dtensor,
    local,
    unflatten,
)
from fthsdp.protos.v1 import catchup_pb2 as cpb

ALIGN = 64
DEFAULT_CHUNK_BYTES = 8 << 20


def capture_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """References to the state at a step boundary (copies of what the next
    forward pass would change)."""
    buffers = {name for name, _ in model.named_buffers()}
    model_state = {
        name: (local(t).detach().clone() if name in buffers else t) for name, t in model.state_dict().items()
    }
    rng = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        rng["cuda"] = torch.cuda.get_rng_state()
    return {"model": model_state, "optimizer": optimizer.state_dict(), "rng": rng}


def load_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
    """Put a received state into ``model`` and ``optimizer`` (in place for the
    parameters, so the optimizer keeps referring to the same tensors)."""
    try:
        source_model, source_optimizer = state["model"], state["optimizer"]
    except (KeyError, TypeError) as e:
        raise StateCodecError(f"the snapshot lacks the model or optimizer state ({e})") from e
    own = model.state_dict()
    missing, extra = sorted(set(own) - set(source_model)), sorted(set(source_model) - set(own))
    if missing or extra:
        raise StateCodecError(
            f"the source's model differs from this one: missing here {extra[:5]}, missing there {missing[:5]}"
        )
    with torch.no_grad():
        for name, dest in own.items():
            target = local(dest)
            src = source_model[name]
            if target.shape != src.shape or target.dtype != src.dtype:
                raise StateCodecError(
                    f"{name}: the source has {src.dtype} {tuple(src.shape)}, "
                    f"this replica {target.dtype} {tuple(target.shape)}"
                )
            target.copy_(src)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    for index, entry in source_optimizer.get("state", {}).items():
        if not 0 <= index < len(params):
            raise StateCodecError(f"optimizer state for parameter {index}, but this optimizer has {len(params)}")
        p = params[index]
        for key, value in list(entry.items()):
            if isinstance(value, torch.Tensor) and is_dtensor(p) and value.dim() > 0 and value.shape == local(p).shape:
                from torch.distributed.tensor import DTensor

                entry[key] = DTensor.from_local(
                    value.to(local(p).device), p.device_mesh, p.placements,
                    run_check=False, shape=p.shape, stride=p.stride(),
                )
    try:
        optimizer.load_state_dict(source_optimizer)
    except (ValueError, KeyError) as e:
        raise StateCodecError(f"the source's optimizer state does not fit this optimizer: {e}") from e
    rng = state.get("rng", {})
    if "cpu" in rng:
        torch.set_rng_state(rng["cpu"].clone())  # a view at an offset is not accepted
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state(rng["cuda"].clone())


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


class Snapshot:
    """One rank's state at one step, copied into a flat host buffer."""

    def __init__(
        self,
        step: int,
        replica_id: str,
        shard_rank: int,
        structure_hash: int,
        state: dict,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        reuse: torch.Tensor | None = None,
    ) -> None:
        skeleton, self._tensors, sharded = flatten(state)
        metas, offset = [], 0
        for t, is_shard in zip(self._tensors, sharded, strict=True):
            nbytes = t.numel() * t.element_size()
            metas.append(cpb.TensorMeta(
                dtype=dtype_name(t.dtype), shape=list(t.shape), offset=offset, nbytes=nbytes, sharded=is_shard
            ))
            offset = _align(offset + nbytes)
        self.total_bytes = offset
        self.manifest = cpb.SnapshotManifest(
            step=step,
            replica_id=replica_id,
            shard_rank=shard_rank,
            skeleton_json=skeleton,
            tensors=metas,
            total_bytes=offset,
            chunk_bytes=chunk_bytes,
            structure_hash=structure_hash,
        )
        pinned = any(t.is_cuda for t in self._tensors)
        if reuse is not None and reuse.numel() == offset and reuse.is_pinned() == pinned:
            self.buffer = reuse
        else:
            self.buffer = torch.empty(offset, dtype=torch.uint8, pin_memory=pinned)
        self.step = step
        self.data_copied = threading.Event()
        """Set once the live tensors may change again (the host copy is taken)."""
        self._host_tensors_copied = threading.Event()
        """Set once the CPU tensors are copied (the CUDA ones are ordered by ``_cuda_event``)."""
        self.ready = threading.Event()
        """Set once the manifest is complete (chunk digests) and bytes can be served."""
        self.error: BaseException | None = None
        self.last_used = time.monotonic()
        self._cuda_event: torch.cuda.Event | None = None
        self._cuda_device: torch.device | None = None

    def start(self) -> None:
        """Begin the copy (call on the training thread at the step boundary)."""
        cuda = [(t, m) for t, m in zip(self._tensors, self.manifest.tensors, strict=True) if t.is_cuda]
        if cuda:
            self._cuda_device = cuda[0][0].device
            stream = torch.cuda.Stream(device=self._cuda_device)
            stream.wait_stream(torch.cuda.current_stream(cuda[0][0].device))
            with torch.cuda.stream(stream):
                for t, meta in cuda:
                    self._view(meta).copy_(t, non_blocking=True)
                self._cuda_event = torch.cuda.Event()
                self._cuda_event.record(stream)
        threading.Thread(target=self._copy, name=f"fthsdp-snapshot-{self.step}", daemon=True).start()

    def wait_copied(self, timeout: float) -> None:
        """Make the training thread's next change of the state safe."""
        if self._cuda_event is not None:
            # The training stream of the tensors' device waits for their copy; the host goes on.
            torch.cuda.current_stream(self._cuda_device).wait_event(self._cuda_event)
        if not self._host_tensors_copied.wait(timeout):
            raise TimeoutError(f"the snapshot of step {self.step} was not copied within {timeout:g}s")

    def _view(self, meta: cpb.TensorMeta) -> torch.Tensor:
        raw = self.buffer[meta.offset : meta.offset + meta.nbytes]
        return raw.view(dtype_from_name(meta.dtype)).view(tuple(meta.shape))

    def _copy(self) -> None:
        try:
            with torch.no_grad():
                for t, meta in zip(self._tensors, self.manifest.tensors, strict=True):
                    if not t.is_cuda:
                        self._view(meta).copy_(t)
            self._host_tensors_copied.set()
            if self._cuda_event is not None:
                self._cuda_event.synchronize()
            self._tensors = []  # let go of the live tensors
            self.data_copied.set()
            data = self.buffer.numpy().data
            size = self.manifest.chunk_bytes
            self.manifest.chunk_xxh3.extend(digest64(data[i : i + size]) for i in range(0, self.total_bytes, size))
        except BaseException as e:  # noqa: BLE001 - handed to the waiters
            self.error = e
            self._host_tensors_copied.set()
            self.data_copied.set()
        finally:
            self.ready.set()

    def data(self) -> memoryview:
        self.last_used = time.monotonic()
        return self.buffer.numpy().data.cast("B")


def tensors_from_bytes(manifest: cpb.SnapshotManifest, data: torch.Tensor) -> list[torch.Tensor]:
    """Tensors (views of ``data``) described by ``manifest``."""
    out = []
    for meta in manifest.tensors:
        if meta.offset < 0 or meta.nbytes < 0 or meta.offset + meta.nbytes > data.numel():
            raise StateCodecError(f"tensor at {meta.offset}+{meta.nbytes} lies outside the {data.numel()} bytes sent")
        raw = data[meta.offset : meta.offset + meta.nbytes]
        out.append(raw.view(dtype_from_name(meta.dtype)).view(tuple(meta.shape)))
    return out


def state_from_bytes(manifest: cpb.SnapshotManifest, data: torch.Tensor) -> dict:
    state = unflatten(manifest.skeleton_json, tensors_from_bytes(manifest, data))
    if not isinstance(state, dict):
        raise StateCodecError("the snapshot's state is not a dict")
    return state
