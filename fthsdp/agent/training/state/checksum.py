"""A cheap, exact fingerprint of a replica's committed state.

A 32-bit hash over the raw bytes of every parameter and optimizer-state
tensor in a fixed order: two replicas agree only if they are bit-identical.
It costs one pass over the state, so the manager computes it every
``checksum_every`` steps (off the training thread where it can:
fthsdp/agent/training/step/background_checksum.py).

The hash is ``STATE_HASH``: XXH3-64 (the xxhash package), of which the low 32
bits are kept, at 10-17 GB/s on one core here against 3 GB/s for zlib's
CRC-32 (benchmarks/README.md, "The state checksum's hash"). Both release
the GIL. Checkpoints written before it recorded CRC-32 checksums and name no
kind; ``HASHES`` keeps CRC-32 so that a restore checks them as they were.
"""

from __future__ import annotations

import hashlib
import json
import zlib

import torch
import xxhash

STATE_HASH = "xxh3"
"""The state checksum's hash, recorded with every checkpoint (``state_checksum_kind``)."""
HASHES = ("xxh3", "crc32")
"""The kinds a checksum can be computed in: the current one, and CRC-32 for older checkpoints' records."""


def digest64(data) -> int:
    """XXH3-64 of one buffer: a catch-up chunk, a logged step's sum (their wire fields ``chunk_xxh3``, ``xxh3``)."""
    return xxhash.xxh3_64_intdigest(data)


class Chain:
    """A running 32-bit hash of a sequence of buffers, started from ``start``
    (the value of what came before): XXH3-64 seeded with it, its low 32 bits;
    or zlib's CRC-32 continued from it."""

    def __init__(self, kind: str = STATE_HASH, start: int = 0) -> None:
        if kind not in HASHES:
            raise ValueError(f"unknown checksum kind {kind!r} (known: {', '.join(HASHES)})")
        self._xxh = xxhash.xxh3_64(seed=start) if kind == "xxh3" else None
        self._crc = start

    def update(self, data) -> None:
        if self._xxh is not None:
            self._xxh.update(data)
        else:
            self._crc = zlib.crc32(data, self._crc)

    def value(self) -> int:
        return self._xxh.intdigest() & 0xFFFFFFFF if self._xxh is not None else self._crc


def tensor_bytes(t: torch.Tensor, local=lambda t: t):
    t = local(t).detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    if t.dim() == 0:
        t = t.reshape(1)
    return t.view(torch.uint8).numpy()


def model_crc(model: torch.nn.Module, local=lambda t: t, crc: int = 0, kind: str = STATE_HASH) -> int:
    """The hash of the model's state dict (names and raw bytes), in name order."""
    return crc_of_items(model_items(model), local, crc, kind)


def optimizer_crc(optimizer: torch.optim.Optimizer, local=lambda t: t, crc: int = 0, kind: str = STATE_HASH) -> int:
    """The hash of the optimizer's per-parameter state, in index and key order."""
    return crc_of_items(optimizer_items(optimizer), local, crc, kind)


Items = list[bytes | torch.Tensor]
"""What a CRC runs over, in order: names and values already as bytes, tensors as they are."""


def model_items(model: torch.nn.Module, copy_buffers: bool = False) -> Items:
    """``model_crc``'s items. ``copy_buffers``: the tensors that are not
    parameters (buffers: batch-norm statistics, which a forward pass changes)
    as copies, the parameters as they are (only an update changes them)."""
    params = {p.data_ptr() for p in model.parameters()} if copy_buffers else set()
    items: Items = []
    for name, t in sorted(model.state_dict().items()):
        items.append(name.encode())
        items.append(t if not copy_buffers or t.data_ptr() in params else t.detach().clone())
    return items


