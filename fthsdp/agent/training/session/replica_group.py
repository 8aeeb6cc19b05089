"""Control collectives among the ranks of one replica group.

The ranks of an FSDP replica group must take the same decisions at the same
step boundaries (drain, snapshot, how far a catch-up replays). They agree
over a gloo group of their own, created next to the training script's
default group (which may be NCCL, on which CPU tensors cannot travel). For a
replica group of one rank every operation is local.
"""

from __future__ import annotations

import datetime
import json

import torch
import torch.distributed as dist

MAX_ADDRESS = 255


class ReplicaGroup:
    def __init__(self, shard_rank: int, shard_count: int, timeout: float) -> None:
        self.rank = shard_rank
        self.size = shard_count
        self.pg: dist.ProcessGroup | None = None
        if shard_count > 1:
            pg = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout))
            assert isinstance(pg, dist.ProcessGroup)  # every rank is a member (not GroupMember.NON_GROUP_MEMBER)
            self.pg = pg

    def max(self, *values: int) -> list[int]:
        return self._reduce(values, dist.ReduceOp.MAX)

    def min(self, *values: int) -> list[int]:
        return self._reduce(values, dist.ReduceOp.MIN)

    def _reduce(self, values, op) -> list[int]:
        if self.pg is None:
            return list(values)
        t = torch.tensor(values, dtype=torch.int64)
        dist.all_reduce(t, op=op, group=self.pg)
        return [int(x) for x in t]

    def broadcast_json(self, obj: object = None) -> object:
        """Rank 0's ``obj`` on every rank."""
        if self.pg is None:
            return obj
        data = json.dumps(obj).encode() if self.rank == 0 else b""
        length = torch.tensor([len(data)], dtype=torch.int64)
        dist.broadcast(length, group_src=0, group=self.pg)
        if self.rank == 0:
            payload = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        else:
            payload = torch.empty(int(length), dtype=torch.uint8)
        dist.broadcast(payload, group_src=0, group=self.pg)
        return json.loads(bytes(payload.numpy()))

    def all_gather_strings(self, text: str) -> list[str]:
        if self.pg is None:
            return [text]
        raw = text.encode()
        if len(raw) > MAX_ADDRESS:
            raise ValueError(f"{text!r} is longer than {MAX_ADDRESS} bytes")
        mine = torch.zeros(MAX_ADDRESS + 1, dtype=torch.uint8)
        mine[0] = len(raw)
        mine[1 : 1 + len(raw)] = torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else mine[1:1]
        parts = [torch.zeros_like(mine) for _ in range(self.size)]
        dist.all_gather(parts, mine, group=self.pg)
        return [bytes(p[1 : 1 + int(p[0])].numpy()).decode() for p in parts]

    def all_gather_int(self, value: int) -> list[int]:
        if self.pg is None:
            return [value]
        parts = [torch.zeros(1, dtype=torch.int64) for _ in range(self.size)]
        dist.all_gather(parts, torch.tensor([value], dtype=torch.int64), group=self.pg)
        return [int(p) for p in parts]

    def all_gather_ints(self, values: list[int]) -> list[list[int]]:
        """Every rank's ``values`` (the same length on every rank), by rank."""
        if self.pg is None:
            return [list(values)]
        mine = torch.tensor(values, dtype=torch.int64)
        parts = [torch.zeros_like(mine) for _ in range(self.size)]
        dist.all_gather(parts, mine, group=self.pg)
        return [[int(x) for x in p] for p in parts]
