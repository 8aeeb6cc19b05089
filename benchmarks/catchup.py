"""Catch-up: transfer throughput, the members' step time while a replica
catches up, and the time from a replica's restart to its first committed
step; torchft 0.2.0's heal side by side.

    python benchmarks/catchup.py [--mib 512] [--tls] [--skip-large] [--skip-torchft] [--restarts standby,cold]

1. Transfer. A source process holds a state of --mib MiB (16 float32 tensors)
   behind fthsdp's catch-up server; this process asks for a snapshot, then
   times ``SourceClient.fetch`` (chunked, CRC-checked, into a fresh buffer).
   Baseline, same run, same bytes: a raw loopback socket (``sendall`` of one
   buffer from another process, ``recv_into`` a fresh buffer here). Also
   timed: the same snapshot over a two-rank gloo group
   (``--catch-up-transport distributed``, fthsdp/agent/training/catchup/group.py).
2. Rejoin. Three replicas under ``fthsdp agent`` (the third with --standby,
   or without for a cold start); after a warm-up the third one's training
   process is SIGKILLed; its agent restarts it and it catches up. Reported:
   the members' mean step time while the catch-up runs (snapshot and replay,
   from the joiner's own timestamps) against their steady step time before
   the failure, the admission step, and the time from the kill to the
   restarted replica's first committed step. Two states: fthsdp.examples.gpt
   (3.2M parameters, 40 MB with AdamW) and a 2-layer MLP of 90M parameters
   (1.08 GB with AdamW; tests/ftar_worker.py --hidden 6700).
3. torchft 0.2.0 (its own environment, see torchft_compare.py): the same
   fthsdp.examples.gpt, 2 replicas under torchrun --max-restarts 1; the time from
   SIGKILL of one replica's process to its first committed step after
   torchrun restarted it and it healed, and the survivor's step time meanwhile.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from itertools import pairwise
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from jsonproc import Proc  # noqa: E402

# ----- 1. transfer ---------------------------------------------------------------------


def serve_http(mib: int, certs: Path | None = None) -> None:
    """Role: a source holding ``mib`` MiB, taking snapshots when asked;
    over mutual TLS with the node certificate in ``certs``, if given."""
    import torch

    from fthsdp.agent.training.catchup import tls as catchup_tls
    from fthsdp.agent.training.catchup.grad_log import GradientLog
    from fthsdp.agent.training.catchup.server import CatchUpServer
    from fthsdp.agent.training.catchup.source import ServedState

    state = {"model": {f"w{i}": torch.rand(mib * 2**20 // 4 // 16) for i in range(16)}}
    source = ServedState("bench", 0, 0, GradientLog())
    channel = None if certs else group_channel()  # the same server pushes over a gloo group when asked
    server = CatchUpServer(source, tls=catchup_tls.server_context(node_tls(certs)) if certs else None,
                           channel=channel).start()
    print(json.dumps({"address": server.address}), flush=True)
    step = 0
    while True:  # the "training thread": a step boundary every millisecond
        if source.wanted:
            source.take(step, state)
            source.wait_copied(60)
        time.sleep(0.001)


def serve_raw(mib: int) -> None:
    """Role: send ``mib`` MiB to every connection, as fast as a socket goes."""
    import torch

    data = memoryview(torch.rand(mib * 2**20 // 4).view(torch.uint8).numpy()).cast("B")
    listener = socket.create_server(("127.0.0.1", 0))
    print(json.dumps({"address": f"127.0.0.1:{listener.getsockname()[1]}"}), flush=True)
    while True:
        conn, _ = listener.accept()
        with conn:
            conn.sendall(data)


def fetch_raw(address: str, buf) -> float:
    host, port = address.rsplit(":", 1)
    nbytes = buf.numel()
    began = time.perf_counter()
    view = memoryview(buf.numpy()).cast("B")
    with socket.create_connection((host, int(port))) as s:
        got = 0
        while got < nbytes:
            n = s.recv_into(view[got:])
            if not n:
                raise RuntimeError("raw source closed early")
            got += n
    return time.perf_counter() - began


def node_tls(certs: Path):
    from fthsdp.core.credentials import TlsFiles

    return TlsFiles(str(certs / "ca.pem"), str(certs / "node.pem"), str(certs / "node.key"))


def group_channel():
    from fthsdp.agent.training.catchup.group import GroupChannel
    from fthsdp.agent.training.transport.gloo import GlooTransport

    return GroupChannel(GlooTransport(), "127.0.0.1", 60.0)


def fetch_http(address: str, buf=None, certs: Path | None = None, group: bool = False) -> tuple[float, int]:
    """Over HTTP(S), or with ``group`` over a two-rank gloo group (HTTP for the manifest)."""
    from fthsdp.agent.training.catchup import tls as catchup_tls
    from fthsdp.agent.training.catchup.client import SourceClient

    client = SourceClient(address, tls=catchup_tls.client_context(node_tls(certs)) if certs else None,
                          channel=group_channel() if group else None)
    manifest = client.request_snapshot()
    began = time.perf_counter()
    client.fetch(manifest, out=buf)
    took = time.perf_counter() - began
    client.release(manifest.step)
    client.close()
    return took, manifest.total_bytes


def transfer(mib: int, trials: int, tls: bool) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    me = [sys.executable, str(Path(__file__).resolve())]
    http = Proc([*me, "--role", "http-source", "--mib", str(mib)], env)
    raw = Proc([*me, "--role", "raw-source", "--mib", str(mib)], env)
    certs = https = None
    if tls:  # the test suite's certificates (openssl), in a temporary folder
        from tests.harness.tls_certs import make_certificates

        certs = make_certificates(Path(tempfile.mkdtemp(prefix="fthsdp-bench-certs-")))
        https = Proc([*me, "--role", "http-source", "--mib", str(mib), "--certs", str(certs)], env)
    import torch

    times_https = []
    try:
        http_address = http.until(lambda x: "address" in x)["address"]
        raw_address = raw.until(lambda x: "address" in x)["address"]
        _, nbytes = fetch_http(http_address)  # warm-up: the source's first copy allocates its buffer
        if https is not None:
            https_address = https.until(lambda x: "address" in x)["address"]
            fetch_http(https_address, certs=certs)
        # One destination buffer, faulted in before timing: this compares the
        # transports, not the kernel's page faults (which cost both the same).
        buf = torch.ones(nbytes, dtype=torch.uint8)
        fetch_http(http_address, group=True)  # warm-up of the group path
        times_http, times_raw, times_group = [], [], []
        for _ in range(trials):  # interleaved, so machine noise hits all
            times_http.append(fetch_http(http_address, buf)[0])
            times_raw.append(fetch_raw(raw_address, buf))
            times_group.append(fetch_http(http_address, buf, group=True)[0])
            if https is not None:
                times_https.append(fetch_http(https_address, buf, certs)[0])
    finally:
        http.stop()
        raw.stop()
        if https is not None:
            https.stop()
    gbps = lambda t: nbytes / t / 1e9  # noqa: E731
    h, r = statistics.median(times_http), statistics.median(times_raw)
    print(f"\n### Transfer of {nbytes / 2**20:.0f} MiB on loopback ({trials} trials, medians)\n")
    print("| transport | GB/s | all trials (GB/s) |")
    print("|---|---:|---|")
    print(f"| raw socket (baseline) | {gbps(r):.2f} | {', '.join(f'{gbps(t):.2f}' for t in times_raw)} |")
    print(f"| fthsdp catch-up (HTTP, 8 MiB chunks, CRC-32 checked) | {gbps(h):.2f} | "
          f"{', '.join(f'{gbps(t):.2f}' for t in times_http)} |")
    print(f"| ratio fthsdp / raw | {r / h:.2f} | |")
    g = statistics.median(times_group)
    print(f"| fthsdp catch-up over a two-rank gloo group (same chunks and CRCs; the group built in the timing) | "
          f"{gbps(g):.2f} | {', '.join(f'{gbps(t):.2f}' for t in times_group)} |")
    print(f"| ratio group / HTTP | {h / g:.2f} | |")
    if times_https:
        t = statistics.median(times_https)
        print(f"| fthsdp catch-up over mutual TLS (HTTPS, same chunks) | {gbps(t):.2f} | "
              f"{', '.join(f'{gbps(x):.2f}' for x in times_https)} |")
        print(f"| ratio TLS / raw | {r / t:.2f} | |")


# ----- 2. rejoin -----------------------------------------------------------------------

CONFIGS = {
    "fthsdp.examples.gpt (3.2M params, 40 MB state)": dict(
        command=["-m", "fthsdp.examples.gpt.train", "--steps", "1000000", "--log-every", "1"], warm=15, steady=20,
        env={}),
    "MLP (90M params, 1.08 GB state)": dict(
        command=["-m", "tests.ftar_worker", "--steps", "1000000", "--hidden", "6700"], warm=4, steady=6,
        env={"FTHSDP_CATCH_UP_LOG_STEPS": "2", "FTHSDP_FTAR_TIMEOUT": "120"}),
}


class Lines:
    """Every JSON line of a Proc, collected on its own thread."""

    def __init__(self, proc: Proc) -> None:
        self.items: list[dict] = []
        self.cond = threading.Condition()
        threading.Thread(target=self._pump, args=(proc,), daemon=True).start()

    def _pump(self, proc: Proc) -> None:
        while True:
            item = proc.lines.get()
            with self.cond:
                self.items.append(item)
                self.cond.notify_all()

    def wait(self, predicate, timeout: float = 600.0) -> dict:
        end = time.monotonic() + timeout
        with self.cond:
            seen = 0
            while True:
                for item in self.items[seen:]:
                    if predicate(item):
                        return item
                seen = len(self.items)
                if not self.cond.wait(max(0.0, end - time.monotonic())):
                    raise TimeoutError("no matching line")


def wait_standby_waiting(agent_pid: int, rank_pid: int, timeout: float = 120.0) -> None:
    """Until the agent's other child (the standby) blocks reading its pipe:
    torch imported, model built (set-up before the measurement)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == rank_pid:
                continue
            try:
                stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
                if int(stat[1]) == agent_pid and "pipe" in Path(f"/proc/{entry}/wchan").read_text():
                    return
            except (OSError, IndexError, ValueError):
                continue
        time.sleep(0.1)
    raise TimeoutError("the standby never started waiting")


