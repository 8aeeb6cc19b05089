"""What a replica's training state is, and the contract that lets a joiner replay it.

The state is the model, the optimizer, and whatever the script registers
(``Manager(..., state={"scheduler": scheduler, "scaler": scaler, "data":
loader})``): anything with ``state_dict()``/``load_state_dict()`` whose state
dict holds only tensors, numbers, strings, None, lists, tuples and dicts
(nothing is pickled). All of it travels in a snapshot and counts in the
state checksum.

The replay contract. A step has two parts:

1. *Inputs*, from the last step boundary to ``allreduce_gradients()``: the
   forward and backward passes, and whatever the loop changes meanwhile (the
   data loader advancing, a learning rate set from the step, a scheduler
   stepped at the top of the loop). When the all-reduce starts the manager
   records the step's inputs: the optimizer's numeric hyperparameters and
   the state of every *small* registered object (at most ``SMALL_STATE_BYTES``
   of tensors; a scheduler, a GradScaler, a sampler, counters) and the
   batch counts of batch-norm layers. Their running statistics, which every
   forward pass changes, travel in the all-reduce itself: every member and
   every replay takes the first contributor's (fthsdp/agent/training/state/running_buffers.py).
2. *The update*, the one function the script hands over (``update=``): what
   turns the averaged gradients into the next state (unscale, clip,
   ``optimizer.step()``, ``scheduler.step()``, an EMA, ``zero_grad``).
   ``commit()`` runs it; a joiner replays it.

A joiner replays step ``s`` as: restore the recorded inputs of ``s``, set
every gradient to the members' sum over the contributors, run ``update``.
On the same device type this reproduces the members' state bit for bit. So
the rules are: ``optimizer.step()`` runs only inside ``update`` (checked: an
``ApiMisuse`` otherwise), the gradients are not changed between the
all-reduce and ``commit()`` (checked on a sample of elements), and a
registered object larger than ``SMALL_STATE_BYTES`` (an EMA of the weights)
changes only inside ``update``, and so does every module buffer other than
batch-norm statistics. A replay that breaks them anyway is caught by
the per-part checksum a joiner compares with its source, whose error names
the part that differs.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable, Mapping
from typing import Protocol, TypeGuard

import torch

from fthsdp.agent.training.state.checksum import (
    STATE_HASH,
    Chain,
    crc_of_items,
    model_crc,
    model_items,
    optimizer_crc,
    optimizer_items,
    tensor_bytes,
)
from fthsdp.agent.training.state.codec import StateCodecError, dtype_from_name, dtype_name, flatten, local, unflatten
from fthsdp.agent.training.state.running_buffers import RunningBuffers
from fthsdp.core.errors import ApiMisuse
from fthsdp.protos.v1 import catchup_pb2 as cpb

SMALL_STATE_BYTES = 256 << 10
"""Registered state with at most this many tensor bytes is recorded with every step."""
RESERVED = ("model", "optimizer", "rng", "extra")


class Stateful(Protocol):
    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> object: ...


def _is_stateful(obj: object) -> TypeGuard[Stateful]:
    return callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))


def default_update(optimizer: torch.optim.Optimizer) -> Callable[[], None]:
    def update() -> None:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return update


def check_registered(state: Mapping[str, object] | None) -> dict[str, Stateful]:
    """The registered objects, or a clear error for a script's mistake."""
    out: dict[str, Stateful] = {}
    for name, obj in (state or {}).items():
        if not isinstance(name, str) or not name or name in RESERVED:
            raise StateCodecError(f"registered state needs a name other than {', '.join(RESERVED)}; got {name!r}")
        if not _is_stateful(obj):
            raise StateCodecError(
                f"registered state {name!r} is a {type(obj).__name__}, which has no state_dict()/load_state_dict()"
            )
        out[name] = obj
    return out


