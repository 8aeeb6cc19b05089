"""The control plane at the real shape, over gRPC: groups of hosts of 8 ranks, as the agents' relays speak.

    python benchmarks/control_plane.py [--hosts 1000,4000,12500] [--hosts-per-group 16] [--ranks 8]
        [--clients 3] [--seconds 20] [--heartbeat-timeout 10s] [--start-rate 2000]
        [--shape host|folded|tree] [--pings digest|whole] [--json FILE]

Two coordinator processes on one private etcd (one leads, one follows), and
``--clients`` processes that simulate the hosts. Each simulated host does
what a host's agent and its relay (fthsdp/agent/node/relay/) send upstream,
on one connection of its own:

* a Host stream: hello, a join of each round, a heartbeat at the interval
  the coordinator sets (fthsdp/agent/node/host_link.py), left out while a
  batch names the host (``--shape``: fthsdp/agent/node/relay/host_beats.py);
* one Watch, shared by its ranks (the relay's fan-out): every event parsed;
* one Pings stream: its ranks' pings with their progress, one batch per
  heartbeat interval (fthsdp/agent/node/relay/pings.py), in columns
  (``--pings digest``, fthsdp/core/rank_digest.py) or a HeartbeatRequest each;
* node rank 0 only: its group's rank 0 Session (register, heartbeats with
  progress, each asking for an answer as a member's does for its lease:
  the heartbeat latency; until 2026-12-07 a tenth of them did).

The ranks are counters: no training, no torch. Ranks step in lockstep on the
shared CLOCK_MONOTONIC (1 s steps, computing 0.6-0.8 s, then in the
all-reduce), as benchmarks/coordinator_scale.py does.

At each size, in order:

1. **join**: from the clients' start until every host's Watch shows its group
   in a quorum of every group;
2. **steady state** over ``--seconds``: the leading coordinator's CPU (user +
   system from /proc, as a share of one core), the clients' CPU, heartbeat
   p50/p99 (the Session answers), messages sent;
3. **a host lost**: one host of the last group closes its connection. From
   then until every host of every other group has a Watch event of the
   quorum without that group ("every surviving host told"), and until every
   other host of its group was pushed the round's end ("its group stopped");
   the Watch bytes pushed for the change, per surviving host;
4. **failover**: the leading coordinator is SIGKILLed. From then until every
   host has been welcomed on its Host stream by the other coordinator, and
   whether any healthy group left the quorum meanwhile (the quorum's member
   count every host sees, and the coordinator's taken-out counter).

All clocks are CLOCK_MONOTONIC, shared by the processes. The clients share
the machine's cores with the coordinators and etcd: where the clients' own
loop lags (reported), latencies include the harness's delay.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.control_plane_hosts import SHAPES  # noqa: E402 - after the path

# ----- the parent ------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def scrape(url: str) -> dict[str, float]:
    """The metrics at ``url``; nothing while the coordinator does not answer (it died, or is too busy)."""
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            lines = r.read().decode().splitlines()
    except OSError as e:
        print(f"  (no metrics from {url}: {e})", file=sys.stderr, flush=True)
        return {}
    return {line.split(" ")[0]: float(line.split(" ")[1]) for line in lines if line and not line.startswith("#")}


def start_coordinator(store: str, timeout: str, env: dict, log: Path | None) -> tuple[subprocess.Popen, str, str]:
    with open(log, "w") if log else open(os.devnull, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "fthsdp", "coordinator", "--bind", "127.0.0.1:0", "--metrics-port", "0",
             "--store", store, "--min-replicas", "1", "--heartbeat-timeout", timeout,
             "--log-level", "info" if log else "warning"],
            stdout=subprocess.PIPE, stderr=out, text=True, env=env, cwd=ROOT)
    line = proc.stdout.readline()
    return proc, line.split("listening on ")[1].split()[0], line.split("metrics on ")[1].split()[0]


def leads(metrics: str) -> bool:
    try:
        with urllib.request.urlopen(metrics.replace("/metrics", "/api/status?limit=0"), timeout=10) as r:
            return bool(json.loads(r.read()).get("leading"))
    except OSError:
        return False


def leader_of(coordinators: list[tuple[subprocess.Popen, str, str]], deadline: float) -> int:
    while time.monotonic() < deadline:
        for k, (_, _, metrics) in enumerate(coordinators):
            if leads(metrics):
                return k
        time.sleep(0.5)
    raise RuntimeError("no coordinator leads")


def wait_until(what, deadline: float, every: float = 0.5) -> bool:
    while time.monotonic() < deadline:
        if what():
            return True
        time.sleep(every)
    return False


def run(hosts: int, per_group: int, ranks: int, clients: int, seconds: float, timeout: str,
        start_rate: float, logs: Path | None = None, shape: str = "folded", pings: str = "digest") -> dict:
    from fthsdp.testing.local_etcd import EtcdServer

    groups = max(2, hosts // per_group)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    etcd = EtcdServer()
    etcd.start()
    coordinators = [start_coordinator(etcd.url, timeout, env, logs / f"coordinator-{hosts}-{k}.log" if logs else None)
                    for k in range(2)]
    procs: list[subprocess.Popen] = []
    try:
        leader = leader_of(coordinators, time.monotonic() + 30)
        addresses = ",".join(address for _, address, _ in coordinators)
        per = [groups // clients + (1 if k < groups % clients else 0) for k in range(clients)]
        first, started = 0, time.monotonic()
        for count in per:
            procs.append(subprocess.Popen(
                [sys.executable, __file__, "--client", addresses, str(first), str(count), str(groups),
                 str(per_group), str(ranks), str(start_rate / clients), shape, pings],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT))
            first += count
        for p in procs:
            assert json.loads(p.stdout.readline())["ready"]

        def command(p: subprocess.Popen, line: str) -> dict:
            p.stdin.write(line + "\n")
            p.stdin.flush()
            return json.loads(p.stdout.readline())

        metrics = coordinators[leader][2]
        healthy = 'fthsdp_replicas{job="default",state="healthy"}'
        joined = wait_until(lambda: scrape(metrics).get(healthy, 0) >= groups, started + 120 + hosts / 10, 1.0)
        join_time = time.monotonic() - started
        pid = coordinators[leader][0].pid
        interval = scrape(metrics).get('fthsdp_heartbeat_interval_seconds{job="default"}', float("nan"))
        time.sleep(max(3.0, 2 * interval))  # the heartbeats settle into the paced rhythm
        sent0 = sum(command(p, "sent")["sent"] for p in procs)
        t0, c0, k0 = time.monotonic(), cpu_seconds(pid), sum(cpu_seconds(p.pid) for p in procs)
        time.sleep(seconds)
        t1, c1, k1 = time.monotonic(), cpu_seconds(pid), sum(cpu_seconds(p.pid) for p in procs)
        sent1 = sum(command(p, "sent")["sent"] for p in procs)
        # A host lost: host 1 of the last group (its group's round ends, the group leaves the quorum).
        victim_group = groups - 1
        lost_at = command(procs[-1], f"lose g{victim_group}-h1")["lost_at"]
        time.sleep(max(5.0, 3 * interval))
        # Failover: the leader SIGKILLed; every host must come back on the other coordinator.
        taken_before = sum(v for k, v in scrape(metrics).items() if k.startswith("fthsdp_replicas_taken_out_total"))
        killed_at = time.monotonic()
        coordinators[leader][0].send_signal(signal.SIGKILL)
        coordinators[leader][0].wait()
        other = coordinators[1 - leader][2]
        wait_until(lambda: leads(other), killed_at + 60)

        def every_host_back() -> bool:
            counts = [command(p, f"back {killed_at}") for p in procs]
            return sum(c["back"] for c in counts) >= sum(c["of"] for c in counts) - per_group  # the lost group's
        wait_until(every_host_back, killed_at + 60 + hosts / 20, 1.0)
        time.sleep(max(5.0, 3 * interval))  # then any group the new leader drops would show
        after = scrape(other)
        taken_after = sum(v for k, v in after.items() if k.startswith("fthsdp_replicas_taken_out_total"))
        settled_at = time.monotonic()  # stopping the clients next closes their streams: groups leave then
        results = [command(p, "stop") for p in procs]
    finally:
        for p in procs:
            p.kill()
        for proc, _, _ in coordinators:
            proc.kill()
            proc.wait()
        etcd.stop()
    return summarize(results, groups, per_group, ranks, victim_group, started, join_time, joined,
                     (t0, t1, c1 - c0, k1 - k0, sent1 - sent0), lost_at, killed_at, interval,
                     (taken_before, taken_after, after.get(healthy, 0), settled_at))


def summarize(results: list[dict], groups: int, per_group: int, ranks: int, victim_group: int, started: float,
              join_time: float, joined: bool, steady: tuple, lost_at: float, killed_at: float, interval: float,
              taken: tuple) -> dict:
    t0, t1, cpu, client_cpu, sent = steady
    hosts = {k: v for r in results for k, v in r["hosts"].items()}
    latencies = sorted(lat for r in results for start, lat in r["latencies"] if t0 <= start <= t1)
    victim = f"g{victim_group}-h1"
    # Every surviving host told: its first Watch event after the loss of a quorum of groups - 1.
    told, change_bytes = [], 0
    for h in hosts.values():
        if h["group"] == victim_group:
            continue
        after = [e for e in h["events"] if lost_at <= e[0] < killed_at]
        hit = next((e for e in after if e[2] == groups - 1), None)
        if hit is not None:
            told.append(hit[0] - lost_at)
            change_bytes += sum(e[4] for e in after if e[0] <= hit[0])
    stopped = [h["ended"][0] - lost_at for hid, h in hosts.items()
               if h["group"] == victim_group and hid != victim and h["ended"]]
    # Every host back on the new leader: its first welcome after the kill.
    survivors = [h for h in hosts.values() if h["group"] != victim_group]
    back = [min((t for t, _ in h["welcomed"] if t > killed_at), default=float("inf")) - killed_at for h in survivors]
    # A quorum without a healthy group, from the kill until the measurement ended (not the clients' stop).
    shrank = [e for h in survivors for e in h["events"] if killed_at < e[0] < taken[3] and e[2] and e[2] < groups - 1]
    n = len(survivors)
    # Joined: every host's Watch shows a quorum of every group (the healthy gauge polled above says when to go on).
    first_full = [min((e[0] for e in h["events"] if e[2] == groups and e[0] < lost_at), default=float("inf"))
                  for h in hosts.values()]
    if max(first_full) < float("inf"):
        join_time = max(first_full) - started
    return {
        "hosts": groups * per_group, "groups": groups, "ranks": groups * per_group * ranks,
        "joined": joined, "join_s": round(join_time, 1), "interval_s": interval,
        "cores": round(cpu / (t1 - t0), 3), "client_cores": round(client_cpu / (t1 - t0), 3),
        "messages_per_s": round(sent / (t1 - t0)),
        "p50_ms": round(latencies[len(latencies) // 2] * 1e3, 1) if latencies else None,
        "p99_ms": round(latencies[int(len(latencies) * 0.99)] * 1e3, 1) if latencies else None,
        "acks": len(latencies),
        "told_s": round(max(told), 3) if len(told) == n else None, "told": len(told), "survivors": n,
        "group_stopped_s": round(max(stopped), 3) if len(stopped) == per_group - 1 else None,
        "bytes_per_host": round(change_bytes / max(len(told), 1)),
        "failover_back_s": round(max(back), 2) if back and max(back) < float("inf") else None,
        "failover_back": sum(b < float("inf") for b in back),
        "failover_taken_out": taken[1] if taken[1] is not None else None,
        "failover_healthy": taken[2], "failover_quorum_shrank": len(shrank),
        "reconnects": sum(r["reconnects"] for r in results),
        "errors": {k: sum(r["errors"].get(k, 0) for r in results) for r in results for k in r["errors"]},
        "refused_pings": sum(r["refused"] for r in results),
        "error_samples": {k: v for r in results for k, v in r["details"].items()},
        "client_lag_s": max(r["loop_lag"] for r in results),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hosts", default="1000,4000,12500")
    p.add_argument("--hosts-per-group", type=int, default=16)
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--clients", type=int, default=3)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--heartbeat-timeout", default="10s")
    p.add_argument("--json", default="")
    p.add_argument("--coordinator-logs", type=Path, help="write each coordinator's log (level info) to DIR")
    p.add_argument("--start-rate", type=float, default=2000.0,
                   help="hosts started per second, all clients together (default 2000)")
    p.add_argument("--shape", default="folded", help="how a host's heartbeats go: " + "; ".join(
        f"{name}: {what}" for name, what in SHAPES.items()) + " (default folded, as the agents send them)")
    p.add_argument("--pings", default="digest", help="how a batch carries its ranks' pings: digest (in columns, "
                   "fthsdp/core/rank_digest.py, as the relays send them) or whole (a HeartbeatRequest each)")
    p.add_argument("--client", nargs=9, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.client:
        addresses, first, count, groups, per_group, ranks, rate, shape, pings = args.client
        from benchmarks.control_plane_hosts import client_main

        asyncio.run(client_main(addresses.split(","), int(first), int(count), int(groups), int(per_group),
                                int(ranks), float(rate), shape, pings))
        return
    if args.shape not in SHAPES:
        p.error(f"--shape {args.shape!r}: one of {', '.join(SHAPES)}")
    if args.pings not in ("digest", "whole"):
        p.error(f"--pings {args.pings!r}: digest or whole")
    rows = []
    for hosts in (int(h) for h in args.hosts.split(",")):
        row = run(hosts, args.hosts_per_group, args.ranks, args.clients, args.seconds, args.heartbeat_timeout,
                  args.start_rate, args.coordinator_logs, args.shape, args.pings)
        row["shape"] = f"{args.shape}, {args.pings}"
        rows.append(row)
        print(json.dumps(row), flush=True)
    print()
    print("| shape | hosts | groups | ranks | join | interval | coordinator cores | clients' cores | messages/s | "
          "heartbeat p50 / p99 | host lost → every surviving host told | → its group stopped | bytes per host | "
          "failover: every host back | healthy groups dropped | clients' worst lag |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        def secs(v, n=None, of=None):
            return f"{v:.2f} s" if v is not None else f"{n} of {of}"
        dropped = int(r["groups"] - 1 - r["failover_healthy"])
        joined = "" if r["joined"] else " (not all)"
        print(f"| {r['shape']} | {r['hosts']} | {r['groups']} | {r['ranks']} | {r['join_s']:.0f} s{joined}"
              f" | {r['interval_s']:g} s | {r['cores']:.2f} | {r['client_cores']:.2f} | {r['messages_per_s']} | "
              f"{r['p50_ms']} / {r['p99_ms']} ms | {secs(r['told_s'], r['told'], r['survivors'])} | "
              f"{secs(r['group_stopped_s'])} | {r['bytes_per_host']} | "
              f"{secs(r['failover_back_s'], r['failover_back'], r['survivors'])} | "
              f"{max(dropped, 0)} ({r['failover_quorum_shrank']} smaller quorums seen) | {r['client_lag_s']:.2f} s |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
