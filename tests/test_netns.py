"""The network-fault harness (tests/harness/netns.py) with real processes and real sockets.

Each test makes its own namespaces (NetLab) and removes them, pass or fail.
They need root and iproute2; elsewhere they skip, saying why.
"""

from __future__ import annotations

import ipaddress
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from tests.harness.netns import NetLab
from tests.harness.netns_state import STATE_DIR, netns_names, remove_leftovers
from tests.harness.processes import ROOT, _env
from tests.harness.waiting import wait_until


@pytest.fixture
def lab_factory():
    NetLab.skip_unless_possible()
    labs = []

    def make(replicas=3) -> NetLab:
        lab = NetLab(replicas)
        labs.append(lab)
        lab.open()
        return lab

    yield make
    for lab in labs:
        lab.close()
        assert not [ns for ns in netns_names() if ns.startswith(lab.prefix)], "namespaces left behind"


@pytest.fixture
def lab(lab_factory) -> NetLab:
    return lab_factory(3)


# ----- a gloo pair in two namespaces ---------------------------------------------------


class GlooRanks:
    """``python -m tests.netns_gloo``: one gloo rank per namespace (forked after
    one import of torch), each command line to every rank, replies by rank."""

    def __init__(self, lab: NetLab, names: list[str], port: int, log) -> None:
        ns = [a for n in names for a in ("--ns", lab.replica(n).ns)]
        self.n = len(names)
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.netns_gloo", *ns, "--host",
                                      lab.replica(names[0]).data_ip, "--port", str(port)],
                                     env=_env(), cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                     text=True)
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: [self.lines.put(x) for x in self.proc.stdout], daemon=True).start()

    def replies(self, timeout: float = 30.0) -> list[dict]:
        """One reply of each rank, in rank order."""
        got: dict[int, dict] = {}
        deadline = time.monotonic() + timeout
        while len(got) < self.n:
            try:
                line = json.loads(self.lines.get(timeout=max(0.0, deadline - time.monotonic())))
            except queue.Empty:
                raise AssertionError(f"replies {got} of {self.n} ranks in {timeout}s") from None
            got[line["rank"]] = line
        return [got[r] for r in range(self.n)]

    def __call__(self, command: str, timeout: float = 30.0) -> list[dict]:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.replies(timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)  # the ranks die with it (PR_SET_PDEATHSIG)
        self.proc.wait(timeout=10)


def in_net(addr: str, net) -> bool:
    host = addr.rsplit(":", 1)[0].strip("[]").removeprefix("::ffff:")
    return ipaddress.ip_address(host) in net


def test_gloo_runs_over_the_data_bridge_and_stops_when_a_data_link_is_cut(lab, tmp_path):
    r0, r1 = lab.replica("r0"), lab.replica("r1")
    log = open(tmp_path / "gloo.log", "w")
    # r0's namespace is the test's own: a port free there now stays free.
    probe = lab.listen("r0")
    port = probe.getsockname()[1]
    probe.close()
    ranks = GlooRanks(lab, ["r0", "r1"], port, log)
    try:
        assert [r["store"] for r in ranks.replies(60)] == [f"{r0.data_ip}:{port}"] * 2
        ranks("group g1")
        assert [r["value"] for r in ranks("allreduce 10")] == [3.0, 3.0]
        # Every connection of r1's (the store's and gloo's pair) is on the data bridge.
        conns = lab.tcp_connections("r1")
        assert conns and all(in_net(local, lab.data_net) and in_net(remote, lab.data_net)
                             for local, remote in conns), conns

        lab.cut_data("r1")
        stuck = ranks("allreduce 3")
        assert not any(r["allreduce"] for r in stuck), f"a collective completed over a cut link: {stuck}"
        # The control path still works: r1 reaches a listener on the control bridge.
        control = lab.listen(None)
        assert lab.can_connect("r1", lab.control_host, control.getsockname()[1])
        control.close()
        assert lab.connect_error("r0", r1.data_ip, 9, timeout=1) == "timeout"

        lab.heal_data("r1")
        ranks("group g2")
        assert [r["value"] for r in ranks("allreduce 10")] == [3.0, 3.0]
    finally:
        ranks.kill()
        log.close()


