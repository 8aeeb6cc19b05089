"""The coordinator's CPU for a host's rank pings: one stream per rank (the ranks' own) against one batch per
host (the agent's relay), measured in the same run.

    python benchmarks/relay_pings.py [--hosts 100,400] [--ranks 8] [--seconds 10] [--interval 1]
    python benchmarks/relay_pings.py --fit 2,8,32,128 [--hosts 300]

One coordinator process (embedded store). A client process registers
``hosts`` replicas of ``ranks`` ranks each (one host each) and, for
``seconds``, sends every rank's ping but rank 0's once per ``interval``,
with progress, at random phases per host:

* **per rank**: as ranks started without the agent's relay do: a
  HeartbeatStream per rank, one message per ping;
* **batched**: as the relay does (fthsdp/agent/node/relay/pings.py): one
  Pings stream per host, one PingBatch per interval holding its ranks'
  pings.

The coordinator's CPU (user + system, from /proc) over the window, as a
share of one core, and its ratio batched / per rank. Rank 0's session and
the Host streams are left out: they are the same either way.

``--fit``: batched only, ``hosts`` batches a second of each size in turn
(the pings of 2, 8, 32, 128 ranks: a host, or a group's hosts gathered by
one of them), and the least-squares line through the coordinator's CPU per
batch: a cost per message (gRPC's, the event loop's) and a cost per ping
(recording it). Whether gathering a group's pings into one message pays
is read from the two.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def ping(pb, host: int, rank: int, step: int):
    return pb.HeartbeatRequest(job="default", replica_id=f"h{host}", shard_rank=rank, step=step,
                               incarnation=f"inc-{host}", progress=pb.Progress(
                                   phase=pb.PHASE_COMPUTE, phase_age_s=0.3, step=step, step_time_s=1.0,
                                   compute_time_s=0.7))


async def client(address: str, hosts: int, ranks: int, seconds: float, interval: float, mode: str) -> dict:
    import grpc

    from fthsdp.protos.v1 import coordinator_pb2 as pb
    from fthsdp.protos.v1 import coordinator_pb2_grpc as pb_grpc

    channel = grpc.aio.insecure_channel(address)
    stub = pb_grpc.CoordinatorStub(channel)
    for h in range(hosts):
        session = (await stub.Register(pb.RegisterRequest(job="default", replica_id=f"h{h}", address=f"h{h}:1",
                                                          world_size=ranks, incarnation=f"inc-{h}"))).session_id
        # One heartbeat of rank 0: the replica is admitted and the quorum settles, so that the decision
        # loop idles through the window instead of polling for a rank 0 that never speaks.
        await stub.Heartbeat(pb.HeartbeatRequest(job="default", replica_id=f"h{h}", session_id=session))
    stop = time.monotonic() + seconds + 2.0  # the parent measures the last ``seconds``
    sent = {"messages": 0, "pings": 0, "refused": 0}

    async def per_rank(h: int, k: int) -> None:
        queue: asyncio.Queue = asyncio.Queue()

        async def requests():
            while (item := await queue.get()) is not None:
                yield item
        call = stub.HeartbeatStream(requests())
        await asyncio.sleep(random.random() * interval)
        step = 0
        while time.monotonic() < stop:
            queue.put_nowait(ping(pb, h, k, step))
            sent["messages"] += 1
            sent["pings"] += 1
            step += 1
            await asyncio.sleep(interval)
        queue.put_nowait(None)
        call.cancel()

    async def batched(h: int) -> None:
        queue: asyncio.Queue = asyncio.Queue()

        async def requests():
            while (item := await queue.get()) is not None:
                yield item
        call = stub.Pings(requests())

        async def refusals():
            async for _ in call:
                sent["refused"] += 1
        reader = asyncio.create_task(refusals())
        await asyncio.sleep(random.random() * interval)
        step = 0
        while time.monotonic() < stop:
            queue.put_nowait(pb.PingBatch(pings=[ping(pb, h, k, step) for k in range(1, ranks)]))
            sent["messages"] += 1
            sent["pings"] += ranks - 1
            step += 1
            await asyncio.sleep(interval)
        queue.put_nowait(None)
        reader.cancel()
        call.cancel()

    tasks = ([per_rank(h, k) for h in range(hosts) for k in range(1, ranks)] if mode == "per-rank"
             else [batched(h) for h in range(hosts)])
    print("registered", flush=True)
    await asyncio.gather(*tasks, return_exceptions=True)
    await channel.close()
    return sent


def run(hosts: int, ranks: int, seconds: float, interval: float, mode: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    coordinator = subprocess.Popen(
        [sys.executable, "-m", "fthsdp", "coordinator", "--bind", "127.0.0.1:0", "--min-replicas", "1",
         "--heartbeat-interval", f"{interval:g}s", "--heartbeat-timeout", "60s", "--heartbeat-budget", "0",
         "--log-level", "warning"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, cwd=ROOT)
    try:
        assert coordinator.stdout is not None
        address = coordinator.stdout.readline().split("listening on ")[1].split()[0]
        proc = subprocess.Popen([sys.executable, __file__, "--client", address, str(hosts), str(ranks), str(seconds),
                                 str(interval), mode], stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "registered"
        time.sleep(2.0)  # every stream open, every phase past
        before, start = cpu_seconds(coordinator.pid), time.monotonic()
        time.sleep(seconds)
        cores = (cpu_seconds(coordinator.pid) - before) / (time.monotonic() - start)
        sent = json.loads(proc.stdout.read().strip().splitlines()[-1])
        proc.wait(timeout=60)
    finally:
        coordinator.terminate()
        coordinator.wait(timeout=30)
    return {"hosts": hosts, "ranks": ranks, "mode": mode, "coordinator_cores": round(cores, 3),
            "pings_per_s": round((ranks - 1) * hosts / interval), **sent}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--client":
        address, hosts, ranks, seconds, interval, mode = sys.argv[2:8]
        out = asyncio.run(client(address, int(hosts), int(ranks), float(seconds), float(interval), mode))
        print(json.dumps(out), flush=True)
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hosts", default="100,400")
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--interval", type=float, default=1.0)
    p.add_argument("--fit", default="", help="batch sizes (pings per message) to fit a cost per message and per "
                                               "ping to, batched only, at the first of --hosts")
    args = p.parse_args()
    if args.fit:
        fit(int(args.hosts.split(",")[0]), [int(n) for n in args.fit.split(",")], args.seconds, args.interval)
        return
    rows = []
    for hosts in (int(h) for h in args.hosts.split(",")):
        pair = {mode: run(hosts, args.ranks, args.seconds, args.interval, mode) for mode in ("per-rank", "batched")}
        for row in pair.values():
            print(json.dumps(row), flush=True)
        rows.append(pair)
    print()
    print("| hosts | ranks per host | pings/s | coordinator CPU, per rank (cores) | coordinator CPU, batched (cores) | "
          "batched / per rank | refused |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for pair in rows:
        a, b = pair["per-rank"], pair["batched"]
        ratio = b["coordinator_cores"] / a["coordinator_cores"] if a["coordinator_cores"] else float("nan")
        print(f"| {a['hosts']} | {a['ranks']} | {a['pings_per_s']} | {a['coordinator_cores']:.3f} | "
              f"{b['coordinator_cores']:.3f} | {ratio:.2f} | {a['refused'] + b['refused']} |")


def fit(hosts: int, sizes: list[int], seconds: float, interval: float) -> None:
    rows = []
    for n in sizes:
        row = run(hosts, n + 1, seconds, interval, "batched")  # rank 0 pings on its session: n others
        per_batch = row["coordinator_cores"] * interval / hosts
        rows.append((n, per_batch, row))
        print(json.dumps({**row, "pings_per_batch": n, "cpu_per_batch_us": round(per_batch * 1e6, 1)}), flush=True)
    xs, ys = [float(n) for n, _, _ in rows], [y for _, y, _ in rows]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    fixed = my - slope * mx
    print()
    print(f"{hosts} batches a second, {seconds:g} s each:")
    print()
    print("| pings per batch | coordinator CPU (cores) | CPU per batch | fit: per message + per ping |")
    print("|---:|---:|---:|---:|")
    for n, y, row in rows:
        print(f"| {n} | {row['coordinator_cores']:.3f} | {y * 1e6:.0f} µs | {(fixed + slope * n) * 1e6:.0f} µs |")
    print()
    print(f"per message {fixed * 1e6:.0f} µs, per ping {slope * 1e6:.1f} µs")


if __name__ == "__main__":
    main()
