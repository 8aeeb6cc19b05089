"""Catch-up over a two-rank torch.distributed group (fthsdp/agent/training/catchup/group.py):
a real source process, this process the joiner. The snapshot's chunks and
the log's entries travel over one session, every chunk and entry
digest-checked, and HTTP takes over from the first unverified chunk whenever
the group path breaks (a corrupt chunk or entry, a source that leaves, a
source without it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fthsdp.agent.training.catchup.client import SourceClient
from fthsdp.agent.training.catchup.group import GroupChannel, GroupTransferError, SessionRequest
from fthsdp.agent.training.state.checksum import state_checksum
from fthsdp.agent.training.state.snapshot import load_state, state_from_bytes
from fthsdp.agent.training.transport.gloo import GlooTransport
from tests.catchup_source_worker import LOG_STEPS, log_sums, model_and_optimizer

ROOT = Path(__file__).resolve().parent.parent
CHUNK = 4096


@pytest.fixture
def source():
    started = []

    def start(fault: str = "none", token: str = "") -> dict:
        proc = subprocess.Popen([sys.executable, "-m", "tests.catchup_source_worker", "--fault", fault,
                                 "--chunk", str(CHUNK), "--token", token], cwd=ROOT, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
        started.append(proc)
        line = proc.stdout.readline()
        assert line, f"the source worker exited with {proc.wait()}"
        return json.loads(line)

    yield start
    for proc in started:
        proc.stdin.close()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Recorded(SourceClient):
    """A client that remembers the HTTP requests it made (method, path and query, Range)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.requests: list[tuple[str, str, str]] = []

    def _request(self, method, path, headers=None, timeout=None):
        self.requests.append((method, path, (headers or {}).get("Range", "")))
        return super()._request(method, path, headers, timeout)


def fetch(address: str, channel: GroupChannel | None, token: str = "") -> tuple[str, Recorded, list[int], object]:
    """Fetch the snapshot and the log as a joiner does; the state's checksum,
    the client, the progress seen, the manifest."""
    client = Recorded(address, timeout=10, channel=channel, token=token, joiner="r2", bind="127.0.0.1")
    manifest = client.request_snapshot()
    seen: list[int] = []
    data = client.fetch(manifest, progress=seen.append)
    model, opt = model_and_optimizer(1, 64)
    load_state(model, opt, state_from_bytes(manifest, data))
    entries, head, _ = client.log(0)
    assert head == LOG_STEPS and [e.step for e, _ in entries] == list(range(LOG_STEPS))
    for (_, got), expected in zip(entries, log_sums(), strict=True):
        assert torch.equal(got, expected)
    client.release(manifest.step)
    client.close()
    assert seen == sorted(seen) and seen[-1] == manifest.total_bytes
    return state_checksum(model, opt), client, seen, manifest


def channel() -> GroupChannel:
    return GroupChannel(GlooTransport(), "127.0.0.1", 10.0)


def data_requests(client: Recorded) -> list[str]:
    return [rng for method, path, rng in client.requests if method == "GET" and "/data" in path]


def log_requests(client: Recorded) -> list[bool]:
    """For each log request: whether it asked for the bytes over the session."""
    return ["session=" in path for method, path, _ in client.requests if path.startswith("/v1/log")]


@pytest.mark.parametrize("token", ["", "s3cret"], ids=["no-token", "transfer-tokens"])
def test_the_snapshot_and_the_log_travel_over_the_group_and_nothing_over_http(source, token):
    """With a job token, the session too is asked for with a transfer token (bound to its store)."""
    src = source(token=token)
    checksum, client, seen, manifest = fetch(src["address"], channel(), token)
    assert checksum == src["checksum"]
    assert len(manifest.chunk_xxh3) >= 4 and len(seen) == len(manifest.chunk_xxh3)
    assert data_requests(client) == [] and log_requests(client) == [True]
    assert client.transport == "distributed (gloo)"


@pytest.mark.parametrize("fault", ["corrupt", "stop"])
def test_http_takes_over_from_the_first_chunk_the_group_did_not_deliver_intact(source, fault):
    """Chunk 0 arrives intact over the group (and chunk 1 too before the
    source leaves); then chunk 1 is corrupt or nothing more comes: HTTP
    resumes at the first chunk not verified, the log comes over HTTP too,
    and the state is exact."""
    src = source(fault)
    checksum, client, _, _ = fetch(src["address"], channel())
    assert checksum == src["checksum"]
    first = 2 if fault == "stop" else 1
    assert data_requests(client) == [f"bytes={first * CHUNK}-"]
    assert log_requests(client) == [False]


def test_a_corrupt_log_entry_is_fetched_again_over_http(source):
    src = source("corrupt-log")
    checksum, client, _, _ = fetch(src["address"], channel())
    assert checksum == src["checksum"]
    assert data_requests(client) == [] and log_requests(client) == [True, False]


def test_a_source_without_sessions_is_read_over_http(source):
    src = source("http-only")
    checksum, client, _, _ = fetch(src["address"], channel())
    assert checksum == src["checksum"]
    assert data_requests(client) == ["bytes=0-"] and log_requests(client) == [False]


def test_http_alone_gives_the_same_state(source):
    src = source()
    checksum, client, _, _ = fetch(src["address"], None)
    assert checksum == src["checksum"] and client.transport == "http"


@pytest.mark.parametrize("query, message", [
    ({"prefix": "p", "backend": "gloo"}, "store is missing"),
    ({"store": "nowhere", "prefix": "p", "backend": "gloo"}, "malformed"),
    ({"store": "h:1", "prefix": "a b", "backend": "gloo"}, "malformed"),
    ({"store": "h:1", "prefix": "a/b", "backend": "gloo"}, "malformed"),
])
def test_a_malformed_session_request_is_refused(query, message):
    with pytest.raises(ValueError, match=message):
        SessionRequest.parse(query)


def test_a_session_request_round_trips_through_its_query():
    request = SessionRequest("[::1]:4242", "catchup-abc", "gloo")
    parsed = dict(part.split("=", 1) for part in request.query().split("&"))
    assert SessionRequest.parse(parsed) == request


def test_a_source_refuses_a_backend_it_does_not_send_over():
    with pytest.raises(GroupTransferError, match="asked for nccl"):
        channel().accept(SessionRequest("127.0.0.1:1", "p", "nccl"))


def test_device_staging_gives_each_piece_in_flight_a_buffer_of_its_size():
    """NCCL's path stages pieces through device buffers, one slot per piece in
    flight, across transfers of different sizes (a meta device stands in for
    a GPU: only the bookkeeping is checked here)."""
    from fthsdp.agent.training.catchup.group import IN_FLIGHT, Session

    class Meta:
        name, device = "nccl", torch.device("meta")

    session = Session(GroupChannel(Meta(), "127.0.0.1", 1.0), group=None, rank=0, name="s")
    first = [session._stage(i, 10) for i in range(2)]  # a transfer of two pieces
    assert [t.numel() for t in first] == [10, 10]
    second = [session._stage(i, 20 if i == 0 else 5) for i in range(IN_FLIGHT + 1)]
    assert [t.numel() for t in second] == [20] + [5] * IN_FLIGHT
