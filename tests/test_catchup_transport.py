"""The catch-up pieces on their own: the state codec, the gradient log, and
the HTTP transport against a real server on a loopback port (no training)."""

from __future__ import annotations

import http.client
import socket
import ssl
import threading

import pytest
import torch

from fthsdp.agent.training.catchup import tls as catchup_tls
from fthsdp.agent.training.catchup.client import (
    LogGone,
    SourceClient,
    SourceUnavailable,
    Unauthorized,
    WrongCertificate,
)
from fthsdp.agent.training.catchup.grad_log import GradientLog
from fthsdp.agent.training.catchup.server import CatchUpServer
from fthsdp.agent.training.catchup.source import ServedState, SnapshotUnavailable
from fthsdp.agent.training.state.checksum import state_checksum
from fthsdp.agent.training.state.codec import StateCodecError, flatten, unflatten
from fthsdp.agent.training.state.snapshot import capture_state, load_state, state_from_bytes
from fthsdp.core.credentials import TlsFiles
from fthsdp.protos.v1 import catchup_pb2 as cpb
from tests.harness.waiting import wait_until

# ----- the codec -------------------------------------------------------------------------


def test_codec_round_trips_an_optimizer_state_without_pickle():
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=0.5, betas=(0.8, 0.9))
    model(torch.ones(2, 4)).sum().backward()
    opt.step()
    state = {"optimizer": opt.state_dict(), "extra": {"$odd": 1, "none": None, "inf": float("inf")}}
    skeleton, tensors, sharded = flatten(state)
    assert not any(sharded)
    back = unflatten(skeleton, tensors)
    assert back["optimizer"]["param_groups"][0]["betas"] == (0.8, 0.9)  # a tuple again
    assert set(back["optimizer"]["state"]) == {0, 1}  # integer keys again
    assert back["extra"] == {"$odd": 1, "none": None, "inf": float("inf")}
    torch.testing.assert_close(back["optimizer"]["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"])


@pytest.mark.parametrize("bad", [{"f": lambda: 0}, {"s": {1, 2}}, {(1, 2): 3}])
def test_codec_refuses_what_it_cannot_send(bad):
    with pytest.raises(StateCodecError, match="cannot be transferred"):
        flatten(bad)


def test_codec_refuses_a_reference_to_a_missing_tensor():
    with pytest.raises(StateCodecError, match="refers to tensor 3"):
        unflatten('{"a": {"$t": 3}}', [])


# ----- the gradient log ------------------------------------------------------------------


def filled_log(keep: int, steps: int, max_bytes: int = 1 << 30) -> GradientLog:
    log = GradientLog(keep_steps=keep, max_bytes=max_bytes)
    for s in range(steps):
        log.append(cpb.LogEntry(step=s, hyperparams_json="[]"), torch.full((4,), float(s)), 2, 1)
    return log


def test_log_keeps_only_the_last_steps_unless_pinned():
    log = filled_log(keep=2, steps=5)
    records, head, oldest = log.read(0, 1 << 20)
    assert (records, head, oldest) == ([], 5, 3)
    log.pin(5)
    for s in range(5, 9):
        log.append(cpb.LogEntry(step=s, hyperparams_json="[]"), torch.zeros(4), 2, 1)
    records, head, _ = log.read(5, 1 << 20)
    assert [r.entry.step for r in records] == [5, 6, 7, 8] and head == 9
    log.unpin(5)
    assert log.read(5, 1 << 20)[0] == []


def test_log_pin_is_bounded_by_bytes():
    log = GradientLog(keep_steps=1, max_bytes=3 * 16)  # three entries of 4 float32
    log.pin(0)
    for s in range(6):
        log.append(cpb.LogEntry(step=s, hyperparams_json="[]"), torch.zeros(4), 2, 1)
    assert [r.entry.step for r in log.read(0, 1 << 20, 0)[0]] == []
    assert [r.entry.step for r in log.read(3, 1 << 20, 0)[0]] == [3, 4, 5]


def test_log_read_returns_at_least_one_entry_and_respects_max_bytes():
    log = filled_log(keep=10, steps=4)
    assert [r.entry.step for r in log.read(1, max_bytes=1)[0]] == [1]
    assert [r.entry.step for r in log.read(1, max_bytes=32)[0]] == [1, 2]


