"""A snapshot over a two-rank torch.distributed group (fthsdp/agent/training/catchup_group.py):
a real source process, this process the joiner; every chunk CRC-checked,
and HTTP taking over from the first unverified chunk whenever the group
path breaks (a corrupt chunk, a source that leaves, a source without it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fthsdp.agent.training.catchup_client import SourceClient
from fthsdp.agent.training.catchup_group import GroupChannel, PushRequest
from fthsdp.agent.training.checksum import state_checksum
from fthsdp.agent.training.snapshot import load_state, state_from_bytes
from fthsdp.agent.training.transport.gloo import GlooTransport
from tests.catchup_source_worker import model_and_optimizer

ROOT = Path(__file__).resolve().parent.parent
CHUNK = 4096


@pytest.fixture
def source():
    started = []

    def start(fault: str = "none") -> dict:
        proc = subprocess.Popen([sys.executable, "-m", "tests.catchup_source_worker", "--fault", fault,
                                 "--chunk", str(CHUNK)], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=True)
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
    """A client that remembers the HTTP requests it made (method, path, Range)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.requests: list[tuple[str, str, str]] = []

    def _request(self, method, path, headers=None, timeout=None):
        self.requests.append((method, path.split("?")[0], (headers or {}).get("Range", "")))
        return super()._request(method, path, headers, timeout)


def fetch(address: str, channel: GroupChannel | None) -> tuple[str, Recorded, list[int], object]:
    client = Recorded(address, timeout=10, channel=channel)
    manifest = client.request_snapshot()
    seen: list[int] = []
    data = client.fetch(manifest, progress=seen.append)
    model, opt = model_and_optimizer(1, 64)
    load_state(model, opt, state_from_bytes(manifest, data))
    client.release(manifest.step)
    assert seen == sorted(seen) and seen[-1] == manifest.total_bytes
    return state_checksum(model, opt), client, seen, manifest


def channel() -> GroupChannel:
    return GroupChannel(GlooTransport(), "127.0.0.1", 10.0)


def data_requests(client: Recorded) -> list[str]:
    return [rng for method, path, rng in client.requests if method == "GET" and path.endswith("/data")]


def test_the_snapshot_travels_over_the_group_and_nothing_over_http(source):
    src = source()
    checksum, client, seen, manifest = fetch(src["address"], channel())
    assert checksum == src["checksum"]
    assert len(manifest.chunk_crc32) >= 4 and len(seen) == len(manifest.chunk_crc32)
    assert data_requests(client) == []
    assert client.transport == "distributed (gloo)"


@pytest.mark.parametrize("fault", ["corrupt", "stop"])
def test_http_takes_over_from_the_first_chunk_the_group_did_not_deliver_intact(source, fault):
    """Chunk 0 arrives intact over the group; chunk 1 is corrupt or never
    comes: HTTP resumes at chunk 1, and the state is exact."""
    src = source(fault)
    checksum, client, _, _ = fetch(src["address"], channel())
    assert checksum == src["checksum"]
    # "stop" delivers chunks 0 and 1 before leaving, "corrupt" only chunk 0 intact.
    first = 2 if fault == "stop" else 1
    assert data_requests(client) == [f"bytes={first * CHUNK}-"]


def test_a_source_that_pushes_nothing_is_read_over_http(source):
    src = source("http-only")
    checksum, client, _, _ = fetch(src["address"], channel())
    assert checksum == src["checksum"]
    assert data_requests(client) == ["bytes=0-"]


def test_http_alone_gives_the_same_state(source):
    src = source()
    checksum, client, _, _ = fetch(src["address"], None)
    assert checksum == src["checksum"] and client.transport == "http"


@pytest.mark.parametrize("query, message", [
    ({"prefix": "p", "from": "0", "backend": "gloo"}, "store is missing"),
    ({"store": "nowhere", "prefix": "p", "from": "0", "backend": "gloo"}, "malformed"),
    ({"store": "h:1", "prefix": "a b", "from": "0", "backend": "gloo"}, "malformed"),
    ({"store": "h:1", "prefix": "p", "from": "-1", "backend": "gloo"}, "malformed"),
])
def test_a_malformed_push_request_is_refused(query, message):
    with pytest.raises(ValueError, match=message):
        PushRequest.parse(query)


def test_a_push_request_round_trips_through_its_query():
    request = PushRequest("[::1]:4242", "catchup/7/abc", 3, "gloo")
    parsed = dict(part.split("=", 1) for part in request.query().split("&"))
    assert PushRequest.parse(parsed) == request


def test_a_source_refuses_a_backend_it_does_not_send_over():
    from fthsdp.agent.training.catchup_group import GroupTransferError

    with pytest.raises(GroupTransferError, match="asked for nccl"):
        channel().push(torch.zeros(8, dtype=torch.uint8), 4, PushRequest("127.0.0.1:1", "p", 0, "nccl"))
