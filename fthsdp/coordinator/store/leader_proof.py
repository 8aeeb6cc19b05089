"""The proof that a leader key's holder is gone, which lets a campaign take
over at once (fthsdp/coordinator/store/leadership.py).

A wrong "gone" makes two coordinators lead at once (and flip the key between
them every few seconds), a wrong "alive" only costs the wait for the lease to
run out; so only a proof counts, and it has two independent halves:

- the holder's process: same boot id and pid namespace as this one, and
  ``kill(pid, 0)`` says ESRCH, or /proc/PID/stat, read, shows a zombie or a
  different start time. EPERM is a live process of another user, and a missing
  /proc entry proves nothing: with ``hidepid=2`` (systemd ``ProtectProc=invisible``)
  another user's live process has none.
- the holder's advertised address refuses a TCP connection (ECONNREFUSED).
  Hosts cloned from one memory image share the boot id and pid namespace, so
  the first half alone would take a live leader's lease there; a live leader
  answers at its address wherever it runs, a dead one on this host refuses.
  One answer counts as a refusal: a successor that its supervisor restarted
  on the dead leader's port listens there itself (its gRPC server binds
  before it campaigns), so a connect that reaches this process's own socket,
  at the address this coordinator advertises too, proves nothing alive there.

The probes (:func:`probe_pid`, :func:`probe_address`) only observe; the pure
:func:`predecessor_gone` decides from what they saw.
"""

from __future__ import annotations

import dataclasses
import enum
import ipaddress
import json
import os
import socket
import stat
import time
from dataclasses import dataclass

from fthsdp.coordinator.store import Versioned
from fthsdp.core.names import split_host_port

CONNECT_TIMEOUT = 0.5
"""Seconds a connect to the holder's address may take: a refusal on this host,
or a live clone's answer on the same network, comes within a millisecond; a
timeout proves nothing and the campaign follows."""


class HolderRecordError(ValueError):
    """A ``leader-holder`` value that is not a record this version can read."""


@dataclass(frozen=True)
class Host:
    """Where pids mean the same thing: one boot of one kernel, one pid namespace.
    (Or a host cloned from its memory image: hence the address probe.)"""

    boot_id: str
    """/proc/sys/kernel/random/boot_id: differs between hosts and across a reboot."""
    pid_ns: str
    """DEV:INODE of /proc/self/ns/pid: containers on one host may each have their own."""


@dataclass(frozen=True)
class Holder:
    """Who holds the leader key, as the holder itself recorded it."""

    address: str
    revision: int
    """The leader key's revision when this holder wrote it: binds the record to that holding."""
    lease: int
    host: Host
    pid: int
    start: int
    """The process's start time (clock ticks since boot): tells a reused pid apart."""

    def encode(self) -> bytes:
        return json.dumps(dataclasses.asdict(self), sort_keys=True).encode()

    @classmethod
    def decode(cls, raw: bytes) -> Holder:
        try:
            d = json.loads(raw)
            holder = cls(str(d["address"]), int(d["revision"]), int(d["lease"]),
                         Host(str(d["host"]["boot_id"]), str(d["host"]["pid_ns"])), int(d["pid"]), int(d["start"]))
        except (ValueError, TypeError, KeyError) as e:
            raise HolderRecordError(f"unreadable leader-holder record {raw[:200]!r}: {e}") from e
        return holder


class Kill(enum.Enum):
    """What ``kill(pid, 0)`` answered."""

    NO_SUCH_PROCESS = "ESRCH"
    SIGNALLED = "ok"
    NOT_PERMITTED = "EPERM"
    """A live process of another user."""
    FAILED = "error"


@dataclass(frozen=True)
class Seen:
    """What this host shows at a pid."""

    kill: Kill
    zombie: bool = False
    start: int | None = None
    """Its start time from /proc/PID/stat; None if that could not be read (then ``zombie`` means nothing)."""


