"""The coordinator under many replicas: heartbeat latency, coordinator CPU,
how fast a failure reaches every survivor, and quorum formation.

    python benchmarks/coordinator_scale.py [--replicas 100,1000,10000] [--clients 4] [--seconds 10] [--budget 5000]
        [--calls session|separate] [--per-connection 1] [--coordinator-logs DIR] [--progress real,no-compute,none]

One coordinator process (embedded store, default settings but for the
heartbeat flags below). ``--clients`` processes simulate the replicas with
gRPC asyncio clients, talking to it as the agents do: each replica opens
one Session call (``--calls separate``: Register, Watch and HeartbeatStream,
three calls), registers on it, is pushed the quorum and its place in it (no
member list) and heartbeats on it at the interval the coordinator asks for
(1 s, stretched past ``--budget`` heartbeats/s; 0 keeps 1 Hz whatever the
count), random phase, each carrying a ``Progress`` as the agent's do
(``--progress``: see SimulatedStep). A tenth of the heartbeats ask for an
answer: their round trip is the latency. After all replicas are members, the
table records heartbeat latency p50/p99, heartbeats sent per second and the
coordinator's CPU (user + system from /proc, as a share of one core) over
``--seconds``; then one replica's streams close (an explicit failure) and the
time until every survivor's Watch delivered the quorum without it is taken
from the survivors' own clocks (CLOCK_MONOTONIC, shared by the processes).
Quorum formation is the coordinator's own histogram
(``fthsdp_quorum_formation_seconds``): from its decision that the membership
must change to the quorum stored and pushed, with the number of quorums it
took for everyone to become a member. The clients share the machine's cores
with the coordinator.
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
import urllib.request
from collections import deque
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


# ----- a client process: many replicas ---------------------------------------------------

ACK_SHARE = 0.1
"""Share of heartbeats that ask for an answer: their round trip is the latency."""


STEP_TIME = 1.0
"""The simulated job's step time: every replica steps in lockstep on the
shared CLOCK_MONOTONIC (step k from k * STEP_TIME on), so that the
coordinator's hang look sees what it sees in a real job."""


