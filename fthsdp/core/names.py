"""Rules for the names that end up in store keys and on the wire."""

from __future__ import annotations

import re

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
MAX_JOB_LEN = 64
MAX_REPLICA_ID_LEN = 128
MAX_ADDRESS_LEN = 256


def name_problem(kind: str, value: str, max_len: int) -> str | None:
    """Why ``value`` is not a valid job name or replica id, or None if it is.

    Names become etcd key segments, so '/' and other separators are refused.
    """
    if not value:
        return f"{kind} is empty"
    if len(value) > max_len:
        return f"{kind} is {len(value)} characters long; the limit is {max_len}"
    if not NAME_RE.match(value):
        return (f"{kind} {value!r} may contain only letters, digits, '.', '_' and '-', "
                "and must start with a letter or digit")
    return None


def split_host_port(address: str, what: str = "address") -> tuple[str, int]:
    """'host:port', '[v6]:port' -> (host, port); ValueError with a clear message otherwise."""
    host, sep, port_text = address.rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise ValueError(f"{what} {address!r} is not HOST:PORT")
    port = int(port_text)
    if not 0 <= port <= 65535:
        raise ValueError(f"{what} {address!r}: port {port} is out of range")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, port
