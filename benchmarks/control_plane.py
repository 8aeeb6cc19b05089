"""The control plane at the real shape, over gRPC: groups of hosts of 8 ranks, as the agents' relays speak.

    python benchmarks/control_plane.py [--hosts 1000,4000,12500] [--hosts-per-group 16] [--ranks 8]
        [--clients 3] [--seconds 20] [--heartbeat-timeout 10s] [--start-rate 2000] [--json FILE]

Two coordinator processes on one private etcd (one leads, one follows), and
``--clients`` processes that simulate the hosts. Each simulated host does
what a host's agent and its relay (fthsdp/agent/node/relay/) send upstream,
on one connection of its own:

* a Host stream: hello, a join of each round, a heartbeat at the interval
  the coordinator sets (fthsdp/agent/node/host_link.py);
* one Watch, shared by its ranks (the relay's fan-out): every event parsed;
* one Pings stream: its ranks' pings with their progress, one batch per
  heartbeat interval (fthsdp/agent/node/relay/pings.py);
* node rank 0 only: its group's rank 0 Session (register, heartbeats with
  progress, a tenth of them asking for an answer: the heartbeat latency).

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
import random
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

STEP_TIME = 1.0
ACK_SHARE = 0.1
RETRY_FIRST, RETRY_CAP = 0.2, 2.0
"""The agents' reconnect back-off (fthsdp/agent/node/host_link.py): equal jitter, doubling to the cap."""
MOVE_ON = ("UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED")
"""What makes an agent try the next coordinator (fthsdp/client.py MOVE_ON)."""


# ----- a client process: many hosts ---------------------------------------------------------


