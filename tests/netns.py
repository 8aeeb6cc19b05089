"""Real network faults for real-process tests: network namespaces on this machine.

``NetLab`` builds, inside this machine only::

    root namespace
      control bridge  PREFIX-bc  10.250.(2n).1/24   <- the coordinator binds this address
      data bridge     PREFIX-bd  (no address: the root namespace has no data path)
    one namespace per replica, PREFIX-rI
      lo    127.0.0.1
      ctl   10.250.(2n).(10+I)/24     veth to the control bridge (root side PREFIX-cI)
      data  10.250.(2n+1).(10+I)/24   veth to the data bridge    (root side PREFIX-dI)

No namespace has a default route, so a replica reaches the coordinator over
its control link only, another replica's data address over its data link
only, and nothing outside the machine at all. A replica's processes get
``FTHSDP_ADVERTISE_HOST`` = its data address (the TCPStore and catch-up
servers bind there; peers connect there) and ``GLOO_SOCKET_IFNAME=data``
(gloo's pairs bind that interface; without it gloo binds what the host name
resolves to, 127.0.0.1 here, and peers cannot connect). etcd and the
coordinator run in the root namespace: etcd on loopback, the coordinator on
the control bridge's address (``NetLab.coordinator``).

Faults (all undone by ``heal_all`` and at exit): ``cut_data``/``heal_data``
(the switch port of the data link goes down: the replica's ``data`` loses its
carrier, its address stays), ``flap_data``, ``cut_pair``/``heal_pair``
(blackhole routes inside the namespaces: one pair only), ``limit_rate``/
``unlimit`` (``tbf`` on both ends of the data link), ``cut_control``/
``heal_control``.

Everything is named ``PREFIX*`` with a per-run PREFIX (``fn`` + 4 hex) and
recorded in /run/fthsdp-netlab/PREFIX.json before it is made; a later run
removes whatever a dead run left (its namespaces, links and the processes in
its namespaces). Only addresses of namespaces made here are ever targets.

Use (as root; ``NetLab.skip_unless_possible()`` skips otherwise)::

    with NetLab(3) as lab:
        c = lab.coordinator(tmp_path, "--store", etcd.url).start()
        agents = [lab.agent(f"r{i}", tmp_path, c.address, i, 3, "--steps", "1000").start() for i in range(3)]
        lab.cut_data("r2")
        ...

Run as a module, it is also the small program the harness's own tests run
inside namespaces (``python -m tests.netns gloo ...``).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import fcntl
import ipaddress
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

STATE_DIR = Path("/run/fthsdp-netlab")
NETNS_DIR = Path("/run/netns")
SUPERNET = ipaddress.ip_network("10.250.0.0/16")  # pairs of /24s: control 10.250.2n.0, data 10.250.2n+1.0
CTL_IF, DATA_IF = "ctl", "data"
CLONE_NEWNET = 0x40000000
PREFIX_HEAD = "fn"


class NetLabUnavailable(RuntimeError):
    """Namespaces cannot be made here (not root, no ``ip``, no netns support)."""


def _run(*argv: str, check: bool = True, timeout: float = 15.0) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {proc.returncode}: {proc.stderr.strip()}")
    return proc


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return _run("ip", *args, check=check)


def _nsip(ns: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return _run("ip", "-n", ns, *args, check=check)


def _tc(ns: str | None, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return _run(*(("ip", "netns", "exec", ns) if ns else ()), "tc", *args, check=check)


def _start_time(pid: int) -> str:
    """The process's start time in clock ticks (against pid reuse), "" if it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def why_unavailable() -> str:
    """Why no lab can be made here, or "" if it probably can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    if shutil.which("tc") is None:
        return "iproute2's `tc` is not installed"
    probe = f"fthsdp-probe-{os.getpid()}"
    made = _run("ip", "netns", "add", probe, check=False)
    _run("ip", "netns", "del", probe, check=False)
    if made.returncode != 0:
        return f"cannot make a network namespace: {made.stderr.strip()}"
    return ""


@contextlib.contextmanager
def _state_lock() -> Iterator[None]:
    STATE_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
    with open(STATE_DIR / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _netns_names() -> list[str]:
    out = _run("ip", "netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _link_names() -> list[str]:
    out = _run("ip", "-o", "link", "show", check=False).stdout
    return [line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if ":" in line]


def _kill_inside(ns: str) -> None:
    """SIGKILL the processes inside one of our namespaces (by pid), and wait for them to go."""
    for _ in range(50):
        pids = [int(p) for p in _run("ip", "netns", "pids", ns, check=False).stdout.split()]
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline and any(_start_time(p) for p in pids):
            time.sleep(0.02)


def _remove_prefix(prefix: str) -> None:
    """Remove every namespace and link named PREFIX*, and the processes in those namespaces."""
    for ns in _netns_names():
        if ns.startswith(prefix + "-"):
            _kill_inside(ns)
            _run("ip", "netns", "del", ns, check=False)
    for link in _link_names():
        if link.startswith(prefix + "-"):
            _ip("link", "del", link, check=False)
    with contextlib.suppress(FileNotFoundError):
        (STATE_DIR / f"{prefix}.json").unlink()


def remove_leftovers() -> list[str]:
    """Remove what runs that are no longer alive left behind; the prefixes removed."""
    removed = []
    with _state_lock():
        for path in STATE_DIR.glob(f"{PREFIX_HEAD}*.json"):
            try:
                owner = json.loads(path.read_text())
            except (OSError, ValueError):
                owner = {"pid": -1, "start": ""}
            if owner.get("pid", -1) > 0 and _start_time(owner["pid"]) == owner.get("start"):
                continue  # a live run, perhaps in parallel
            _remove_prefix(path.stem)
            removed.append(path.stem)
    return removed


@dataclass
class Replica:
    """One replica's namespace and addresses."""

    name: str
    ns: str
    ctl_ip: str
    data_ip: str
    ctl_peer: str  # the root-namespace end of the control link (the control switch's port)
    data_peer: str  # the root-namespace end of the data link (the data switch's port)
    ctl_if: str = CTL_IF
    data_if: str = DATA_IF

    def env(self) -> dict[str, str]:
        """What a replica's processes need to use the data link (passed to ``ip netns exec``)."""
        return {"FTHSDP_ADVERTISE_HOST": self.data_ip, "GLOO_SOCKET_IFNAME": self.data_if,
                "TP_SOCKET_IFNAME": self.data_if}