LOGS: Path | None = None
"""--logs: a folder for every process's stderr (the runs append to it)."""


def rejoin(name: str, standby: bool, pin: bool = False) -> dict:
    """``pin``: the members r0 and r1 on CPU 0, r2 (killed, restarted, the
    joiner) on CPU 1, as on a cluster where the joiner has its own host: the
    members' step during the catch-up then shows what serving it costs them,
    not the joiner's own replay competing with them for the same cores."""
    cfg = CONFIGS[name]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **cfg["env"]}
    coordinator = subprocess.Popen(
        [sys.executable, "-m", "fthsdp", "coordinator", "--bind", "127.0.0.1:0", "--min-replicas", "2",
         "--heartbeat-interval", "200ms", "--heartbeat-timeout", "1s", "--join-timeout", "2s"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, cwd=ROOT, start_new_session=True)
    address = coordinator.stdout.readline().split("listening on ")[1].split()[0]
    procs = [
        Proc([*(["taskset", "-c", "1" if i == 2 else "0"] if pin else []),
              sys.executable, "-m", "fthsdp", "agent", "--coordinator", address, "--replica-id", f"r{i}",
              "--num-replicas", "3", "--restart-backoff", "0",
              *(["--standby", "--standby-delay", "3s"] if standby and i == 2 else []),
              "--", sys.executable, *cfg["command"]], env, stderr_path=LOGS / f"rejoin-r{i}.log" if LOGS else None)
        for i in range(3)
    ]
    r0, r2 = Lines(procs[0]), Lines(procs[2])
    try:
        first = r2.wait(lambda x: "pid" in x)
        r0.wait(lambda x: x.get("step", 0) >= cfg["warm"] + cfg["steady"])
        if standby:
            wait_standby_waiting(procs[2].p.pid, first["pid"])
        t_kill = time.monotonic()
        os.kill(first["pid"], signal.SIGKILL)
        again = r2.wait(lambda x: "pid" in x and x["pid"] != first["pid"])
        report = again["catch_up"]
        first_commit = r2.wait(lambda x: "step" in x and x["t"] > again["t"])
        r0.wait(lambda x: x.get("t", 0) > first_commit["t"] and "step" in x)
    finally:
        for p in procs:
            p.stop()
        coordinator.kill()
        coordinator.wait()
    if LOGS:
        with open(LOGS / "rejoin-lines.jsonl", "a") as f:
            for who, lines in (("r0", r0.items), ("r2", r2.items)):
                for x in lines:
                    f.write(json.dumps({"from": who, "t_kill": t_kill, **x}) + "\n")
    steps = sorted((x["t"], x["step"], x.get("quorum", 0)) for x in r0.items if "step" in x and "t" in x)
    times = [t for t, _, _ in steps]
    intervals = list(pairwise(times))
    before = [b - a for a, b in intervals if b < t_kill][-cfg["steady"]:]
    # Every step of the members that overlapped the catch-up (snapshot to ready).
    # The catch-up runs from the snapshot request to the joiner's first
    # committed step (its admission included). The members' step that
    # absorbed the kill (abandoned, redone without the victim) is the
    # failure's cost, not the catch-up's: reported on its own.
    failure_step = next((a, b) for a, b in intervals if b > t_kill)
    window = [(a, b) for a, b in intervals if b > report["began"] and a < first_commit["t"] and (a, b) != failure_step]
    during = [b - a for a, b in window]
    # The admission step: the members' first step in the joiner's quorum.
    joined = next((i for i, (_, _, q) in enumerate(steps) if q == first_commit.get("quorum")), None)
    admission = times[joined] - times[joined - 1] if joined else float("nan")
    longest = max(window, key=lambda ab: ab[1] - ab[0]) if window else None
    phase = ""
    if longest is not None:
        a, b = longest
        phase = ("admission" if joined and b == times[joined] else
                 "snapshot" if a < report["loaded"] else "replay and join")
    steady = statistics.mean(before)
    return {
        "failure": failure_step[1] - failure_step[0],
        "steady": steady,
        "during": statistics.mean(during) if during else float("nan"),
        "steps_during": len(during),
        "longest": longest[1] - longest[0] if longest else float("nan"),
        "longest_phase": phase,
        "admission": admission,
        "transfer": report["loaded"] - report["began"],
        "bytes": report["snapshot_bytes"],
        "replayed": report["replayed_steps"],
        "restart_to_commit": first_commit["t"] - t_kill,
        "start_to_catch_up": report["began"] - t_kill,
    }


def rejoin_table(configs: list[str], repeat: int = 1, pin: bool = False,
                 restarts: tuple[str, ...] = ("standby", "cold")) -> None:
    print("\n### A replica killed and restarted by its agent: the members' step time and the time to rejoin"
          + (" (members on CPU 0, the joiner on CPU 1)" if pin else "") + "\n")
    print("| state | restart | members' steady step (3 replicas) | failure step |"
          " members' mean step during the catch-up (ratio) | such steps | longest of them (ratio, during) |"
          " the admission step (ratio) | snapshot: load time | steps replayed | kill → catch-up starts |"
          " kill → first committed step |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name in configs:
        for standby in [kind == "standby" for kind in restarts] * repeat:
            r = rejoin(name, standby, pin)
            during = (f"{r['during'] * 1e3:.0f} ms ({r['during'] / r['steady']:.2f}×)" if r["steps_during"]
                      else "none")
            print(f"| {name} | {'warm standby' if standby else 'cold'} | {r['steady'] * 1e3:.0f} ms | "
                  f"{r['failure'] * 1e3:.0f} ms | "
                  f"{during} | {r['steps_during']} | "
                  f"{r['longest'] * 1e3:.0f} ms ({r['longest'] / r['steady']:.2f}×, {r['longest_phase']}) | "
                  f"{r['admission'] * 1e3:.0f} ms ({r['admission'] / r['steady']:.2f}×) | "
                  f"{r['bytes'] / 2**20:.0f} MiB in {r['transfer']:.2f} s | "
                  f"{r['replayed']} | {r['start_to_catch_up']:.2f} s | {r['restart_to_commit']:.2f} s |", flush=True)


# ----- 3. torchft ----------------------------------------------------------------------


def torchft_restart() -> None:
    from torchft_compare import VENV, torchft_python

    from fthsdp.testing.local_etcd import free_port

    python = torchft_python()
    port = free_port()
    env = {**os.environ, "PYTHONPATH": "", "OMP_NUM_THREADS": "1"}
    lighthouse = Proc([str(VENV / "bin" / "torchft_lighthouse"), "--min_replicas", "1", "--bind",
                       f"127.0.0.1:{port}", "--join_timeout_ms", "1000", "--heartbeat_timeout_ms", "1000"], env)
    replicas = []
    for i in range(2):
        renv = {**env, "REPLICA_GROUP_ID": str(i), "TORCHFT_LIGHTHOUSE": f"http://127.0.0.1:{port}"}
        replicas.append(Proc([str(python), "-m", "torch.distributed.run", "--nnodes=1", "--nproc_per_node=1",
                              "--max-restarts=1", "--master_addr=127.0.0.1", f"--master_port={free_port()}",
                              "benchmarks/torchft_train.py", "--steps", "1000000"], renv))
    r0, r1 = Lines(replicas[0]), Lines(replicas[1])
    first_commit = None
    try:
        first = r1.wait(lambda x: "pid" in x)
        r0.wait(lambda x: x.get("step", 0) >= 35 and x.get("committed"))
        t_kill = time.monotonic()
        os.kill(first["pid"], signal.SIGKILL)
        again = r1.wait(lambda x: "pid" in x and x["pid"] != first["pid"], timeout=120)
        first_commit = r1.wait(lambda x: x.get("committed") and x.get("t", 0) > t_kill, timeout=120)
        r0.wait(lambda x: x.get("t", 0) > first_commit["t"] + 1, timeout=120)
    except TimeoutError:
        pass  # reported below as no commit within the time allowed
    finally:
        # torchrun's workers run in sessions of their own: kill them by pid too.
        for pid in {x["pid"] for lines in (r0, r1) for x in lines.items if "pid" in x}:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for p in replicas + [lighthouse]:
            p.stop()
    if first_commit is None:
        print("\n### torchft 0.2.0: the restarted replica committed no step within 120 s of the kill\n")
        return
    times = sorted(x["t"] for x in r0.items if x.get("committed"))
    intervals = [(b, b - a) for a, b in pairwise(times)]
    steady = statistics.mean([d for t, d in intervals if t < t_kill][-20:])
    heal = [d for t, d in intervals if again.get("t", t_kill) < t <= first_commit["t"]]
    print("\n### torchft 0.2.0, same model and machine (2 replicas, torchrun --max-restarts 1)\n")
    print("| figure | torchft 0.2.0 |")
    print("|---|---:|")
    print(f"| survivor's steady step | {steady * 1e3:.0f} ms |")
    print(f"| kill → restarted replica's first committed step | {first_commit['t'] - t_kill:.2f} s |")
    if heal:
        print(f"| survivor's longest step while the replica restarted and healed | {max(heal) * 1e3:.0f} ms |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--role", choices=("http-source", "raw-source"), help=argparse.SUPPRESS)
    p.add_argument("--mib", type=int, default=512)
    p.add_argument("--tls", action="store_true", help="also time the transfer over mutual TLS (needs openssl)")
    p.add_argument("--certs", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--skip-large", action="store_true", help="leave out the 1 GB state")
    p.add_argument("--skip-torchft", action="store_true")
    p.add_argument("--repeat", type=int, default=1, help="rejoin runs per state and restart kind")
    p.add_argument("--logs", type=Path, help="a folder for the rejoin runs' logs (stderr of every agent and rank)")
    p.add_argument("--skip-transfer", action="store_true")
    p.add_argument("--only-transfer", action="store_true", help="the transfer table alone")
    p.add_argument("--only-large", action="store_true", help="leave out fthsdp.examples.gpt")
    p.add_argument("--restarts", type=lambda s: tuple(s.split(",")), default=("standby", "cold"),
                   help="rejoin: which restarts to time, of standby (warm) and cold (default both)")
    p.add_argument("--pin", action="store_true",
                   help="rejoin: the two members on CPU 0, the replica killed and restarted on CPU 1 (Linux taskset)")
    args = p.parse_args()
    global LOGS
    if args.logs:
        args.logs.mkdir(parents=True, exist_ok=True)
        LOGS = args.logs
    if args.role == "http-source":
        return serve_http(args.mib, args.certs)
    if args.role == "raw-source":
        return serve_raw(args.mib)
    if not args.skip_transfer:
        transfer(args.mib, args.trials, args.tls)
    if args.only_transfer:
        return None
    configs = list(CONFIGS)[:1] if args.skip_large else list(CONFIGS)[1:] if args.only_large else list(CONFIGS)
    if args.pin and len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("--pin needs 2 CPUs")
    if not args.restarts or set(args.restarts) - {"standby", "cold"}:
        raise SystemExit(f"--restarts takes standby, cold or both, got {','.join(args.restarts)!r}")
    rejoin_table(configs, args.repeat, args.pin, args.restarts)
    if not args.skip_torchft:
        torchft_restart()
    return None


if __name__ == "__main__":
    main()
