"""The host table's store: hosts by host id, by group and as spares, and their streams (issue 49).

Every write of a host or a stream goes through the few methods here
(``_put``, ``_remove``, ``_link``, ``_unlink``), which keep the indexes in
step with ``hosts`` and schedule a stream's heartbeat deadline, so that
neither can drift: ``hosts`` itself is read-only. A group's hosts are found
by its name, the spares by their own index, never by a pass over every
host; ``visits`` counts the hosts looked at, for the tests that hold the
table to work that does not grow with the number of groups
(tests/test_host_table_events.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from types import MappingProxyType

from fthsdp.coordinator.hosts.deadlines import Due
from fthsdp.coordinator.hosts.rendezvous import Host
from fthsdp.protos.v1 import coordinator_pb2 as pb

Push = Callable[[pb.HostPush | None], None]
"""Sends one message down a host's stream; None ends the stream (the agent opens it again, saying hello)."""


def no_stream(message: pb.HostPush | None) -> None:
    """The push of a host known only from the others' hellos: it has no stream yet."""


@dataclasses.dataclass(eq=False)
class Link:
    """A host's open stream (compared by identity: a newer stream of the host is another link)."""

    push: Push
    connection: int
    """0: a host known only from the others' hellos, whose stream has not opened yet."""
    last_seen: float
    incarnation: str = ""
    """The agent's own id (HostHello.incarnation): only it may say hello as this host while the stream is open."""
    address: str = ""
    since: float = 0.0
    carried: bool = False
    """Its heartbeats come in ping batches (PingBatch.hosts), not on its stream: it is no heartbeat sender
    of its own (``HostIndex.carried``)."""


class HostIndex:
    """A job's hosts, indexed by group, and their streams."""

    def __init__(self) -> None:
        self._hosts: dict[str, Host] = {}
        self.hosts: Mapping[str, Host] = MappingProxyType(self._hosts)
        """Every host by host id (read-only: written through ``_put`` and ``_remove``)."""
        # Dicts as ordered sets: the order hosts came in, the same on every run (a set's is not).
        self._by_group: dict[str, dict[str, None]] = {}
        self._spare_ids: dict[str, None] = {}
        self._links: dict[str, Link] = {}
        self._streams = 0
        """Links of an open stream (``connection`` set), kept as they come and go: read every tick."""
        self._carried = 0
        """Of those, the links whose heartbeats come in ping batches (``Link.carried``)."""
        self._silent = Due(strict=True)
        """Streams by when their host was last heard (at the time of the entry): lost once silent past the
        heartbeat timeout (``now - last_seen > timeout``, strictly, as before)."""
        self.visits = 0
        """Hosts looked at so far (a group's, the spares, a stream whose deadline fell due)."""

    def _put(self, host: Host) -> None:
        """Record ``host`` (new, changed, or moved to another group: a spare adopted)."""
        old = self._hosts.get(host.host_id)
        if old is not None and old.group != host.group:
            self._unindex(old)
        self._hosts[host.host_id] = host
        if host.group:
            self._by_group.setdefault(host.group, {})[host.host_id] = None
        else:
            self._spare_ids[host.host_id] = None

    def _remove(self, host_id: str) -> Host | None:
        """Forget a host; a host known only from the others' hellos goes with its placeholder stream."""
        host = self._hosts.pop(host_id, None)
        if host is not None:
            self._unindex(host)
            link = self._links.get(host_id)
            if link is not None and not link.connection:
                self._unlink(host_id)
        return host

    def _unindex(self, host: Host) -> None:
        if not host.group:
            self._spare_ids.pop(host.host_id, None)
            return
        members = self._by_group.get(host.group)
        if members is not None:
            members.pop(host.host_id, None)
            if not members:
                del self._by_group[host.group]

    def _link(self, host_id: str, link: Link) -> None:
        """``link`` is the host's stream from now: its silence is watched from ``link.last_seen``."""
        self._unlink(host_id)
        self._links[host_id] = link
        self._streams += bool(link.connection)
        self._carried += bool(link.connection and link.carried)
        self._silent.add(link.last_seen, host_id, link)

    def _unlink(self, host_id: str) -> Link | None:
        link = self._links.pop(host_id, None)
        if link is not None:
            self._streams -= bool(link.connection)
            self._carried -= bool(link.connection and link.carried)
        return link

    def _carry(self, link: Link, carried: bool) -> None:
        """The host's heartbeats come in ping batches from now (``carried``), or on its stream again."""
        if link.connection and link.carried != carried:
            self._carried += 1 if carried else -1
        link.carried = carried

    def _members(self, group: str) -> list[Host]:
        """The hosts of ``group`` (counted as visited)."""
        ids = self._by_group.get(group, {})
        self.visits += len(ids)
        return [self._hosts[i] for i in ids]

    def _spare_hosts(self) -> list[Host]:
        """The hosts of no group (counted as visited)."""
        self.visits += len(self._spare_ids)
        return [self._hosts[i] for i in self._spare_ids]

    def _member(self, host_id: str, group: str) -> bool:
        host = self._hosts.get(host_id)
        return host is not None and host.group == group

    def _push(self, host_id: str, message: pb.HostPush) -> None:
        link = self._links.get(host_id)
        if link is not None:
            link.push(message)

    @property
    def streams(self) -> int:
        """Host streams open."""
        return self._streams

    @property
    def carried(self) -> int:
        """Host streams open whose heartbeats come in ping batches: the others are heartbeat senders of their
        own, counted in the job's heartbeat budget (``streams - carried``)."""
        return self._carried

    def pace(self, interval: float) -> None:
        """Tell every connected host its heartbeat interval from now on (the pace changed: rare, in steps)."""
        for link in self._links.values():
            if link.connection:
                link.push(pb.HostPush(heartbeat_interval=interval))

    # ----- status ---------------------------------------------------------------------

    def spares(self) -> list[str]:
        return sorted(h.host_id for h in self._spare_hosts() if h.alive)

    def group_hosts(self, replica_id: str) -> list[Host]:
        return sorted(self._members(replica_id), key=lambda h: h.host_id)

    def reconnecting(self, host_id: str) -> bool:
        """A host known from the others' hellos, not back yet itself."""
        link = self._links.get(host_id)
        return link is not None and not link.connection