class NetLab:
    """Two bridges and one namespace per replica, removed at exit; faults as methods."""

    def __init__(self, replicas: int | list[str] = 3, prefix: str | None = None) -> None:
        names = [f"r{i}" for i in range(replicas)] if isinstance(replicas, int) else list(replicas)
        if len(names) > 200:
            raise ValueError("at most 200 replicas")
        self.names = names
        self.prefix = prefix or ""
        if len(self.prefix) > 8:
            raise ValueError("prefix: 8 characters at most (interface names are 15)")
        self.replicas: dict[str, Replica] = {}
        self.control_host = ""
        self.ctl_net: ipaddress.IPv4Network | None = None
        self.data_net: ipaddress.IPv4Network | None = None
        self._timers: list[threading.Thread] = []
        self._stop = threading.Event()
        self._closed = False

    # ----- life cycle ------------------------------------------------------------

    @staticmethod
    def skip_unless_possible() -> None:
        """pytest.skip with the reason where no lab can be made here."""
        import pytest

        reason = why_unavailable()
        if reason:
            pytest.skip(f"network-fault tests: {reason}")

    def __enter__(self) -> NetLab:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _used_networks(self) -> list[ipaddress.IPv4Network]:
        used = []
        for line in _run("ip", "-4", "-o", "addr", "show", check=False).stdout.splitlines():
            parts = line.split()
            if "inet" in parts:
                used.append(ipaddress.ip_interface(parts[parts.index("inet") + 1]).network)
        for line in _run("ip", "-4", "route", "show", "table", "all", check=False).stdout.splitlines():
            first = line.split()[0] if line.split() else ""
            if first in ("broadcast", "local", "unicast", "blackhole", "unreachable", "prohibit"):
                first = line.split()[1]
            with contextlib.suppress(ValueError):
                if first != "default":
                    used.append(ipaddress.ip_network(first, strict=False))
        for path in STATE_DIR.glob(f"{PREFIX_HEAD}*.json"):
            with contextlib.suppress(OSError, ValueError, KeyError):
                state = json.loads(path.read_text())
                used += [ipaddress.ip_network(state["ctl_net"]), ipaddress.ip_network(state["data_net"])]
        return used

    def open(self) -> None:
        reason = why_unavailable()
        if reason:
            raise NetLabUnavailable(reason)
        remove_leftovers()
        with _state_lock():
            taken = ({p.stem for p in STATE_DIR.glob("*.json")}
                     | {n.split("-")[0] for n in _netns_names() + _link_names()})
            while not self.prefix or self.prefix in taken:
                self.prefix = PREFIX_HEAD + secrets.token_hex(2)
            self.ctl_bridge, self.data_bridge = f"{self.prefix}-bc", f"{self.prefix}-bd"
            used = self._used_networks()
            subnets = list(SUPERNET.subnets(new_prefix=24))
            for k in range(0, len(subnets), 2):
                ctl, data = subnets[k], subnets[k + 1]
                if not any(ctl.overlaps(u) or data.overlaps(u) for u in used):
                    self.ctl_net, self.data_net = ctl, data
                    break
            else:
                raise NetLabUnavailable(f"no free pair of /24s left in {SUPERNET}")
            # Recorded before anything is made, so a killed run's leftovers are found.
            (STATE_DIR / f"{self.prefix}.json").write_text(json.dumps({
                "pid": os.getpid(), "start": _start_time(os.getpid()),
                "ctl_net": str(self.ctl_net), "data_net": str(self.data_net), "replicas": self.names,
            }))
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def _build(self) -> None:
        ctl_hosts, data_hosts = list(self.ctl_net.hosts()), list(self.data_net.hosts())
        self.control_host = str(ctl_hosts[0])
        for bridge in (self.ctl_bridge, self.data_bridge):
            _ip("link", "add", bridge, "type", "bridge")
            _run("sysctl", "-qw", f"net.ipv6.conf.{bridge}.disable_ipv6=1", check=False)
            _ip("link", "set", bridge, "up")
        _ip("addr", "add", f"{self.control_host}/{self.ctl_net.prefixlen}", "dev", self.ctl_bridge)
        for i, name in enumerate(self.names):
            ns = f"{self.prefix}-{name}"
            r = Replica(name, ns, str(ctl_hosts[9 + i]), str(data_hosts[9 + i]),
                        f"{self.prefix}-c{i}", f"{self.prefix}-d{i}")
            self.replicas[name] = r
            _run("ip", "netns", "add", ns)
            for peer, inner, bridge, ip, net in ((r.ctl_peer, CTL_IF, self.ctl_bridge, r.ctl_ip, self.ctl_net),
                                                 (r.data_peer, DATA_IF, self.data_bridge, r.data_ip, self.data_net)):
                tmp = f"{peer}n"
                _ip("link", "add", peer, "type", "veth", "peer", "name", tmp)
                _ip("link", "set", tmp, "netns", ns)
                _nsip(ns, "link", "set", tmp, "name", inner)
                _run("ip", "netns", "exec", ns, "sysctl", "-qw", f"net.ipv6.conf.{inner}.disable_ipv6=1", check=False)
                _nsip(ns, "addr", "add", f"{ip}/{net.prefixlen}", "dev", inner)
                _nsip(ns, "link", "set", inner, "up")
                _ip("link", "set", peer, "master", bridge)
                _run("sysctl", "-qw", f"net.ipv6.conf.{peer}.disable_ipv6=1", check=False)
                _ip("link", "set", peer, "up")
            _nsip(ns, "link", "set", "lo", "up")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        for t in self._timers:
            t.join(timeout=10)
        if self.prefix:
            with _state_lock():
                _remove_prefix(self.prefix)

    # ----- running things inside -------------------------------------------------

    def replica(self, name: str) -> Replica:
        return self.replicas[name]

    def env(self, name: str) -> dict[str, str]:
        return self.replicas[name].env()

    def argv(self, name: str, argv: list[str]) -> list[str]:
        """``argv`` run inside the replica's namespace with its ``env()`` on top
        of the caller's environment (``ip netns exec NS env K=V ... argv``: both
        exec, so the pid is the command's own and signals reach it)."""
        return ["ip", "netns", "exec", self.replicas[name].ns, "env",
                *(f"{k}={v}" for k, v in self.env(name).items()), *argv]

    def popen(self, name: str, argv: list[str], **kwargs) -> subprocess.Popen:
        """subprocess.Popen of ``argv`` inside the replica's namespace."""
        return subprocess.Popen(self.argv(name, argv), **kwargs)

    def inside(self, name: str, proc):
        """Make an unstarted tests.processes process (AgentProcess, WorkerProcess,
        ReplicaProcess) run inside the replica's namespace; returns it. (tests.processes strips FTHSDP_* from
        the environment, so the replica's settings travel on the command line.)"""
        proc.argv = self.argv(name, proc.argv)
        return proc

    def agent(self, name: str, tmp: Path, coordinator: str, replica_rank: int, num_replicas: int,
              *worker_args: str, **kwargs):
        """tests.processes.AgentProcess for replica ``name``, inside its namespace (not started)."""
        from tests.processes import AgentProcess

        return self.inside(name, AgentProcess(tmp, coordinator, name, replica_rank, num_replicas, *worker_args,
                                              **kwargs))

    def coordinator(self, tmp: Path, *args: str, port: int = 0):
        """tests.processes.CoordinatorProcess bound to the control bridge's address
        (root namespace: replicas reach it over their control links only)."""
        from tests.processes import CoordinatorProcess

        return CoordinatorProcess(tmp, "--bind", f"{self.control_host}:{port}", *args, port=port)

    def socket(self, name: str | None, family: int = socket.AF_INET, kind: int = socket.SOCK_STREAM) -> socket.socket:
        """A socket of the replica's namespace (None: the root namespace), made
        on a short-lived thread that enters the namespace; the socket stays there."""
        if name is None:
            return socket.socket(family, kind)
        result: list = []

        def make() -> None:
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                fd = os.open(NETNS_DIR / self.replicas[name].ns, os.O_RDONLY)
                try:
                    if libc.setns(fd, CLONE_NEWNET) != 0:
                        raise OSError(ctypes.get_errno(), "setns")
                finally:
                    os.close(fd)
                result.append(socket.socket(family, kind))
            except BaseException as e:  # noqa: BLE001 - re-raised on the caller's thread
                result.append(e)

        t = threading.Thread(target=make, daemon=True)
        t.start()
        t.join()
        if isinstance(result[0], BaseException):
            raise result[0]
        return result[0]

    def can_connect(self, src: str | None, host: str, port: int, timeout: float = 2.0) -> bool:
        """Whether a TCP connect from ``src``'s namespace (None: root) to HOST:PORT completes in time."""
        return self.connect_error(src, host, port, timeout) == "ok"

    def connect_error(self, src: str | None, host: str, port: int, timeout: float = 2.0) -> str:
        """What a TCP connect from ``src`` to HOST:PORT gives: "ok", "timeout" or the errno's name."""
        self._check_target(host)
        s = self.socket(src)
        s.settimeout(timeout)
        try:
            s.connect((host, port))
            return "ok"
        except TimeoutError:
            return "timeout"
        except OSError as e:
            import errno

            return errno.errorcode.get(e.errno, str(e))
        finally:
            s.close()

    def listen(self, name: str | None, host: str | None = None, port: int = 0) -> socket.socket:
        """A listening TCP socket in ``name``'s namespace on its data address
        (root: the control bridge's address), or ``host``."""
        if host is None:
            host = self.replicas[name].data_ip if name else self.control_host
        s = self.socket(name)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, port))
        s.listen(16)
        return s

    def _check_target(self, host: str) -> None:
        addr = ipaddress.ip_address(host)
        if addr not in self.ctl_net and addr not in self.data_net:
            raise ValueError(f"{host} is not an address of this lab")

    # ----- faults ----------------------------------------------------------------

    def cut_data(self, name: str) -> None:
        """The data link's switch port goes down: no traffic either way on the
        replica's data link; its ``data`` keeps its address, without a carrier."""
        _ip("link", "set", self.replicas[name].data_peer, "down")

    def heal_data(self, name: str) -> None:
        _ip("link", "set", self.replicas[name].data_peer, "up")

    def cut_control(self, name: str) -> None:
        """The control link's switch port goes down: the coordinator is unreachable, the data path works."""
        _ip("link", "set", self.replicas[name].ctl_peer, "down")

    def heal_control(self, name: str) -> None:
        _ip("link", "set", self.replicas[name].ctl_peer, "up")

    def flap_data(self, name: str, seconds: float, wait: bool = False) -> threading.Thread:
        """Cut the data link now and heal it ``seconds`` later (on a thread
        unless ``wait``); returns the thread (joined at close)."""
        self.cut_data(name)

        def heal_later() -> None:
            if not self._stop.wait(seconds):  # the length of the fault itself (close() ends it early)
                self.heal_data(name)

        t = threading.Thread(target=heal_later, daemon=True, name=f"flap-{name}")
        t.start()
        self._timers.append(t)
        if wait:
            t.join()
        return t

    def cut_pair(self, a: str, b: str, both: bool = True) -> None:
        """Traffic between a's and b's data addresses only is dropped: a
        blackhole route in a's namespace to b (and in b's to a, if ``both``).
        A connect from a blackholed side fails at once (EINVAL); a packet
        arriving from the other side gets no answer. Each still reaches the rest."""
        ra, rb = self.replicas[a], self.replicas[b]
        _nsip(ra.ns, "route", "replace", "blackhole", f"{rb.data_ip}/32")
        if both:
            _nsip(rb.ns, "route", "replace", "blackhole", f"{ra.data_ip}/32")

    def heal_pair(self, a: str, b: str) -> None:
        ra, rb = self.replicas[a], self.replicas[b]
        _nsip(ra.ns, "route", "del", "blackhole", f"{rb.data_ip}/32", check=False)
        _nsip(rb.ns, "route", "del", "blackhole", f"{ra.data_ip}/32", check=False)

    def limit_rate(self, name: str, rate: str = "8mbit", burst: str = "32kb", latency: str = "200ms",
                   both: bool = True) -> None:
        """A slow data link: ``tbf`` on the replica's ``data`` (what it sends) and,
        if ``both``, on the data switch's port (what it receives)."""
        r = self.replicas[name]
        spec = ("root", "tbf", "rate", rate, "burst", burst, "latency", latency)
        _tc(r.ns, "qdisc", "replace", "dev", r.data_if, *spec)
        if both:
            _tc(None, "qdisc", "replace", "dev", r.data_peer, *spec)

    def unlimit(self, name: str) -> None:
        r = self.replicas[name]
        _tc(r.ns, "qdisc", "del", "dev", r.data_if, "root", check=False)
        _tc(None, "qdisc", "del", "dev", r.data_peer, "root", check=False)

    def heal_all(self) -> None:
        for name in self.replicas:
            self.heal_data(name)
            self.heal_control(name)
            self.unlimit(name)
            for other in self.replicas:
                if other != name:
                    self.heal_pair(name, other)

    # ----- looking -----------------------------------------------------------------

    def tcp_connections(self, name: str) -> list[tuple[str, str]]:
        """(local, remote) HOST:PORT of the established TCP connections in the namespace."""
        out = _run("ip", "netns", "exec", self.replicas[name].ns, "ss", "-Htn", "state", "established").stdout
        conns = []
        for line in out.splitlines():
            parts = line.split()
            if len(parts) >= 4:
                conns.append((parts[-2], parts[-1]))
        return conns

    def tcp_listeners(self, name: str) -> list[str]:
        out = _run("ip", "netns", "exec", self.replicas[name].ns, "ss", "-Htln").stdout
        return [line.split()[-2] for line in out.splitlines() if len(line.split()) >= 4]


