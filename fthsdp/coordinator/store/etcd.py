"""The etcd backend: the store to use when state must outlive the coordinator
or be shared by a standby coordinator."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from typing import TypeVar

import grpc
import pyetcd
from pyetcd import exceptions as etcd_exc

from fthsdp.coordinator.store.base import (
    CasResult,
    Store,
    TxnResult,
    Versioned,
    validate_key,
    validate_revision,
    validate_txn,
    validate_write,
)
from fthsdp.core.errors import StoreError, StoreUnavailable

T = TypeVar("T")

# pyetcd marks an endpoint that failed once as unusable for ``time_retry``
# seconds (default 300) and raises NoServerAvailableError without trying it in
# the meantime; a short window keeps a restarted etcd usable at once.
DEFAULT_TIME_RETRY = 0.5

_GRPC_OPTIONS = [
    # gRPC's default reconnect backoff grows to 120 s, so after a long etcd
    # outage the channel would keep failing fast long after etcd is back.
    # Capping it at 1 s bounds recovery to about etcd's own start-up time.
    # Not grpc.min_reconnect_backoff_ms: gRPC core uses that as the minimum
    # *connect timeout* (default 20 s); set low, a slow link could never
    # finish the HTTP/2 handshake.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    # A dead peer that never sends a RST (a partition) would otherwise keep a
    # half-open connection until the kernel gives up, minutes later. etcd
    # rejects client pings more often than every 5 s, so stay well above.
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 3_000),
    # etcd is an internal service; an http_proxy meant for the internet must
    # not capture its traffic.
    ("grpc.enable_http_proxy", 0),
    # get_prefix of a large job can exceed gRPC's 4 MiB default.
    ("grpc.max_receive_message_length", 256 * 1024 * 1024),
]

# Codes after which the same request may well succeed later.
_TRANSIENT_CODES = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.ABORTED,
    grpc.StatusCode.INTERNAL,
}


class EtcdStore(Store):
    """:class:`Store` on an etcd v3 cluster, through ``pyetcd``.

    ``endpoints`` are ``(host, port)`` pairs of members of ONE cluster; when one
    fails the next call goes to another. ``timeout`` bounds each RPC, so every
    method returns or raises within about ``timeout`` seconds per endpoint
    tried. Creating the store does not connect: an unreachable etcd shows up
    at the first call (use :meth:`check` to fail early).

    Revisions are etcd's ``mod_revision``. Reads are linearizable. Reads that
    fail on one endpoint are retried once on each other endpoint; writes are
    never retried, because an RPC that failed in flight may still have been
    applied (the caller must re-read, see the module docs of ``base``).
    """

    def __init__(
        self,
        endpoints: list[tuple[str, int]],
        timeout: float = 2.0,
        *,
        time_retry: float = DEFAULT_TIME_RETRY,
    ) -> None:
        if not endpoints:
            raise ValueError("EtcdStore needs at least one endpoint")
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0, got {timeout!r}")
        self._timeout = timeout
        self._netlocs = [_netloc(host, port) for host, port in endpoints]
        self._where = ",".join(self._netlocs)
        self._last_reason = "it failed recently"
        self._closed = False
        try:
            eps = [
                pyetcd.Endpoint(
                    _grpc_host(host), port, secure=False, time_retry=time_retry, opts=_GRPC_OPTIONS
                )
                for host, port in endpoints
            ]
            self._client = pyetcd.MultiEndpointEtcd3Client(
                endpoints=eps, timeout=timeout, failover=True
            )
        except Exception as e:  # noqa: BLE001 - the contract allows only StoreError out
            raise StoreUnavailable(f"etcd at {self._where}: cannot create a client: {e}") from e

    @property
    def description(self) -> str:
        return f"etcd://{self._where}"

    def get(self, key: str) -> Versioned | None:
        key_b = validate_key(key)
        resp = self._call(lambda: self._client.get_response(key_b), idempotent=True)
        return _versioned(resp.kvs[0]) if resp.kvs else None

    def get_prefix(self, prefix: str) -> dict[str, Versioned]:
        if not isinstance(prefix, str):
            raise TypeError(f"store prefix must be str, got {type(prefix).__name__}")
        if prefix:
            prefix_b = prefix.encode("utf-8")
            resp = self._call(lambda: self._client.get_prefix_response(prefix_b), idempotent=True)
        else:
            # An empty range_end would mean "just the empty key"; get_all asks
            # for every key instead.
            resp = self._call(self._client.get_all_response, idempotent=True)
        out: dict[str, Versioned] = {}
        for kv in resp.kvs:
            try:
                out[kv.key.decode("utf-8")] = _versioned(kv)
            except UnicodeDecodeError as e:
                raise StoreError(
                    f"etcd at {self._where} holds a key that is not UTF-8 under {prefix!r}: {kv.key!r}"
                ) from e
        return out

    def compare_and_set(self, key: str, value: bytes, expected_revision: int, lease: int = 0) -> CasResult:
        key_b = validate_key(key)
        validate_write(value, expected_revision)
        value_b = bytes(value)  # pyetcd only passes real bytes through unencoded
        t = self._client.transactions
        # mod_revision of an absent key compares as 0, so one comparison covers
        # both create and update. Reading back inside the same transaction
        # gives the new revision (a get sees the put before it) or what beat us.
        succeeded, responses = self._call(
            lambda: self._client.transaction(
                compare=[t.mod(key_b) == expected_revision],
                success=[t.put(key_b, value_b, lease=lease or None), t.get(key_b)],
                failure=[t.get(key_b)],
            ),
            idempotent=False,
        )
        kvs = responses[-1]
        current = Versioned(value=kvs[0][0], revision=kvs[0][1].mod_revision) if kvs else None
        return CasResult(succeeded=bool(succeeded), current=current)

    def compare_and_delete(self, key: str, expected_revision: int) -> CasResult:
        key_b = validate_key(key)
        validate_revision(expected_revision)
        t = self._client.transactions
        succeeded, responses = self._call(
            lambda: self._client.transaction(
                compare=[t.mod(key_b) == expected_revision],
                success=[t.delete(key_b)],
                failure=[t.get(key_b)],
            ),
            idempotent=False,
        )
        if succeeded:
            return CasResult(succeeded=True, current=None)
        kvs = responses[-1]
        current = Versioned(value=kvs[0][0], revision=kvs[0][1].mod_revision) if kvs else None
        return CasResult(succeeded=False, current=current)

    def transact(self, compares: Mapping[str, int], puts: Mapping[str, bytes],
                 deletes: Iterable[str] = ()) -> TxnResult:
        gone = validate_txn(compares, puts, deletes)
        t = self._client.transactions
        compared = [validate_key(k) for k in compares]
        written = [validate_key(k) for k in puts]
        # Reading the written keys back inside the transaction gives their new revision; on failure, the
        # compared keys as they are.
        succeeded, responses = self._call(
            lambda: self._client.transaction(
                compare=[t.mod(k) == r for k, r in zip(compared, compares.values(), strict=True)],
                success=[*(t.put(k, bytes(v)) for k, v in zip(written, puts.values(), strict=True)),
                         *(t.delete(validate_key(k)) for k in gone), *(t.get(k) for k in written)],
                failure=[t.get(k) for k in compared],
            ),
            idempotent=False,
        )
        if succeeded:
            reads = responses[len(responses) - len(written):]
            return TxnResult(True, revisions={k: kvs[0][1].mod_revision for k, kvs in zip(puts, reads, strict=True)})
        current = {k: (Versioned(value=kvs[0][0], revision=kvs[0][1].mod_revision) if kvs else None)
                   for k, kvs in zip(compares, responses, strict=True)}
        return TxnResult(False, current=current)

    def grant_lease(self, ttl: float) -> int:
        if not ttl > 0:
            raise ValueError(f"a lease's time to live must be positive, got {ttl}")
        # etcd counts whole seconds (and raises short ones to its minimum).
        granted = self._call(lambda: self._client.lease(max(1, math.ceil(ttl))), idempotent=False)
        return int(granted.id)

    def refresh_lease(self, lease: int) -> bool:
        answers = self._call(lambda: list(self._client.refresh_lease(lease)), idempotent=True)
        return bool(answers) and answers[0].TTL > 0  # an ended lease answers with TTL 0

    def revoke_lease(self, lease: int) -> None:
        try:
            self._call(lambda: self._client.revoke_lease(lease), idempotent=True)
        except StoreError as e:
            if "lease not found" not in str(e):
                raise

    def check(self) -> None:
        # A linearizable read goes through the raft leader, so this also fails
        # while a reachable member has no quorum; count_only keeps it tiny.
        self._call(
            lambda: self._client.get_response(b"/", count_only=True, keys_only=True),
            idempotent=True,
        )

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._client.close()
        except Exception:  # noqa: BLE001 - closing must not fail the caller's shutdown
            pass

    # -- error mapping ---------------------------------------------------

    def _call(self, rpc: Callable[[], T], *, idempotent: bool) -> T:
        if self._closed:
            raise RuntimeError(f"{self!r} is closed")
        attempts = len(self._netlocs) if idempotent else 1
        for attempt in range(attempts):
            try:
                return rpc()
            except Exception as e:  # noqa: BLE001 - mapped or re-raised below
                err = self._map_error(e)
                if err is None:
                    raise
                if isinstance(err, StoreUnavailable) and attempt + 1 < attempts:
                    # pyetcd has marked the endpoint failed; the retry goes to
                    # the next one.
                    continue
                raise err from e
        raise AssertionError("unreachable")

    def _map_error(self, e: BaseException) -> StoreError | None:
        """The StoreError for a client-library exception; None if ``e`` is not
        from the client library (a bug here, which must surface as is)."""
        if isinstance(e, etcd_exc.NoServerAvailableError) or (
            isinstance(e, ValueError) and "failed node" in str(e)
        ):
            # pyetcd did not even try: every endpoint failed within time_retry.
            return StoreUnavailable(f"etcd at {self._where} is unreachable: {self._last_reason}")
        if isinstance(e, ValueError) and "closed channel" in str(e):
            return StoreUnavailable(f"etcd at {self._where} is unreachable: the client is closed")
        rpc_error = e if isinstance(e, grpc.RpcError) else e.__context__
        if not isinstance(e, (etcd_exc.Etcd3Exception, grpc.RpcError)):
            return None
        code, details = _code_and_details(rpc_error)
        if isinstance(e, (etcd_exc.ConnectionFailedError, etcd_exc.ConnectionTimeoutError,
                          etcd_exc.InternalServerError)) or code in _TRANSIENT_CODES:
            reason = self._reason(code, details)
            self._last_reason = reason
            return StoreUnavailable(f"etcd at {self._where} is unreachable: {reason}")
        code_name = code.name if code is not None else type(e).__name__
        return StoreError(f"etcd at {self._where} rejected the request: {code_name}: {details}")

    def _reason(self, code: grpc.StatusCode | None, details: str) -> str:
        low = details.lower()
        if "connection refused" in low:
            return "connection refused"
        if code is grpc.StatusCode.DEADLINE_EXCEEDED:
            return f"no answer within {self._timeout:g}s"
        if "etcdserver:" in low:
            # etcd's own words ("no leader", "request timed out") are the best hint.
            return details[low.index("etcdserver:"):]
        return details or (code.name if code is not None else "unknown error")


def _code_and_details(rpc_error: object) -> tuple[grpc.StatusCode | None, str]:
    if not isinstance(rpc_error, grpc.RpcError):
        return None, ""
    code = rpc_error.code() if hasattr(rpc_error, "code") else None
    details = rpc_error.details() if hasattr(rpc_error, "details") else ""
    # gRPC details can span lines and embed whole address lists; one short line
    # reads better in a log.
    details = re.sub(r"\s+", " ", details or "").strip()
    if len(details) > 200:
        details = details[:197] + "..."
    return code, details


def _versioned(kv: object) -> Versioned:
    return Versioned(value=kv.value, revision=kv.mod_revision)  # type: ignore[attr-defined]


def _netloc(host: str, port: int) -> str:
    return f"{_grpc_host(host)}:{port}"


def _grpc_host(host: str) -> str:
    # gRPC targets need IPv6 literals bracketed; pyetcd joins host:port as is.
    return f"[{host}]" if ":" in host and not host.startswith("[") else host
