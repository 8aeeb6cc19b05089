"""Who may ask a catch-up source for what: the short-lived transfer token
(fthsdp/agent/training/catchup/transfer_token.py) that replaces the job token
on the wire, and the rule that a source opens a session only with a store at
the address the request came from (fthsdp/agent/training/catchup/group.py),
on their own and against a real server on a loopback port."""

from __future__ import annotations

import http.client
import ipaddress
import socket
import threading
import time
import types

import pytest

from fthsdp.agent.training.catchup.client import SourceClient, Unauthorized
from fthsdp.agent.training.catchup.grad_log import GradientLog
from fthsdp.agent.training.catchup.group import numeric_host, store_host_problem
from fthsdp.agent.training.catchup.server import CatchUpServer
from fthsdp.agent.training.catchup.source import ServedState
from fthsdp.agent.training.catchup.transfer_token import LIFETIME, TokenRefused, mint, verify

KEY = "job-s3cret-token"
SOURCE = "10.0.0.1:4000"
STORE = "10.0.0.2:5000"
NOW = 1_700_000_000.0

# ----- the token on its own --------------------------------------------------------------


def test_a_token_verifies_for_the_source_and_store_it_was_minted_for_and_holds_no_job_token():
    plain = mint(KEY, SOURCE, "r2", NOW)
    assert verify(plain, KEY, SOURCE, NOW + LIFETIME - 0.01) == "r2"
    assert KEY not in plain and plain.startswith("v1.r2.")
    session = mint(KEY, SOURCE, "r2.a-1", NOW, store=STORE)  # a replica id with dots
    assert verify(session, KEY, SOURCE, NOW, store=STORE) == "r2.a-1"
    assert verify(mint(KEY, SOURCE, "", NOW), KEY, SOURCE, NOW) == ""  # a tool, not a replica


def _forged_mac(token: str) -> str:
    return token[:-1] + ("0" if token[-1] != "0" else "1")


def _other_joiner(token: str) -> str:
    return token.replace("v1.r2.", "v1.r3.", 1)


def _longer_expiry(token: str) -> str:
    version, joiner, expiry, mac = token.split(".")
    return ".".join((version, joiner, str(int(expiry) + 3_600_000), mac))


PLAIN = mint(KEY, SOURCE, "r2", NOW)
SESSION = mint(KEY, SOURCE, "r2", NOW, store=STORE)


@pytest.mark.parametrize("presented, source, store, now, match", [
    (PLAIN, SOURCE, "", NOW + LIFETIME + 0.01, "expired"),
    (mint(KEY, SOURCE, "r2", NOW + 1000), SOURCE, "", NOW, "more than 120 s after now"),
    (PLAIN, "10.0.0.9:4000", "", NOW, "does not verify for source 10.0.0.9:4000"),
    (PLAIN, "10.0.0.1:4001", "", NOW, "does not verify"),
    (SESSION, SOURCE, "10.0.0.3:5000", NOW, "does not verify for source 10.0.0.1:4000 and store 10.0.0.3:5000"),
    (SESSION, SOURCE, "", NOW, "does not verify"),  # a session's token is good for that session only
    (PLAIN, SOURCE, STORE, NOW, "does not verify"),  # and another request's for no session
    (mint("another-job", SOURCE, "r2", NOW), SOURCE, "", NOW, "does not verify"),
    (_forged_mac(PLAIN), SOURCE, "", NOW, "does not verify"),
    (_other_joiner(PLAIN), SOURCE, "", NOW, "does not verify"),
    (_longer_expiry(PLAIN), SOURCE, "", NOW, "does not verify"),
    (KEY, SOURCE, "", NOW, "malformed"),  # the raw job token
    ("", SOURCE, "", NOW, "malformed"),
    ("v1.r2.soon." + "0" * 64, SOURCE, "", NOW, "malformed"),
    ("v2" + PLAIN[2:], SOURCE, "", NOW, "malformed"),
    (PLAIN.upper(), SOURCE, "", NOW, "malformed"),
], ids=["expired", "far-ahead", "other-source", "other-port", "other-store", "session-for-plain",
        "plain-for-session", "other-key", "forged-mac", "other-joiner", "longer-expiry", "job-token", "empty",
        "bad-expiry", "other-version", "upper-case"])
