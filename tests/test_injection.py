"""Fault injection's pure parts (fthsdp/coordinator/job/injection.py, fthsdp/agent/injection.py):
request checks, the admin check, the coordinator's record and push, the
executors' once-per-incarnation rule, the CLI's usage errors and the status
views. In-process, no processes; tests/test_inject_auth.py has the gRPC edge,
tests/test_inject_processes.py real replicas under `fthsdp agent`."""

from __future__ import annotations

import asyncio
import logging
import signal
from types import SimpleNamespace

import pytest

from fthsdp.agent import injection as agent_injection
from fthsdp.agent.injection import AgentFaults, RankFaults, kill_ranks
from fthsdp.cli import main as cli
from fthsdp.coordinator.decisions.status_view import status_dict, status_table
from fthsdp.coordinator.job.injection import MAX_PER_INCARNATION, NotInjectable
from fthsdp.coordinator.serving.web import recent_events
from fthsdp.coordinator.validation import check_inject
from fthsdp.core.auth import PermissionDenied, Unauthenticated, check_admin
from fthsdp.core.errors import ConfigError, InvalidRequest, NotFound
from fthsdp.protos.v1 import coordinator_pb2 as pb
from tests.harness.runtimes import agent_of, joined_runtime

KILL, HANG, SLOW = pb.FAULT_KIND_KILL, pb.FAULT_KIND_HANG, pb.FAULT_KIND_SLOW


# ----- the request at the edge -------------------------------------------------------

@pytest.mark.parametrize("fields, problem", [
    ({"replica_id": "r1", "kind": KILL}, None),
    ({"replica_id": "r1", "kind": HANG, "requested_by": "alice@host"}, None),
    ({"replica_id": "r1", "kind": SLOW, "seconds": 0.5, "steps": 3}, None),
    ({"replica_id": "", "kind": KILL}, "replica_id is empty"),
    ({"replica_id": "../r1", "kind": KILL}, "may contain only"),
    ({"replica_id": "r1"}, "not a fault kind"),
    ({"replica_id": "r1", "kind": 9}, "not a fault kind"),
    ({"replica_id": "r1", "kind": KILL, "seconds": 1.0}, "slow fault only"),
    ({"replica_id": "r1", "kind": HANG, "steps": 2}, "slow fault only"),
    ({"replica_id": "r1", "kind": SLOW, "steps": 3}, "seconds"),
    ({"replica_id": "r1", "kind": SLOW, "seconds": -1.0, "steps": 3}, "seconds"),
    ({"replica_id": "r1", "kind": SLOW, "seconds": float("nan"), "steps": 3}, "seconds"),
    ({"replica_id": "r1", "kind": SLOW, "seconds": 7200.0, "steps": 3}, "at most 3600"),
    ({"replica_id": "r1", "kind": SLOW, "seconds": 1.0}, "steps"),
    ({"replica_id": "r1", "kind": SLOW, "seconds": 1.0, "steps": -2}, "steps"),
    ({"replica_id": "r1", "kind": KILL, "requested_by": "x" * 200}, "requested_by"),
])
def test_inject_requests_are_checked(fields, problem):
    request = pb.InjectRequest(**fields)
    if problem is None:
        check_inject(request)
    else:
        with pytest.raises(InvalidRequest, match=problem):
            check_inject(request)


ADMIN = (("authorization", "Bearer job"), ("fthsdp-admin-token", "admin-secret"))
JOB_ONLY = (("authorization", "Bearer job"),)
WRONG = (("fthsdp-admin-token", "guess"),)


@pytest.mark.parametrize("method, configured, metadata, refusal", [
    # Without an admin token the existing admin calls work as before; Inject is off.
    ("Drain", "", JOB_ONLY, None),
    ("GiveUpState", "", (), None),
    ("Inject", "", ADMIN, PermissionDenied),
    ("Inject", "", (), PermissionDenied),
    # With one, every admin call needs it.
    ("Inject", "admin-secret", ADMIN, None),
    ("Inject", "admin-secret", JOB_ONLY, PermissionDenied),
    ("Inject", "admin-secret", WRONG, Unauthenticated),
    ("Drain", "admin-secret", JOB_ONLY, PermissionDenied),
    ("Cordon", "admin-secret", WRONG, Unauthenticated),
    ("ReopenJob", "admin-secret", ADMIN, None),
    # Calls of the job's processes never need it.
    ("Register", "admin-secret", JOB_ONLY, None),
    ("Status", "admin-secret", (), None),
])
def test_admin_calls_need_the_admin_token(method, configured, metadata, refusal):
    if refusal is None:
        check_admin(method, metadata, configured)
    else:
        with pytest.raises(refusal, match=method):
            check_admin(method, metadata, configured)


