"""A rank's ping in a batch against the same ping taken as a heartbeat, in process.

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
  (``runtime.batched_rank_ping``): the Pings call's path.

Prints the microseconds per ping of each, the best of ``--trials``, and
their ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def batch_of(pb, ranks: int) -> bytes:
    batch = pb.PingBatch(job="default", hosts=[f"g0-h{k}" for k in range(max(1, ranks // 8))])
    for rank in range(1, ranks):
        batch.pings.append(pb.HeartbeatRequest(
            job="default", replica_id="g0", shard_rank=rank, step=5, incarnation="inc-1",
            progress=pb.Progress(phase=pb.PHASE_COMPUTE, phase_age_s=0.3, step=5, step_time_s=1.0,
                                 compute_time_s=0.7)))
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
    raw = batch_of(pb, ranks)

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

    best = {"as a heartbeat": float("inf"), "batched": float("inf")}
    for _ in range(trials):
        for name, take in (("as a heartbeat", as_heartbeats), ("batched", batched)):
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
    print("| pings per batch | as a heartbeat | batched | batched / as a heartbeat |")
    print("|---:|---:|---:|---:|")
    print(f"| {args.ranks - 1} | {best['as a heartbeat']:.2f} µs | {best['batched']:.2f} µs | "
          f"{best['batched'] / best['as a heartbeat']:.2f} |")


if __name__ == "__main__":
    main()
