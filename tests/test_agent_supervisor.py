"""The node agent (`fthsdp agent`): launch contract, restarts, drain, reporting.

Real processes throughout: the agent runs as `python -m fthsdp agent`
and supervises tests/rank_script.py, which writes its environment to files
that the tests wait for (with deadlines), and behaves per its plan.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from fthsdp.agent.node.agent_state import TRANSITIONS, AgentState
from fthsdp.agent.node.config import AgentConfig, replica_rank_from_id
from fthsdp.agent.node.launch import describe_exit, rank_environments
from fthsdp.agent.node.reporter import Reporter
from fthsdp.agent.node.supervisor import Supervisor, backoff_delay
from fthsdp.client import CoordinatorClient
from fthsdp.core.errors import ConfigError, CoordinatorUnavailable, RequestRejected
from fthsdp.protos.v1 import coordinator_pb2 as pb
from fthsdp.testing.local_etcd import free_port
from tests.harness.cli import fthsdp, one_line_error
from tests.harness.events import JsonLog, has
from tests.harness.processes import ROOT, CoordinatorProcess, _env
from tests.harness.waiting import wait_until

RANK_SCRIPT = str(ROOT / "tests" / "rank_script.py")
S = AgentState


class Agent:
    """`fthsdp agent ... -- python tests/rank_script.py OUT PLAN`, its log in tmp, in JSON lines:
    the tests read its transitions from the ``agent_state`` events, not from their wording."""

    def __init__(self, tmp: Path, plan: str, *args: str, coordinator: str | None = None,
                 plan_args: tuple[str, ...] = ()) -> None:
        self.out = tmp / "ranks"
        self.out.mkdir(exist_ok=True)
        self.log_path = tmp / "agent.log"
        # By default nothing listens on the coordinator port: reporting fails fast.
        coordinator = coordinator or f"127.0.0.1:{free_port()}"
        argv = [sys.executable, "-m", "fthsdp", "agent", "--coordinator", coordinator]
        argv += ["--monitor-interval", "20ms", "--restart-backoff", "10ms", "--log-format", "json", *args]
        argv += ["--", sys.executable, RANK_SCRIPT, str(self.out), plan, *plan_args]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(argv, cwd=ROOT, env=_env(), stdout=log, stderr=log)
        self.events = JsonLog(self.log_path)

    def wait(self, timeout: float = 30.0) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError(f"agent still running after {timeout}s; log:\n{self.log()}") from None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def states(self) -> list[str]:
        """The states the agent went through, in order (its ``agent_state`` events)."""
        return [e["state"] for e in self.events.events_named("agent_state")]

    def entered(self, state: str, **fields) -> dict | None:
        """The agent's first transition to ``state`` whose fields match (``detail=...``), or None."""
        return self.events.find_event("agent_state", state=state, **fields)

    def env(self, rank: int, restart: int = 0) -> dict:
        return json.loads((self.out / f"env-rank{rank}-restart{restart}.json").read_text())

    def started(self) -> list[str]:
        return sorted(p.name for p in self.out.glob("env-*.json"))

    def wait_started(self, n: int, timeout: float = 20.0) -> None:
        wait_until(lambda: len(self.started()) >= n, timeout, message=f"{n} rank starts (log:\n{self.log()})")


@pytest.fixture
def agents():
    started: list[Agent] = []
    yield lambda *a, **kw: started.append(Agent(*a, **kw)) or started[-1]
    for agent in started:  # a failed test must not leave an agent (and its ranks) behind
        if agent.proc.poll() is None:
            agent.proc.send_signal(signal.SIGTERM)
            agent.wait(20)


# ----- with processes ----------------------------------------------------------------


