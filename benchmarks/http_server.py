"""The coordinator's HTTP server: the hand-written one it had (from git,
``BASELINE_REV``) against aiohttp, which replaced it.

    python benchmarks/http_server.py [--reps 8] [-n 1000] [--replicas 4]

One server process runs both servers on one asyncio loop, each in front of
the same WebApp over an in-process runtime with replicas (tests/test_metrics'
joined_runtime). A client process (asyncio, raw sockets) sends GET /metrics
and GET /api/status to each in turn, alternating which server goes first,
sequentially (one at a time: latency) and 8 at a time (throughput), a new
connection per request as the hand-written server requires; aiohttp also on
one kept-alive connection.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests.harness.runtimes


BASELINE_REV = "1be8e8c"
"""The last commit with the hand-written server (then fthsdp/coordinator/http_server.py, now under serving/)."""


def load_old():
    path = os.path.join(tempfile.mkdtemp(prefix="fthsdp-http-bench-"), "http_server_old.py")
    source = subprocess.run(["git", "show", f"{os.environ.get('BASELINE_REV', BASELINE_REV)}:"
                             "fthsdp/coordinator/http_server.py"], capture_output=True, text=True, check=True).stdout
    with open(path, "w") as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location("http_server_old", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["http_server_old"] = module
    spec.loader.exec_module(module)
    return module


def server_main(replicas: int) -> None:
    from fthsdp.coordinator.serving import http_server as new
    from fthsdp.coordinator.serving.web import WebApp
    from tests.harness.runtimes import joined_runtime

    old = load_old()

    async def run() -> None:
        runtime, _, _ = await joined_runtime(replicas)
        app = WebApp(runtime, runtime.config, "")

        async def old_handle(request):  # the old module has its own Request/Response classes
            r = await app.handle(new.Request(request.method, request.path, request.query, request.headers,
                                             request.body))
            return old.Response(r.status, r.body, r.content_type, r.headers)

        servers = {"hand-written": await old.serve_http(old_handle, "127.0.0.1", 0),
                   "aiohttp": await new.serve_http(app.handle, "127.0.0.1", 0)}
        print(json.dumps({k: s.sockets[0].getsockname()[1] for k, s in servers.items()}), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the client is done

    asyncio.run(run())


async def fetch(port: int, path: str) -> float:
    t = time.perf_counter()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n".encode())
    data = await reader.read()
    writer.close()
    assert data.startswith(b"HTTP/1.1 200"), data[:100]
    return time.perf_counter() - t


async def keepalive(port: int, path: str, n: int) -> list[float]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    times = []
    for _ in range(n):
        t = time.perf_counter()
        writer.write(f"GET {path} HTTP/1.1\r\nHost: bench\r\n\r\n".encode())
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), head
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:")))
        await reader.readexactly(length)
        times.append(time.perf_counter() - t)
    writer.close()
    return times


async def batch(port: int, path: str, n: int, concurrency: int) -> tuple[list[float], float]:
    times: list[float] = []
    todo = iter(range(n))

    async def worker():
        for _ in todo:
            times.append(await fetch(port, path))

    t = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return times, time.perf_counter() - t


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(p / 100 * len(values)))]


async def client(ports: dict[str, int], reps: int, n: int,
                 paths: tuple[str, ...] = ("/metrics", "/api/status")) -> dict:
    results: dict = {}
    for port in ports.values():  # warm up
        for path in ("/metrics", "/api/status"):
            await batch(port, path, 50, 4)
    for rep in range(reps):
        order = list(ports) if rep % 2 == 0 else list(reversed(ports))
        for path in paths:
            for name in order:
                for label, conc in (("seq", 1), ("c8", 8)):
                    times, elapsed = await batch(ports[name], path, n, conc)
                    entry = results.setdefault((name, path, label), {"rps": [], "lat": []})
                    entry["rps"].append(n / elapsed)
                    entry["lat"].extend(times)
                if name == "aiohttp":
                    t = time.perf_counter()
                    times = await keepalive(ports[name], path, n)
                    entry = results.setdefault(("aiohttp keep-alive", path, "seq"), {"rps": [], "lat": []})
                    entry["rps"].append(n / (time.perf_counter() - t))
                    entry["lat"].extend(times)
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("-n", type=int, default=400)
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--serve", action="store_true")
    parser.add_argument("--paths", default="/metrics,/api/status")
    args = parser.parse_args()
    if args.serve:
        return server_main(args.replicas)
    proc = subprocess.Popen([sys.executable, __file__, "--serve", "--replicas", str(args.replicas)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        ports = json.loads(proc.stdout.readline())
        results = asyncio.run(client(ports, args.reps, args.n, tuple(args.paths.split(","))))
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
    print(f"{args.replicas} replicas, {args.reps} interleaved repetitions x {args.n} requests per cell; "
          f"Python {sys.version.split()[0]}")
    print("| server | route | client | req/s (median of reps, min-max) | p50 ms | p99 ms |")
    print("|---|---|---|---|---|---|")
    for (name, path, label), e in sorted(results.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][0])):
        rps = e["rps"]
        print(f"| {name} | {path} | {'1 at a time' if label == 'seq' else '8 at a time'} | "
              f"{statistics.median(rps):.0f} ({min(rps):.0f}-{max(rps):.0f}) | "
              f"{pct(e['lat'], 50) * 1e3:.2f} | {pct(e['lat'], 99) * 1e3:.2f} |")


if __name__ == "__main__":
    main()
