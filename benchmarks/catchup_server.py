"""The catch-up server: fthsdp's (``http.server.ThreadingHTTPServer``) against
an aiohttp port of it, serving the same snapshot bytes to the same client.

    python benchmarks/catchup_server.py [--mib 256] [--trials 5] [--requests 500] [--busy] [--piece-kib 1024]

One source process (another replica, as in reality) holds a state of --mib
MiB (16 float32 tensors) in a ``ServedState`` and a "training thread" that
takes the snapshot asked for at its next step boundary (every millisecond),
as in benchmarks/catchup.py part 1; between boundaries it sleeps, or with
--busy spins in pure Python, holding the GIL but for the interpreter's switch
interval (the worst case of a training loop's Python overhead). It serves
that one snapshot from:

- fthsdp's ``CatchUpServer`` (threads; transfer tokens; Range);
- a minimal aiohttp port written here, on an event loop of its own in a thread
  of its own (the training process's main thread is the training loop):
  ``GET /v1/health``, ``GET /v1/snapshots/<step>/manifest`` and
  ``GET /v1/snapshots/<step>/data`` with the same transfer-token check and the
  same ``Range`` handling. Two variants: the body written in 1 MiB pieces
  (--piece-kib), each awaited (``StreamResponse``; what a port needs to keep
  the real server's rate limit), and the whole body handed to
  ``web.Response`` at once;
- a raw socket (baseline): ``sendall`` of the same bytes, ``recv_into`` here.

This process asks fthsdp's server for the snapshot once (``POST
/v1/snapshots``), then fetches it from each server in turn with the real
``SourceClient.fetch`` (8 MiB chunks, CRC-32 checked, ``Range: bytes=0-``,
a new client and connection per fetch) into one destination buffer faulted in
before timing; the order rotates every trial so that the machine's noise hits
all alike. Reported: GB/s per trial and the median; the ratio to http.server
(the median of the per-trial ratios); and the source process's CPU time per
GB sent, less its training thread's (``process_time`` - ``thread_time``
there: what serving costs the replica).

Small requests: --requests GET /v1/health (plain ``http.client``) and GET
manifest (``SourceClient.manifest``, as a joiner polls) to each server, each on
a new connection, sequentially, in interleaved blocks of 50; p50 and p99 of
the latency and requests per second.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import re
import socket
import statistics
import struct
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from jsonproc import Proc  # noqa: E402

TOKEN = "bench-token"
PIECE = 1 << 20
"""The aiohttp port's write size (the real server's WRITE_PIECE when it paces)."""
_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")  # as fthsdp/agent/training/catchup/server.py
SERVERS = ("http.server", "aiohttp", "aiohttp whole body", "raw socket")
SMALL = ("http.server", "aiohttp")
"""The servers timed on small requests (both aiohttp variants answer those alike)."""

# ----- the source process --------------------------------------------------------------


def aiohttp_server(source, token: str, piece: int) -> str:
    """Start an aiohttp port of the catch-up server's read endpoints on a
    thread and loop of its own; its address. ``piece``: write the snapshot in
    pieces of this many bytes, each awaited; 0: the whole body in one
    ``web.Response``."""
    from aiohttp import web

    from fthsdp.agent.training.catchup import transfer_token
    from fthsdp.agent.training.catchup.server import PROTOBUF
    from fthsdp.agent.training.catchup.source import SnapshotUnavailable

    def error(code: int, message: str, headers=None) -> web.Response:
        return web.Response(status=code, text=message + "\n", headers=headers)

    started: list = []

    def authorized(request) -> bool:
        """The real server's check: a transfer token minted for this address."""
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        if not token:
            return True
        try:
            transfer_token.verify(given if scheme == "Bearer" else "", token, f"127.0.0.1:{started[0]}", time.time())
        except transfer_token.TokenRefused:
            return False
        return True

    async def snapshot(request):
        """``source.snapshot`` may wait for a step boundary: the loop must not.
        Ready already (the common case): answered on the loop; else on a thread."""
        step, wait = int(request.match_info["step"]), min(float(request.query.get("wait", "10")), 60.0)
        try:
            return source.snapshot(step, 0.0)
        except SnapshotUnavailable:
            if wait <= 0:
                raise
        return await asyncio.get_running_loop().run_in_executor(None, source.snapshot, step, wait)

    async def health(request):
        return web.Response(text="ok\n")

    async def manifest(request):
        if not authorized(request):
            return error(401, "missing or wrong bearer token", {"WWW-Authenticate": "Bearer"})
        try:
            snap = await snapshot(request)
        except ValueError as e:
            return error(400, f"bad request: {e}")
        except SnapshotUnavailable as e:
            return error(404, str(e))
        return web.Response(body=snap.manifest.SerializeToString(), content_type=PROTOBUF)

    async def data(request):
        if not authorized(request):
            return error(401, "missing or wrong bearer token", {"WWW-Authenticate": "Bearer"})
        try:
            snap = await snapshot(request)
        except ValueError as e:
            return error(400, f"bad request: {e}")
        except SnapshotUnavailable as e:
            return error(404, str(e))
        total = snap.total_bytes
        start, end = 0, total
        header = request.headers.get("Range")
        if header:
            m = _RANGE.match(header.strip())
            if not m or int(m.group(1)) > total or (m.group(2) and int(m.group(2)) < int(m.group(1))):
                return error(416, f"bad range {header!r} for {total} bytes")
            start = int(m.group(1))
            end = min(total, int(m.group(2)) + 1) if m.group(2) else total
        headers = {"Content-Range": f"bytes {start}-{max(start, end - 1)}/{total}"} if header else {}
        view = snap.data()[start:end]
        if not piece:
            return web.Response(status=206 if header else 200, body=view, headers=headers,
                                content_type="application/octet-stream")
        response = web.StreamResponse(status=206 if header else 200, headers=headers)
        response.content_type = "application/octet-stream"
        response.content_length = end - start
        await response.prepare(request)
        for offset in range(0, view.nbytes, piece):
            await response.write(view[offset : offset + piece])
        await response.write_eof()
        snap.last_used = time.monotonic()
        return response

    app = web.Application()
    app.router.add_get("/v1/health", health)
    app.router.add_get(r"/v1/snapshots/{step:\d+}/manifest", manifest)
    app.router.add_get(r"/v1/snapshots/{step:\d+}/data", data)
    loop = asyncio.new_event_loop()
    ready = threading.Event()

    async def start() -> None:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        started.append(runner.addresses[0][1])

    def run() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(start())
        finally:
            ready.set()
        loop.run_forever()

    threading.Thread(target=run, name="bench-aiohttp", daemon=True).start()
    ready.wait()
    if not started:
        raise RuntimeError("the aiohttp server did not start")
    return f"127.0.0.1:{started[0]}"


