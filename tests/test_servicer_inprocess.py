"""The coordinator's gRPC edge (fthsdp/coordinator/serving/servicer.py) in
process: its methods called directly with a fake context
(tests/harness/inprocess.py), over a real runtime on the memory store or a
fake one that raises. Typed errors become their status codes with their
one-line message; anything else is INTERNAL, logged with its traceback; a
request whose bytes do not parse is INVALID_ARGUMENT in one line, no
traceback; the streams end with their errors' statuses and close what they
opened."""

from __future__ import annotations

import asyncio
import logging

import grpc
import pytest

from fthsdp.coordinator.job.injection import NotInjectable
from fthsdp.coordinator.serving.servicer import CoordinatorServicer, add_to_server
from fthsdp.core.auth import PermissionDenied, Unauthenticated
from fthsdp.core.errors import (
    FtarTimeout,
    InvalidRequest,
    JobNotFinished,
    LostOwnership,
    NotFound,
    NotLeader,
    OutOfRange,
    StaleSession,
    StateNotLost,
    StoreUnavailable,
    UnknownJob,
)
from fthsdp.protos.v1 import coordinator_pb2 as pb
from tests.harness.inprocess import (
    DEADLINE,
    Aborted,
    Collector,
    FakeContext,
    Requests,
    leading_runtime,
    register_request,
    registered,
)
from tests.harness.jobs import agent_of

LIMIT = 1 << 20
"""The servicer's --max-request-bytes here."""

Code = grpc.StatusCode


def call(method, request, context: FakeContext | None = None):
    """``await method(request, context)`` for a unary method; returns (response, context)."""
    context = context or FakeContext()

    async def run():
        return await method(request, context)

    return asyncio.run(run()), context


def aborted(method, request) -> Aborted:
    """The status a unary call ended with (it must have ended with one)."""
    with pytest.raises(Aborted) as ended:
        call(method, request)
    return ended.value


def no_traceback(caplog) -> None:
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR], caplog.text


# ----- the map from typed errors to status codes ----------------------------------------


class Raising:
    """A runtime whose register raises ``error``: the servicer's mapping alone."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    async def register(self, request):
        raise self.error


@pytest.mark.parametrize("error, code", [
    (InvalidRequest("replica_id is empty"), Code.INVALID_ARGUMENT),
    (UnknownJob("unknown job 'x'"), Code.INVALID_ARGUMENT),
    (NotFound("job 'default' has no replica 'r9'"), Code.NOT_FOUND),
    (StaleSession("session 'ab' of replica 'r0' was replaced by a newer registration"), Code.FAILED_PRECONDITION),
    (OutOfRange("replica 'r0' says it trains in quorum 9"), Code.FAILED_PRECONDITION),
    (StateNotLost("the state of job 'default' is not lost"), Code.FAILED_PRECONDITION),
    (JobNotFinished("job 'default' did not finish"), Code.FAILED_PRECONDITION),
    (NotInjectable("replica 'r0' has no running incarnation"), Code.FAILED_PRECONDITION),
    (PermissionDenied("a report from an agent that did not start its processes"), Code.PERMISSION_DENIED),
    (Unauthenticated("no token"), Code.UNAUTHENTICATED),
    (StoreUnavailable("etcd is unreachable"), Code.UNAVAILABLE),
    (LostOwnership("another coordinator leads"), Code.ABORTED),
    (NotLeader("this coordinator follows coord:2; ask the leader"), Code.UNAVAILABLE),
    (FtarTimeout("a typed error no status is given for"), Code.INTERNAL),
])
def test_a_typed_error_ends_the_call_with_its_status_and_its_message(error, code, caplog):
    servicer = CoordinatorServicer(Raising(error), LIMIT)
    ended = aborted(servicer.Register, register_request("r0"))
    assert (ended.code, ended.details) == (code, str(error))
    no_traceback(caplog)


def test_anything_else_is_internal_and_logged_once_with_its_traceback(caplog):
    servicer = CoordinatorServicer(Raising(KeyError("r0")), LIMIT)
    with caplog.at_level(logging.ERROR, logger="fthsdp.coordinator"):
        ended = aborted(servicer.Register, register_request("r0"))
    assert (ended.code, ended.details) == (Code.INTERNAL, "internal error; see the coordinator's log")
    (record,) = caplog.records
    assert record.getMessage() == "Register failed" and record.exc_info[0] is KeyError


# ----- requests that are not what they should be ---------------------------------------


class Server:
    """What ``add_to_server`` registers the servicer's handlers with."""

    def add_generic_rpc_handlers(self, handlers) -> None:
        pass

    def add_registered_method_handlers(self, service: str, handlers: dict) -> None:
        self.handlers = handlers