# ----- a small program the harness's tests run inside namespaces -----------------------


def enter_netns(ns: str) -> None:
    """Move the calling thread (a process's only thread after fork) into namespace ``ns``."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(NETNS_DIR / ns, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns {ns}")
    finally:
        os.close(fd)


def _gloo_peer(rank: int, args: argparse.Namespace, commands) -> None:
    """One gloo rank driven by ``commands`` (lines): ``group NAME`` builds a
    ProcessGroupGloo over the TCPStore; ``allreduce SECONDS`` runs one
    all-reduce of (rank + 1)s and waits at most SECONDS. One JSON line per
    command on stdout, with the rank."""
    import datetime

    import torch
    import torch.distributed as dist

    def say(**fields) -> None:
        os.write(1, (json.dumps({"rank": rank, **fields}) + "\n").encode())  # one write: lines never interleave

    timeout = datetime.timedelta(seconds=args.timeout)
    store = dist.TCPStore(args.host, args.port, args.world, is_master=rank == 0, timeout=timeout,
                          wait_for_workers=False)
    say(store=f"{args.host}:{store.port}", pid=os.getpid())
    keep = []  # groups are never destroyed: gloo's destructor waits for a stuck collective
    pg = None
    for line in commands:
        cmd = line.split()
        if not cmd:
            continue
        if cmd[0] == "group":
            t0 = time.monotonic()
            pg = dist.ProcessGroupGloo(dist.PrefixStore(cmd[1], store), rank, args.world, timeout)
            keep.append(pg)
            say(group=cmd[1], s=round(time.monotonic() - t0, 3))
        elif cmd[0] == "allreduce":
            t = torch.ones(1024) * (rank + 1)
            t0 = time.monotonic()
            work = pg.allreduce([t])
            while not work.is_completed() and time.monotonic() - t0 < float(cmd[1]):
                time.sleep(0.005)
            done = work.is_completed()
            say(allreduce=done, value=float(t[0]) if done else None, s=round(time.monotonic() - t0, 3))
        elif cmd[0] == "exit":
            break
    os._exit(0)


def _gloo_main(args: argparse.Namespace) -> None:
    """Import torch once, then fork one gloo rank per ``--ns`` (rank i enters
    namespace i, with GLOO_SOCKET_IFNAME set); each line on stdin goes to
    every rank. The ranks die with this process."""
    import importlib

    importlib.import_module("torch.distributed")  # imported once, before the forks

    pipes = []
    for rank, ns in enumerate(args.ns):
        r, w = os.pipe()
        if os.fork() == 0:
            try:
                os.close(w)
                for _, other in pipes:
                    other.close()
                ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
                enter_netns(ns)
                os.environ["GLOO_SOCKET_IFNAME"] = args.ifname
                _gloo_peer(rank, args, os.fdopen(r))
            finally:
                os._exit(1)
        os.close(r)
        pipes.append((rank, os.fdopen(w, "w")))
    for line in sys.stdin:
        for _, pipe in pipes:
            with contextlib.suppress(BrokenPipeError):
                pipe.write(line)
                pipe.flush()
    for _, pipe in pipes:
        with contextlib.suppress(BrokenPipeError):
            pipe.close()
    for _ in pipes:
        with contextlib.suppress(ChildProcessError):
            os.wait()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m tests.netns")
    sub = p.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gloo", help="gloo ranks, one per namespace, driven by stdin")
    g.add_argument("--ns", action="append", required=True, help="a namespace per rank, rank 0 first")
    g.add_argument("--host", required=True, help="rank 0's data address: the TCPStore")
    g.add_argument("--port", type=int, required=True)
    g.add_argument("--ifname", default=DATA_IF)
    g.add_argument("--timeout", type=float, default=30.0)
    sub.add_parser("leftovers", help="remove what dead runs left behind")
    args = p.parse_args(argv)
    if args.cmd == "gloo":
        args.world = len(args.ns)
        _gloo_main(args)
    else:
        print(remove_leftovers())


if __name__ == "__main__":
    main()