def test_log_forgets_entries_across_a_gap():
    log = filled_log(keep=10, steps=3)
    log.append(cpb.LogEntry(step=7, hyperparams_json="[]"), torch.zeros(4), 2, 1)
    assert [r.entry.step for r in log.read(0, 1 << 20)[0]] == []
    assert [r.entry.step for r in log.read(7, 1 << 20)[0]] == [7]


# ----- the transport ---------------------------------------------------------------------


class Source:
    """A ServedState over a real server, with a 'training thread' that
    takes a requested snapshot at its next step boundary."""

    def __init__(self, token: str = "", chunk: int = 4096, tls=None) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.BatchNorm1d(32), torch.nn.Linear(32, 4))
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-2)
        self.model(torch.randn(8, 32)).sum().backward()
        self.opt.step()
        self.log = GradientLog()
        self.log.append(cpb.LogEntry(step=0, hyperparams_json='[{"lr": 0.01}]'), torch.arange(6.0), 2, 5, "cafe0001")
        self.source = ServedState("r0", 0, 42, self.log, chunk_bytes=chunk)
        self.server = CatchUpServer(self.source, token=token, tls=tls).start()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._train, daemon=True)
        self._thread.start()

    def _train(self) -> None:
        while not self._stop.wait(0.001):
            if self.source.wanted:
                self.source.take(self.log.head, capture_state(self.model, self.opt))
                self.source.wait_copied(10)

    def close(self) -> None:
        self._stop.set()
        self.server.close()


@pytest.fixture
def source():
    made = []

    def make(**kw) -> Source:
        made.append(Source(**kw))
        return made[-1]

    yield make
    for s in made:
        s.close()


def test_snapshot_round_trip_gives_the_same_state(source):
    src = source()
    client = SourceClient(src.server.address)
    manifest = client.request_snapshot()
    assert (manifest.step, manifest.structure_hash, manifest.replica_id) == (1, 42, "r0")
    seen = []
    data = client.fetch(manifest, progress=seen.append)
    assert seen[-1] == manifest.total_bytes and len(seen) == len(manifest.chunk_xxh3)
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.BatchNorm1d(32), torch.nn.Linear(32, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    load_state(model, opt, state_from_bytes(manifest, data))
    assert state_checksum(model, opt) == state_checksum(src.model, src.opt)
    assert src.source.held == [1]
    client.release(1)
    assert src.source.held == []


def test_log_entries_arrive_with_their_metadata(source):
    src = source()
    entries, head, oldest = SourceClient(src.server.address).log(0)
    assert (head, oldest) == (1, 0)
    (entry, data), = entries
    assert (entry.step, entry.contributors, entry.quorum_id, entry.checksum_after) == (0, 2, 5, "cafe0001")
    torch.testing.assert_close(data, torch.arange(6.0))


def test_log_gone_when_the_step_is_no_longer_held(source):
    src = source()
    for s in range(1, 10):
        src.log.append(cpb.LogEntry(step=s, hyperparams_json="[]"), torch.zeros(6), 2, 5)
    with pytest.raises(LogGone, match="no longer held"):
        SourceClient(src.server.address).log(0)


@pytest.mark.parametrize("given", ["", "wrong"])
def test_a_missing_or_wrong_token_is_refused_and_takes_no_snapshot(source, given):
    src = source(token="s3cret")
    with pytest.raises(Unauthorized):
        SourceClient(src.server.address, token=given).request_snapshot(wait=1)
    assert not src.source.wanted and src.source.held == []
    assert SourceClient(src.server.address, token="s3cret").request_snapshot().step == 1


def test_health_needs_no_token(source):
    src = source(token="s3cret")
    host, port = src.server.address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=5)
    conn.request("GET", "/v1/health")
    assert conn.getresponse().status == 200


def test_ranged_read_resumes_in_the_middle(source):
    src = source()
    client = SourceClient(src.server.address)
    manifest = client.request_snapshot()
    host, port = src.server.address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=5)
    conn.request("GET", f"/v1/snapshots/{manifest.step}/data", headers={"Range": "bytes=100-199"})
    response = conn.getresponse()
    assert response.status == 206
    assert response.getheader("Content-Range") == f"bytes 100-199/{manifest.total_bytes}"
    assert response.read() == bytes(client.fetch(manifest)[100:200].numpy())


