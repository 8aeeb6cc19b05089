"""The simulated hosts of benchmarks/control_plane.py: one client process, many hosts.

Each host speaks as a node agent and its relay do (fthsdp/agent/node/): a
Host stream, one Watch shared by its ranks, one ping batch per interval of
its ranks' progress, and for node rank 0 its group's Session; each stream
on its own connection to the coordinator it talks to, reopened on its own
after a jittered back-off, at the next coordinator when this one did not
answer. The ranks are counters stepping in lockstep on the shared
CLOCK_MONOTONIC. ``shape`` is how a host's heartbeats go (``SHAPES``). The parent process drives it with lines on stdin
(``lose HOST``, ``sent``, ``back T``, ``stop``), answered in JSON on stdout.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time

STEP_TIME = 1.0
ACK_SHARE = 1.0
"""The share of rank 0's session heartbeats that ask for an answer: every one, as a member's renews its lease
(fthsdp/agent/training/session/membership.py). Until 2026-12-07 a tenth: the rows measured with it miss
nine answers in ten (benchmarks/README.md)."""
RETRY_FIRST, RETRY_CAP = 0.2, 2.0
"""The agents' reconnect back-off (fthsdp/agent/node/host_link.py): equal jitter, doubling to the cap."""
MOVE_ON = ("UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED")
"""What makes an agent try the next coordinator (fthsdp/client.py MOVE_ON)."""
CARRIED_FOR = 1.5
"""A heartbeat is left out while a batch named the host this many intervals ago (relay/host_beats.py)."""
SHAPES = {
    "host": "each host its Host heartbeat and its ping batch: two messages per host per interval",
    "folded": "the heartbeat in the batch (PingBatch.hosts), as the relay sends them: one message per host",
    "tree": "a group's host 0 sends its group's pings and names its hosts: one message per group; the others "
            "send their own batches only while their host 0 is lost",
}




def add_columns(digest, ranks: range, progress) -> None:
    """``ranks``, all at ``progress``, in a RankDigest's columns."""
    n = len(ranks)
    digest.ranks.extend(ranks)
    digest.phases.extend([progress.phase] * n)
    digest.phase_ages_s.extend([progress.phase_age_s] * n)
    digest.steps.extend([progress.step] * n)
    digest.step_times_s.extend([progress.step_time_s] * n)
    digest.compute_times_s.extend([progress.compute_time_s] * n)


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
        self.carried_at = float("-inf")
        """When a batch last named this host (shapes other than "host")."""
        self.beats_in_batches = False
        """The coordinator's welcome said it takes heartbeats from batches."""

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
                if self.beats_in_batches and time.monotonic() - self.carried_at < CARRIED_FOR * self.interval:
                    continue  # a batch named the host: the relay leaves its heartbeat out
                queue.put_nowait(pb.HostRequest(heartbeat=True))
                self.sim.sent += 1

        call = self.sim.stub(channel, "Host", pb.HostRequest, pb.HostPush)(requests())
        beating = asyncio.create_task(beats())
        try:
            async for push in call:
                which = push.WhichOneof("message")
                if which == "welcome":
                    self.welcomed.append((time.monotonic(), self.address))
                    self.beats_in_batches = self.sim.shape != "host" and push.welcome.beats_in_batches
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
                speaks_for = self._speaks_for()
                if speaks_for:
                    batch = pb.PingBatch()
                    incarnation = f"{self.rid}-{self.round}"
                    # In columns, as the relay sends them to a coordinator that reads digests
                    # (fthsdp/core/rank_digest.py): built as columns here, the harness's cheapest way.
                    digest = pb.RankDigest(job="default", replica_id=self.rid, incarnation=incarnation)
                    for host in speaks_for:
                        if self.sim.pings == "digest":
                            add_columns(digest, host.ranks, progress(pb, now, host.compute))
                        else:
                            for rank in host.ranks:
                                batch.pings.append(pb.HeartbeatRequest(
                                    job="default", replica_id=self.rid, shard_rank=rank, step=0,
                                    incarnation=incarnation, progress=progress(pb, now, host.compute)))
                        if self.sim.shape != "host" and host.beats_in_batches:
                            batch.job = "default"
                            batch.hosts.append(host.host_id)
                            host.carried_at = now
                    if digest.ranks:
                        batch.digests.append(digest)
                    self.sim.sent += 1
                    yield batch
                await asyncio.sleep(self.interval)

        call = self.sim.stub(channel, "Pings", pb.PingBatch, pb.PingRefused)(batches())
        async for _ in call:
            self.sim.refused += 1
        raise ConnectionError("the Pings stream ended")

    def _speaks_for(self) -> list[Host]:
        """The hosts whose pings (and heartbeats) this host's next batch carries."""
        if not self.running:
            return []
        if self.sim.shape != "tree":
            return [self]
        group = self.sim.by_group[self.group]
        if self.node == 0:
            return [h for h in group if h.running and not h.lost]
        return [] if not group[0].lost and group[0].running else [self]  # its host 0 gone: its own, direct

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
    def __init__(self, addresses: list[str], first: int, count: int, groups: int, per_group: int, ranks: int,
                 shape: str = "folded", pings: str = "digest") -> None:
        import grpc

        from fthsdp.protos.v1 import coordinator_pb2 as pb

        self.grpc, self.pb = grpc, pb
        self.addresses, self.groups, self.per_group, self.ranks = addresses, groups, per_group, ranks
        self.shape, self.pings = shape, pings
        self.hosts = [Host(self, g, n) for g in range(first, first + count) for n in range(per_group)]
        self.by_group: dict[int, list[Host]] = {}
        for host in self.hosts:
            self.by_group.setdefault(host.group, []).append(host)
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
                      start_rate: float, shape: str = "folded", pings: str = "digest") -> None:
    from fthsdp.coordinator.engine.loop_lag import LagWindow, probe

    sim = Client(addresses, first, count, groups, per_group, ranks, shape, pings)
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