def test_an_admin_token_equal_to_the_job_token_is_refused(tmp_path):
    from fthsdp.coordinator.config import CoordinatorConfig

    (tmp_path / "job").write_text("same-token\n")
    (tmp_path / "admin").write_text("same-token")
    with pytest.raises(ConfigError, match="same token"):
        CoordinatorConfig(token_file=str(tmp_path / "job"), admin_token_file=str(tmp_path / "admin"))
    (tmp_path / "admin").write_text("another-token")
    CoordinatorConfig(token_file=str(tmp_path / "job"), admin_token_file=str(tmp_path / "admin"))


# ----- the coordinator's record and push ---------------------------------------------

async def _first_event(runtime, replica_id: str) -> pb.WatchEvent:
    stream = runtime.watch(pb.WatchRequest(job="default", replica_id=replica_id))
    try:
        return pb.WatchEvent.FromString(await anext(stream))
    finally:
        await stream.aclose()


def test_an_injection_is_recorded_logged_pushed_to_its_replica_only_and_shown_in_status(caplog):
    async def scenario():
        runtime, _, _ = await joined_runtime()
        request = pb.InjectRequest(job="default", replica_id="r2", kind=HANG, requested_by="alice@box")
        with caplog.at_level(logging.WARNING, logger="fthsdp.coordinator"):
            done = runtime.inject(request, "ipv4:10.0.0.9:5000").injection
        slow = runtime.inject(pb.InjectRequest(replica_id="r1", kind=SLOW, seconds=2, steps=4), "").injection
        return runtime, done, slow, await _first_event(runtime, "r2"), await _first_event(runtime, "r0")

    runtime, done, slow, r2_event, r0_event = asyncio.run(scenario())
    assert (done.replica_id, done.kind, done.restart_count, done.unix_ms) == ("r2", HANG, 0, 1_000_000)
    assert slow.id > done.id  # unique and increasing, also within one millisecond
    assert list(r2_event.injections) == [done] and not r0_event.injections
    assert ("job default: replica r2: fault injected: hang (asked by alice@box from ipv4:10.0.0.9:5000)"
            in caplog.text)
    status = runtime.status(pb.StatusRequest())
    assert list(status.injections) == [done, slow]
    shown = status_dict(status)["injections"]
    assert [(i["replica"], i["fault"], i["seconds"], i["steps"]) for i in shown] == [
        ("r2", "hang", None, None), ("r1", "slow", 2.0, 4)]
    table = status_table(status)
    assert "replica r2: fault injected: hang (asked by alice@box) at step 0" in table
    assert "replica r1: fault injected: slow (+2s per step for 4 steps) (asked by an unnamed operator)" in table


def test_a_restarted_replica_is_no_longer_told_but_status_keeps_the_record():
    async def scenario():
        runtime, _, _ = await joined_runtime()
        runtime.inject(pb.InjectRequest(replica_id="r2", kind=KILL), "")
        before = await _first_event(runtime, "r2")
        await runtime.register(pb.RegisterRequest(job="default", replica_id="r2", address="h2:1", world_size=1,
                                                  restart_count=1, agent_ids=[agent_of("r2")]))
        return runtime, before, await _first_event(runtime, "r2")

    runtime, before, after = asyncio.run(scenario())
    assert len(before.injections) == 1 and not after.injections
    assert len(runtime.status(pb.StatusRequest()).injections) == 1