def test_env_contract_for_two_ranks(tmp_path, agents):
    agent = agents(tmp_path, "exit0", "--nproc", "2", "--replica-id", "replica-1", "--num-replicas", "3",
                   "--job", "llama")
    assert agent.wait() == 0, agent.log()
    assert agent.started() == ["env-rank0-restart0.json", "env-rank1-restart0.json"]
    envs = [agent.env(0), agent.env(1)]
    for rank, env in enumerate(envs):
        assert env["RANK"] == env["LOCAL_RANK"] == str(rank)
        assert (env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"], env["GROUP_RANK"]) == ("2", "2", "0")
        assert env["MASTER_ADDR"] == "127.0.0.1" and int(env["MASTER_PORT"]) > 0
        assert env["TORCHELASTIC_RESTART_COUNT"] == env["FTHSDP_RESTART_COUNT"] == "0"
        assert (env["FTHSDP_JOB"], env["FTHSDP_REPLICA_ID"]) == ("llama", "replica-1")
        assert (env["FTHSDP_REPLICA_RANK"], env["FTHSDP_NUM_REPLICAS"]) == ("1", "3")
        # The agent's relay, not the coordinator: no rank connects to the coordinator itself.
        assert env["FTHSDP_COORDINATOR"].startswith("unix:/") and env["FTHSDP_COORDINATOR"].endswith(".sock")
        assert env["pgid"] == env["pid"], "each rank leads its own process group"
    assert envs[0]["MASTER_PORT"] == envs[1]["MASTER_PORT"]
    assert agent.entered("SUCCEEDED", replica="replica-1"), agent.log()


def test_sigkilled_rank_restarts_the_whole_group(tmp_path, agents):
    agent = agents(tmp_path, "kill1", "--nproc", "2", "--replica-id", "r0", "--max-restarts", "1")
    assert agent.wait() == 0, agent.log()
    assert agent.started() == [f"env-rank{r}-restart{n}.json" for r in (0, 1) for n in (0, 1)]
    # Rank 0 did not fail: the agent stopped it with SIGTERM before restarting.
    assert (agent.out / "sigterm-rank0-restart0").exists()
    assert agent.env(0, 1)["TORCHELASTIC_RESTART_COUNT"] == agent.env(1, 1)["FTHSDP_RESTART_COUNT"] == "1"
    assert agent.entered("FAILED", replica="r0", detail=has("local rank 1 exited with signal SIGKILL")), agent.log()


def test_gives_up_after_max_restarts(tmp_path, agents):
    agent = agents(tmp_path, "fail", "--replica-id", "r0", "--max-restarts", "2")
    assert agent.wait() == 1, agent.log()
    assert agent.started() == [f"env-rank0-restart{n}.json" for n in range(3)]
    assert agent.entered("GAVE_UP", replica="r0", detail=has("no restarts left")), agent.log()


def test_sigterm_drains_the_ranks(tmp_path, agents):
    agent = agents(tmp_path, "wait", "--nproc", "2", "--replica-id", "r0")
    agent.wait_started(2)  # the ranks' SIGTERM handlers are installed
    agent.proc.send_signal(signal.SIGTERM)
    assert agent.wait() == 0, agent.log()
    assert (agent.out / "sigterm-rank0-restart0").exists() and (agent.out / "sigterm-rank1-restart0").exists()
    assert agent.entered("DRAINING", replica="r0"), agent.log()
    assert agent.started() == ["env-rank0-restart0.json", "env-rank1-restart0.json"]


@pytest.mark.parametrize("ending, restarted", [("drained", False), ("evicted", True), ("failed", True)])
def test_a_rank_that_dies_after_it_left_drained_is_not_restarted(tmp_path, agents, ending, restarted):
    """A drained replica never comes back, also when its process then dies
    (SIGABRT, as Python's teardown can make it): said, never a failure. Any
    other ending that dies is a failure and restarts."""
    agent = agents(tmp_path, "left-abort", "--replica-id", "r0", "--max-restarts", "1", plan_args=(ending,))
    assert agent.wait() == 0, agent.log()
    log = agent.log()
    if restarted:
        assert agent.started() == ["env-rank0-restart0.json", "env-rank0-restart1.json"], log
        assert agent.entered("FAILED", detail=has("local rank 0 exited with signal SIGABRT")), log
        assert agent.entered("RESTARTING"), log
    else:
        assert agent.started() == ["env-rank0-restart0.json"], log
        assert not {"FAILED", "RESTARTING"} & set(agent.states()), log
        # No event for this line (a warning of the late exit): its message says it.
        assert agent.events.find(r"exited with signal SIGABRT after it had left the job \(drained\): not a failure, "
                                 r"not restarted"), log
        assert agent.entered("SUCCEEDED", detail="every local rank left (drained); local rank 0 then exited with "
                                                 "signal SIGABRT"), log


def test_a_rank_that_dies_after_it_left_drained_on_sigterm_is_a_drain(tmp_path, agents):
    agent = agents(tmp_path, "left-abort", "--replica-id", "r0", plan_args=("drained", "wait"))
    agent.wait_started(1)
    agent.proc.send_signal(signal.SIGTERM)
    assert agent.wait() == 0, agent.log()
    assert agent.entered("SUCCEEDED", detail="drained: every local rank left (drained); local rank 0 then exited "
                                             "with signal SIGABRT"), agent.log()


def test_sigterm_during_the_backoff_stops_without_restarting(tmp_path, agents):
    agent = agents(tmp_path, "fail", "--replica-id", "r0", "--restart-backoff", "60s")
    agent.events.wait_event("agent_state", 20, state="RESTARTING")
    began = time.monotonic()
    agent.proc.send_signal(signal.SIGTERM)
    assert agent.wait() == 0, agent.log()
    assert time.monotonic() - began < 10, "the back-off must be interruptible"
    assert agent.started() == ["env-rank0-restart0.json"]


def test_transitions_are_reported_to_a_real_coordinator(tmp_path, agents):
    coordinator = CoordinatorProcess(tmp_path, "--log-format", "json").start()
    try:
        with CoordinatorClient([coordinator.address]) as client:
            # The coordinator shows agent state only for replicas it knows: each start registers r0
            # as a training process does, with its agent's id, so that the agent's reports count.
            agent = agents(tmp_path, "fail-once", "--replica-id", "r0", coordinator=coordinator.address,
                           plan_args=("register",))
            assert agent.wait() == 0, agent.log()
            replica = {r.replica_id: r for r in client.status().replicas}["r0"]
            assert (replica.agent_state, replica.restart_count) == (pb.AGENT_STATE_SUCCEEDED, 1)
        log = JsonLog(coordinator.log_path)
        log.wait_event("agent_reported", 10, replica="r0", node_rank=0, state="succeeded")
        reported = log.events_named("agent_reported", replica="r0", node_rank=0)
        assert [e["state"] for e in reported] == [
            "starting", "running", "failed", "restarting", "starting", "running", "succeeded"]
        # A report from another agent (the job token alone) about r0 is refused and changes nothing.
        with CoordinatorClient([coordinator.address]) as client, pytest.raises(RequestRejected) as refused:
            client.call("ReportAgentEvent", pb.AgentEventRequest(job="default", replica_id="r0",
                                                                 state=pb.AGENT_STATE_FAILED, agent_id="forged"))
        assert refused.value.code == grpc.StatusCode.PERMISSION_DENIED
        assert log.find_event("agent_reported", job="default", replica="r0", node_rank=0, state="failed",
                              detail="local rank 0 exited with code 3")
    finally:
        coordinator.stop()


def test_supervision_goes_on_without_a_coordinator(tmp_path, agents):
    began = time.monotonic()
    agent = agents(tmp_path, "fail-once", "--replica-id", "r0")  # nothing listens on its coordinator port
    assert agent.wait() == 0, agent.log()
    assert time.monotonic() - began < 15
    assert agent.started() == ["env-rank0-restart0.json", "env-rank0-restart1.json"]
    assert "could not report" in agent.log()


def registered(client: CoordinatorClient) -> bool:
    try:
        client.call("Register", pb.RegisterRequest(job="default", replica_id="r0", address="127.0.0.1:1", world_size=1,
                                                   agent_ids=["agent-0"]))
    except CoordinatorUnavailable:
        return False
    return True


def test_events_the_coordinator_missed_reach_it_in_order_once_it_is_back(tmp_path):
    # As after a coordinator's restart: the agent reported while nothing listened.
    from fthsdp.coordinator.config import CoordinatorConfig
    from tests.harness.inprocess import InProcessCoordinator

    address = f"127.0.0.1:{free_port()}"
    reporter = Reporter([address], timeout=0.5)
    for state in (pb.AGENT_STATE_RUNNING, pb.AGENT_STATE_FAILED):
        reporter(pb.AgentEventRequest(job="default", replica_id="r0", state=state, detail="rank 0 exited with -9",
                                      agent_id="agent-0"))
    coordinator = InProcessCoordinator(CoordinatorConfig(bind=address))
    try:
        with CoordinatorClient([address]) as client:
            # The channel may be in its (1 s) reconnect back-off from the reporter's attempts.
            wait_until(lambda: registered(client), 30, message="the coordinator to take a registration")
            wait_until(lambda: {r.replica_id: r.agent_state for r in client.status().replicas}.get("r0")
                       == pb.AGENT_STATE_FAILED, 30, message="the events sent again to reach the coordinator")
        reporter.close()
    finally:
        coordinator.close()


def test_supervisor_reports_every_transition_in_order(tmp_path):
    (tmp_path / "ranks").mkdir()
    events: list[pb.AgentEventRequest] = []
    config = AgentConfig(replica_id="r0", nproc=2, max_restarts=1, restart_backoff=0.01, monitor_interval=0.02)
    command = [sys.executable, RANK_SCRIPT, str(tmp_path / "ranks"), "kill1"]
    supervisor = Supervisor(config, command, env=_env(), report=events.append)
    assert supervisor.run() == 0
    assert [(S(e.state), e.restart_count) for e in events] == [
        (S.STARTING, 0), (S.RUNNING, 0), (S.FAILED, 0), (S.RESTARTING, 0),
        (S.STARTING, 1), (S.RUNNING, 1), (S.SUCCEEDED, 1),
    ]  # fmt: skip
    assert events[2].detail == "local rank 1 exited with signal SIGKILL"
    assert {(e.job, e.replica_id, e.node_rank) for e in events} == {("default", "r0", 0)}


def test_a_missing_rank_command_gives_up_at_once(tmp_path):
    events: list[pb.AgentEventRequest] = []
    config = AgentConfig(replica_id="r0", max_restarts=5)
    assert Supervisor(config, [str(tmp_path / "no-such-program")], env=_env(), report=events.append).run() == 1
    assert [S(e.state) for e in events] == [S.STARTING, S.GAVE_UP]
    assert "cannot start the rank command" in events[-1].detail


@pytest.mark.parametrize(
    "args, words",
    [
        (("--replica-id", "r0"), "no rank command"),
        (("--replica-id", "r0", "--"), "no rank command"),
        (("--", "true"), "--replica-id is required"),
        (("--replica-id", "r0", "--nnodes", "2", "--node-rank", "2", "--master-port", "29400", "--", "true"),
         "--node-rank"),
        (("--replica-id", "r0", "--nnodes", "2", "--node-rank", "1", "--", "true"),
         "--node-rank 1 without --master-port"),
        (("--replica-id", "r0", "--nnodes", "2", "--master-port", "29400", "--", "true"),
         "give each host its --node-rank"),
        (("--spare", "--replica-id", "r0", "--nnodes", "2", "--", "true"), "--spare and --replica-id r0"),
        (("--spare", "--", "true"), "--spare needs the --nnodes"),
        (("--replica-id", "r0", "--cross-replica-backend", "mpi", "--", "true"), "auto, gloo or nccl"),
        (("--replica-id", "r0", "--nproc", "0", "--", "true"), "--nproc must be at least 1"),
        (("--replica-id", "r0", "--restart-backoff", "soon", "--", "true"), "expected a duration"),
        (("--replica-id", "r0", "--replica-rank", "2", "--", "true"), "must be less than --num-replicas"),
        (("--replica-id", "a/b", "--", "true"), "may contain only"),
        (("--replica-id", "r0", "--coordinator", "nowhere", "--", "true"), "is not HOST:PORT"),
    ],
)
def test_cli_errors_are_one_line(args, words):
    one_line_error(fthsdp("agent", *args), 2, words)


def test_cli_reads_the_environment_and_a_config_file(tmp_path):
    config = tmp_path / "agent.toml"
    config.write_text("[agent]\nreplica_id = 'r0'\nnproc = 0\n")
    one_line_error(fthsdp("agent", "--config", str(config), "--", "true"), 2, "--nproc must be at least 1")
    one_line_error(fthsdp("agent", "--", "true", env={"FTHSDP_REPLICA_ID": "r0", "FTHSDP_MAX_RESTARTS": "-1"}), 2,
                   "--max-restarts")


# ----- pure ----------------------------------------------------------------------------


def test_rank_environments_across_nodes():
    config = AgentConfig(replica_id="r0", nproc=4, nnodes=2, node_rank=1, master_addr="10.0.0.1", master_port=29400)
    envs = rank_environments(config, restart_count=2, master_port=29400, base={"PATH": "/bin", "RANK": "stale"})
    assert [e["RANK"] for e in envs] == ["4", "5", "6", "7"]
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "1", "2", "3"]
    for e in envs:
        assert (e["WORLD_SIZE"], e["LOCAL_WORLD_SIZE"], e["GROUP_RANK"]) == ("8", "4", "1")
        assert (e["MASTER_ADDR"], e["MASTER_PORT"]) == ("10.0.0.1", "29400")
        assert e["TORCHELASTIC_RESTART_COUNT"] == e["FTHSDP_RESTART_COUNT"] == "2"
        assert e["PATH"] == "/bin"  # the agent's environment passes through underneath