def test_a_snapshot_nobody_asks_for_in_time_is_unavailable():
    source = ServedState("r0", 0, 1, GradientLog())  # no training thread takes it
    with pytest.raises(SnapshotUnavailable, match="is this replica training"):
        source.request_snapshot(timeout=0.05)
    assert not source.wanted


def test_a_source_that_breaks_off_is_given_up():
    # A "server" that sends headers and a few bytes, then closes: every attempt fails.
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            conn, _ = listener.accept()
            with conn:
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 206 Partial Content\r\nContent-Length: 8192\r\n\r\nxx")

    threading.Thread(target=serve, daemon=True).start()
    from fthsdp.protos.v1 import catchup_pb2 as cpb

    manifest = cpb.SnapshotManifest(step=1, total_bytes=8192, chunk_bytes=4096, chunk_xxh3=[0, 0])
    client = SourceClient(f"127.0.0.1:{listener.getsockname()[1]}", attempts=2, timeout=5)
    with pytest.raises(SourceUnavailable, match="2 attempts"):
        client.fetch(manifest)
    stop.set()
    listener.close()


def test_idle_snapshots_expire(source):
    src = source()
    src.source.idle_timeout = 0.0
    SourceClient(src.server.address).request_snapshot()
    wait_until(lambda: (src.source.expire(), src.source.held == [])[1], 5, message="the idle snapshot expired")


def test_a_joiner_reading_the_log_keeps_its_snapshot_and_the_log_held(source):
    """A joiner may follow the log for longer than the idle timeout (its
    admission waits for the members' next step boundary): the snapshot, and
    the log entries it pins, must not expire under it."""
    src = source()
    client = SourceClient(src.server.address)
    step = client.request_snapshot().step
    snap = src.source.snapshot(step, 1)
    snap.last_used -= 2 * src.source.idle_timeout  # idle for longer than the timeout...
    client.log(step)  # ...but the joiner reads the log from the snapshot's step
    src.source.expire()
    assert src.source.held == [step]
    snap.last_used -= 2 * src.source.idle_timeout
    src.source.expire()
    assert src.source.held == []


def test_status_table_shows_catch_up_progress():
    from fthsdp.coordinator.decisions.status_view import status_table
    from fthsdp.protos.v1 import coordinator_pb2 as pb

    status = pb.StatusResponse(job="j", replicas=[pb.ReplicaStatus(
        replica_id="r2", state=pb.REPLICA_STATE_CATCHING_UP, catch_up_source="r0",
        catch_up_bytes=12 << 20, catch_up_total_bytes=48 << 20, heartbeat_age_s=0.1)])
    row = next(line for line in status_table(status).splitlines() if line.startswith("r2"))
    assert "catching-up" in row and "from r0, 12/48 MiB (25%)" in row


# ----- TLS, from the control plane's files ---------------------------------------------


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    from tests.harness.tls_certs import make_certificates

    return make_certificates(tmp_path_factory.mktemp("certs"))


def _files(certs, name: str | None) -> TlsFiles:
    if name is None:
        return TlsFiles(str(certs / "ca.pem"))
    return TlsFiles(str(certs / "ca.pem"), str(certs / f"{name}.pem"), str(certs / f"{name}.key"))


def test_snapshot_over_mutual_tls(source, certs):
    src = source(token="t", tls=catchup_tls.server_context(_files(certs, "node")))
    client = SourceClient(src.server.address, token="t", tls=catchup_tls.client_context(_files(certs, "node")))
    assert client.transport == "https"
    manifest = client.request_snapshot()
    assert len(client.fetch(manifest)) == manifest.total_bytes


@pytest.mark.parametrize(
    "joiner, source_cert",
    [
        ("plain", "node"),  # plain HTTP to a TLS source
        ("stranger", "node"),  # a certificate from another CA
        ("expired", "node"),
        ("node", "client"),  # the source's certificate does not name its address
    ],
)
def test_tls_source_refuses_joiners_without_valid_credentials(source, certs, joiner, source_cert):
    src = source(token="t", tls=catchup_tls.server_context(_files(certs, source_cert)))
    if joiner == "plain":
        client = SourceClient(src.server.address, token="t", attempts=1)
    elif joiner == "stranger":
        context = ssl.create_default_context(cafile=str(certs / "ca.pem"))
        context.load_cert_chain(str(certs / "stranger.pem"), str(certs / "stranger.key"))
        client = SourceClient(src.server.address, token="t", tls=context)
    else:
        client = SourceClient(src.server.address, token="t", tls=catchup_tls.client_context(_files(certs, joiner)))
    with pytest.raises(SourceUnavailable):
        client.request_snapshot(wait=1)
    assert not src.source.wanted and src.source.held == []