def encode_blob(state: object) -> cpb.StateBlob:
    """A small state as JSON structure plus raw tensor bytes (a copy)."""
    skeleton, tensors, sharded = flatten(state)
    metas, parts, offset = [], [], 0
    for t, is_shard in zip(tensors, sharded, strict=True):
        raw = tensor_bytes(t).tobytes()
        metas.append(cpb.TensorMeta(
            dtype=dtype_name(t.dtype), shape=list(t.shape), offset=offset, nbytes=len(raw), sharded=is_shard
        ))
        parts.append(raw)
        offset += len(raw)
    return cpb.StateBlob(skeleton_json=skeleton, tensors=metas, data=b"".join(parts))


def decode_blob(blob: cpb.StateBlob) -> object:
    data = blob.data
    tensors = []
    for meta in blob.tensors:
        if meta.offset < 0 or meta.offset + meta.nbytes > len(data):
            raise StateCodecError(
                f"a recorded tensor at {meta.offset}+{meta.nbytes} lies outside the {len(data)} bytes sent"
            )
        raw = bytearray(data[meta.offset : meta.offset + meta.nbytes])
        dtype = dtype_from_name(meta.dtype)
        t = torch.frombuffer(raw, dtype=dtype) if raw else torch.empty(0, dtype=dtype)
        tensors.append(t.reshape(tuple(meta.shape)))
    return unflatten(blob.skeleton_json, tensors)