def handlers(servicer: CoordinatorServicer) -> dict:
    server = Server()
    add_to_server(servicer, server)
    return server.handlers


GARBAGE = b"\x0a\xff"
"""Field 1, length-delimited, with a length that never ends: no message parses from it."""


def test_a_request_that_does_not_parse_is_invalid_argument_in_one_line_and_no_traceback(caplog):
    runtime, _ = leading_runtime()
    register = handlers(CoordinatorServicer(runtime, LIMIT))["Register"]
    request = register.request_deserializer(GARBAGE)  # as the server parses the call's bytes
    with caplog.at_level(logging.DEBUG):
        with pytest.raises(Aborted) as ended:
            call(register.unary_unary, request)
    assert ended.value.code == Code.INVALID_ARGUMENT
    details = ended.value.details
    assert details.startswith("request is not a valid Register message: Error parsing message") and "\n" not in details
    no_traceback(caplog)
    assert not runtime.jobs["default"].state.replicas


def test_a_session_whose_first_request_does_not_parse_ends_with_invalid_argument_in_one_line(caplog):
    runtime, _ = leading_runtime()
    session = handlers(CoordinatorServicer(runtime, LIMIT))["Session"]
    context = FakeContext()

    async def run():
        stream = session.stream_stream(Requests(session.request_deserializer(GARBAGE)), context)
        with pytest.raises(Aborted) as ended:
            await asyncio.wait_for(anext(stream), DEADLINE)
        return ended.value

    with caplog.at_level(logging.DEBUG):
        ended = asyncio.run(run())
    assert ended.code == Code.INVALID_ARGUMENT and "\n" not in ended.details
    assert ended.details.startswith("request is not a valid Session message")
    assert context.aborts == [(ended.code, ended.details)]  # one status, once
    no_traceback(caplog)
    assert not runtime.jobs["default"].state.replicas


def test_a_request_over_the_size_limit_is_invalid_argument_and_records_nothing():
    runtime, _ = leading_runtime()
    servicer = CoordinatorServicer(runtime, max_request_bytes=64)
    addresses = [f"10.0.0.{i}:7000" for i in range(9)]
    ended = aborted(servicer.Register, register_request("r0", catch_up_addresses=addresses))
    assert ended.code == Code.INVALID_ARGUMENT and "the limit is 64 (--max-request-bytes)" in ended.details
    assert not runtime.jobs["default"].state.replicas


# ----- a real runtime's refusals, through the edge ---------------------------------------


def test_the_runtime_refusals_reach_the_caller_as_their_statuses(caplog):
    """Each refusal a replica meets, from the runtime itself: its status and
    its line, and nothing recorded for the refused call."""

    async def scenario():
        runtime, clock = leading_runtime()
        servicer = CoordinatorServicer(runtime, LIMIT)
        sessions = await registered(runtime, "r0")
        clock.t = 0.5
        await runtime.evaluate(runtime.jobs["default"])  # quorum 1: r0
        out = {}

        async def status(name, method, request):
            context = FakeContext()
            try:
                await method(request, context)
            except Aborted as e:
                out[name] = (e.code, e.details)
            else:
                out[name] = None

        await status("unknown job", servicer.Register, register_request("r1", job="nope"))
        await status("bad replica id", servicer.Register, register_request("r1/x"))
        await status("another agent's replica", servicer.Register,
                     register_request("r0", agent_ids=["agent-of-someone-else"]))
        await status("not registered", servicer.Heartbeat, pb.HeartbeatRequest(replica_id="r7", session_id="s"))
        await status("stale session", servicer.Heartbeat, pb.HeartbeatRequest(replica_id="r0", session_id="0" * 16))
        await status("another agent's report", servicer.ReportAgentEvent, pb.AgentEventRequest(
            replica_id="r0", agent_id="agent-of-someone-else", state=pb.AGENT_STATE_FAILED))
        await status("a quorum from the future", servicer.Register, register_request("r1", quorum_id=2))
        entry = runtime.jobs["default"].state.replicas["r0"]
        recorded = (sorted(runtime.jobs["default"].state.replicas), entry.incarnation.session_id == sessions["r0"],
                    entry.incarnation.failed_at, entry.incarnation.last_heartbeat)
        runtime.leading, runtime.leader_hint = False, "coord:2"
        await status("a follower", servicer.Register, register_request("r1"))
        await status("a follower's status", servicer.Status, pb.StatusRequest())
        return out, recorded

    with caplog.at_level(logging.INFO, logger="fthsdp.coordinator"):
        statuses, recorded = asyncio.run(scenario())
    assert {name: s[0] if s else None for name, s in statuses.items()} == {
        "unknown job": Code.INVALID_ARGUMENT,
        "bad replica id": Code.INVALID_ARGUMENT,
        "another agent's replica": Code.PERMISSION_DENIED,
        "not registered": Code.NOT_FOUND,
        "stale session": Code.FAILED_PRECONDITION,
        "another agent's report": Code.PERMISSION_DENIED,
        "a quorum from the future": Code.FAILED_PRECONDITION,
        "a follower": Code.UNAVAILABLE,
        "a follower's status": None,  # a follower answers Status: who leads
    }
    assert statuses["unknown job"][1].startswith("unknown job 'nope'; this coordinator serves: default")
    assert "only one agent runs a replica" in statuses["another agent's replica"][1]
    assert "replica 'r7' is not registered in job 'default'; register first" == statuses["not registered"][1]
    assert "was replaced by a newer registration" in statuses["stale session"][1]
    assert statuses["a follower"][1] == "this coordinator follows coord:2; ask the leader"
    assert all("\n" not in s[1] for s in statuses.values() if s)
    assert recorded == (["r0"], True, None, 0.0)  # r0 as it registered; nobody else
    no_traceback(caplog)


