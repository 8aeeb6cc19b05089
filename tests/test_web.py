"""The coordinator's status page and JSON API (--metrics-port), against a real
coordinator with simulated-replica processes; the page itself rendered by a
headless Chromium (Debian's `chromium`, installed by `make etcd`)."""

from __future__ import annotations

import asyncio
import json
import socket
import uuid

from fthsdp.coordinator.config import CoordinatorConfig
from fthsdp.coordinator.serving.http_server import Request
from fthsdp.coordinator.serving.web import WebApp, checksum_summary, history_view
from tests.harness.fixtures import TOKEN
from tests.harness.processes import CoordinatorProcess, ReplicaProcess
from tests.harness.runtimes import hung_runtime, straggler_runtime
from tests.harness.waiting import wait_until
from tests.harness.web import FAST, drain, http, members, page_url, states, status, steps

# ----- HTTP helpers ------------------------------------------------------------------















def settled(base: str, ids: list[str]) -> dict:
    """The status once ``ids`` are the quorum and all healthy."""
    wait_until(lambda: members(status(base)) == ids and set(states(status(base)).values()) == {"healthy"}, 30,
               message=f"quorum {ids}, all healthy")
    return status(base)


# ----- the JSON API and the admin action -------------------------------------------------

def test_status_api_follows_replicas_and_the_quorum(tmp_path, processes):
    c = processes(CoordinatorProcess(tmp_path, *FAST).start())
    base = page_url(c)
    replicas = [processes(ReplicaProcess(tmp_path, c.address, f"r{i}", "--step-period", "0.05").start())
                for i in range(3)]
    s = settled(base, ["r0", "r1", "r2"])
    assert s["leading"] and not s["follower"] and s["leader"] == c.address
    assert sorted(states(s)) == ["r0", "r1", "r2"] and s["counts"] == {"healthy": 3} and s["total_replicas"] == 3
    assert all(0 <= r["heartbeat_age_s"] < 1.0 for r in s["replicas"])
    assert s["history"][0]["id"] == s["quorum"]["id"] and s["history"][0]["reason"]
    assert s["checksums"]["verdict"] == "unknown"  # these replicas report no checksums
    assert s["admin"]["enabled"] is False
    step = steps(s)["r0"]
    wait_until(lambda: steps(status(base))["r0"] > step, 10, message="r0's step advancing")

    before = s["quorum"]["id"]
    replicas[2].kill()
    wait_until(lambda: members(status(base)) == ["r0", "r1"], 20, message="r2 out of the quorum")
    s = status(base)
    newest = s["history"][0]
    assert newest["id"] == s["quorum"]["id"] > before
    assert (newest["left"], newest["joined"], newest["size"]) == (["r2"], [], 2)
    assert "r2" in newest["reason"]
    assert [h["id"] for h in s["history"]] == sorted((h["id"] for h in s["history"]), reverse=True)
    code, _, body = http(base + "api/status?limit=1")  # those not healthy first
    assert code == 200 and [r["id"] for r in json.loads(body)["replicas"]] == ["r2"]
    assert json.loads(body)["total_replicas"] == 3

    # Without --token-file the admin action is off, and refusing it changes nothing.
    code, body = drain(base, "r0")
    assert code == 403 and "--token-file" in body["error"]
    assert "r0" in members(status(base)) and states(status(base))["r0"] == "healthy"


def test_the_http_surface_is_read_only_but_for_drain(tmp_path, processes):
    c = processes(CoordinatorProcess(tmp_path, "--metrics-port", "0", "--job", "a,b").start())
    base = page_url(c)
    assert (status(base)["job"], status(base, "b")["job"], status(base)["jobs"]) == ("a", "b", ["a", "b"])
    code, headers, body = http(base)
    assert code == 200 and headers["Content-Type"].startswith("text/html") and b"/api/status" in body
    assert http(base + "metrics")[0] == 200
    assert http(base + "api/status", "POST")[0] == 405
    assert http(base, "POST")[0] == 405
    assert http(base + "api/replicas/r0/drain")[0] == 405  # a GET never acts
    assert http(base + "admin")[0] == 404
    code, _, body = http(base + "api/status?job=nope")
    assert code == 400 and "unknown job" in json.loads(body)["error"]
    assert http(base + "api/status?limit=x")[0] == 400