class PidState(enum.Enum):
    GONE = "gone"
    ALIVE = "alive"
    UNKNOWN = "unknown"


class Reach(enum.Enum):
    """What a TCP connect to the holder's advertised address got."""

    REFUSED = "refused"
    """ECONNREFUSED from every address it resolves to: nothing listens there."""
    ANSWERED = "answered"
    OWN = "own"
    """Answered, by a socket this very process listens on (a coordinator restarted on its old port)."""
    SILENT = "silent"
    """A timeout, an unreachable network, a name that does not resolve: no answer either way."""
    NOT_TRIED = "not tried"


@dataclass(frozen=True)
class Verdict:
    gone: bool
    why: str


def pid_state(seen: Seen, pid: int, start: int) -> tuple[PidState, str]:
    """Whether the process that had ``pid`` and started at ``start`` is gone, from what this host shows at pid."""
    if seen.kill is Kill.NO_SUCH_PROCESS:
        return PidState.GONE, "no such process"
    if seen.start is not None:
        if seen.zombie:
            return PidState.GONE, "it exited"
        if seen.start != start:
            return PidState.GONE, "its pid now belongs to a newer process"
        return PidState.ALIVE, "its process is alive"
    # No /proc entry, yet kill did not say ESRCH: with hidepid that is another
    # user's live process, and it may simply have ended between the two looks.
    if seen.kill is Kill.NOT_PERMITTED:
        return PidState.ALIVE, f"pid {pid} is another user's live process (kill: EPERM; /proc hides it)"
    return PidState.UNKNOWN, f"pid {pid} exists but /proc does not show its start time"


def predecessor_gone(holder: Holder | None, leader: Versioned, here: Host | None, me: str,
                     seen: Seen | None, reach: Reach) -> Verdict:
    """Whether the holder of ``leader`` (the key as just read) is provably dead.

    ``me`` is this coordinator's advertised address; ``seen``, what this host
    shows at the holder's pid (None: not looked); ``reach``, what a connect
    to the holder's address got.
    """
    if holder is None:
        return Verdict(False, "it left no holder record")
    if holder.revision != leader.revision or holder.address.encode() != leader.value:
        return Verdict(False, "its holder record belongs to another holding of the key")
    if here is None:
        return Verdict(False, "this host's boot id or pid namespace is unreadable")
    if holder.host.boot_id != here.boot_id:
        return Verdict(False, "it ran on another host (or before a reboot)")
    if holder.host.pid_ns != here.pid_ns:
        return Verdict(False, "it ran in another pid namespace")
    if seen is None:
        return Verdict(False, f"pid {holder.pid} was not looked at")
    state, why = pid_state(seen, holder.pid, holder.start)
    if state is not PidState.GONE:
        return Verdict(False, why)
    if reach is Reach.REFUSED:
        return Verdict(True, f"{why}; {holder.address} refuses connections")
    if reach is Reach.OWN and holder.address == me:
        # Its address is ours and our own socket answers there: this is its
        # successor on its host, listening where it listened.
        return Verdict(True, f"{why}; {holder.address} is this coordinator's own address")
    if reach is Reach.OWN:
        return Verdict(False, f"{why} here, but {holder.address} answers (this process listens there, "
                              f"advertised as {me})")
    if reach is Reach.ANSWERED:
        return Verdict(False, f"{why} here, but {holder.address} answers: it runs on another host "
                              "(one cloned from this one: same boot id)")
    if reach is Reach.SILENT:
        return Verdict(False, f"{why} here, but {holder.address} did not refuse a connection (no answer)")
    return Verdict(False, f"{why} here, but {holder.address} was not tried")


def this_host() -> Host | None:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot_id = f.read().strip()
        ns = os.stat("/proc/self/ns/pid")
    except OSError:
        return None
    return Host(boot_id, f"{ns.st_dev}:{ns.st_ino}") if boot_id else None