CPU_QUERY = 2**64 - 1
"""Sent to the raw server instead of a step: it answers the source process's
CPU time (ns) less the training thread's: the CPU time spent serving."""
TRAINER_CPU_NS = [0]
"""The training thread's own CPU time, updated at each of its step boundaries."""


def raw_server(source) -> str:
    """Per connection: read a step (8 bytes), ``sendall`` that snapshot's bytes
    (or, for ``CPU_QUERY``, the CPU time spent serving so far)."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            conn, _ = listener.accept()
            with conn:
                (step,) = struct.unpack(">Q", conn.recv(8, socket.MSG_WAITALL))
                if step == CPU_QUERY:
                    conn.sendall(struct.pack(">Q", time.process_time_ns() - TRAINER_CPU_NS[0]))
                    continue
                conn.sendall(source.snapshot(step, 10.0).data())

    threading.Thread(target=serve, name="bench-raw", daemon=True).start()
    return f"127.0.0.1:{listener.getsockname()[1]}"


def serve(mib: int, piece: int, busy: bool) -> None:
    """Role: the source replica, its snapshot behind every server. ``busy``:
    its training thread spins in Python between step boundaries (holding the
    GIL but for the interpreter's switch interval) instead of sleeping."""
    import torch

    from fthsdp.agent.training.catchup.grad_log import GradientLog
    from fthsdp.agent.training.catchup.server import CatchUpServer
    from fthsdp.agent.training.catchup.source import ServedState

    state = {"model": {f"w{i}": torch.rand(mib * 2**20 // 4 // 16) for i in range(16)}}
    source = ServedState("bench", 0, 0, GradientLog())
    addresses = {
        "http.server": CatchUpServer(source, token=TOKEN).start().address,
        "aiohttp": aiohttp_server(source, TOKEN, piece),
        "aiohttp whole body": aiohttp_server(source, TOKEN, 0),
        "raw socket": raw_server(source),
    }
    print(json.dumps({"addresses": addresses}), flush=True)
    step = 0
    while True:  # the "training thread": a step boundary every millisecond
        if source.wanted:
            source.take(step, state)
            source.wait_copied(60)
        TRAINER_CPU_NS[0] = time.thread_time_ns()
        if busy:
            end = time.perf_counter() + 0.001
            while time.perf_counter() < end:
                pass
        else:
            time.sleep(0.001)


# ----- this process: the joiner --------------------------------------------------------


def cpu_seconds(raw_address: str) -> float:
    """The source process's CPU time so far (user + system, all its threads)."""
    host, port = raw_address.rsplit(":", 1)
    with socket.create_connection((host, int(port))) as s:
        s.sendall(struct.pack(">Q", CPU_QUERY))
        return struct.unpack(">Q", s.recv(8, socket.MSG_WAITALL))[0] / 1e9


def fetch(name: str, address: str, manifest, buf) -> float:
    from fthsdp.agent.training.catchup.client import SourceClient

    began = time.perf_counter()
    if name == "raw socket":
        host, port = address.rsplit(":", 1)
        view = memoryview(buf.numpy()).cast("B")
        with socket.create_connection((host, int(port))) as s:
            s.sendall(struct.pack(">Q", manifest.step))
            got = 0
            while got < view.nbytes:
                n = s.recv_into(view[got:])
                if not n:
                    raise RuntimeError("raw source closed early")
                got += n
    else:
        client = SourceClient(address, token=TOKEN)
        client.fetch(manifest, out=buf)
        client.close()
    return time.perf_counter() - began


def small_request(name: str, address: str, path: str, step: int) -> float:
    """One request on a new connection: health with http.client, the manifest with SourceClient."""
    from fthsdp.agent.training.catchup.client import SourceClient

    host, port = address.rsplit(":", 1)
    began = time.perf_counter()
    if path == "manifest":
        client = SourceClient(address, token=TOKEN)
        client.manifest(step)
        client.close()
    else:
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        conn.request("GET", "/v1/health")
        response = conn.getresponse()
        body = response.read()
        conn.close()
        if response.status != 200 or body != b"ok\n":
            raise RuntimeError(f"{name}: /v1/health answered {response.status} {body!r}")
    return time.perf_counter() - began


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(p / 100 * len(values)))]


def check_token(address: str, step: int) -> None:
    """The server refuses a wrong token (401); SourceClient.fetch checks the Range answer (206)."""
    host, port = address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.request("GET", f"/v1/snapshots/{step}/data", headers={"Authorization": "Bearer wrong"})
    response = conn.getresponse()
    response.read()
    conn.close()
    if response.status != 401:
        raise RuntimeError(f"{address}: a wrong token got {response.status}, not 401")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--role", choices=("source",), help=argparse.SUPPRESS)
    p.add_argument("--mib", type=int, default=256, help="snapshot size (MiB)")
    p.add_argument("--trials", type=int, default=5, help="fetches from each server, interleaved")
    p.add_argument("--piece-kib", type=int, default=PIECE >> 10, help="the aiohttp port's write size (KiB)")
    p.add_argument("--busy", action="store_true",
                   help="the source's training thread spins in Python (holds the GIL) instead of sleeping")
    p.add_argument("--requests", type=int, default=500, help="small requests per server and route")
    args = p.parse_args()
    if args.role == "source":
        return serve(args.mib, args.piece_kib << 10, args.busy)

    import torch

    from fthsdp.agent.training.catchup.client import SourceClient
    from fthsdp.agent.training.state.checksum import digest64

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    source = Proc([sys.executable, str(Path(__file__).resolve()), "--role", "source", "--mib", str(args.mib),
                   "--piece-kib", str(args.piece_kib), *(["--busy"] if args.busy else [])], env)
    times: dict[str, list[float]] = {name: [] for name in SERVERS}
    cpu: dict[str, list[float]] = {name: [] for name in SERVERS}
    latency: dict[tuple[str, str], list[float]] = {}
    elapsed: dict[tuple[str, str], float] = {}
    try:
        addresses = source.until(lambda x: "addresses" in x)["addresses"]
        client = SourceClient(addresses["http.server"], token=TOKEN)
        manifest = client.request_snapshot()
        nbytes = manifest.total_bytes
        # One destination buffer, faulted in before timing (page faults cost every server alike).
        buf = torch.ones(nbytes, dtype=torch.uint8)
        for name in SERVERS:  # warm-up, and every server sends the very bytes of the manifest
            fetch(name, addresses[name], manifest, buf)
            if name == "raw socket":
                size = manifest.chunk_bytes
                view = memoryview(buf.numpy()).cast("B")
                if [digest64(view[i : i + size]) for i in range(0, nbytes, size)] != list(manifest.chunk_xxh3):
                    raise RuntimeError("the raw socket sent other bytes")
            else:
                check_token(addresses[name], manifest.step)
        for trial in range(args.trials):
            k = trial % len(SERVERS)
            for name in SERVERS[k:] + SERVERS[:k]:
                before = cpu_seconds(addresses["raw socket"])
                times[name].append(fetch(name, addresses[name], manifest, buf))
                cpu[name].append(cpu_seconds(addresses["raw socket"]) - before)
        for name in SMALL:  # warm-up
            for path in ("health", "manifest"):
                for _ in range(10):
                    small_request(name, addresses[name], path, manifest.step)
        block = 50
        for round_ in range((args.requests + block - 1) // block):
            n = min(block, args.requests - round_ * block)
            for path in ("health", "manifest"):
                for name in SMALL if round_ % 2 == 0 else SMALL[::-1]:
                    began = time.perf_counter()
                    latency.setdefault((name, path), []).extend(
                        small_request(name, addresses[name], path, manifest.step) for _ in range(n))
                    elapsed[(name, path)] = elapsed.get((name, path), 0.0) + time.perf_counter() - began
        client.release(manifest.step)
        client.close()
    finally:
        source.stop()

    gbps = lambda t: nbytes / t / 1e9  # noqa: E731
    base = times["http.server"]
    print(f"\n### Snapshot of {nbytes / 2**20:.0f} MiB on loopback, SourceClient.fetch from another process "
          f"({args.trials} trials; the source's training thread {'busy in Python' if args.busy else 'idle'}; "
          f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs)\n")
    print("| server | GB/s (median) | all trials (GB/s) | / http.server (median of trials) | source CPU s per GB |")
    print("|---|---:|---|---:|---:|")
    labels = {"http.server": "fthsdp CatchUpServer (http.server, threads)",
              "aiohttp": f"aiohttp port (StreamResponse, {args.piece_kib} KiB awaited writes)",
              "aiohttp whole body": "aiohttp port (whole body in one web.Response)",
              "raw socket": "raw socket (baseline: sendall / recv_into)"}
    for name in SERVERS:
        ratio = statistics.median(b / t for b, t in zip(base, times[name], strict=True))
        per_gb = statistics.median(c / (nbytes / 1e9) for c in cpu[name])
        print(f"| {labels[name]} | {gbps(statistics.median(times[name])):.2f} | "
              f"{', '.join(f'{gbps(t):.2f}' for t in times[name])} | {ratio:.2f} | {per_gb:.2f} |")
    print(f"\n### {args.requests} small requests per server and route, each on a new connection, sequential\n")
    print("| server | request | p50 ms | p99 ms | req/s |")
    print("|---|---|---:|---:|---:|")
    for path in ("health", "manifest"):
        for name in SMALL:
            lat = latency[(name, path)]
            what = "GET /v1/health (http.client)" if path == "health" else "GET manifest (SourceClient.manifest)"
            print(f"| {labels[name]} | {what} | {pct(lat, 50) * 1e3:.2f} | {pct(lat, 99) * 1e3:.2f} | "
                  f"{len(lat) / elapsed[(name, path)]:.0f} |")
    print()
    for path in ("health", "manifest"):
        a, h = pct(latency[("aiohttp", path)], 50), pct(latency[("http.server", path)], 50)
        print(f"p50 aiohttp / http.server, {path}: {a / h:.2f}")
    return None


if __name__ == "__main__":
    main()