def test_backoff_doubles_up_to_a_cap():
    assert [backoff_delay(1.0, n) for n in range(1, 8)] == [1, 2, 4, 8, 16, 30, 30]
    assert backoff_delay(0.0, 5) == 0
    assert backoff_delay(45.0, 3) == 45  # a base above the cap is taken as given
    assert backoff_delay(1.0, 10_000) == 30
    with pytest.raises(ValueError):
        backoff_delay(1.0, 0)


def test_replica_rank_defaults_to_the_ids_trailing_digits_and_a_lone_replica_takes_any_name():
    assert [replica_rank_from_id(i, 16) for i in ("replica-3", "r12", "trainer", "a1b")] == [3, 12, 0, 0]
    assert AgentConfig(replica_id="replica-2", num_replicas=4).replica_rank == 2
    assert AgentConfig(replica_id="replica-2", replica_rank=0).replica_rank == 0
    assert AgentConfig(replica_id="r5").replica_rank == 0  # one replica group: a name, not a refusal
    # Once --num-replicas states the job's size, digits outside it are a
    # mistake that wrapping round would hide (two groups on one shard).
    with pytest.raises(ConfigError, match="reads as replica rank 3, which is not below --num-replicas 3"):
        AgentConfig(replica_id="r3", num_replicas=3)
    with pytest.raises(ConfigError, match="--replica-rank 2 must be less than --num-replicas"):
        AgentConfig(replica_id="replica-2", replica_rank=2)


def test_agent_state_mirrors_the_proto():
    names = {n.removeprefix("AGENT_STATE_"): v for n, v in pb.AgentState.items() if n != "AGENT_STATE_UNSPECIFIED"}
    assert {s.name: int(s) for s in AgentState} == names
    # Every state is reachable from the start and every non-final one can end.
    reachable, frontier = set(), {None}
    while frontier:
        frontier = {n for s in frontier for n in TRANSITIONS[s]} - reachable
        reachable |= frontier
    assert reachable == set(AgentState)
    assert all(TRANSITIONS[s] for s in AgentState if not s.final)
    assert all(not TRANSITIONS[s] for s in AgentState if s.final)


def test_describe_exit():
    assert describe_exit(3) == "code 3"
    assert describe_exit(-9) == "signal SIGKILL"