class SimulatedStep:
    """What one simulated replica reports of its step (fthsdp/agent/training/step/clock.py):
    computing for ``compute`` seconds of each step (its own, 0.6-0.8 s), then
    in the all-reduce, waiting for the others, until the next step begins.
    Only in ``Progress``: the heartbeat's committed ``step`` stays 0, as
    before, so that joining is what it was (a replica whose step moved on
    before it was a member would count as needing a catch-up it never does).
    ``mode`` "no-compute" leaves out the compute time (no straggler scores),
    "none" sends no progress at all (replicas before hang detection)."""

    def __init__(self, pb, mode: str) -> None:
        self.pb, self.mode = pb, mode
        self.compute = random.uniform(0.6, 0.8)
        self.step_time = STEP_TIME * random.uniform(0.98, 1.02)  # its median of recent step times

    def step(self, now: float) -> int:
        return int(now // STEP_TIME)

    def progress(self, now: float):
        if self.mode == "none":
            return None
        within = now % STEP_TIME
        computing = within < self.compute
        return self.pb.Progress(
            phase=self.pb.PHASE_COMPUTE if computing else self.pb.PHASE_ALLREDUCE,
            phase_age_s=within if computing else within - self.compute, step=self.step(now),
            step_time_s=self.step_time, compute_time_s=0.0 if self.mode == "no-compute" else self.compute)


REFUSED = ("NOT_FOUND", "FAILED_PRECONDITION")
"""A heartbeat refused with these names a session the coordinator dropped:
register again, as the agent does (fthsdp/agent/training/session/membership.py)."""


async def register(grpc, stub, pb, rid: str, out: dict):
    # Like an agent (fthsdp/client.py): a shed call (CANCELLED) or an
    # unreachable coordinator is retried; anything else is an error.
    while True:
        try:
            request = pb.RegisterRequest(job="default", replica_id=rid, address="127.0.0.1:1", world_size=1)
            return await stub.Register(request)
        except grpc.aio.AioRpcError as e:
            if e.code() in (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE):
                out["register_retries"] += 1
                await asyncio.sleep(0.2 + random.random())
                continue
            out["errors"] += 1
            out["last_error"] = f"register: {str(e)[:300]}"
            return None


async def watch(stream, pb, rid: str, out: dict, pace: dict) -> None:
    # As an agent does: every event parsed; a member by its place (the
    # coordinator sends replicas no member list).
    try:
        async for data in stream:
            out["bytes"] += len(data)
            event = pb.WatchEvent.FromString(data)
            if event.heartbeat_interval_s:
                pace["interval"] = event.heartbeat_interval_s
            out["events"].append((rid, time.monotonic(), event.quorum.id, event.quorum.member_count,
                                  event.HasField("place")))
    except Exception:  # noqa: BLE001 - cancelled at the end, closed as the victim, or reopened
        pass


async def answers(beats, pending: deque, out: dict) -> None:
    # The answers come in the order of the heartbeats that asked for them;
    # read apart from sending, as the agent does (it asks for none), so that
    # a late answer never holds the next heartbeat back.
    try:
        async for _ in beats:
            start = pending.popleft()
            out["latencies"].append((start, time.monotonic() - start))
    except Exception:  # noqa: BLE001 - the stream ended: the sender sees why
        pass


async def replica(grpc, stub, raw_watch, pb, rid: str, out: dict, stop: asyncio.Event, victim: bool,
                  go_silent: asyncio.Event, sim: SimulatedStep):
    reply = await register(grpc, stub, pb, rid, out)
    if reply is None:
        return
    session = reply.session_id
    pace = {"interval": reply.heartbeat_interval_s or 1.0}
    stream = raw_watch(pb.WatchRequest(job="default", replica_id=rid, session_id=session))
    watcher = asyncio.create_task(watch(stream, pb, rid, out, pace))
    beats, pending = stub.HeartbeatStream(), deque()
    reader = asyncio.create_task(answers(beats, pending, out))
    await asyncio.sleep(random.random() * pace["interval"])  # spread the heartbeats over the interval
    while not stop.is_set():
        if victim and go_silent.is_set():
            out["victim_closed"] = time.monotonic()
            stream.cancel()
            beats.cancel()
            return
        start = time.monotonic()
        ack = random.random() < ACK_SHARE  # a sample asks for an answer, to time the round trip
        try:
            if ack:
                pending.append(start)
            await beats.write(pb.HeartbeatRequest(job="default", replica_id=rid, session_id=session, ack=ack,
                                                  progress=sim.progress(start)))
            out["sent"].append(start)
        except Exception as e:  # noqa: BLE001
            code = e.code() if isinstance(e, grpc.aio.AioRpcError) else await beats.code() if beats.done() else None
            beats.cancel()
            reader.cancel()
            if code is not None and code.name in REFUSED:
                # Dropped (it was late): register again and reopen the Watch, as an agent does.
                out["reregistered"] += 1
                reply = await register(grpc, stub, pb, rid, out)
                if reply is None:
                    return
                session = reply.session_id
                stream.cancel()
                watcher.cancel()
                stream = raw_watch(pb.WatchRequest(job="default", replica_id=rid, session_id=session))
                watcher = asyncio.create_task(watch(stream, pb, rid, out, pace))
            else:
                out["errors"] += 1
                out["last_error"] = (f"heartbeat: {type(e).__name__} {str(e)[:200]} "
                                     f"(stream status {code.name if code else None})")
            beats, pending = stub.HeartbeatStream(), deque()
            reader = asyncio.create_task(answers(beats, pending, out))
        await asyncio.sleep(max(0.0, pace["interval"] - (time.monotonic() - start)))
    watcher.cancel()
    reader.cancel()
    beats.cancel()


async def session_replica(grpc, session_call, pb, rid: str, out: dict, stop: asyncio.Event, victim: bool,
                          go_silent: asyncio.Event, sim: SimulatedStep):
    # The same replica on one Session call (Register, heartbeats and Watch together).
    register = pb.SessionRequest(
        register=pb.RegisterRequest(job="default", replica_id=rid, address="127.0.0.1:1", world_size=1))
    while not stop.is_set():
        call = session_call()
        pending: deque = deque()
        pace = {"interval": 1.0}
        registered = asyncio.Event()

        # The reader task outlives this pass of the loop (cancelled, not awaited): it keeps this session's objects.
        async def receive(call=call, pending: deque = pending, pace: dict = pace,
                          registered: asyncio.Event = registered) -> None:
            try:
                async for data in call:
                    out["bytes"] += len(data)
                    event = pb.SessionEvent.FromString(data)
                    kind = event.WhichOneof("message")
                    if kind == "registered":
                        pace["interval"] = event.registered.heartbeat_interval_s or 1.0
                        registered.set()
                    elif kind == "ack":
                        start = pending.popleft()
                        out["latencies"].append((start, time.monotonic() - start))
                    else:
                        w = event.watch
                        if w.heartbeat_interval_s:
                            pace["interval"] = w.heartbeat_interval_s
                        out["events"].append((rid, time.monotonic(), w.quorum.id, w.quorum.member_count,
                                              w.HasField("place")))
            except Exception:  # noqa: BLE001 - cancelled, closed as the victim, or ended by the coordinator
                pass

        reader = asyncio.create_task(receive())
        try:
            await call.write(register)
            await registered.wait()
            await asyncio.sleep(random.random() * pace["interval"])  # spread the heartbeats over the interval
            while not stop.is_set():
                if victim and go_silent.is_set():
                    out["victim_closed"] = time.monotonic()
                    call.cancel()
                    return
                start = time.monotonic()
                ack = random.random() < ACK_SHARE
                if ack:
                    pending.append(start)
                beat = pb.HeartbeatRequest(ack=ack, progress=sim.progress(start))
                await call.write(pb.SessionRequest(heartbeat=beat))
                out["sent"].append(start)
                await asyncio.sleep(max(0.0, pace["interval"] - (time.monotonic() - start)))
        except Exception as e:  # noqa: BLE001 - the session ended: open a new one, as an agent does
            out["reregistered"] += 1
            out["last_error"] = f"session: {type(e).__name__} {str(e)[:200]}"
            await asyncio.sleep(0.2 + random.random())
        finally:
            reader.cancel()
            call.cancel()


async def client_main(address: str, first: int, count: int, victim: int, per_connection: int, session: bool = False,
                      progress: str = "real") -> None:
    import grpc

    from fthsdp.client import CHANNEL_OPTIONS
    from fthsdp.protos.v1 import coordinator_pb2 as pb
    from fthsdp.protos.v1 import coordinator_pb2_grpc as pb_grpc

    # Real replicas each have a connection of their own (per_connection 1);
    # sharing one between several is cheaper for both sides but couples
    # them: a big Watch event for one delays the others' answers.
    channels = [
        grpc.aio.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1), *CHANNEL_OPTIONS])
        for _ in range(max(1, -(-count // per_connection)))
    ]
    stubs = [pb_grpc.CoordinatorStub(c) for c in channels]
    # Watch answers as bytes: parsed by the replica as it sees fit.
    raw = [c.unary_stream("/fthsdp.v1.Coordinator/Watch", request_serializer=pb.WatchRequest.SerializeToString)
           for c in channels]
    out = {"latencies": [], "events": [], "errors": 0, "sent": [], "register_retries": 0, "bytes": 0, "reregistered": 0}
    stop, go_silent = asyncio.Event(), asyncio.Event()
    from fthsdp.coordinator.engine.loop_lag import LagWindow, probe

    lag = LagWindow(1e9)  # this process's worst lag over the whole run: are the simulated replicas late themselves?
    lag_probe = asyncio.create_task(probe(lag))
    if session:
        calls = [
            c.stream_stream("/fthsdp.v1.Coordinator/Session", request_serializer=pb.SessionRequest.SerializeToString)
            for c in channels
        ]
        tasks = [
            asyncio.create_task(session_replica(grpc, calls[k // per_connection], pb, f"r{i}", out, stop, i == victim,
                                                go_silent, SimulatedStep(pb, progress)))
            for k, i in enumerate(range(first, first + count))
        ]
    else:
        tasks = [
            asyncio.create_task(replica(grpc, stubs[k // per_connection], raw[k // per_connection], pb, f"r{i}", out,
                                        stop, i == victim, go_silent, SimulatedStep(pb, progress)))
            for k, i in enumerate(range(first, first + count))
        ]
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    print(json.dumps({"ready": True}), flush=True)
    while line := (await reader.readline()).decode().strip():  # commands from the parent
        if line == "silence":
            go_silent.set()
        elif line == "stop":
            break
    stop.set()
    lag_probe.cancel()
    out["loop_lag"] = lag.worst(time.monotonic())
    print(json.dumps(out), flush=True)
    for t in tasks:
        t.cancel()
    os._exit(0)


# ----- the parent ------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def scrape(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url, timeout=10) as r:
        lines = r.read().decode().splitlines()
    return {line.split(" ")[0]: float(line.split(" ")[1]) for line in lines if line and not line.startswith("#")}


def run(n: int, clients: int, seconds: float, budget: float, per_connection: int, log_dir: Path | None = None,
        session: bool = False, progress: str = "real") -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    log = open(log_dir / f"coordinator-{n}.log", "w") if log_dir else subprocess.DEVNULL  # noqa: SIM115
    coordinator = subprocess.Popen(
        [sys.executable, "-m", "fthsdp", "coordinator", "--bind", "127.0.0.1:0", "--metrics-port", "0",
         "--min-replicas", "1", "--heartbeat-interval", "1s", "--heartbeat-timeout", "10s",
         "--heartbeat-budget", str(budget), "--log-level", "info" if log_dir else "warning"],
        stdout=subprocess.PIPE, stderr=log, text=True, env=env, cwd=ROOT)
    line = coordinator.stdout.readline()
    address = line.split("listening on ")[1].split()[0]
    metrics = line.split("metrics on ")[1].split()[0]
    per = [n // clients + (1 if k < n % clients else 0) for k in range(clients)]
    procs = []
    first = 0
    for count in per:
        procs.append(subprocess.Popen(
            [sys.executable, __file__, "--client", address, str(first), str(count), str(n - 1), str(per_connection),
             str(int(session)), progress],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT))
        first += count
    try:
        for p in procs:
            assert json.loads(p.stdout.readline())["ready"]
        # Everyone a member (the coordinator's healthy count reaches n), or as
        # many as made it by the deadline: reported, not hidden.
        started = time.monotonic()
        deadline = started + 60 + n / 20
        healthy = 'fthsdp_replicas{job="default",state="healthy"}'
        lag = "fthsdp_event_loop_lag_seconds"
        worst_lag = 0.0
        while (members := (m := scrape(metrics)).get(healthy, 0)) < n and time.monotonic() < deadline:
            worst_lag = max(worst_lag, m.get(lag, 0.0))
            time.sleep(2.0)  # a scrape renders every replica: not too often
        formed = time.monotonic() - started
        time.sleep(2)  # let the spread-out heartbeats settle into their 1 Hz rhythm
        t0, c0, k0 = time.monotonic(), cpu_seconds(coordinator.pid), sum(cpu_seconds(p.pid) for p in procs)
        time.sleep(seconds)
        t1, c1, k1 = time.monotonic(), cpu_seconds(coordinator.pid), sum(cpu_seconds(p.pid) for p in procs)
        procs[-1].stdin.write("silence\n")
        procs[-1].stdin.flush()
        time.sleep(5)
        m = scrape(metrics)
        worst_lag = max(worst_lag, m.get(lag, 0.0))
        for p in procs:
            p.stdin.write("stop\n")
            p.stdin.flush()
        results = [json.loads(p.stdout.readline()) for p in procs]
    finally:
        for p in procs:
            p.kill()
        coordinator.kill()
        coordinator.wait()
        if log_dir:
            log.close()
    latencies = sorted(lat for r in results for start, lat in r["latencies"] if t0 <= start <= t1)
    closed = next((r["victim_closed"] for r in results if "victim_closed" in r), float("inf"))
    # The survivors' first event of a quorum without the victim.
    told: dict[str, float] = {}
    for r in results:
        for rid, t, _qid, size, member in r["events"]:
            if t >= closed and size == n - 1 and member and rid not in told:
                told[rid] = t
    return {
        "n": n,
        "p50": latencies[len(latencies) // 2] if latencies else float("nan"),
        "p99": latencies[int(len(latencies) * 0.99)] if latencies else float("nan"),
        "heartbeats_per_s": sum(t0 <= t <= t1 for r in results for t in r["sent"]) / (t1 - t0),
        "acked": len(latencies),
        "cpu": (c1 - c0) / (t1 - t0),
        "client_cpu": (k1 - k0) / (t1 - t0),
        "coordinator_lag": worst_lag,
        "client_lag": max(r["loop_lag"] for r in results),
        "reregistered": sum(r["reregistered"] for r in results),
        "told_all": (max(told.values()) - closed) if len(told) == n - 1 else float("nan"),
        "told_count": len(told),
        "formation_mean": (m['fthsdp_quorum_formation_seconds_sum{job="default"}']
                           / m['fthsdp_quorum_formation_seconds_count{job="default"}']),
        "formations": m['fthsdp_quorum_formation_seconds_count{job="default"}'],
        "errors": sum(r["errors"] for r in results),
        "register_retries": sum(r["register_retries"] for r in results),
        "watch_bytes": sum(r["bytes"] for r in results),
        "last_error": next((r["last_error"] for r in results if r.get("last_error")), ""),
        "members": members,
        "join_time": formed,
        "interval": m['fthsdp_heartbeat_interval_seconds{job="default"}'],
        "hang_limit": m.get('fthsdp_hang_limit_seconds{job="default"}', float("nan")),
        "median_step": m.get('fthsdp_median_step_seconds{job="default"}', float("nan")),
        "taken_out": sum(v for k, v in m.items() if k.startswith("fthsdp_replicas_taken_out_total")),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--replicas", default="100,1000")
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--budget", type=float, default=5000.0,
                   help="the coordinator's --heartbeat-budget (heartbeats/s; 0: every replica at 1 Hz whatever the "
                        "count)")
    p.add_argument("--coordinator-logs", type=Path,
                   help="write each coordinator's log (level info) to DIR/coordinator-N.log")
    p.add_argument("--per-connection", type=int, default=1,
                   help="simulated replicas sharing one gRPC connection (1: one each, as real agents)")
    p.add_argument("--calls", choices=("session", "separate"), default="session",
                   help="session: each simulated replica on one Session call, as the agent does; separate: "
                        "Register + Watch + HeartbeatStream, three calls (what agents did before)")
    p.add_argument("--progress", default="real",
                   help="comma-separated, each run in turn at every size: real: heartbeats carry a Progress as the "
                        "agent's (fthsdp/agent/training/step/clock.py: lockstep 1 s steps, computing then in the "
                        "all-reduce, with step and compute times); no-compute: the same without compute times (no "
                        "straggler scores); none: no Progress")
    p.add_argument("--client", nargs=7, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.client:
        address, first, count, victim, per_connection, session, progress = args.client
        asyncio.run(client_main(address, int(first), int(count), int(victim), int(per_connection), session == "1",
                                progress))
        return
    print("\n| replicas | progress | members reached (time) | heartbeat interval | heartbeats/s | heartbeat p50 |"
          " heartbeat p99 | coordinator CPU (cores) | clients CPU (cores) | worst loop lag: coordinator / clients |"
          " stream closed → every survivor told | quorums formed (mean formation) | Watch bytes (whole run) |"
          " registrations retried | dropped and registered again | errors | hang limit (median step) |"
          " taken out as hung |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n, mode in ((int(x), mode) for x in args.replicas.split(",") for mode in args.progress.split(",")):
        r = run(n, args.clients, args.seconds, args.budget, args.per_connection, args.coordinator_logs,
                args.calls == "session", mode)
        told = f"{r['told_all'] * 1e3:.0f} ms" if r["told_count"] == n - 1 else f"{r['told_count']} of {n - 1} told"
        print(f"| {n} | {mode} | {r['members']:.0f} ({r['join_time']:.0f} s) | {r['interval']:.2g} s | "
              f"{r['heartbeats_per_s']:.0f} | {r['p50'] * 1e3:.1f} ms | {r['p99'] * 1e3:.1f} ms | {r['cpu']:.2f} | "
              f"{r['client_cpu']:.2f} | {r['coordinator_lag']:.2f} / {r['client_lag']:.2f} s | {told} | "
              f"{r['formations']:.0f} ({r['formation_mean'] * 1e3:.1f} ms) | {r['watch_bytes'] / 1e6:.0f} MB | "
              f"{r['register_retries']} | {r['reregistered']} | {r['errors']} | "
              f"{r['hang_limit']:.3g} s ({r['median_step']:.2g} s) | "
              f"{r['taken_out']:.0f} |", flush=True)
        if r["last_error"]:
            print(f"  (last heartbeat error at {n}: {r['last_error']})", flush=True)


if __name__ == "__main__":
    main()