def test_a_token_is_refused_with_one_line(presented, source, store, now, match):
    with pytest.raises(TokenRefused, match=match) as e:
        verify(presented, KEY, source, now, store=store)
    assert "\n" not in str(e.value) and KEY not in str(e.value)


def test_minting_refuses_what_would_not_verify():
    with pytest.raises(ValueError, match="needs the job token"):
        mint("", SOURCE, "r2", NOW)
    with pytest.raises(ValueError, match="not a replica id"):
        mint(KEY, SOURCE, "r2 x", NOW)


# ----- the store-host rule ---------------------------------------------------------------


@pytest.mark.parametrize("store, peer, allowed", [
    ("127.0.0.1:5000", "127.0.0.1", True),
    ("[::1]:5000", "::1", True),
    ("127.0.0.1:5000", "::ffff:127.0.0.1", True),  # a dual-stack server sees an IPv4 peer so
    ("10.0.0.2:5000", "10.0.0.1", False),
    ("[::1]:5000", "127.0.0.1", False),
    ("localhost:5000", "127.0.0.1", False),  # a name: its answer could be anyone's
])
def test_a_session_store_must_be_at_the_address_the_request_came_from(store, peer, allowed):
    problem = store_host_problem(store, peer)
    assert (problem == "") is allowed
    if not allowed:
        assert f"this request's address {peer}" in problem and "\n" not in problem


def test_numeric_host_gives_an_ip_literal():
    assert numeric_host("127.0.0.1") == "127.0.0.1"
    assert numeric_host("[::1]") == "::1"
    assert ipaddress.ip_address(numeric_host("localhost")).is_loopback
    assert numeric_host("no-such-host.invalid") == "no-such-host.invalid"  # the source refuses its sessions


# ----- against a real server -------------------------------------------------------------


class FakeChannel:
    """Stands in for a GroupChannel: records the sessions a source was asked to accept."""

    name = "distributed (fake)"

    def __init__(self) -> None:
        self.accepted: list = []

    def accept(self, request):
        self.accepted.append(request)
        return types.SimpleNamespace(name=request.prefix, closed=False, last_used=time.monotonic(),
                                     close=lambda: None)


class Server:
    def __init__(self, token: str = KEY) -> None:
        self.now = time.time()
        self.channel = FakeChannel()
        self.source = ServedState("r0", 0, 42, GradientLog())  # no training thread: no snapshot is ever taken
        self.server = CatchUpServer(self.source, token=token, channel=self.channel,  # type: ignore[arg-type]
                                    clock=lambda: self.now).start()
        self.address = self.server.address

    def ask(self, method: str, path: str, authorization: str | None) -> tuple[int, str]:
        host, port = self.address.rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        try:
            conn.request(method, path, headers={"Authorization": authorization} if authorization is not None else {})
            response = conn.getresponse()
            return response.status, response.read().decode()
        finally:
            conn.close()

    def token(self, store: str = "", source: str = "", key: str = KEY) -> str:
        return "Bearer " + mint(key, source or self.address, "r2", self.now, store)


@pytest.fixture
def server():
    made: list[Server] = []

    def make(**kw) -> Server:
        made.append(Server(**kw))
        return made[-1]

    yield make
    for s in made:
        s.server.close()


def test_the_source_refuses_the_job_token_and_no_token_and_takes_no_snapshot(server):
    s = server()
    for authorization in (None, f"Bearer {KEY}", KEY, f"Basic {KEY}", s.token(source="127.0.0.1:1"),
                          s.token(key="another-job")):
        status, body = s.ask("POST", "/v1/snapshots?wait=5", authorization)
        assert status == 401, (authorization, status, body)
        assert body.count("\n") == 1 and KEY not in body
    assert not s.source.wanted and s.source.held == []
    assert s.ask("GET", "/v1/log?from=0", s.token())[0] == 200  # the same request with a transfer token
    assert s.ask("GET", "/v1/health", None) == (200, "ok\n")  # kept open


def test_without_a_job_token_there_is_no_authentication(server):
    s = server(token="")
    assert s.ask("GET", "/v1/log?from=0", None)[0] == 200
    entries, head, _ = SourceClient(s.address).log(0)
    assert (entries, head) == ([], 0)