def optimizer_items(optimizer: torch.optim.Optimizer) -> Items:
    """``optimizer_crc``'s items: the tensors as they are (only an update changes them)."""
    state = optimizer.state_dict()["state"]
    items: Items = []
    for index in sorted(state):
        for key in sorted(state[index]):
            value = state[index][key]
            items.append(value if isinstance(value, torch.Tensor) else repr(value).encode())
    return items


def crc_of_items(items: Items, local=lambda t: t, crc: int = 0, kind: str = STATE_HASH) -> int:
    chain = Chain(kind, crc)
    for item in items:
        chain.update(item if isinstance(item, bytes) else tensor_bytes(item, local))
    return chain.value()


def state_checksum(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None, local=lambda t: t,
                   kind: str = STATE_HASH) -> str:
    """``local`` maps a sharded tensor to this rank's shard (FSDP2)."""
    crc = model_crc(model, local, kind=kind)
    if optimizer is not None:
        crc = optimizer_crc(optimizer, local, crc, kind)
    return f"{crc:08x}"


def structure_hash(model: torch.nn.Module) -> int:
    """A 62-bit hash of the parameter names, shapes and dtypes (not values):
    replicas whose hashes differ are not training the same model. For FSDP2
    parameters the shape of this rank's shard counts too."""
    h = hashlib.blake2b(digest_size=8)
    for name, p in model.named_parameters():
        shard = tuple(p.to_local().shape) if hasattr(p, "to_local") else ()
        h.update(f"{name}:{tuple(p.shape)}:{shard}:{p.dtype};".encode())
    return int.from_bytes(h.digest(), "big") >> 2


CHECKSUM_STRIDES = (1, 10, 100, 1000, 10000)

MAX_INPUTS = 512
"""Bytes of a step's recorded inputs sent with its checksum (StepChecksum.inputs):
every heartbeat carries up to one per stride."""


def cap_inputs(inputs: str, limit: int = MAX_INPUTS) -> str:
    """A step's inputs (TrainState.hyperparams(): a JSON list of each param
    group's numeric hyperparameters) cut to at most ``limit`` bytes, still
    valid JSON: the first groups that fit ("" if none does or it is not
    such a list). A divergence is named from the groups sent."""
    if len(inputs) <= limit:
        return inputs
    try:
        groups = json.loads(inputs)
    except ValueError:
        return ""
    if not isinstance(groups, list):
        return ""
    while groups:
        groups.pop()
        text = json.dumps(groups, separators=(",", ":"))
        if len(text) <= limit:
            return text if groups else ""
    return ""


class RecentChecksums(dict):
    """{step: checksum} to report, and ``inputs``: {step: the inputs of the
    step that produced that state} (fthsdp/agent/training/session/membership.py sends both)."""

    def __init__(self, checksums: dict[int, str], inputs: dict[int, str]) -> None:
        super().__init__(checksums)
        self.inputs = inputs


class StridedHistory:
    """The latest checksum at each stride of 1, 10, 100... checksum periods,
    sent with every heartbeat: replicas whose heartbeats sample different
    steps still report some steps in common for the coordinator to compare.
    Each goes with the inputs of the step that produced it (the optimizer's
    hyperparameters), so that the coordinator can say which differ when
    the states do (fthsdp/coordinator/decisions/divergence.py)."""

    def __init__(self, every: int) -> None:
        self.every = every
        self._latest: dict[int, tuple[int, str, str]] = {}

    def record(self, step: int, checksum: str, inputs: str = "") -> RecentChecksums:
        """Note ``checksum`` at ``step``, produced by a step whose inputs were
        ``inputs`` (TrainState.hyperparams(); capped at MAX_INPUTS bytes);
        returns {step: checksum} to report, with ``.inputs``."""
        inputs = cap_inputs(inputs)
        for level in CHECKSUM_STRIDES:
            if step % (self.every * level) == 0:
                self._latest[level] = (step, checksum, inputs)
        latest = self._latest.values()
        return RecentChecksums({s: c for s, c, _ in latest}, {s: i for s, _, i in latest if i})
