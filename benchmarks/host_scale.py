"""The coordinator's own cost at the real shape: groups of hosts of 8 ranks.

    python benchmarks/host_scale.py [--hosts 1000,4000,12500] [--hosts-per-group 16] [--ranks 8]
        [--seconds 5] [--shape tree|host] [--json FILE]

In process, on the memory store and a fake clock, with no gRPC: the
coordinator's runtime (fthsdp/coordinator/engine/runtime.py) driven as the
agents' relays drive it (fthsdp/agent/node/relay/). Every host of a group
has a Host stream (hello, join, heartbeats), every group one replica of
``hosts-per-group x ranks`` ranks: rank 0 heartbeats on its session with
progress, and the other ranks' pings come in one of two shapes:

* ``tree`` (the default: what the agents send now): one ``PingBatch`` per
  group per interval, as its host 0's relay sends it, naming every host of
  the group (their heartbeats) with the ranks' pings in one digest
  (fthsdp/core/rank_digest.py), each parsed from its bytes and taken by
  the servicer's own ``take_batch``, as a Pings stream takes it;
* ``host``: every rank's ping as its own request, coalesced per host, and
  a Host-stream heartbeat per host (before the tree and the digests).

At each size it measures, on this process's CPU clock:

* **joining**: every group registered and every host's round complete;
* **steady state**, per second of the job at the pace the coordinator sets
  for that many senders: every ping, session heartbeat and host heartbeat
  of one interval, and the decision loop's ticks (10 a second): CPU
  seconds per second of job, i.e. cores;
* **a host lost**: from its stream closing to the group's round ended,
  the quorum without the group decided, stored and applied (the
  coordinator's part of "every surviving host told"), and the bytes of
  the Watch event each surviving host is sent (one Watch per host under
  the agent's relay);
* the heartbeat interval and timeout the pacer sets for that many senders.

What this leaves out is the gRPC layer: the cost per message and per
stream of the asyncio server, measured apart by benchmarks/coordinator_scale.py
(one-rank replicas) and added in benchmarks/README.md as an estimate.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fthsdp.coordinator.config import CoordinatorConfig  # noqa: E402
from fthsdp.coordinator.engine.runtime import CoordinatorRuntime  # noqa: E402
from fthsdp.coordinator.serving.servicer import CoordinatorServicer  # noqa: E402
from fthsdp.coordinator.store.memory import MemoryStore  # noqa: E402
from fthsdp.core import rank_digest  # noqa: E402
from fthsdp.protos.v1 import coordinator_pb2 as pb  # noqa: E402

TICKS_PER_SECOND = 10


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def progress(step: int, age: float) -> pb.Progress:
    return pb.Progress(phase=pb.PHASE_COMPUTE, phase_age_s=age, step=step, step_time_s=1.0, compute_time_s=0.7)


class Job:
    """One job of ``groups`` groups of ``per_group`` hosts of ``ranks`` ranks, in one runtime."""

    def __init__(self, groups: int, per_group: int, ranks: int, shape: str = "tree") -> None:
        self.groups, self.per_group, self.ranks, self.shape = groups, per_group, ranks, shape
        self.clock = Clock()
        config = CoordinatorConfig(min_replicas=1, join_settle=0.0, heartbeat_timeout=10.0)
        self.runtime = CoordinatorRuntime(config, MemoryStore(), "bench:1", clock=self.clock, wall=time.time)
        self.runtime.leading = True
        self.job = self.runtime.jobs["default"]
        self.sessions: dict[str, str] = {}
        self.connections: dict[str, int] = {}
        self.pushed = 0
        self.servicer = CoordinatorServicer(self.runtime, 1 << 22)
        self.batches: list[bytes] = []
        """The tree: each group's batch as its host 0's relay sends it (the ranks' progress as of step 1)."""
        self.senders: list[set[str]] = [set() for _ in range(groups)]
        """The tree: each group's Pings stream's jobs (the servicer's)."""

    def group(self, g: int) -> str:
        return f"g{g}"

    def host(self, g: int, n: int) -> str:
        return f"g{g}-h{n}"

    def _push(self, message) -> None:
        self.pushed += 1

    async def join(self) -> None:
        table = self.job.hosts
        for g in range(self.groups):
            rid = self.group(g)
            for n in range(self.per_group):
                hello = pb.HostHello(job="default", host_id=self.host(g, n), replica_id=rid, replica_rank=g,
                                     num_replicas=self.groups, nnodes=self.per_group, nproc=self.ranks,
                                     incarnation=f"agent-{g}-{n}", address=f"10.{g // 250}.{g % 250}.{n}")
                self.connections[self.host(g, n)] = table.hello(hello, self._push, self.clock())
            for n in range(self.per_group):
                table.join(self.host(g, n), 1, f"10.0.0.{n}:7000", self.clock())
            reply = await self.runtime.register(pb.RegisterRequest(
                job="default", replica_id=rid, address=f"{rid}:1", world_size=self.per_group * self.ranks,
                incarnation=f"inc-{g}", agent_ids=[f"agent-{g}-{n}" for n in range(self.per_group)]))
            self.sessions[rid] = reply.session_id
            self.batches.append(self._batch(g))
        self.beat_all(step=0)
        self.clock.t += 0.5
        await self.runtime.evaluate(self.job)

    def _batch(self, g: int) -> bytes:
        rid = self.group(g)
        pings = [pb.HeartbeatRequest(job="default", replica_id=rid, shard_rank=k, step=1, incarnation=f"inc-{g}",
                                     progress=progress(1, 0.3)) for k in range(1, self.per_group * self.ranks)]
        digests, whole = rank_digest.encode(pings)
        batch = pb.PingBatch(job="default", hosts=[self.host(g, n) for n in range(self.per_group)],
                             digests=digests, pings=whole)
        return batch.SerializeToString()

    def beat_all(self, step: int) -> int:
        """One interval's heartbeats of every sender; returns how many."""
        runtime, now, count = self.runtime, self.clock(), 0
        for g in range(self.groups):
            rid = self.group(g)
            runtime.heartbeat(pb.HeartbeatRequest(job="default", replica_id=rid, session_id=self.sessions[rid],
                                                  step=step, progress=progress(step, 0.3)))
            count += self.per_group * self.ranks + self.per_group
            if self.shape == "tree":
                refused = self.servicer.take_batch(pb.PingBatch.FromString(self.batches[g]), self.senders[g])
                assert not refused, refused[0].details
                continue
            for k in range(1, self.per_group * self.ranks):
                runtime.heartbeat(pb.HeartbeatRequest(job="default", replica_id=rid, shard_rank=k, step=step,
                                                      incarnation=f"inc-{g}", progress=progress(step, 0.3)),
                                  batched=True)  # in its host's batch, as the relay sends it
            for n in range(self.per_group):
                self.job.hosts.beat(self.host(g, n), now)
        return count

    async def tick(self) -> None:
        decisions = self.runtime.decisions
        job = self.job
        job.hosts.tick(self.clock(), job.pacer.current.timeout)
        await decisions.evaluate(job)


async def measure(hosts: int, per_group: int, ranks: int, seconds: float, shape: str = "tree") -> dict:
    groups = max(1, hosts // per_group)
    job = Job(groups, per_group, ranks, shape)
    cpu = time.process_time()
    await job.join()
    joined = time.process_time() - cpu
    members = len(job.job.state.quorum.members) if job.job.state.quorum else 0
    # Let the pacer settle at this many senders.
    for _ in range(3):
        job.clock.t += 1.0
        job.beat_all(step=1)
        await job.tick()
    interval, timeout = job.job.pacer.current.interval, job.job.pacer.current.timeout
    # Steady state: ``seconds`` of job time, the heartbeats of each interval and 10 ticks a second.
    cpu, beats, step = time.process_time(), 0, 2
    elapsed, next_beat = 0.0, 0.0
    while elapsed < seconds:
        if elapsed >= next_beat:
            beats += job.beat_all(step)
            step += 1
            next_beat += interval
        job.clock.t += 1.0 / TICKS_PER_SECOND
        elapsed += 1.0 / TICKS_PER_SECOND
        await job.tick()
    steady = (time.process_time() - cpu) / seconds
    # A host lost: its stream closes; its group's round ends; the quorum drops the group.
    victim_group = groups - 1
    victim = job.host(victim_group, 1)
    cpu = time.process_time()
    pushed_before = job.pushed
    job.job.hosts.closed(victim, job.connections[victim], job.clock())
    job.runtime.agent_event(pb.AgentEventRequest(job="default", replica_id=job.group(victim_group),
                                                 state=pb.AGENT_STATE_FAILED, restart_count=0,
                                                 agent_id=f"agent-{victim_group}-1"))
    await job.tick()
    lost = time.process_time() - cpu
    dropped = job.group(victim_group) not in (job.job.state.quorum.member_ids if job.job.state.quorum else ())
    sample = job.job.state.watch_event(job.group(0), "")
    return {
        "hosts": groups * per_group, "groups": groups, "ranks": groups * per_group * ranks, "members": members,
        "join_cpu_s": round(joined, 3), "interval_s": interval, "timeout_s": timeout,
        "heartbeats_per_s": round(beats / seconds), "steady_cores": round(steady, 3),
        # Per interval, one session heartbeat per group, and the tree's one batch per group, or one ping batch
        # and one Host-stream heartbeat per host: the gRPC messages the coordinator takes.
        "shape": shape,
        "messages_per_s": round((2 * groups if shape == "tree" else groups + 2 * groups * per_group) / interval),
        "host_lost_cpu_ms": round(lost * 1000, 1), "group_dropped": dropped,
        "host_pushes": job.pushed - pushed_before,
        "watch_event_bytes": len(sample.SerializeToString()),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hosts", default="1000,4000,12500")
    p.add_argument("--hosts-per-group", type=int, default=16)
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--shape", choices=("tree", "host"), default="tree")
    p.add_argument("--json", default="")
    args = p.parse_args()
    rows = []
    for hosts in (int(h) for h in args.hosts.split(",")):
        row = asyncio.run(measure(hosts, args.hosts_per_group, args.ranks, args.seconds, args.shape))
        rows.append(row)
        print(json.dumps(row), flush=True)
    print()
    print("| shape | hosts | groups | ranks | interval / timeout | heartbeats/s (ranks and hosts) | gRPC messages/s | "
          "steady cores (in process) | per heartbeat | join CPU | host lost: coordinator CPU | group dropped | "
          "host pushes |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|")
    for r in rows:
        per = r["steady_cores"] / max(r["heartbeats_per_s"], 1) * 1e6
        print(f"| {r['shape']} | {r['hosts']} | {r['groups']} | {r['ranks']} | "
              f"{r['interval_s']:g} s / {r['timeout_s']:g} s | "
              f"{r['heartbeats_per_s']} | {r['messages_per_s']} | {r['steady_cores']:.3f} | {per:.0f} µs | "
              f"{r['join_cpu_s']:.1f} s | {r['host_lost_cpu_ms']:.0f} ms | {r['group_dropped']} | "
              f"{r['host_pushes']} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