def test_injections_are_refused_without_a_running_incarnation_or_past_the_limit():
    async def scenario():
        runtime, clock, _ = await joined_runtime()
        with pytest.raises(NotFound, match="no replica 'r9'"):
            runtime.inject(pb.InjectRequest(replica_id="r9", kind=KILL), "")
        runtime.agent_event(pb.AgentEventRequest(job="default", replica_id="r2", state=pb.AGENT_STATE_FAILED,
                                                 agent_id=agent_of("r2")))
        with pytest.raises(NotInjectable, match="no running incarnation"):
            runtime.inject(pb.InjectRequest(replica_id="r2", kind=KILL), "")
        for _ in range(MAX_PER_INCARNATION):
            runtime.inject(pb.InjectRequest(replica_id="r1", kind=HANG), "")
        with pytest.raises(NotInjectable, match="already"):
            runtime.inject(pb.InjectRequest(replica_id="r1", kind=HANG), "")
        return runtime

    runtime = asyncio.run(scenario())
    assert len(runtime.status(pb.StatusRequest()).injections) == MAX_PER_INCARNATION


# ----- the executors -----------------------------------------------------------------

def _event(*injections: pb.FaultInjection) -> pb.WatchEvent:
    return pb.WatchEvent(injections=injections)


def _injection(id: int, kind: int, restart_count: int = 0, **fields) -> pb.FaultInjection:
    return pb.FaultInjection(id=id, replica_id="r1", kind=kind, restart_count=restart_count, **fields)


class _Never:
    """Stands in for the event a hung training thread waits on."""

    def __init__(self) -> None:
        self.waits = 0

    def wait(self, timeout=None) -> bool:
        self.waits += 1
        return False


def test_a_rank_hangs_once_and_only_in_its_own_incarnation(monkeypatch):
    monkeypatch.setattr(agent_injection.time, "sleep", lambda s: pytest.fail("not a slow fault"))
    faults = RankFaults("r1", 0, restart_count=1)
    faults._never = never = _Never()
    faults(_event(_injection(1, HANG, restart_count=0), _injection(2, KILL, restart_count=1)))
    faults.at_step(5)
    assert never.waits == 0  # the predecessor's hang and the agent's kill are not the rank's to do
    faults(_event(_injection(3, HANG, restart_count=1)))
    faults.at_step(6)
    assert never.waits == 1


def test_a_slow_fault_slows_its_steps_and_then_stops(monkeypatch):
    slept = []
    monkeypatch.setattr(agent_injection.time, "sleep", slept.append)
    faults = RankFaults("r1", 0, restart_count=0)
    slow = _injection(7, SLOW, seconds=0.25, steps=3)
    for step in range(1, 6):
        faults(_event(slow))  # every push repeats it: carried out once
        faults.at_step(step)
    assert slept == [0.25, 0.25, 0.25] and faults.slowed == 3
    faults(_event(slow, _injection(8, SLOW, seconds=1.0, steps=1)))  # a newer one replaces it
    faults.at_step(6)
    faults.at_step(7)
    assert slept[3:] == [1.0]


def test_the_agent_kills_once_per_injection_and_incarnation():
    faults = AgentFaults("r1")
    faults.update([_injection(1, KILL, restart_count=0), _injection(2, HANG, restart_count=0)])
    assert faults.kill_due(1) is None  # the agent runs incarnation 1 now: not for it
    first = faults.kill_due(0)
    assert first is not None and first.id == 1
    assert faults.kill_due(0) is None  # the same push again
    faults.update([_injection(1, KILL, restart_count=0), _injection(3, KILL, restart_count=0)])
    assert faults.kill_due(0).id == 3


def test_kill_ranks_sigkills_every_rank_group():
    signals = []
    ranks = [SimpleNamespace(pid=100 + i, signal_group=lambda sig, i=i: signals.append((i, sig))) for i in range(2)]
    kill_ranks(ranks, _injection(1, KILL, requested_by="bob"), "r1")
    assert signals == [(0, signal.SIGKILL), (1, signal.SIGKILL)]


# ----- the command line --------------------------------------------------------------

def _inject_args(*argv: str):
    return cli.build_parser().parse_args(["inject", "--replica", "r1", *argv])