def test_an_operators_call_carries_the_callers_peer(caplog):
    async def scenario():
        runtime, _ = leading_runtime()
        await registered(runtime, "r0")
        servicer = CoordinatorServicer(runtime, LIMIT)
        context = FakeContext(peer="ipv4:10.1.2.3:4444")
        return await servicer.Inject(pb.InjectRequest(replica_id="r0", kind=pb.FAULT_KIND_KILL), context)

    with caplog.at_level(logging.WARNING, logger="fthsdp.coordinator"):
        response = asyncio.run(scenario())
    assert response.injection.replica_id == "r0"
    assert "replica r0: fault injected: kill (asked by an unnamed operator from ipv4:10.1.2.3:4444)" in caplog.text


# ----- streams through the edge ----------------------------------------------------------


def test_watch_refusals_end_the_call_before_anything_is_sent():
    async def scenario():
        runtime, _ = leading_runtime()
        sessions = await registered(runtime, "r0")
        servicer = CoordinatorServicer(runtime, LIMIT)
        out = {}
        for name, request in (("unknown job", pb.WatchRequest(job="nope")),
                              ("stale session", pb.WatchRequest(replica_id="r0", session_id="0" * 16)),
                              ("not registered", pb.WatchRequest(replica_id="r7", session_id=sessions["r0"]))):
            context = FakeContext()
            with pytest.raises(Aborted) as ended:
                await asyncio.wait_for(anext(servicer.Watch(request, context)), DEADLINE)
            out[name] = ended.value.code
        return out, runtime.jobs["default"].state.replicas["r0"].incarnation.open_watches

    codes, open_watches = asyncio.run(scenario())
    assert codes == {"unknown job": Code.INVALID_ARGUMENT, "stale session": Code.FAILED_PRECONDITION,
                     "not registered": Code.NOT_FOUND}
    assert open_watches == 0


def test_a_watch_call_sends_serialized_events_and_its_cancellation_counts_as_the_replica_disconnected():
    async def scenario():
        runtime, clock = leading_runtime()
        job = runtime.jobs["default"]
        sessions = await registered(runtime, "r0", "r1")
        servicer = CoordinatorServicer(runtime, LIMIT)
        request = pb.WatchRequest(replica_id="r0", session_id=sessions["r0"])
        watch = Collector(servicer.Watch(request, FakeContext()), pb.WatchEvent.FromString)
        await watch.until(1)
        opened = job.state.replicas["r0"].incarnation.open_watches
        clock.t = 0.5
        await runtime.evaluate(job)
        await watch.until(2)
        clock.t = 0.7
        watch.task.cancel()  # the client went: gRPC cancels the call
        await asyncio.gather(watch.task, return_exceptions=True)
        entry = job.state.replicas["r0"].incarnation
        return [e.quorum.id for e in watch.items], opened, (entry.open_watches, entry.disconnected_at)

    ids, opened, closed = asyncio.run(scenario())
    assert ids == [0, 1] and opened == 1 and closed == (0, 0.7)


