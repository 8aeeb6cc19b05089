"""The node agent: start and supervise the local ranks of one replica group.

``fthsdp agent --replica-id replica-3 --nproc 8 -- python train.py`` starts 8
ranks with torchrun's environment for the replica group's own world (RANK,
WORLD_SIZE, MASTER_ADDR, ...; see ``fthsdp.agent.node.launch.rank_environments``) plus
FTHSDP_*, and restarts the whole group when one of them dies: the group is
the unit of failure, the other replica groups of the job keep training, and
the restarted one catches up from them.

Every transition of ``AgentState`` is reported to the coordinator
(``ReportAgentEvent``) from a background thread, in order; FAILED goes out the
moment a rank's death is seen, before the other ranks are stopped, because
that report is how the surviving replicas learn of the failure fast. An
unreachable coordinator costs a warning, never supervision.

With ``--nnodes`` > 1 the group's hosts meet through the coordinator
(fthsdp/agent/node/group_rendezvous.py): every incarnation of the group is a
rendezvous round, whose number less one is every host's restart count, whose store
is a fresh one on the host of node rank 0, and which one failure on any
host ends on every host at once (the coordinator pushes it; the ranks here
are stopped as after a local failure, and the agent joins the next round).
``--max-restarts`` then counts the group's rounds. With ``--master-port``
given as well the launch is static (every node's agent is given the same
--master-addr/--master-port and its own --node-rank) and each agent
restarts its own node's ranks on its own schedule.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from typing import cast

from fthsdp.agent import outcome, standby
from fthsdp.agent.injection import kill_ranks
from fthsdp.agent.node.agent_state import TRANSITIONS, AgentState
from fthsdp.agent.node.config import MAX_BACKOFF, AgentConfig
from fthsdp.agent.node.group_rendezvous import Assignment, GroupRendezvous
from fthsdp.agent.node.group_round import Phase
from fthsdp.agent.node.hang_watch import HangWatch
from fthsdp.agent.node.late_exits import LateExits
from fthsdp.agent.node.launch import Rank, describe_exit, free_port, rank_environments, stop_ranks
from fthsdp.agent.node.relay.liveness import Silence
from fthsdp.agent.node.relay.server import LocalRelay
from fthsdp.agent.node.reporter import Reporter
from fthsdp.agent.node.stop_request import StopRequest
from fthsdp.core.credentials import read_token_file
from fthsdp.core.log_format import configure_logging
from fthsdp.protos.v1 import coordinator_pb2 as pb

log = logging.getLogger("fthsdp.agent")

STABLE_UPTIME = 60.0
"""A group that ran this long before failing is not crash-looping: it restarts without back-off."""
ROUND_END_GRACE = 0.0
"""Seconds the ranks get after SIGTERM, before SIGKILL, when the coordinator ended their round (another host of the
group failed): none. Their group's state is lost with the round, and a rank blocked in a gloo collective with the
failed host ignores SIGTERM until that collective times out (measured: every host stopped 1.1 s after the failure
was known with a 1 s grace, 0.1 s with none)."""
DIVERGENCE_SETTLE = 1.0
"""After a failure, seconds to wait at most for the coordinator's push that took the replica out
(it carries a checksum-mismatch verdict, if any) to reach the agent's stream."""


def backoff_delay(base: float, restart: int, cap: float = MAX_BACKOFF) -> float:
    """Seconds to wait before restart number ``restart`` (1, 2, ...): ``base``,
    doubling per restart, at most ``cap`` (or ``base`` if that is larger)."""
    if restart < 1:
        raise ValueError(f"restart numbers start at 1, got {restart}")
    return min(max(cap, base), base * 2.0 ** min(restart - 1, 64))


