"""Short-lived transfer tokens: what a joiner shows a catch-up source instead of the job token.

The job token is the job's one credential: whoever holds it may speak to the
coordinator. Catch-up crosses the data network, in cleartext where the job
has no TLS, so the job token never goes on it. For each request the joiner
mints instead

    v1.<joiner>.<expiry_unix_ms>.<mac>

where ``mac`` is the hex HMAC-SHA256, keyed by the job token, of the
version, the source's catch-up address (host:port, as the coordinator named
it and as the source's server calls itself), the joiner's replica id, the
expiry and the store address of a session request (empty for every other
request). So a token seen on the wire is good for one source, for a minute,
and, on ``POST /v1/sessions``, for the one store it was minted for: it
cannot make the source connect anywhere else. The source checks it with the
same job token (``verify``); nothing is pickled, the MAC is compared in
constant time.

Expiry is wall-clock time (the two hosts' clocks, not a shared one): hosts
whose clocks disagree by more than ``LIFETIME`` refuse each other's
transfers, and the refusal names both times.
"""

from __future__ import annotations

import hashlib
import hmac
import re

from fthsdp.core.errors import FthsdpError

VERSION = "v1"
LIFETIME = 60.0
"""Seconds a minted token is good for: a request is verified when it
arrives, so this bounds the replay of a sniffed token, not a transfer's length."""

MAX_AHEAD = 2 * LIFETIME
"""The furthest in the future a presented expiry may be (a token minted to
last longer, or a clock far ahead): refused."""

_JOINER = re.compile(r"^[A-Za-z0-9_.-]{0,200}$")
_TOKEN = re.compile(r"^v1\.([A-Za-z0-9_.-]{0,200})\.(\d{1,16})\.([0-9a-f]{64})$")


class TokenRefused(FthsdpError):
    """A presented transfer token is malformed, expired, forged, or minted
    for another source or store (the server answers 401 with this line)."""


def _mac(key: str, source: str, joiner: str, expiry_ms: int, store: str) -> str:
    # Newline-separated: none of the fields can hold one (addresses and
    # replica ids are checked), so no two bindings give the same message.
    message = "\n".join((VERSION, source, joiner, str(expiry_ms), store)).encode()
    return hmac.new(key.encode(), message, hashlib.sha256).hexdigest()


def mint(key: str, source: str, joiner: str, now: float, store: str = "", lifetime: float = LIFETIME) -> str:
    """A token for one request to ``source`` by ``joiner``, good until
    ``now + lifetime`` (unix seconds); ``store``: the store address of a
    session request. ``key``: the job token (never empty here: without one
    catch-up sends no credential at all)."""
    if not key:
        raise ValueError("a transfer token needs the job token as its key")
    if not _JOINER.match(joiner):
        raise ValueError(f"joiner {joiner!r} is not a replica id")
    if "\n" in source or "\n" in store:
        raise ValueError("an address holds no newline")
    expiry_ms = int((now + lifetime) * 1000)
    return f"{VERSION}.{joiner}.{expiry_ms}.{_mac(key, source, joiner, expiry_ms, store)}"


def verify(presented: str, key: str, source: str, now: float, store: str = "") -> str:
    """The joiner a token was minted by, if it is good now (unix seconds) for
    a request to ``source`` (this server's own address) about ``store``;
    else ``TokenRefused`` with one line saying why."""
    m = _TOKEN.match(presented)
    if m is None:
        raise TokenRefused("malformed transfer token")
    joiner, expiry_ms, mac = m.group(1), int(m.group(2)), m.group(3)
    # The MAC first: only an authentic token learns anything about its expiry.
    if not hmac.compare_digest(mac, _mac(key, source, joiner, expiry_ms, store)):
        what = f"source {source} and store {store}" if store else f"source {source}"
        raise TokenRefused(f"transfer token does not verify for {what} (minted for another, or forged)")
    now_ms = int(now * 1000)
    if expiry_ms < now_ms:
        raise TokenRefused(f"transfer token of {joiner or 'a joiner'} expired at {expiry_ms} ms, "
                           f"now {now_ms} ms (unix): are the two hosts' clocks apart?")
    if expiry_ms > now_ms + MAX_AHEAD * 1000:
        raise TokenRefused(f"transfer token of {joiner or 'a joiner'} expires at {expiry_ms} ms, more than "
                           f"{MAX_AHEAD:g} s after now ({now_ms} ms, unix): are the two hosts' clocks apart?")
    return joiner


__all__ = ["LIFETIME", "MAX_AHEAD", "VERSION", "TokenRefused", "mint", "verify"]