# ----- the faults at the network level ------------------------------------------------


class Listeners:
    """A TCP listener on each replica's data address, accepting on a thread."""

    def __init__(self, lab: NetLab) -> None:
        self.socks = {name: lab.listen(name) for name in lab.replicas}
        self.port = {name: s.getsockname()[1] for name, s in self.socks.items()}
        self.received: dict[str, queue.Queue] = {name: queue.Queue() for name in lab.replicas}
        for name, s in self.socks.items():
            threading.Thread(target=self._accept, args=(name, s), daemon=True).start()

    def _accept(self, name: str, s: socket.socket) -> None:
        while True:
            try:
                conn, _ = s.accept()
            except OSError:
                return
            threading.Thread(target=self._drain, args=(name, conn), daemon=True).start()

    def _drain(self, name: str, conn: socket.socket) -> None:
        total, first, last = 0, None, None
        with conn:
            while chunk := conn.recv(1 << 16):
                now = time.monotonic()
                first = now if first is None else first
                total, last = total + len(chunk), now
        if total:
            self.received[name].put((total, first, last))

    def close(self) -> None:
        for s in self.socks.values():
            s.close()


def reach(lab: NetLab, listeners: Listeners, src: str, dst: str, timeout: float = 1.0) -> str:
    return lab.connect_error(src, lab.replica(dst).data_ip, listeners.port[dst], timeout=timeout)


def test_a_pair_cut_separates_two_replicas_only(lab):
    listeners = Listeners(lab)
    try:
        pairs = [(a, b) for a in lab.replicas for b in lab.replicas if a != b]
        assert all(reach(lab, listeners, a, b) == "ok" for a, b in pairs)
        lab.cut_pair("r0", "r1")
        seen = {(a, b): reach(lab, listeners, a, b) for a, b in pairs}
        cut = {("r0", "r1"), ("r1", "r0")}
        assert all(seen[p] != "ok" for p in cut), seen
        assert all(seen[p] == "ok" for p in pairs if p not in cut), seen
        # A blackhole route fails the sender's own connect at once (EINVAL).
        assert seen[("r0", "r1")] == "EINVAL", seen
        lab.heal_pair("r0", "r1")
        assert all(reach(lab, listeners, a, b) == "ok" for a, b in pairs)
    finally:
        listeners.close()


def test_a_control_cut_leaves_the_data_path(lab):
    listeners = Listeners(lab)
    control = lab.listen(None)
    port = control.getsockname()[1]
    try:
        lab.cut_control("r0")
        assert lab.connect_error("r0", lab.control_host, port, timeout=1) == "timeout"
        assert lab.connect_error("r1", lab.control_host, port) == "ok"
        assert reach(lab, listeners, "r0", "r1") == "ok" and reach(lab, listeners, "r1", "r0") == "ok"
        lab.heal_control("r0")
        assert lab.connect_error("r0", lab.control_host, port, timeout=3) == "ok"
    finally:
        control.close()
        listeners.close()


def test_a_flapped_data_link_comes_back_by_itself(lab):
    listeners = Listeners(lab)
    try:
        cut_at = time.monotonic()
        lab.flap_data("r2", 2.0)
        assert reach(lab, listeners, "r0", "r2", timeout=0.5) == "timeout"
        wait_until(lambda: reach(lab, listeners, "r0", "r2", timeout=0.5) == "ok", 10, interval=0.1,
                   message="r2's data link back after the flap")
        down = time.monotonic() - cut_at
        assert 1.9 <= down < 5.0, f"the link was out {down:.1f}s for a 2 s flap"
        assert reach(lab, listeners, "r2", "r1") == "ok"
    finally:
        listeners.close()


def throughput(lab: NetLab, listeners: Listeners, src: str, dst: str, nbytes: int) -> float:
    """Bytes per second of one TCP stream of ``nbytes`` from src to dst, as dst receives it."""
    s = lab.socket(src)
    s.settimeout(60)
    s.connect((lab.replica(dst).data_ip, listeners.port[dst]))
    start = time.monotonic()
    s.sendall(b"\0" * nbytes)
    s.close()
    total, _, last = listeners.received[dst].get(timeout=60)
    assert total == nbytes
    return total / (last - start)


