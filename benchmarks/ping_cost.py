"""A rank's ping in a batch, whole and in a digest, against the same ping taken as a heartbeat, in process.

    python benchmarks/ping_cost.py [--ranks 128] [--batches 2000] [--trials 3]

At thousands of hosts the coordinator's CPU is the ranks' pings (one per
rank per interval: benchmarks/README.md, "the tree"). A group's batch of
``--ranks`` - 1 pings (every rank but rank 0, with its progress) is parsed
and taken ``--batches`` times by a leading coordinator runtime with no
gRPC, two ways, alternately, in one process:

* **as a heartbeat**: each ping checked as any heartbeat is
  (``validation.check_heartbeat``) and taken by ``runtime.heartbeat``, which
  answers it (what a rank's own HeartbeatStream ping costs, and what a
  batched ping cost before);
* **batched**: each checked for what is read of it
  (``validation.check_rank_ping``) and taken without an answer
  (``runtime.batched_rank_ping``): the Pings call's path for a ping sent
  whole (to an older coordinator, or one a digest cannot carry);
* **in a digest**: the same pings as one ``RankDigest``, in columns
  (fthsdp/core/rank_digest.py), checked (``validation.check_rank_digest``)
  and taken (``runtime.batched_rank_digest``) once for the group: what the
  relay sends a coordinator that reads digests.

Prints the microseconds per ping of each, the best of ``--trials``, and
their ratios to the heartbeat path.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def batch_of(pb, ranks: int, digests: bool = False) -> bytes:
    from fthsdp.core import rank_digest

    batch = pb.PingBatch(job="default", hosts=[f"g0-h{k}" for k in range(max(1, ranks // 8))])
    for rank in range(1, ranks):
        batch.pings.append(pb.HeartbeatRequest(
            job="default", replica_id="g0", shard_rank=rank, step=5, incarnation="inc-1",
            progress=pb.Progress(phase=pb.PHASE_COMPUTE, phase_age_s=0.3, step=5, step_time_s=1.0,
                                 compute_time_s=0.7)))
    if digests:
        columns, whole = rank_digest.encode(batch.pings)
        assert not whole
        del batch.pings[:]
        batch.digests.extend(columns)
    return batch.SerializeToString()


async def measure(ranks: int, batches: int, trials: int) -> dict[str, float]:
    from fthsdp.coordinator import validation
    from fthsdp.coordinator.config import CoordinatorConfig
    from fthsdp.coordinator.engine.runtime import CoordinatorRuntime
    from fthsdp.coordinator.store.memory import MemoryStore
    from fthsdp.protos.v1 import coordinator_pb2 as pb

    runtime = CoordinatorRuntime(CoordinatorConfig(min_replicas=1, join_settle=0.0), MemoryStore(), "c:1")
    runtime.leading = True
    await runtime.register(pb.RegisterRequest(job="default", replica_id="g0", address="g0:1", world_size=ranks,
                                              agent_ids=["agent-g0"], incarnation="inc-1"))
    raw, raw_digests = batch_of(pb, ranks), batch_of(pb, ranks, digests=True)

    def as_heartbeats() -> None:
        checked: set[str] = set()
        for ping in pb.PingBatch.FromString(raw).pings:
            validation.check_heartbeat(ping, checked)
            runtime.heartbeat(ping, batched=True, counted=False)

    def batched() -> None:
        checked: set[str] = set()
        for ping in pb.PingBatch.FromString(raw).pings:
            validation.check_rank_ping(ping, checked)
            runtime.batched_rank_ping(ping)

    def in_digests() -> None:
        checked: set[str] = set()
        for digest in pb.PingBatch.FromString(raw_digests).digests:
            validation.check_rank_digest(digest, checked)
            runtime.batched_rank_digest(digest)

    ways = (("as a heartbeat", as_heartbeats), ("batched", batched), ("in a digest", in_digests))
    best = {name: float("inf") for name, _ in ways}
    for _ in range(trials):
        for name, take in ways:
            start = time.perf_counter()
            for _ in range(batches):
                take()
            best[name] = min(best[name], (time.perf_counter() - start) / batches / (ranks - 1) * 1e6)
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=128, help="ranks of the group (its batch: all but rank 0)")
    p.add_argument("--batches", type=int, default=2000)
    p.add_argument("--trials", type=int, default=3)
    args = p.parse_args()
    if args.ranks < 2:
        p.error("--ranks: at least 2 (rank 0 heartbeats on its session, not in a batch)")
    best = asyncio.run(measure(args.ranks, args.batches, args.trials))
    base = best["as a heartbeat"]
    print("| pings per batch | as a heartbeat | batched | in a digest | batched / heartbeat | digest / heartbeat |")
    print("|---:|---:|---:|---:|---:|---:|")
    print(f"| {args.ranks - 1} | {base:.2f} µs | {best['batched']:.2f} µs | {best['in a digest']:.2f} µs | "
          f"{best['batched'] / base:.2f} | {best['in a digest'] / base:.2f} |")


if __name__ == "__main__":
    main()