def probe_pid(pid: int) -> Seen:
    """What this host shows at ``pid`` (in this process's pid namespace)."""
    try:
        # Not /proc alone: with hidepid a live process of another user has no
        # /proc entry, while kill(0) still tells "no such process" apart.
        os.kill(pid, 0)
        kill = Kill.SIGNALLED
    except ProcessLookupError:
        return Seen(Kill.NO_SUCH_PROCESS)
    except PermissionError:
        kill = Kill.NOT_PERMITTED
    except OSError:
        kill = Kill.FAILED
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            line = f.read()
        # The command name (field 2) may hold spaces and parentheses: count from the last ')'.
        fields = line[line.rindex(b")") + 2:].split()
        return Seen(kill, zombie=fields[0] in (b"Z", b"X"), start=int(fields[19]))
    except (OSError, ValueError, IndexError):
        return Seen(kill)


def probe_address(address: str, timeout: float = CONNECT_TIMEOUT) -> Reach:
    """Connect to ``address`` (HOST:PORT) over TCP, at every address it resolves to."""
    deadline = time.monotonic() + timeout
    try:
        host, port = split_host_port(address)
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, ValueError, UnicodeError):
        return Reach.SILENT
    seen: set[Reach] = set()
    for family, kind, proto, _, target in infos:
        left = deadline - time.monotonic()
        if left <= 0:
            seen.add(Reach.SILENT)
            break
        seen.add(_connect(family, kind, proto, target, left))
    # The weakest proof counts: one live answer anywhere means it may be alive.
    for reach in (Reach.ANSWERED, Reach.SILENT, Reach.OWN, Reach.REFUSED):
        if reach in seen:
            return reach
    return Reach.SILENT


def _connect(family: int, kind: int, proto: int, target: tuple, timeout: float) -> Reach:
    try:
        sock = socket.socket(family, kind, proto)
    except OSError:
        return Reach.SILENT
    with sock:
        sock.settimeout(timeout)
        try:
            sock.connect(target)
        except ConnectionRefusedError:
            return Reach.REFUSED
        except OSError:
            return Reach.SILENT
        try:
            host, port = sock.getpeername()[:2]
        except OSError:
            return Reach.ANSWERED  # accepted, then reset at once: something lives there
        return Reach.OWN if any(listens(mine, host, port) for mine in own_listeners()) else Reach.ANSWERED


@dataclass(frozen=True)
class Listener:
    """A listening TCP socket: its bound address, and which families it accepts."""

    host: str
    port: int
    v4: bool
    v6: bool


def listens(listener: Listener, host: str, port: int) -> bool:
    """Whether a connection that reached ``host``:``port`` can have been accepted by ``listener``."""
    if port != listener.port:
        return False
    peer, bound = _ip(host), _ip(listener.host)
    if peer is None or bound is None or not (listener.v4 if peer.version == 4 else listener.v6):
        return False
    return bound.is_unspecified or bound == peer


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        ip = ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return None
    # gRPC binds 127.0.0.1 as ::ffff:127.0.0.1 on a dual-stack socket.
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def own_listeners() -> list[Listener]:
    """The TCP sockets this process listens on (its gRPC server, bound before it campaigns)."""
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return []
    found = []
    for name in names:
        try:
            if not stat.S_ISSOCK(os.fstat(int(name)).st_mode):
                continue
            copy = os.dup(int(name))  # a copy: closing it leaves the owner's socket alone
        except (ValueError, OSError):
            continue  # closed meanwhile
        try:
            sock = socket.socket(fileno=copy)
        except OSError:
            os.close(copy)
            continue
        with sock:
            try:
                if (sock.type != socket.SOCK_STREAM or sock.family not in (socket.AF_INET, socket.AF_INET6)
                        or not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)):
                    continue
                host, port = sock.getsockname()[:2]
                v4 = sock.family == socket.AF_INET or not sock.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY)
                found.append(Listener(host, port, v4, sock.family == socket.AF_INET6))
            except OSError:
                continue
    return found