def progress(pb, now: float, compute: float):
    within = now % STEP_TIME
    computing = within < compute
    return pb.Progress(phase=pb.PHASE_COMPUTE if computing else pb.PHASE_ALLREDUCE,
                       phase_age_s=within if computing else within - compute, step=int(now // STEP_TIME),
                       step_time_s=STEP_TIME, compute_time_s=compute)


class Host:
    """One simulated host: its connection, its streams, what it saw."""

    def __init__(self, sim: Client, group: int, node: int) -> None:
        self.sim, self.group, self.node = sim, group, node
        self.rid = f"g{group}"
        self.host_id = f"g{group}-h{node}"
        self.incarnation = f"agent-{group}-{node}"
        self.compute = random.uniform(0.6, 0.8)
        self.interval = 1.0
        self.round, self.running, self.quorum_id = 0, False, 0
        self.address = 0
        self.lost = False
        self.events: list[tuple[float, int, int, bool, int]] = []
        """Watch events: (time, quorum id, member count, has a place, bytes)."""
        self.welcomed: list[tuple[float, int]] = []
        """(time, coordinator index) of each welcome on the Host stream."""
        self.ended: list[float] = []
        self.channels: dict[int, object] = {}
        """One connection per coordinator, opened on first use (the relay's Upstream)."""
        self.tasks: list[asyncio.Task] = []

    @property
    def ranks(self) -> range:
        per = self.sim.ranks
        return range(max(1, self.node * per), (self.node + 1) * per)

    async def run(self) -> None:
        """Each stream on its own, as the agent's host link and relay keep them: one that ends opens
        again after a jittered back-off, at the next coordinator if this one did not answer."""
        self.tasks = [asyncio.create_task(self._keep(opener)) for opener in
                      (self._host_stream, self._watch, self._pings)]
        if self.node == 0:
            self.tasks.append(asyncio.create_task(self._keep(self._session)))
        await asyncio.gather(*self.tasks, return_exceptions=True)

    def _channel(self, index: int):
        channel = self.channels.get(index)
        if channel is None:
            channel = self.channels[index] = self.sim.grpc.aio.insecure_channel(
                self.sim.addresses[index], options=[("grpc.use_local_subchannel_pool", 1)])
        return channel

    async def _keep(self, opener) -> None:
        loop, delay = asyncio.get_running_loop(), RETRY_FIRST
        while not self.lost:
            index, opened = self.address, loop.time()
            try:
                await opener(self._channel(index))
                code = "ENDED"
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - what ended the stream decides where it opens again
                code = e.code().name if hasattr(e, "code") else type(e).__name__
                self.sim.details.setdefault(f"{opener.__name__} {code}", str(e)[:300])
            self.sim.errors[code] = self.sim.errors.get(code, 0) + 1
            if code in MOVE_ON and index == self.address:  # the first of its streams to find out moves them all
                self.address = (index + 1) % len(self.sim.addresses)
                self.sim.reconnects += 1
            if loop.time() - opened > 5 * RETRY_CAP:
                delay = RETRY_FIRST  # it had been working: this is a new outage
            await asyncio.sleep(delay * (0.5 + 0.5 * random.random()))
            delay = min(2 * delay, RETRY_CAP)

    def _hello(self):
        pb = self.sim.pb
        return pb.HostHello(job="default", host_id=self.host_id, replica_id=self.rid, replica_rank=self.group,
                            num_replicas=self.sim.groups, nnodes=self.sim.per_group, nproc=self.sim.ranks,
                            incarnation=self.incarnation, address=self._store().rsplit(":", 1)[0],
                            round=self.round, node_rank=self.node if self.running else -1,
                            store=self._store() if self.running else "")

    def _store(self) -> str:
        return f"10.{self.group // 250}.{self.group % 250}.{self.node}:7000"

    async def _host_stream(self, channel) -> None:
        pb = self.sim.pb
        queue: asyncio.Queue = asyncio.Queue()
        queue.put_nowait(pb.HostRequest(hello=self._hello()))

        async def requests():
            while True:
                yield await queue.get()

        async def beats():
            while True:
                await asyncio.sleep(self.interval * random.uniform(0.9, 1.0))
                queue.put_nowait(pb.HostRequest(heartbeat=True))
                self.sim.sent += 1

        call = self.sim.stub(channel, "Host", pb.HostRequest, pb.HostPush)(requests())
        beating = asyncio.create_task(beats())
        try:
            async for push in call:
                which = push.WhichOneof("message")
                if which == "welcome":
                    self.welcomed.append((time.monotonic(), self.address))
                    if push.welcome.heartbeat_interval > 0:
                        self.interval = push.welcome.heartbeat_interval
                    if not self.running or push.welcome.round > self.round:
                        self.round, self.running = push.welcome.round, False
                        queue.put_nowait(pb.HostRequest(join=pb.HostJoin(round=self.round, store=self._store())))
                elif which == "heartbeat_interval":
                    self.interval = push.heartbeat_interval
                elif which == "complete":
                    self.round, self.running = push.complete.round, True
                elif which == "ended":
                    self.ended.append(time.monotonic())
                    self.running = False
                    if self.node == 0:
                        self.sim.end_session(self)
        finally:
            beating.cancel()
        raise ConnectionError("the Host stream ended")

    async def _watch(self, channel) -> None:
        pb = self.sim.pb
        call = self.sim.stub(channel, "Watch", pb.WatchRequest, None, stream_in=False)(
            pb.WatchRequest(job="default", replica_id=self.rid))
        async for data in call:
            event = pb.WatchEvent.FromString(data)
            if event.heartbeat_interval_s:
                self.interval = max(self.interval, event.heartbeat_interval_s)
            self.events.append((time.monotonic(), event.quorum.id, event.quorum.member_count,
                                event.HasField("place"), len(data)))
        raise ConnectionError("the Watch ended")

    async def _pings(self, channel) -> None:
        pb = self.sim.pb

        async def batches():
            await asyncio.sleep(random.random() * self.interval)
            while True:
                now = time.monotonic()
                if self.running:
                    batch = pb.PingBatch()
                    for rank in self.ranks:
                        batch.pings.append(pb.HeartbeatRequest(
                            job="default", replica_id=self.rid, shard_rank=rank, step=0,
                            incarnation=f"{self.rid}-{self.round}", progress=progress(pb, now, self.compute)))
                    self.sim.sent += 1
                    yield batch
                await asyncio.sleep(self.interval)

        call = self.sim.stub(channel, "Pings", pb.PingBatch, pb.PingRefused)(batches())
        async for _ in call:
            self.sim.refused += 1
        raise ConnectionError("the Pings stream ended")

    async def _session(self, channel) -> None:
        pb = self.sim.pb
        while not self.running:
            await asyncio.sleep(0.05)
        queue: asyncio.Queue = asyncio.Queue()
        agents = [f"agent-{self.group}-{n}" for n in range(self.sim.per_group)]
        queue.put_nowait(pb.SessionRequest(register=pb.RegisterRequest(
            job="default", replica_id=self.rid, address=f"{self.rid}:1", world_size=self.sim.per_group * self.sim.ranks,
            incarnation=f"{self.rid}-{self.round}", agent_ids=agents, quorum_id=self.quorum_id)))
        pending: list[float] = []

        async def requests():
            while True:
                item = await queue.get()
                if item is None:
                    return
                yield item

        async def beats():
            await asyncio.sleep(random.random() * self.interval)
            while True:
                now = time.monotonic()
                ack = random.random() < ACK_SHARE
                if ack:
                    pending.append(now)
                queue.put_nowait(pb.SessionRequest(heartbeat=pb.HeartbeatRequest(
                    ack=ack, progress=progress(pb, now, self.compute))))
                self.sim.sent += 1
                await asyncio.sleep(self.interval)

        call = self.sim.stub(channel, "Session", pb.SessionRequest, pb.SessionEvent)(requests())
        self.sim.sessions[self.host_id] = queue
        beating = None
        try:
            async for event in call:
                kind = event.WhichOneof("message")
                if kind == "registered":
                    beating = asyncio.create_task(beats())
                elif kind == "ack" and pending:
                    start = pending.pop(0)
                    self.sim.latencies.append((start, time.monotonic() - start))
                elif kind == "watch" and event.watch.quorum.id:
                    self.quorum_id = event.watch.quorum.id
        finally:
            if beating is not None:
                beating.cancel()
        if not self.running:
            await asyncio.Event().wait()  # its round ended: the group's ranks are stopped, nothing more to send
        raise ConnectionError("the Session ended")

    def lose(self) -> None:
        """The host is gone: its connections close, nothing more is sent."""
        self.lost = True
        for task in self.tasks:
            task.cancel()
        for channel in self.channels.values():
            asyncio.ensure_future(channel.close())


class Client:
    def __init__(self, addresses: list[str], first: int, count: int, groups: int, per_group: int, ranks: int) -> None:
        import grpc

        from fthsdp.protos.v1 import coordinator_pb2 as pb

        self.grpc, self.pb = grpc, pb
        self.addresses, self.groups, self.per_group, self.ranks = addresses, groups, per_group, ranks
        self.hosts = [Host(self, g, n) for g in range(first, first + count) for n in range(per_group)]
        self.sent = self.refused = self.reconnects = 0
        self.errors: dict[str, int] = {}
        self.details: dict[str, str] = {}
        """A sample of each kind of error, by stream and code."""
        self.latencies: list[tuple[float, float]] = []
        self.sessions: dict[str, asyncio.Queue] = {}

    def stub(self, channel, method: str, request, response, stream_in: bool = True):
        path = f"/fthsdp.v1.Coordinator/{method}"
        parse = response.FromString if response is not None else None
        if stream_in:
            return channel.stream_stream(path, request_serializer=request.SerializeToString,
                                         response_deserializer=parse)
        return channel.unary_stream(path, request_serializer=request.SerializeToString, response_deserializer=parse)

    def end_session(self, host: Host) -> None:
        queue = self.sessions.pop(host.host_id, None)
        if queue is not None:
            queue.put_nowait(None)  # the group's ranks stop: rank 0's Session closes

    def report(self) -> dict:
        return {
            "sent": self.sent, "refused": self.refused, "reconnects": self.reconnects, "errors": self.errors,
            "details": self.details,
            "latencies": self.latencies,
            "hosts": {h.host_id: {"group": h.group, "events": h.events, "welcomed": h.welcomed, "ended": h.ended}
                      for h in self.hosts},
        }


async def client_main(addresses: list[str], first: int, count: int, groups: int, per_group: int, ranks: int,
                      start_rate: float) -> None:
    from fthsdp.coordinator.engine.loop_lag import LagWindow, probe

    sim = Client(addresses, first, count, groups, per_group, ranks)
    lag = LagWindow(1e9)
    lag_probe = asyncio.create_task(probe(lag))
    loop = asyncio.get_running_loop()
    # Tasks cancelled at the end leave their request generators closing: nothing to report then.
    loop.set_exception_handler(lambda _loop, context: None if stopping else _loop.default_exception_handler(context))
    stopping, tasks, began = False, [], loop.time()
    for k, host in enumerate(sim.hosts):  # a real job's agents start over seconds, not in one instant
        tasks.append(asyncio.create_task(host.run()))
        await asyncio.sleep(max(0.0, began + k / start_rate - loop.time()))
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    print(json.dumps({"ready": True}), flush=True)
    while line := (await reader.readline()).decode().strip():
        if line.startswith("lose "):
            lost = next(h for h in sim.hosts if h.host_id == line.split()[1])
            lost.lose()
            print(json.dumps({"lost_at": time.monotonic()}), flush=True)
        elif line == "sent":
            print(json.dumps({"sent": sim.sent}), flush=True)
        elif line.startswith("back "):  # hosts welcomed again since the time given (a failover)
            since = float(line.split()[1])
            back = sum(1 for h in sim.hosts if not h.lost and any(t > since for t, _ in h.welcomed))
            print(json.dumps({"back": back, "of": sum(1 for h in sim.hosts if not h.lost)}), flush=True)
        elif line == "stop":
            break
    stopping = True
    out = sim.report()
    out["loop_lag"] = lag.worst(time.monotonic())
    lag_probe.cancel()
    print(json.dumps(out), flush=True)
    for t in tasks:
        t.cancel()


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
        start_rate: float, logs: Path | None = None) -> dict:
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
                 str(per_group), str(ranks), str(start_rate / clients)],
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
                     (taken_before, taken_after, after.get(healthy, 0)))


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
    shrank = [e for h in survivors for e in h["events"] if e[0] > killed_at and e[2] and e[2] < groups - 1]
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
    p.add_argument("--client", nargs=7, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.client:
        addresses, first, count, groups, per_group, ranks, rate = args.client
        asyncio.run(client_main(addresses.split(","), int(first), int(count), int(groups), int(per_group),
                                int(ranks), float(rate)))
        return
    rows = []
    for hosts in (int(h) for h in args.hosts.split(",")):
        row = run(hosts, args.hosts_per_group, args.ranks, args.clients, args.seconds, args.heartbeat_timeout,
                  args.start_rate, args.coordinator_logs)
        rows.append(row)
        print(json.dumps(row), flush=True)
    print()
    print("| hosts | groups | ranks | join | interval | coordinator cores | clients' cores | messages/s | "
          "heartbeat p50 / p99 | host lost → every surviving host told | → its group stopped | bytes per host | "
          "failover: every host back | healthy groups dropped | clients' worst lag |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        def secs(v, n=None, of=None):
            return f"{v:.2f} s" if v is not None else f"{n} of {of}"
        dropped = int(r["groups"] - 1 - r["failover_healthy"])
        joined = "" if r["joined"] else " (not all)"
        print(f"| {r['hosts']} | {r['groups']} | {r['ranks']} | {r['join_s']:.0f} s{joined}"
              f" | {r['interval_s']:g} s | {r['cores']:.2f} | {r['client_cores']:.2f} | {r['messages_per_s']} | "
              f"{r['p50_ms']} / {r['p99_ms']} ms | {secs(r['told_s'], r['told'], r['survivors'])} | "
              f"{secs(r['group_stopped_s'])} | {r['bytes_per_host']} | "
              f"{secs(r['failover_back_s'], r['failover_back'], r['survivors'])} | "
              f"{max(dropped, 0)} ({r['failover_quorum_shrank']} smaller quorums seen) | {r['client_lag_s']:.2f} s |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