def test_a_forged_session_request_ends_the_call_with_invalid_argument_and_closes_its_watch():
    async def scenario():
        runtime, clock = leading_runtime()
        servicer = CoordinatorServicer(runtime, LIMIT)
        requests = Requests(pb.SessionRequest(register=register_request("r0")))
        context = FakeContext()
        session = Collector(servicer.Session(requests, context), pb.SessionEvent.FromString)
        await session.until(2)
        clock.t = 0.4
        requests.send(pb.SessionRequest(heartbeat=pb.HeartbeatRequest(replica_id="r9", step=3)))
        await session.ended()
        entry = runtime.jobs["default"].state.replicas["r0"]
        return (session.items, session.error, context.aborts, sorted(runtime.jobs["default"].state.replicas),
                (entry.incarnation.open_watches, entry.incarnation.disconnected_at))

    items, error, aborts, replicas, r0 = asyncio.run(scenario())
    assert [e.WhichOneof("message") for e in items] == ["registered", "watch"]
    assert isinstance(error, Aborted)
    assert aborts == [(Code.INVALID_ARGUMENT, "this Session is replica 'r0''s, not 'r9''s")]  # one status, once
    assert replicas == ["r0"] and r0 == (0, 0.4)


def test_a_heartbeat_stream_answers_only_those_that_ask_and_a_stale_one_ends_it():
    async def scenario():
        runtime, clock = leading_runtime()
        sessions = await registered(runtime, "r0")
        servicer = CoordinatorServicer(runtime, LIMIT)
        requests, context = Requests(), FakeContext()
        answers = Collector(servicer.HeartbeatStream(requests, context))
        clock.t = 0.3
        for seq in (1, 2, 3):
            requests.send(pb.HeartbeatRequest(replica_id="r0", session_id=sessions["r0"], lease_seq=seq,
                                              ack=seq != 2))
        await answers.until(2)
        requests.send(pb.HeartbeatRequest(replica_id="r0", session_id="0" * 16, ack=True))
        await answers.ended()
        return answers.items, answers.error, context.aborts, runtime.jobs["default"].state.replicas["r0"]

    items, error, aborts, entry = asyncio.run(scenario())
    assert [a.lease_seq for a in items] == [1, 3]
    assert isinstance(error, Aborted) and [code for code, _ in aborts] == [Code.FAILED_PRECONDITION]
    assert entry.incarnation.last_heartbeat == 0.3  # the good ones recorded


def hello(host_id: str, incarnation: str) -> pb.HostRequest:
    return pb.HostRequest(hello=pb.HostHello(host_id=host_id, replica_id="r1", replica_rank=1, num_replicas=2,
                                             nnodes=2, nproc=1, incarnation=incarnation))


def test_a_host_is_refused_with_permission_denied_for_a_host_id_its_certificate_or_a_live_agent_does_not_give_it():
    async def scenario():
        runtime, _ = leading_runtime()
        servicer = CoordinatorServicer(runtime, LIMIT)
        certified = {"x509_pem_cert": [b"-----BEGIN CERTIFICATE-----"], "x509_common_name": [b"a"],
                     "x509_subject_alternative_name": [b"a.hosts.example"]}
        a_requests = Requests(hello("a", "agent-a"))
        a = Collector(servicer.Host(a_requests, FakeContext(auth=certified)))
        welcome = (await a.until(1))[0]
        out = {}
        for name, request, auth in (("b with a's certificate", hello("b", "agent-b"), certified),
                                    ("a's twin", hello("a", "another-agent"), {})):
            context = FakeContext(auth=auth)
            with pytest.raises(Aborted):
                await asyncio.wait_for(anext(servicer.Host(Requests(request), context)), DEADLINE)
            out[name] = context.aborts
        hosts = sorted(runtime.jobs["default"].hosts.hosts)
        a_requests.close()
        await a.ended()
        return welcome, out, hosts

    welcome, refusals, hosts = asyncio.run(scenario())
    assert welcome.welcome.host_id == "a"
    ((code, details),) = refusals["b with a's certificate"]
    assert code == Code.PERMISSION_DENIED and details.startswith(
        "host 'b': its client certificate names a, a.hosts.example; a host's certificate must name the host id")
    ((code, details),) = refusals["a's twin"]
    assert code == Code.PERMISSION_DENIED and details.startswith("host id 'a' is taken")
    assert hosts == ["a"]  # neither refusal recorded a host


def test_an_agent_report_from_the_replicas_own_agent_is_taken():
    """The PERMISSION_DENIED above is about the agent, not the call: r0's own agent is heard."""

    async def scenario():
        runtime, _ = leading_runtime()
        await registered(runtime, "r0")
        servicer = CoordinatorServicer(runtime, LIMIT)
        request = pb.AgentEventRequest(replica_id="r0", agent_id=agent_of("r0"), state=pb.AGENT_STATE_FAILED)
        response = await servicer.ReportAgentEvent(request, FakeContext())
        return response, runtime.jobs["default"].state.replicas["r0"].incarnation.failed_at

    response, failed_at = asyncio.run(scenario())
    assert isinstance(response, pb.AgentEventResponse) and failed_at == 0.0
