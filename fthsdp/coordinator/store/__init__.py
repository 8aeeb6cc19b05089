"""Where the coordinator keeps its state: a versioned key-value store with
compare-and-swap (see :mod:`fthsdp.coordinator.store.base` for the semantics).

``open_store`` turns the ``--store`` flag into a backend:

* ``memory``: :class:`~fthsdp.coordinator.store.memory.MemoryStore`, in-process,
  gone when the process exits;
* ``etcd://HOST:PORT[,HOST:PORT...]``: :class:`~fthsdp.coordinator.store.etcd.EtcdStore`
  on the members of one etcd cluster (port 2379 if omitted; IPv6 hosts in
  brackets, ``etcd://[::1]:2379``).
"""

from __future__ import annotations

from fthsdp.coordinator.store.base import CasResult, Store, TxnResult, Versioned
from fthsdp.coordinator.store.memory import MemoryStore
from fthsdp.core.errors import ConfigError

__all__ = ["CasResult", "MemoryStore", "Store", "TxnResult", "Versioned", "open_store", "parse_etcd_url"]

DEFAULT_ETCD_PORT = 2379
_EXPECTED = "expected 'memory' or 'etcd://HOST:PORT[,HOST:PORT...]'"


def open_store(url: str, timeout: float = 2.0) -> Store:
    """The store named by ``url``; raises ConfigError (one line) if it is malformed.

    Does not contact the store: call ``check()`` on the result to find out
    whether it is reachable. ``timeout`` is the per-request timeout in seconds
    (ignored by the memory store).
    """
    if url == "memory":
        return MemoryStore()
    if isinstance(url, str) and url.startswith("etcd://"):
        endpoints = parse_etcd_url(url)
        if not (isinstance(timeout, (int, float)) and timeout > 0):
            raise ConfigError(f"store timeout must be a positive number of seconds, got {timeout!r}")
        # Imported here so that the memory store works without grpc/pyetcd.
        from fthsdp.coordinator.store.etcd import EtcdStore

        return EtcdStore(endpoints, timeout=timeout)
    raise ConfigError(f"--store: {_EXPECTED}, got {url!r}")


def parse_etcd_url(url: str) -> list[tuple[str, int]]:
    """``etcd://h1:p1,[::1]:p2,h3`` -> ``[("h1", p1), ("::1", p2), ("h3", 2379)]``."""

    def bad(why: str) -> ConfigError:
        return ConfigError(f"--store: {_EXPECTED}, got {url!r} ({why})")

    rest = url[len("etcd://"):]
    if not rest:
        raise bad("no endpoints")
    endpoints = []
    for item in rest.split(","):
        if not item:
            raise bad("empty endpoint")
        if item.startswith("["):
            host, sep, tail = item[1:].partition("]")
            if not sep or not host:
                raise bad(f"bad IPv6 endpoint {item!r}")
            if tail and not tail.startswith(":"):
                raise bad(f"bad IPv6 endpoint {item!r}")
            port_text = tail[1:] if tail else None
        else:
            if item.count(":") > 1:
                raise bad(f"IPv6 address {item!r} must be in brackets, like [::1]:2379")
            host, sep, port_text = item.partition(":")
            if not sep:
                port_text = None
            if not host:
                raise bad(f"no host in {item!r}")
        if any(c in host for c in "/?#@ "):
            raise bad(f"bad host {host!r}")
        if port_text is None:
            port = DEFAULT_ETCD_PORT
        elif port_text.isdigit() and port_text.isascii() and 0 < int(port_text) < 65536:
            port = int(port_text)
        else:
            raise bad(f"port {port_text!r} is not a number from 1 to 65535")
        endpoints.append((host, port))
    return endpoints
