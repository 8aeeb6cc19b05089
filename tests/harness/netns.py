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

Run as a module (``python -m tests.harness.netns leftovers``), it removes what dead
runs left. The gloo ranks the harness's own tests run inside namespaces are
tests/netns_gloo.py.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ipaddress
import json
import os
import secrets
import shutil
import socket
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

from tests.harness.netns_state import (
    PREFIX_HEAD,
    STATE_DIR,
    ip,
    link_names,
    netns_names,
    remove_leftovers,
    remove_prefix,
    run,
    start_time,
    state_lock,
)

NETNS_DIR = Path("/run/netns")
SUPERNET = ipaddress.ip_network("10.250.0.0/16")  # pairs of /24s: control 10.250.2n.0, data 10.250.2n+1.0
CTL_IF, DATA_IF = "ctl", "data"
CLONE_NEWNET = 0x40000000


class NetLabUnavailable(RuntimeError):
    """Namespaces cannot be made here (not root, no ``ip``, no netns support)."""


def _nsip(ns: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return run("ip", "-n", ns, *args, check=check)


def _tc(ns: str | None, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return run(*(("ip", "netns", "exec", ns) if ns else ()), "tc", *args, check=check)


def why_unavailable() -> str:
    """Why no lab can be made here, or "" if it probably can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    if shutil.which("tc") is None:
        return "iproute2's `tc` is not installed"
    probe = f"fthsdp-probe-{os.getpid()}"
    made = run("ip", "netns", "add", probe, check=False)
    run("ip", "netns", "del", probe, check=False)
    if made.returncode != 0:
        return f"cannot make a network namespace: {made.stderr.strip()}"
    return ""


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
        for line in run("ip", "-4", "-o", "addr", "show", check=False).stdout.splitlines():
            parts = line.split()
            if "inet" in parts:
                used.append(ipaddress.ip_interface(parts[parts.index("inet") + 1]).network)
        for line in run("ip", "-4", "route", "show", "table", "all", check=False).stdout.splitlines():
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
        with state_lock():
            taken = ({p.stem for p in STATE_DIR.glob("*.json")}
                     | {n.split("-")[0] for n in netns_names() + link_names()})
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
                "pid": os.getpid(), "start": start_time(os.getpid()),
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
            ip("link", "add", bridge, "type", "bridge")
            run("sysctl", "-qw", f"net.ipv6.conf.{bridge}.disable_ipv6=1", check=False)
            ip("link", "set", bridge, "up")
        ip("addr", "add", f"{self.control_host}/{self.ctl_net.prefixlen}", "dev", self.ctl_bridge)
        for i, name in enumerate(self.names):
            ns = f"{self.prefix}-{name}"
            r = Replica(name, ns, str(ctl_hosts[9 + i]), str(data_hosts[9 + i]),
                        f"{self.prefix}-c{i}", f"{self.prefix}-d{i}")
            self.replicas[name] = r
            run("ip", "netns", "add", ns)
            for peer, inner, bridge, addr, net in ((r.ctl_peer, CTL_IF, self.ctl_bridge, r.ctl_ip, self.ctl_net),
                                                 (r.data_peer, DATA_IF, self.data_bridge, r.data_ip, self.data_net)):
                tmp = f"{peer}n"
                ip("link", "add", peer, "type", "veth", "peer", "name", tmp)
                ip("link", "set", tmp, "netns", ns)
                _nsip(ns, "link", "set", tmp, "name", inner)
                run("ip", "netns", "exec", ns, "sysctl", "-qw", f"net.ipv6.conf.{inner}.disable_ipv6=1", check=False)
                _nsip(ns, "addr", "add", f"{addr}/{net.prefixlen}", "dev", inner)
                _nsip(ns, "link", "set", inner, "up")
                ip("link", "set", peer, "master", bridge)
                run("sysctl", "-qw", f"net.ipv6.conf.{peer}.disable_ipv6=1", check=False)
                ip("link", "set", peer, "up")
            _nsip(ns, "link", "set", "lo", "up")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        for t in self._timers:
            t.join(timeout=10)
        if self.prefix:
            with state_lock():
                remove_prefix(self.prefix)

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
        """Make an unstarted tests.harness.processes process (AgentProcess, WorkerProcess,
        ReplicaProcess) run inside the replica's namespace; returns it. (tests.harness.processes strips FTHSDP_* from
        the environment, so the replica's settings travel on the command line.)"""
        proc.argv = self.argv(name, proc.argv)
        return proc

    def agent(self, name: str, tmp: Path, coordinator: str, replica_rank: int, num_replicas: int,
              *worker_args: str, **kwargs):
        """tests.harness.processes.AgentProcess for replica ``name``, inside its namespace (not started)."""
        from tests.harness.processes import AgentProcess

        return self.inside(name, AgentProcess(tmp, coordinator, name, replica_rank, num_replicas, *worker_args,
                                              **kwargs))

    def coordinator(self, tmp: Path, *args: str, port: int = 0):
        """tests.harness.processes.CoordinatorProcess bound to the control bridge's address
        (root namespace: replicas reach it over their control links only)."""
        from tests.harness.processes import CoordinatorProcess

        return CoordinatorProcess(tmp, "--bind", f"{self.control_host}:{port}", *args, port=port)

    def socket(self, name: str | None, family: int = socket.AF_INET, kind: int = socket.SOCK_STREAM) -> socket.socket:
        """A socket of the replica's namespace (None: the root namespace), made
        on a short-lived thread that enters the namespace; the socket stays there."""
        if name is None:
            return socket.socket(family, kind)
        result: list = []

        def make() -> None:
            try:
                enter_netns(self.replicas[name].ns)
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
        ip("link", "set", self.replicas[name].data_peer, "down")

    def heal_data(self, name: str) -> None:
        ip("link", "set", self.replicas[name].data_peer, "up")

    def cut_control(self, name: str) -> None:
        """The control link's switch port goes down: the coordinator is unreachable, the data path works."""
        ip("link", "set", self.replicas[name].ctl_peer, "down")

    def heal_control(self, name: str) -> None:
        ip("link", "set", self.replicas[name].ctl_peer, "up")

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
        out = run("ip", "netns", "exec", self.replicas[name].ns, "ss", "-Htn", "state", "established").stdout
        conns = []
        for line in out.splitlines():
            parts = line.split()
            if len(parts) >= 4:
                conns.append((parts[-2], parts[-1]))
        return conns

    def tcp_listeners(self, name: str) -> list[str]:
        out = run("ip", "netns", "exec", self.replicas[name].ns, "ss", "-Htln").stdout
        return [line.split()[-2] for line in out.splitlines() if len(line.split()) >= 4]


# ----- entering a namespace ---------------------------------------------------------


def enter_netns(ns: str) -> None:
    """Move the calling thread (a process's only thread after fork) into namespace ``ns``."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(NETNS_DIR / ns, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns {ns}")
    finally:
        os.close(fd)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m tests.harness.netns")
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("leftovers", help="remove what dead runs left behind")
    p.parse_args(argv)
    print(remove_leftovers())


if __name__ == "__main__":
    main()