def raw(address: str, request: bytes) -> str:
    """The status line the server answers ``request`` with."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(request)
        return conn.makefile("rb").readline().decode().strip()


def test_malformed_requests_get_a_clear_status(tmp_path, processes):
    c = processes(CoordinatorProcess(tmp_path, "--metrics-port", "0").start())
    address = c.metrics_url.removeprefix("http://").removesuffix("/metrics")
    # Not HTTP, so no version to answer in: aiohttp answers in 1.0. (The
    # requests below carry the Host header that HTTP/1.1 requires: 400 without.)
    assert raw(address, b"hello\r\n\r\n") in ("HTTP/1.0 400 Bad Request", "HTTP/1.1 400 Bad Request")
    assert raw(address, b"GET / HTTP/1.1\r\nHost: x\r\nX: " + b"a" * 20_000 + b"\r\n\r\n").startswith("HTTP/1.1 431")
    big = b"POST /api/replicas/r0/drain HTTP/1.1\r\nHost: x\r\nContent-Length: 10000000\r\n\r\n"
    assert raw(address, big).startswith("HTTP/1.1 413")
    assert raw(address, b"GET /api/status HTTP/1.1\r\nHost: x\r\n\r\n") == "HTTP/1.1 200 OK"  # still serving


def test_drain_needs_the_token(tmp_path, processes, token_file):
    c = processes(CoordinatorProcess(tmp_path, *FAST, "--token-file", token_file).start())
    base = page_url(c)
    replicas = {
        f"r{i}": processes(ReplicaProcess(tmp_path, c.address, f"r{i}", "--step-period", "0.05",
                                          "--token-file", token_file).start())
        for i in range(3)
    }
    s = settled(base, ["r0", "r1", "r2"])  # reading stays open without the token
    assert s["admin"]["enabled"] is True

    for auth in ({}, {"token": "wrong"}, {"auth": f"Basic {TOKEN}"}, {"auth": TOKEN}):
        code, body = drain(base, "r1", **auth)
        assert code == 401, (auth, body)
    code, body = drain(base, "nobody", token=TOKEN)
    assert code == 404 and "nobody" in body["error"]

    code, body = drain(base, "r0", token=TOKEN)
    assert code == 200 and body["drain"] is True
    wait_until(lambda: "r0" not in members(status(base)), 20, message="r0 drained out of the quorum")
    assert replicas["r0"].proc.wait(timeout=20) == 0  # the replica saw the drain and left
    newest = status(base)["history"][0]
    assert newest["left"] == ["r0"] and "r0" in newest["reason"]
    # The refused requests changed nothing: r1 kept its place.
    s = status(base)
    assert members(s) == ["r1", "r2"] and states(s)["r1"] == "healthy"
    assert not any(r["cordoned"] for r in s["replicas"])


def test_a_follower_points_to_the_leader(tmp_path, processes, token_file, etcd_url):
    args = ("--store", etcd_url, "--store-prefix", f"/fthsdp-test/{uuid.uuid4().hex[:12]}", "--leader-ttl", "2s",
            "--token-file", token_file, *FAST)
    first = processes(CoordinatorProcess(tmp_path / "c0", *args))
    (tmp_path / "c0").mkdir()
    (tmp_path / "c1").mkdir()
    first.start()
    wait_until(lambda: status(page_url(first))["leading"], 20, message="the first coordinator to lead")
    second = processes(CoordinatorProcess(tmp_path / "c1", *args).start())
    processes(ReplicaProcess(tmp_path, f"{first.address},{second.address}", "r0", "--token-file", token_file).start())
    wait_until(lambda: members(status(page_url(first))) == ["r0"], 20, message="r0 in the leader's quorum")

    leader, follower = status(page_url(first)), status(page_url(second))
    assert follower["follower"] is True and follower["leading"] is False
    assert follower["leader"] == first.address
    assert follower["quorum"]["id"] == leader["quorum"]["id"] and members(follower) == ["r0"]  # as stored
    assert follower["replicas"] == [] and follower["history"] == []
    code, body = drain(page_url(second), "r0", token=TOKEN)
    assert code == 503 and first.address in body["error"]
    assert members(status(page_url(first))) == ["r0"]


# ----- hangs and stragglers, from a runtime in this process --------------------------------

def api_status(runtime, query: str = "") -> dict:
    app = WebApp(runtime, runtime.config, "")
    params = dict(p.split("=") for p in query.split("&")) if query else {}
    response = asyncio.run(app.handle(Request("GET", "/api/status", params, {})))
    assert response.status == 200, response.body
    return json.loads(response.body)


def test_status_api_shows_progress_and_why_a_replica_was_taken_out():
    s = api_status(hung_runtime())
    assert (s["hang_limit_s"], s["median_step_time_s"]) == (2.0, 0.2)
    r = {replica["id"]: replica for replica in s["replicas"]}
    assert {k: r["r2"][k] for k in ("phase", "phase_age_s", "step_time_s", "compute_time_s", "straggler_score")} == {
        "phase": "computing", "phase_age_s": 6.1, "step_time_s": 0.2, "compute_time_s": 0.35, "straggler_score": 3.5}
    assert r["r2"]["hang_reason"].startswith("hung: no progress at step 7 (computing for 6.1s) while r0 waited 6.0s")
    assert (r["r0"]["phase"], r["r0"]["hang_reason"]) == ("all-reduce", None)
    assert [x["id"] for x in api_status(hung_runtime(), "limit=1")["replicas"]] == ["r2"]  # taken out: trouble first


def test_status_api_says_why_a_straggler_was_taken_out():
    r2 = next(r for r in api_status(straggler_runtime())["replicas"] if r["id"] == "r2")
    assert r2["hang_reason"].startswith("straggler: compute 3.5x") and r2["cordoned"] and r2["state"] == "failed"


# ----- pure parts ----------------------------------------------------------------------

def _replica(rid: str, checksum: str | None = None, step: int | None = None, flagged: int | None = None) -> dict:
    return {"id": rid, "state_checksum": checksum, "checksum_step": step, "checksum_mismatch_step": flagged}


def test_checksum_summary():
    assert checksum_summary([])["verdict"] == "unknown"
    assert checksum_summary([_replica("a", "x", 5), _replica("b", "x", 6)])["verdict"] == "unknown"  # no common step
    agree = checksum_summary([_replica("a", "x", 5), _replica("b", "x", 5), _replica("c", "y", 4)])
    assert (agree["verdict"], agree["compared_step"], agree["mismatched"]) == ("agree", 5, {})
    differ = checksum_summary([_replica("a", "x", 5), _replica("b", "x", 5), _replica("c", "y", 5)])
    assert (differ["verdict"], differ["mismatched"]) == ("mismatch", {"c": 5})
    flagged = checksum_summary([_replica("a", "x", 9), _replica("b", "x", 9, flagged=3)])
    assert (flagged["verdict"], flagged["mismatched"]) == ("mismatch", {"b": 3})


def test_history_view_is_newest_first_with_joins_and_leaves():
    history = [
        {"id": 7, "members": ["a", "b"], "reason": "loaded", "time": 1.0},
        {"id": 8, "members": ["a", "b", "c"], "reason": "admitting c", "time": 2.0},
        {"id": 9, "members": ["a", "c"], "reason": "b lost", "time": 3.0},
    ]
    view = history_view(history)
    assert [h["id"] for h in view] == [9, 8, 7]
    assert (view[0]["joined"], view[0]["left"], view[0]["size"]) == ([], ["b"], 2)
    assert (view[1]["joined"], view[1]["left"]) == (["c"], [])
    assert (view[2]["joined"], view[2]["left"]) == ([], [])  # the quorum before 7 is unknown
    assert history_view([{"id": 1, "members": ["a"], "reason": "first", "time": 0.0}])[0]["joined"] == ["a"]
    assert len(history_view(history, limit=2)) == 2
    cache: dict = {}
    assert history_view(history, cache=cache) == view and len(cache) == 3
    assert history_view(history, limit=1, cache=cache) == view[:1] and len(cache) == 1  # only what is shown


def test_leader_page_assumes_the_same_port():
    def page(port: int, leader: str):
        return WebApp(None, CoordinatorConfig(metrics_port=port), "")._leader_page(leader)

    assert page(9100, "10.0.0.7:29510") == "http://10.0.0.7:9100/"
    assert page(9100, "[fd00::7]:29510") == "http://[fd00::7]:9100/"
    assert page(0, "10.0.0.7:29510") is None  # each coordinator picked its own port
    assert page(9100, "") is None