def test_catch_up_uses_tls_whenever_the_coordinator_does(certs):
    Mode = catchup_tls.Mode
    assert catchup_tls.mode(TlsFiles()) is Mode.PLAIN
    assert catchup_tls.serving(TlsFiles()) == (None, "") and catchup_tls.client_context(TlsFiles()) is None
    assert catchup_tls.mode(_files(certs, "node")) is Mode.MUTUAL
    context, fingerprint = catchup_tls.serving(_files(certs, "node"))
    assert context is not None and fingerprint == ""  # verified against the CA: nothing to pin
    # Server-only TLS (a CA file, no certificate of its own): an ephemeral certificate, pinned.
    assert catchup_tls.mode(_files(certs, None)) is Mode.PINNED
    context, fingerprint = catchup_tls.serving(_files(certs, None))
    assert context is not None and len(fingerprint) == 64 and fingerprint != catchup_tls.serving(_files(certs, None))[1]
    assert catchup_tls.client_context(_files(certs, None)).verify_mode == ssl.CERT_NONE  # the pin is the check


def test_snapshot_over_pinned_tls_with_an_ephemeral_certificate(source, certs):
    context, fingerprint = catchup_tls.ephemeral_server()
    src = source(token="t", tls=context)
    client = SourceClient(src.server.address, token="t", tls=catchup_tls.client_context(_files(certs, None)),
                          fingerprint=fingerprint)
    assert client.transport == "https"
    manifest = client.request_snapshot()
    assert len(client.fetch(manifest)) == manifest.total_bytes


@pytest.mark.parametrize("joiner", ["another-certificate", "no-fingerprint", "plain"])
def test_a_pinned_source_with_another_certificate_is_refused(source, certs, joiner):
    context, fingerprint = catchup_tls.ephemeral_server()
    _, other = catchup_tls.ephemeral_server()
    src = source(token="t", tls=context)
    pinned = catchup_tls.client_context(_files(certs, None))
    if joiner == "plain":
        with pytest.raises(SourceUnavailable):
            SourceClient(src.server.address, token="t", attempts=1).request_snapshot(wait=1)
    elif joiner == "no-fingerprint":
        with pytest.raises(WrongCertificate, match="named no certificate fingerprint"):
            SourceClient(src.server.address, token="t", tls=pinned).request_snapshot(wait=1)
    else:
        with pytest.raises(WrongCertificate, match=f"fingerprint {fingerprint}, not {other}"):
            SourceClient(src.server.address, token="t", tls=pinned, fingerprint=other).request_snapshot(wait=1)
    assert not src.source.wanted and src.source.held == []


def test_chunks_and_log_entries_are_checked_in_the_digest_their_source_sent():
    """XXH3-64 from this version's sources; CRC-32 from a source before it (a replica restarted on a
    newer image catches up from members still on the older one)."""
    import zlib

    from fthsdp.agent.training.catchup.client import chunk_digests, entry_intact
    from fthsdp.agent.training.state.checksum import digest64
    from fthsdp.protos.v1 import catchup_pb2 as cpb

    data = memoryview(bytes(range(256)) * 64)
    bad = memoryview(bytes(data[:-1]) + b"\x00")
    for manifest, kind in ((cpb.SnapshotManifest(chunk_xxh3=[digest64(data)]), "xxh3"),
                           (cpb.SnapshotManifest(chunk_crc32=[zlib.crc32(data)]), "crc32")):
        digest, expected = chunk_digests(manifest)
        assert digest(data) == expected[0] and digest(bad) != expected[0], kind
    for entry in (cpb.LogEntry(numel=1, xxh3=digest64(data)), cpb.LogEntry(numel=1, crc32=zlib.crc32(data))):
        assert entry_intact(entry, data) and not entry_intact(entry, bad), entry