class Supervisor:
    """Runs the ranks of one node through the ``AgentState`` lifecycle.

    ``env`` is the environment the ranks inherit underneath the launch
    contract (the agent's own, which only its entry point reads: ``main``);
    ``report`` receives one ``AgentEventRequest`` per transition (default: a
    ``Reporter`` to ``config.coordinator``).
    """

    def __init__(
        self,
        config: AgentConfig,
        command: Sequence[str],
        env: Mapping[str, str],
        report: Callable[[pb.AgentEventRequest], None] | None = None,
    ) -> None:
        if not command:
            raise ValueError("the rank command is empty")
        self.config = config
        """The settings of the incarnation that runs (with a rendezvous: the round's node rank and store)."""
        self._base = config
        self.command = list(command)
        self.env = dict(env)
        self._report = report
        self.state: AgentState | None = None
        self.restart_count = 0
        self.agent_id = secrets.token_hex(16)
        """Drawn at start, shown to nobody but its ranks: the coordinator takes
        this agent's reports only about the processes it started (``RegisterRequest.agent_id``)."""
        self.history: list[tuple[AgentState, str]] = []
        self._ranks: list[Rank] = []
        self._stop = StopRequest()
        self._standby: list[tuple[Rank, int]] = []
        """The warm standby group (--standby): each rank with the pipe that activates it."""
        self._fast_failures = 0
        self._running_since = 0.0
        self._outcome_dir: str | None = None
        """A private folder for the ranks' outcome files (fthsdp/agent/outcome.py)."""
        self._hangs: HangWatch | None = None
        """The coordinator's hang notices for this replica (fthsdp/agent/node/hang_watch.py)."""
        self._late = LateExits()
        """Local ranks of this start that exited non-zero after leaving the job for good."""
        self._round_over = False
        """The coordinator ended the running round (not a failure of this host's ranks)."""
        self._rendezvous: GroupRendezvous | None = None
        """The group's rounds, with --nnodes above 1 (fthsdp/agent/node/group_rendezvous.py)."""
        self._token = ""
        self._relay: LocalRelay | None = None
        """Where the ranks and this agent's clients reach the coordinator (fthsdp/agent/node/relay/)."""

    def request_stop(self) -> None:
        """What SIGTERM does: drain the ranks (or skip a pending restart) and exit."""
        self._stop.request()

    def run(self) -> int:
        """Supervise until SUCCEEDED (returns 0) or GAVE_UP (returns 1)."""
        reporter = None
        self._token = read_token_file(self.config.token_file)
        # The host's one connection to the coordinator: the ranks and this agent's own clients reach it through
        # the relay (fthsdp/agent/node/relay/).
        self._relay = LocalRelay(self.config.coordinators, self._token, self.config.tls,
                                 rank_silence=self.config.rank_silence).start()
        if self._report is None:
            reporter = self._report = Reporter([self._relay.address], self._token, None)
            if self.config.replica_id:  # a spare's, once a group adopts it
                self._watch_hangs()
        if self.config.rendezvous:
            self._rendezvous = GroupRendezvous(self.config, self.env, self._token, relay=self._relay.address)
        self._stop.install()
        try:
            return self._supervise()
        finally:
            if self._rendezvous is not None:
                # Finished or drained: the host leaves for good; else its stream closing counts as lost.
                self._rendezvous.close(self.history[-1][1] or "done" if self.state is AgentState.SUCCEEDED else "")
            if self._outcome_dir is not None:
                shutil.rmtree(self._outcome_dir, ignore_errors=True)
            self._retire_standby()
            if any(rank.poll() is None for rank in self._ranks):  # only on an unexpected exception
                stop_ranks(self._ranks, self.config.stop_timeout, self.config.monitor_interval)
            self._stop.close()
            if self._hangs is not None:
                self._hangs.close()
            if reporter is not None:
                reporter.close()
            self._relay.close()  # last: the ranks and the clients above are gone

    def _watch_hangs(self) -> None:
        if self._hangs is not None:
            self._hangs.close()
        assert self._relay is not None  # started first
        self._hangs = HangWatch([self._relay.address], self.config.job, self.config.replica_id, self._token, None)

    def _join_round(self) -> int | None:
        """With a rendezvous: join the group's next round and take its
        settings; an exit code if the agent ends instead."""
        assert self._rendezvous is not None
        got = self._rendezvous.next_round(lambda timeout: self._stop.wait(timeout) if timeout else
                                          self._stop.requested)
        if not isinstance(got, Assignment):
            if self._stop.requested:
                return self._stop_without_restart()
            if got.exit_code == 0:  # released: a spare at the job's end, a host a spare replaced
                self._transition(AgentState.SUCCEEDED, got.reason)
                return 0
            self._transition(AgentState.GAVE_UP, got.reason)
            return got.exit_code
        adopted = got.replica_id != self.config.replica_id
        # Round 1 runs as restart count 0, as torchrun counts: a script's first incarnation is the same either way.
        self.config, self.restart_count = got.config(self._base), got.round - 1
        if adopted and self._report is not None and isinstance(self._report, Reporter):
            self._watch_hangs()  # a spare serves its group from now on
        log.info("replica %s: round %d: node rank %d of %d, store %s:%d", got.replica_id, got.round, got.node_rank,
                 self.config.nnodes, got.store_host, got.store_port)
        return None

    # ----- the loop ------------------------------------------------------------------

    def _supervise(self) -> int:
        while True:
            cfg = self.config
            self._transition(AgentState.STARTING, f"starting {cfg.nproc} local rank(s)" if self._rendezvous is None
                             else f"joining the next round of group {cfg.replica_id}" if cfg.replica_id
                             else "a spare host, waiting for a group to take it")
            if self._rendezvous is not None and (code := self._join_round()) is not None:
                return code
            cfg = self.config
            self._late.reset()
            try:
                self._start_ranks()
            except OSError as e:  # command not found, not executable: restarting cannot help
                stop_ranks(self._ranks, cfg.stop_timeout, cfg.monitor_interval)
                self._transition(
                    AgentState.GAVE_UP, f"cannot start the rank command {self.command[0]!r}: {e.strerror or e}"
                )
                return 1
            if self._stop.requested:
                return self._drain()
            self._transition(AgentState.RUNNING, "pids " + " ".join(str(r.pid) for r in self._ranks))
            self._running_since = time.monotonic()
            failure = self._monitor()
            if failure is None and self._stop.requested:
                return self._drain()
            if failure is None:
                finished = self._hangs.finished_step if self._hangs is not None else 0
                if finished:  # a rank that arrived after the end: success, never a restart
                    log.info("replica %s: succeeded (job finished at step %d); nothing to restart",
                             cfg.replica_id, finished)
                ended = outcome.describe([outcome.read(self._outcome_path(self.restart_count, r.local_rank))
                                          for r in self._ranks])  # drained by the coordinator, say
                ended = ended or (f"job finished at step {finished}" if finished else "")
                self._transition(AgentState.SUCCEEDED, self._late.how_ranks_ended(ended))
                return 0
            self._transition(AgentState.FAILED, failure)  # reported before the others are stopped
            if self._rendezvous is not None and not self._round_over:
                self._rendezvous.failed(failure)  # the coordinator ends the round on every host of the group
            hung = self._hangs is not None and self._hangs.notice_for(self.restart_count) is not None
            grace = ROUND_END_GRACE if self._round_over else cfg.hang_grace if hung else cfg.stop_timeout
            stop_ranks(self._ranks, min(grace, cfg.stop_timeout), cfg.monitor_interval)
            if self._stop.requested:
                return self._stop_without_restart()
            diverged = self._hangs.divergence_for(self.restart_count, DIVERGENCE_SETTLE) if self._hangs else None
            if diverged is not None and diverged.give_up:
                # Another catch-up would replay the members' steps and diverge again in the loop's own state.
                log.error("replica %s gave up: %s", cfg.replica_id, diverged.reason)
                self._transition(AgentState.GAVE_UP, f"gave up: {diverged.reason}")
                return 1
            if diverged is not None:
                log.warning("replica %s was taken out for a checksum mismatch (%d in a row after catching up): %s",
                            cfg.replica_id, diverged.strikes, diverged.reason)
            if self._rendezvous is None and self.restart_count >= cfg.max_restarts:
                self._transition(AgentState.GAVE_UP, f"{failure}; no restarts left (--max-restarts {cfg.max_restarts})")
                return 1
            # Back off only from a crash loop; a group that ran a while restarts at once.
            stable = time.monotonic() - self._running_since >= STABLE_UPTIME
            self._fast_failures = 0 if stable else self._fast_failures + 1
            delay = 0.0 if stable else backoff_delay(cfg.restart_backoff, self._fast_failures)
            self._transition(
                AgentState.RESTARTING, f"restart {self.restart_count + 1} of {cfg.max_restarts} in {delay:g}s"
                if self._rendezvous is None else f"joining the group's next round in {delay:g}s")
            if self._stop.wait(delay):
                return self._stop_without_restart()
            self.restart_count += 1

    def _outcome_path(self, restart: int, local_rank: int) -> str:
        """Where rank ``local_rank`` of incarnation ``restart`` says how it ended (fthsdp/agent/outcome.py)."""
        if self._outcome_dir is None:
            self._outcome_dir = tempfile.mkdtemp(prefix=f"fthsdp-agent-{self.config.replica_id}-")
        return os.path.join(self._outcome_dir, f"rank{local_rank}-restart{restart}.json")

    def _start_ranks(self) -> None:
        if self._activate_standby():
            return
        port = self.config.master_port or free_port()  # a fresh port per start: the old one may linger in TIME_WAIT
        # With a rendezvous the ranks reach the round's store as clients, under the round's prefix (torchrun's
        # agent store: torch.distributed's env:// rendezvous reads these two).
        base = self.env if self._rendezvous is None else {**self.env, "TORCHELASTIC_USE_AGENT_STORE": "True"}
        assert self._relay is not None  # started first
        envs = rank_environments(self.config, self.restart_count, port, base, self.agent_id, self._relay.address)
        self._ranks = []
        for local_rank, env in enumerate(envs):
            env = {**env, outcome.ENV: self._outcome_path(self.restart_count, local_rank)}
            self._ranks.append(Rank(local_rank, self.command, env))
        log.info("started %d rank(s) (MASTER_ADDR=%s MASTER_PORT=%d)", len(envs), self.config.master_addr, port)

    # ----- warm standby (fthsdp/agent/standby.py) --------------------------------------------

    def _spawn_standby(self) -> None:
        """Start the next restart's group ahead of need; it waits inside Manager.from_env."""
        self._retire_standby()
        assert self._relay is not None  # started first
        envs = rank_environments(self.config, self.restart_count + 1, free_port(), self.env, self.agent_id,
                                 self._relay.address)
        try:
            for local_rank, env in enumerate(envs):
                read_end, write_end = os.pipe()
                try:
                    env = {**env, standby.ENV: str(read_end),
                           outcome.ENV: self._outcome_path(self.restart_count + 1, local_rank)}
                    rank = Rank(local_rank, self.command, env, pass_fds=(read_end,))
                except OSError:
                    os.close(write_end)
                    raise
                finally:
                    os.close(read_end)
                self._standby.append((rank, write_end))
        except OSError as e:
            log.warning("could not start a warm standby: %s", e)
            self._retire_standby()
            return
        log.info("warm standby ready to start: pids %s", " ".join(str(r.pid) for r, _ in self._standby))

    def _activate_standby(self) -> bool:
        """Make the standby group the running one, if it is still alive."""
        if not self._standby:
            return False
        if any(rank.poll() is not None for rank, _ in self._standby):
            log.warning("the warm standby exited; starting the ranks cold")
            self._retire_standby()
            return False
        self._ranks = []
        for rank, pipe in self._standby:
            try:
                os.write(pipe, standby.GO)
            except OSError as e:  # it died just now: the monitor will see the rank fail
                log.warning("could not activate standby rank %d: %s", rank.local_rank, e)
            os.close(pipe)
            self._ranks.append(rank)
        self._standby = []
        log.info("activated the warm standby (pids %s)", " ".join(str(r.pid) for r in self._ranks))
        return True

    def _retire_standby(self) -> None:
        """Close the pipes (a waiting standby then exits 0) and make sure they are gone."""
        if not self._standby:
            return
        ranks = [rank for rank, _ in self._standby]
        for _, pipe in self._standby:
            os.close(pipe)
        self._standby = []
        stop_ranks(ranks, self.config.stop_timeout, self.config.monitor_interval)

    def _monitor(self) -> str | None:
        """Wait until every rank exited 0 (None), one failed (its description),
        or a stop was requested (None, with the request set)."""
        standby_due = self._running_since + self.config.standby_delay if self.config.standby else None
        self._round_over = False
        while not self._stop.requested:
            ended = self._rendezvous.round_ended() if self._rendezvous is not None else None
            if ended is not None:  # another host failed, or the group gave up: stop here too
                log.warning("replica %s: %s; stopping this host's ranks", self.config.replica_id, ended)
                self._round_over = True
                return ended
            if standby_due is not None and time.monotonic() >= standby_due:
                standby_due = None  # once per start: a standby that dies is not restarted in a loop
                self._spawn_standby()
            kill = self._hangs.faults.kill_due(self.restart_count) if self._hangs is not None else None
            if kill is not None:  # `fthsdp inject kill`: seen below as any crash is (fthsdp/agent/injection.py)
                kill_ranks(self._ranks, kill, self.config.replica_id)
            hung = self._hangs.notice_for(self.restart_count) if self._hangs is not None else None
            if hung is not None:
                log.error("the coordinator took replica %s out: %s; ending its ranks", self.config.replica_id, hung)
                return f"taken out by the coordinator ({hung})"
            silence = self._relay.silent() if self._relay is not None else None
            if silence is not None and self._runs(silence):
                log.error("replica %s: %s; ending its ranks", self.config.replica_id, silence.reason())
                return silence.reason()
            codes = [rank.poll() for rank in self._ranks]
            for rank, code in zip(self._ranks, codes, strict=True):
                if code is not None and code != 0 and not self._exited_after_leaving(rank, code):
                    log.error("local rank %d (pid %d) exited with %s", rank.local_rank, rank.pid, describe_exit(code))
                    return f"local rank {rank.local_rank} exited with {describe_exit(code)}"
            if all(code == 0 or (code is not None and rank.local_rank in self._late)
                   for rank, code in zip(self._ranks, codes, strict=True)):
                return None
            self._stop.wait(self.config.monitor_interval)
        return None

    def _leave_group(self) -> int:
        """SIGTERM to one host of a group of several hosts (a node drained or
        preempted): this host leaves the group as a failed one, so that the
        group's other hosts restart without it and a spare (or this host,
        rescheduled) takes its place. No drain: the ranks here cannot leave
        at a step boundary without the whole replica leaving with them.
        Drain a whole group with ``fthsdp drain REPLICA``."""
        signame = signal.Signals(self._stop.signum or signal.SIGTERM).name
        detail = (f"{signame}: this host leaves group {self.config.replica_id}; its ranks are stopped at once and "
                  "the group goes on without it (drain a whole group with fthsdp drain)")
        self._transition(AgentState.DRAINING, detail)
        assert self._rendezvous is not None
        if self._rendezvous.state.phase is Phase.RUNNING:
            self._rendezvous.failed(detail)
        stop_ranks(self._ranks, 0.0, self.config.monitor_interval)
        self._transition(AgentState.GAVE_UP, f"{signame}: left group {self.config.replica_id}")
        return 1

    def _drain(self) -> int:
        if self._rendezvous is not None and self.config.replica_id:
            return self._leave_group()
        signame = signal.Signals(self._stop.signum or signal.SIGTERM).name
        self._transition(AgentState.DRAINING, f"{signame}: ranks leave at their next step boundary")
        stop_ranks(self._ranks, self.config.stop_timeout, self.config.monitor_interval)
        for rank in self._ranks:
            code = rank.poll()
            if code != 0 and not (code is not None and self._exited_after_leaving(rank, code)):
                how = "did not exit" if code is None else f"exited with {describe_exit(code)}"
                self._transition(AgentState.GAVE_UP, f"drain: local rank {rank.local_rank} {how}")
                return 1
        self._transition(AgentState.SUCCEEDED, "drained: " + self._late.how_ranks_ended(""))
        return 0

    def _runs(self, silence: Silence) -> bool:
        """Whether a silent rank is one of this agent's (its replica's; a past incarnation's processes,
        ended, closed their streams)."""
        return silence.replica_id == self.config.replica_id

    def _exited_after_leaving(self, rank: Rank, code: int) -> bool:
        """Whether ``rank``, which exited with ``code`` (not 0), had left the job for good first."""
        return self._late.after_leaving(rank, code, self._outcome_path(self.restart_count, rank.local_rank))

    def _stop_without_restart(self) -> int:
        if self._rendezvous is not None and self.config.replica_id:
            return self._leave_group()
        signame = signal.Signals(self._stop.signum or signal.SIGTERM).name
        self._transition(AgentState.DRAINING, f"{signame} while restarting: not restarting")
        self._transition(AgentState.SUCCEEDED, "stopped; the ranks were already down")
        return 0

    def _transition(self, state: AgentState, detail: str) -> None:
        if state not in TRANSITIONS[self.state]:
            raise RuntimeError(f"bug: agent transition {self.state} -> {state.name} is not allowed")
        previous = self.state.name if self.state is not None else "-"
        self.state = state
        self.history.append((state, detail))
        cfg = self.config
        log.info("replica %s node %d: %s -> %s (%s)", cfg.replica_id, cfg.node_rank, previous, state.name, detail,
                 extra={"event": "agent_state", "replica": cfg.replica_id, "node_rank": cfg.node_rank,
                        "previous": previous, "state": state.name, "detail": detail})
        assert self._report is not None
        if not cfg.replica_id:  # a spare that no group took yet: no replica to report about
            return
        try:
            self._report(
                pb.AgentEventRequest(
                    job=cfg.job,
                    replica_id=cfg.replica_id,
                    state=cast(pb.AgentState, int(state)),  # the values are the proto's (see AgentState)
                    node_rank=max(cfg.node_rank, 0),
                    restart_count=self.restart_count,
                    detail=detail[:1000],  # the coordinator refuses over 1024
                    agent_id=self.agent_id,
                )
            )
        except Exception as e:  # noqa: BLE001 - a custom reporter must not end supervision either
            log.warning("could not report %s: %s", state.name, e)


def main(args, env: Mapping[str, str]) -> int:
    """``fthsdp agent``: resolve the settings, then supervise until done."""
    from fthsdp.agent.node.config import config_from_args

    config, command = config_from_args(args, env)
    configure_logging(config.log_level, config.log_format)
    return Supervisor(config, command, env=env).run()