def test_a_rate_limited_data_link_is_slow_both_ways_but_works(lab):
    listeners = Listeners(lab)
    try:
        fast = throughput(lab, listeners, "r0", "r1", 4 << 20)
        lab.limit_rate("r1", "8mbit")  # 1 MB/s
        slow_in = throughput(lab, listeners, "r0", "r1", 2 << 20)
        slow_out = throughput(lab, listeners, "r1", "r2", 2 << 20)
        other = throughput(lab, listeners, "r0", "r2", 4 << 20)
        lab.unlimit("r1")
        back = throughput(lab, listeners, "r0", "r1", 4 << 20)
        print(f"MB/s: unlimited {fast / 1e6:.0f}, to r1 limited {slow_in / 1e6:.2f}, from r1 {slow_out / 1e6:.2f}, "
              f"r0->r2 {other / 1e6:.0f}, r1 unlimited again {back / 1e6:.0f}")
        for rate in (slow_in, slow_out):
            assert 0.6e6 < rate < 1.4e6, f"{rate / 1e6:.2f} MB/s through an 8 mbit/s tbf"
        assert fast > 5e6 and other > 5e6 and back > 5e6
    finally:
        listeners.close()


# ----- the lab itself -------------------------------------------------------------------


def test_leftovers_of_a_killed_run_are_removed(tmp_path):
    NetLab.skip_unless_possible()
    code = ("import sys, time; from tests.harness.netns import NetLab; lab = NetLab(2); lab.open(); "
            "print(lab.prefix, flush=True); sys.stdin.read()")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=_env(), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        prefix = proc.stdout.readline().strip()
        assert prefix, "the child made no lab"
        assert [ns for ns in netns_names() if ns.startswith(prefix)]
        with NetLab(1) as live:  # a live run beside it: another /24 pair, kept by the clean-up
            child_lab = json.loads((STATE_DIR / f"{prefix}.json").read_text())
            assert live.ctl_net != ipaddress.ip_network(child_lab["ctl_net"])
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
            assert prefix in remove_leftovers()
            assert not [ns for ns in netns_names() if ns.startswith(prefix)]
            assert not (STATE_DIR / f"{prefix}.json").exists()
            assert [ns for ns in netns_names() if ns.startswith(live.prefix)], "a live lab was removed"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        remove_leftovers()


# ----- a real fthsdp job in namespaces --------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_three_replicas_train_over_the_data_bridge(lab, tmp_path, etcd_url, key_prefix):
    """A coordinator (etcd behind it) on the control bridge and three replicas
    each under `fthsdp agent` in its own namespace: they commit steps, every
    connection to the coordinator runs over a control link and every
    connection between replicas over the data bridge."""
    c = lab.coordinator(tmp_path, "--store", etcd_url, "--store-prefix", key_prefix.rstrip("/"), "--min-replicas", "2",
                        "--heartbeat-interval", "200ms", "--heartbeat-timeout", "2s", "--join-timeout", "2s").start()
    agents = []
    try:
        assert c.address.startswith(lab.control_host + ":"), c.address
        for i in range(3):
            agents.append(lab.agent(f"r{i}", tmp_path, c.address, i, 3, "--steps", "1000000", "--wait-for", "3",
                                    "--hidden", "64").start())
        first = agents[0].read_until(lambda line: line.get("step", 0) >= 1 and line.get("contributors") == 3,
                                     timeout=120)
        for a in agents:
            a.read_until(lambda line: line.get("step", 0) >= first["step"] + 20, timeout=60)
        for s in range(first["step"], first["step"] + 20):
            assert len({a.steps[s]["checksum"] for a in agents if s in a.steps}) == 1, f"states differ at step {s}"
        coordinator_port = c.address.rsplit(":", 1)[1]
        for name in lab.replicas:
            for local, remote in lab.tcp_connections(name):
                if remote.endswith(":" + coordinator_port) and in_net(remote, lab.ctl_net):
                    assert in_net(local, lab.ctl_net), (name, local, remote)
                elif not local.startswith(("127.", "[::ffff:127.", "[::1]")):
                    assert in_net(local, lab.data_net) and in_net(remote, lab.data_net), (name, local, remote)
    finally:
        for a in agents:
            a.stop()
        c.stop()