def _tensor_nbytes(state: object) -> int:
    if isinstance(state, torch.Tensor):
        return local(state).numel() * state.element_size()
    if isinstance(state, dict):
        return sum(_tensor_nbytes(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(_tensor_nbytes(v) for v in state)
    return 0


def _crc_of(state: object, crc: int = 0, kind: str = STATE_HASH) -> int:
    skeleton, tensors, _ = flatten(state)
    chain = Chain(kind, crc)
    chain.update(skeleton.encode())
    for t in tensors:
        chain.update(tensor_bytes(t))
    return chain.value()


class TrainState:
    """The model, the optimizer and the registered objects of one rank."""

    def __init__(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, extra: Mapping[str, object] | None = None
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.extra = check_registered(extra)
        self.running = RunningBuffers(model)
        """Batch-norm running statistics: kept equal across replicas
        (fthsdp/agent/training/state/running_buffers.py)."""
        self.unrecorded: set[str] = {
            n for n, obj in self.extra.items() if _tensor_nbytes(obj.state_dict()) > SMALL_STATE_BYTES
        }
        """Registered objects too large to record with each step (see the module docstring)."""

    # ----- hyperparameters ------------------------------------------------------------

    def hyperparams(self) -> str:
        """The optimizer's numeric hyperparameters per param group, as JSON."""
        groups = [
            {k: v for k, v in g.items() if k != "params" and isinstance(v, (int, float)) and not isinstance(v, bool)}
            for g in self.optimizer.param_groups
        ]
        return json.dumps(groups, separators=(",", ":"))

    def set_hyperparams(self, text: str) -> None:
        groups = json.loads(text) if text else []
        if len(groups) != len(self.optimizer.param_groups):
            raise StateCodecError(
                f"the source's optimizer has {len(groups)} param groups, this one {len(self.optimizer.param_groups)}"
            )
        for group, values in zip(self.optimizer.param_groups, groups, strict=True):
            group.update(values)

    # ----- a step's inputs (recorded at the all-reduce, replayed before the update) ---------

    def inputs(self, step: int) -> cpb.LogEntry:
        """What ``update`` reads besides the gradients, as the log entry of
        ``step`` without its data: hyperparameters and the small registered state."""
        small = {}
        for name, obj in self.extra.items():
            if name in self.unrecorded:
                continue  # large once, large for good (an EMA of the weights): no state_dict() every step
            state = obj.state_dict()
            if _tensor_nbytes(state) > SMALL_STATE_BYTES:
                self.unrecorded.add(name)
                continue
            small[name] = state
        if self.running.counts:
            small["model"] = self.running.count_state()  # a reserved name: no registered object has it
        return cpb.LogEntry(step=step, hyperparams_json=self.hyperparams(), inputs=encode_blob(small))

    def apply_inputs(self, entry: cpb.LogEntry) -> None:
        """Restore the recorded inputs of ``entry.step``."""
        self.set_hyperparams(entry.hyperparams_json)
        if not entry.HasField("inputs"):
            return
        small = decode_blob(entry.inputs)
        if not isinstance(small, dict):
            raise StateCodecError("the recorded inputs are not a dict")
        counts = small.pop("model", None)
        if counts is not None or self.running.counts:
            try:
                self.running.load_counts(counts if isinstance(counts, dict) else {})
            except (ValueError, RuntimeError) as e:
                raise StateCodecError(f"the recorded batch-norm counts: {e}") from e
        unknown = sorted(set(small) - set(self.extra))
        if unknown:
            raise StateCodecError(f"the source records state {unknown} that this replica does not register")
        for name, state in small.items():
            self.extra[name].load_state_dict(state)

    # ----- snapshots ------------------------------------------------------------------

    def capture(self) -> dict:
        """References to the state at a step boundary (copies of what the
        next forward pass may change: module buffers, the small registered
        state; the rest is copied before the next update)."""
        buffers = {name for name, _ in self.model.named_buffers()}
        model_state = {
            name: (local(t).detach().clone() if name in buffers else t) for name, t in self.model.state_dict().items()
        }
        extra = {}
        for name, obj in self.extra.items():
            state = obj.state_dict()
            # A small state is decoupled now (the loop may change it before
            # the copy runs); a large one changes only inside update().
            extra[name] = decode_blob(encode_blob(state)) if name not in self.unrecorded else state
        rng = {"cpu": torch.get_rng_state()}
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            rng["cuda"] = torch.cuda.get_rng_state()
        return {"model": model_state, "optimizer": self.optimizer.state_dict(), "extra": extra, "rng": rng}

    def load(self, state: dict) -> None:
        from fthsdp.agent.training.state.snapshot import load_state

        load_state(self.model, self.optimizer, state)
        extra = state.get("extra", {})
        missing, unknown = sorted(set(self.extra) - set(extra)), sorted(set(extra) - set(self.extra))
        if missing or unknown:
            raise StateCodecError(
                f"the source registers state {sorted(extra)}, this replica {sorted(self.extra)} "
                "(pass the same state= to Manager on every replica)"
            )
        for name, obj in self.extra.items():
            try:
                obj.load_state_dict(extra[name])
            except (KeyError, ValueError, TypeError, RuntimeError) as e:
                raise StateCodecError(f"registered state {name!r} did not load the source's: {e}") from e
            if isinstance(obj, torch.amp.GradScaler) and obj.is_enabled():
                # A GradScaler makes its scale tensor on the first scale(); a
                # joiner replays unscale_/step before its first forward pass.
                obj.scale(torch.zeros((), device=self._device()))

    def _device(self) -> torch.device:
        first = next(iter(self.model.parameters()), None)
        return local(first).device if first is not None else torch.device("cpu")

    # ----- checksums ------------------------------------------------------------------

    def part_checksums(self, kind: str = STATE_HASH) -> dict[str, int]:
        """A 32-bit hash per part of this rank's state (``kind``:
        fthsdp/agent/training/state/checksum.py): ``model`` (parameters and
        buffers), ``optimizer`` (its state and numeric hyperparameters), and
        each registered object."""
        parts = {"model": model_crc(self.model, local, kind=kind)}
        crc = optimizer_crc(self.optimizer, local, zlib.crc32(self.hyperparams().encode()), kind)
        parts["optimizer"] = crc
        for name, obj in self.extra.items():
            parts[name] = _crc_of(obj.state_dict(), kind=kind)
        return parts

    def part_checksums_later(self) -> Callable[[], dict[str, int]]:
        """``part_checksums`` of the state as it is now, to be computed on
        another thread before the next update: what may change before then
        (the buffers, which a forward pass updates; the registered objects;
        the hyperparameters) is read now, the parameters and the optimizer's
        state (which only an update changes) when it runs."""
        model = model_items(self.model, copy_buffers=True)
        optimizer = optimizer_items(self.optimizer)
        hyper = zlib.crc32(self.hyperparams().encode())
        extra = {name: _crc_of(obj.state_dict()) for name, obj in self.extra.items()}

        def compute() -> dict[str, int]:
            return {"model": crc_of_items(model, local), "optimizer": crc_of_items(optimizer, local, hyper), **extra}

        return compute


def combine(parts: Mapping[str, int]) -> str:
    """One checksum of the parts, the one reported to the coordinator."""
    crc = 0
    for name, value in parts.items():
        crc = zlib.crc32(f"{name}={value:08x};".encode(), crc)
    return f"{crc:08x}"


def explain_mismatch(mine: Mapping[str, str], theirs: Mapping[str, str], step: int, unrecorded: set[str]) -> str:
    """Why a replayed state differs from the source's, part by part."""
    differ = [name for name in theirs if mine.get(name) != theirs[name]]
    differ += [name for name in mine if name not in theirs]
    hints = []
    for name in differ:
        if name in ("model", "optimizer"):
            hints.append(
                f"{name}: replaying update() on the members' averaged gradients gave another result; does the loop "
                "change the gradients, the model or the optimizer outside the update passed to Manager, or does "
                "update() read state that is not registered (state=...), or does the forward pass change a "
                "module buffer other than batch-norm running statistics?"
            )
        elif name in unrecorded:
            hints.append(
                f"{name!r}: its state is larger than {SMALL_STATE_BYTES >> 10} KiB, so it is not recorded with each "
                "step; it must change only inside update()"
            )
        elif name not in theirs or name not in mine:
            hints.append(f"{name!r}: registered on one replica only")
        else:
            hints.append(
                f"{name!r}: its state after replaying update() differs; does its load_state_dict() restore "
                "everything its state_dict() holds?"
            )
    parts = "; ".join(hints or ["(no part named)"])
    return f"after step {step} this replica's state differs from the source's in {parts}"


# ----- the contract's checks, run by the manager --------------------------------------

SENTINEL = 8
"""Gradient elements compared at commit against what the all-reduce left."""


def step_outside_update() -> ApiMisuse:
    return ApiMisuse(
        "optimizer.step() ran outside the update fthsdp runs at commit(): a replica that catches up replays "
        "only that update, so this step would be lost to it. Pass the update (unscale, clipping, "
        "optimizer.step(), scheduler.step(), zero_grad) as Manager(..., update=fn) and call ft.commit() "
        "instead of optimizer.step() (docs/training-api.md, the replay contract)"
    )


def check_dense(grads: list[torch.Tensor]) -> None:
    """FTAR sums one flat dense tensor: a sparse gradient has no place in it."""
    if any(g.is_sparse for g in grads):
        raise ApiMisuse(
            "a parameter has a sparse gradient (torch.nn.Embedding(sparse=True)?): fthsdp all-reduces dense "
            "gradients only; build the module with sparse=False"
        )


def gradient_sample(param: torch.Tensor) -> torch.Tensor:
    """A copy of the first elements of ``param``'s gradient (this rank's shard)."""
    grad = param.grad
    assert grad is not None  # called once the step's gradients are in place (StepBuffer makes missing ones)
    return local(grad).reshape(-1)[:SENTINEL].clone()


def check_gradient(param: torch.Tensor, sample: torch.Tensor | None) -> None:
    """The gradients must reach the update as the all-reduce left them: a
    joiner replays the update on the members' sum, nothing in between.
    Bits, not values: an overflowed fp16 step (inf/NaN, which a GradScaler
    skips) equals itself."""
    if sample is None:
        return
    now = local(param.grad).reshape(-1)[:SENTINEL] if param.grad is not None else None
    if now is None or not torch.equal(now.contiguous().view(torch.uint8), sample.view(torch.uint8)):
        raise ApiMisuse(
            "the gradients changed between allreduce_gradients() and commit() (gradient clipping, "
            "GradScaler.unscale_ or zero_grad there?): a replica that catches up replays only the update, "
            "so move that code into the update passed to Manager(..., update=fn)"
        )