def test_the_token_expires_on_the_sources_clock(server):
    s = server()
    minted = s.now
    client = SourceClient(s.address, token=KEY, joiner="r2", clock=lambda: minted)
    s.now = minted + LIFETIME / 2
    assert client.log(0)[1] == 0
    s.now = minted + LIFETIME + 1
    with pytest.raises(Unauthorized, match="expired"):
        client.log(0)


def _capture_one_request(answer: bytes) -> tuple[str, dict]:
    """A listener that records the first request's bytes and answers ``answer``."""
    listener = socket.create_server(("127.0.0.1", 0))
    seen: dict = {}

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            seen["request"] = data.decode()
            conn.sendall(answer)

    threading.Thread(target=serve, daemon=True).start()
    return f"127.0.0.1:{listener.getsockname()[1]}", seen


@pytest.mark.parametrize("token", [KEY, ""])
def test_the_client_sends_a_transfer_token_never_the_job_token(token):
    address, seen = _capture_one_request(b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n")
    SourceClient(address, token=token, joiner="r2", timeout=10).release(3)
    headers = dict(line.split(": ", 1) for line in seen["request"].split("\r\n")[1:] if ": " in line)
    if not token:
        assert "Authorization" not in headers  # no job token: no credential at all, as before
        return
    assert KEY not in seen["request"]
    scheme, presented = headers["Authorization"].split(" ")
    assert scheme == "Bearer" and verify(presented, KEY, address, time.time()) == "r2"


def test_a_session_store_elsewhere_is_refused_and_never_connected_to(server):
    s = server()
    asked = "/v1/sessions?store={}&prefix=p1&backend=gloo"
    status, body = s.ask("POST", asked.format(STORE), s.token(store=STORE))  # a valid token, another host
    assert status == 403 and "this request's address 127.0.0.1, not 10.0.0.2" in body and body.count("\n") == 1
    status, body = s.ask("POST", asked.format("localhost:5000"), s.token(store="localhost:5000"))
    assert status == 403
    # A token seen on its way to a session cannot point the source at another store.
    status, body = s.ask("POST", asked.format("127.0.0.1:5001"), s.token(store="127.0.0.1:5000"))
    assert status == 401 and "does not verify" in body
    status, _ = s.ask("POST", asked.format("127.0.0.1:5001"), s.token())  # a token of no session
    assert status == 401
    assert s.channel.accepted == []
    status, body = s.ask("POST", asked.format("127.0.0.1:5001"), s.token(store="127.0.0.1:5001"))
    assert (status, body) == (200, "open\n")
    assert [r.store for r in s.channel.accepted] == ["127.0.0.1:5001"]


# ----- the fingerprints' way through the coordinator -------------------------------------


FINGERPRINT = "ab" * 32


@pytest.mark.parametrize("fingerprints, match", [
    ([FINGERPRINT], "give one per catch-up address"),
    ([FINGERPRINT, "AB" * 32], "is not a SHA-256 fingerprint"),
    ([FINGERPRINT, "ab" * 31], "is not a SHA-256 fingerprint"),
])
def test_a_registration_with_malformed_fingerprints_is_refused(fingerprints, match):
    from fthsdp.coordinator.validation import check_register
    from fthsdp.core.errors import InvalidRequest
    from fthsdp.protos.v1 import coordinator_pb2 as pb

    def register(fingerprints: list[str]) -> pb.RegisterRequest:
        return pb.RegisterRequest(job="default", replica_id="r0", address="127.0.0.1:1", world_size=2,
                                  catch_up_addresses=["127.0.0.1:2", "127.0.0.1:3"],
                                  catch_up_fingerprints=fingerprints)

    check_register(register([]))  # plain HTTP or mutual TLS: none
    check_register(register([FINGERPRINT, "cd" * 32]))
    with pytest.raises(InvalidRequest, match=match):
        check_register(register(fingerprints))


def test_a_joiner_is_handed_its_sources_fingerprints_with_their_addresses():
    from fthsdp.coordinator.decisions.quorum_outcome import _assign_sources
    from fthsdp.coordinator.decisions.quorum_types import ReplicaView

    alive = {"r0": ReplicaView("r0", address="h:1", step=9, catch_up_addresses=("h:2",),
                               catch_up_fingerprints=(FINGERPRINT,))}
    source = _assign_sources(["r2"], ["r0"], alive, {})["r2"]
    assert (source.catch_up_addresses, source.catch_up_fingerprints) == (("h:2",), (FINGERPRINT,))