@pytest.mark.parametrize("argv, fields", [
    (("kill",), {"kind": KILL}),
    (("hang",), {"kind": HANG}),
    (("slow",), {"kind": SLOW, "seconds": cli.SLOW_SECONDS, "steps": cli.SLOW_STEPS}),
    (("slow", "--seconds", "500ms", "--steps", "4"), {"kind": SLOW, "seconds": 0.5, "steps": 4}),
])
def test_inject_arguments(argv, fields):
    assert cli.inject_request(_inject_args(*argv)) == fields


@pytest.mark.parametrize("argv, words", [
    (("kill", "--seconds", "2"), "for a slow fault only"),
    (("hang", "--steps", "2"), "for a slow fault only"),
    (("slow", "--seconds", "0"), "--seconds must be above 0"),
    (("slow", "--seconds", "soon"), "expected a duration"),
    (("slow", "--steps", "0"), "--steps must be between 1"),
])
def test_inject_usage_mistakes_are_one_line_and_exit_2(argv, words, capsys):
    code = cli.main(["inject", "--coordinator", "127.0.0.1:1", "--replica", "r1", *argv], env={})
    err = capsys.readouterr().err
    assert code == cli.EXIT_USAGE and "Traceback" not in err
    assert err.count("error") == 1 and words in err, err


def test_inject_needs_a_readable_admin_token_file(tmp_path, capsys):
    code = cli.main(["inject", "--coordinator", "127.0.0.1:1", "--replica", "r1", "kill"],
                    env={"FTHSDP_ADMIN_TOKEN_FILE": str(tmp_path / "missing")})
    err = capsys.readouterr().err
    assert code == cli.EXIT_USAGE and "--admin-token-file: cannot read" in err, err


# ----- the status page's recent events -----------------------------------------------

def test_recent_events_merge_quorum_changes_and_injections_newest_first():
    history = [{"id": 3, "time": 30.0, "reason": "r2 failed", "size": 2, "joined": [], "left": ["r2"]},
               {"id": 2, "time": 10.0, "reason": "r2 joined", "size": 3, "joined": ["r2"], "left": []}]
    injections = [{"id": 5, "replica": "r2", "fault": "kill", "seconds": None, "steps": None, "restart_count": 0,
                   "step": 12, "time": 20.0, "requested_by": "alice", "peer": ""}]
    events = recent_events(history, injections)
    assert [e["kind"] for e in events] == ["quorum_change", "fault_injected", "quorum_change"]
    assert events[0]["text"] == "quorum #3, 2 members (-r2): r2 failed"
    assert events[1]["text"] == "replica r2: fault injected: kill (asked by alice) at step 12"
    assert events[1]["replica"] == "r2"
    assert len(recent_events(history, injections, limit=1)) == 1


def test_the_http_drain_takes_the_admin_token_once_there_is_one(tmp_path):
    import dataclasses
    import json

    from fthsdp.coordinator.serving.http_server import Request
    from fthsdp.coordinator.serving.web import WebApp

    (tmp_path / "admin").write_text("admin-secret")

    async def scenario():
        runtime, _, _ = await joined_runtime()
        runtime.config = dataclasses.replace(runtime.config, admin_token_file=str(tmp_path / "admin"))
        app = WebApp(runtime, runtime.config, "job-token")
        answers = []
        for auth in ("Bearer job-token", "Bearer admin-secret"):
            answer = await app.handle(Request("POST", "/api/replicas/r1/drain", {}, {"authorization": auth}))
            answers.append((answer.status, json.loads(answer.body)))
        status = await app.handle(Request("GET", "/api/status", {}, {}))
        return answers, json.loads(status.body)

    ((refused, _), (accepted, body)), status = asyncio.run(scenario())
    assert (refused, accepted, body["drain"]) == (401, 200, True)
    assert status["admin"] == {"enabled": True, "why": "needs the coordinator's admin token (--admin-token-file)"}
    assert status["events"] and status["events"][0]["kind"] == "quorum_change"


def test_status_lists_injections_also_when_no_replica_is_left():
    status = pb.StatusResponse(job="default", injections=[_injection(1, KILL, requested_by="bob", step=4)])
    assert "replica r1: fault injected: kill (asked by bob) at step 4" in status_table(status)
