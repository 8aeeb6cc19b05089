"""``fthsdp demo``: the real example under real agents, a failure, its recovery.

1. A coordinator (embedded store, or a private etcd with ``--store etcd``).
2. ``--replicas`` replica groups, each an ``fthsdp agent --standby`` running
   the example ``python -m fthsdp.examples.gpt.train`` (one rank on the CPU).
3. Once the failing replica committed ``--fail-step``, its training process
   is SIGKILLed (``kill``) or SIGSTOPped (``hang``; SIGKILLed once the
   coordinator dropped it, as a watchdog would), or its training loop blocks
   after the next backward pass (``deadlock``, train.py ``--fail-how
   deadlock``: alive and heartbeating; the coordinator takes it out as hung,
   its agent ends it after a stack dump). Its agent restarts it (the warm
   standby takes over), it catches up from a healthy peer and rejoins.
   ``kill-all``: the replicas write a checkpoint every ``--checkpoint-every``
   steps (into ``--out``/checkpoints); once the newest one before
   ``--fail-step`` is complete and the replicas committed ``--fail-step``,
   every training process is SIGKILLed at once. Their agents restart them,
   the coordinator restores that checkpoint (the steps committed after it
   are lost), they load it and form a quorum at its step.
4. Every replica trains to ``--steps``; then the summary, ``summary.json`` and
   ``demo.png`` in ``--out``.

Every wait is on a recorded condition with a deadline. Every process started
is stopped on the way out, on an error, Ctrl-C or SIGTERM too (children.py).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from fthsdp.core.errors import ConfigError
from fthsdp.demo.children import Child, Children
from fthsdp.demo.config import DemoConfig
from fthsdp.demo.live import LiveView, PlainLog
from fthsdp.demo.poller import StatusPoller
from fthsdp.demo.record import DemoFailed, Failure, RankStart, Recorder, StatusSample, StepLine
from fthsdp.demo.report import write_report
from fthsdp.demo.summary import summarize, summary_text

if TYPE_CHECKING:
    from fthsdp.client import CoordinatorClient

TRAIN_MODULE = "fthsdp.examples.gpt.train"
"""The example the replicas train, run as a module (shipped in the package)."""
COORDINATOR_FLAGS = ("--heartbeat-interval", "200ms", "--heartbeat-timeout", "2s", "--join-timeout", "2s")
"""A hang is found after 2 s of silence (the default 5 s would only make the demo longer)."""
DEADLOCK_FLAGS = ("--hang-floor", "2s", "--hang-multiple", "3")
"""--fail-mode deadlock: a member is hung once the others waited for it 3 x the
median step, at least 2 s (the defaults, 5 x and 10 s, would only make the demo
longer). Not for hang: there the heartbeat timeout is to find the stopped process."""
AGENT_FLAGS = ("--standby", "--standby-delay", "2s", "--restart-backoff", "0", "--stop-timeout", "5s",
               "--hang-grace", "1s")
"""--restart-backoff 0: the demo's replicas fail within a minute of starting,
which the agent would otherwise take for a crash loop and wait a second.
--hang-grace 1s: a deadlocked rank ignores its SIGTERM (its loop never reaches
the step boundary where it would leave); SIGKILL it after 1 s, not 5."""
ENDED_TIMEOUT = 30.0
"""The agent ends a rank taken out as hung within --hang-grace of the notice."""
START_TIMEOUT = 180.0
"""Three replicas importing torch at once on a small machine take a while."""
RECOVERY_TIMEOUT = 120.0
SECONDS_PER_STEP_BOUND = 10.0
"""A deadline, not a pace: the example's step takes well under a second on a CPU."""


def _check_prerequisites(live: bool) -> None:
    if not _importable(TRAIN_MODULE):
        raise ConfigError(f"the demo trains the module {TRAIN_MODULE}, which is missing from this installation "
                          "of fthsdp: reinstall it (pip install --force-reinstall 'fthsdp[demo]')")
    missing = [name for name in (("rich", "matplotlib") if live else ("matplotlib",)) if not _importable(name)]
    if missing:
        raise ConfigError(f"the demo needs {' and '.join(missing)}: pip install 'fthsdp[demo]'")


def _importable(name: str) -> bool:
    """Whether ``name`` can be imported, without importing it (only the
    packages above it, for a dotted name)."""
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a package above it is missing
        return False


def fresh_out_dir(out: str, cwd: Path) -> Path:
    """``out`` if given, else a new ./fthsdp-demo-YYYYmmdd-HHMMSS[-N]/."""
    if out:
        return Path(out)
    base = cwd / f"fthsdp-demo-{time.strftime('%Y%m%d-%H%M%S')}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


class _Interrupted(KeyboardInterrupt):
    """SIGTERM, handled like Ctrl-C."""


@contextmanager
def _interruptible():
    """SIGINT and SIGTERM interrupt the demo; while it cleans up they are ignored,
    so that a second Ctrl-C cannot leave processes behind."""
    if threading.current_thread() is not threading.main_thread():
        yield lambda: None
        return

    def interrupt(signum, frame):
        raise _Interrupted(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}

    def shield() -> None:
        for sig in previous:
            signal.signal(sig, signal.SIG_IGN)

    try:
        yield shield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_demo(config: DemoConfig, out: TextIO = sys.stdout) -> int:
    _check_prerequisites(config.live)
    out_dir = fresh_out_dir(config.out, Path.cwd())
    logdir = out_dir / "logs"
    logdir.mkdir(parents=True, exist_ok=True)
    rec = Recorder(config.replica_ids)
    children = Children(logdir, cwd=out_dir.resolve())

    def say(text: str) -> None:
        print(text, file=out, flush=True)

    what = (f"SIGKILL of every replica after step {config.fail_step} (a checkpoint every "
            f"{config.checkpoint_interval} steps)" if config.fail_mode == "kill-all"
            else f"{config.fail_mode} of {config.victim} after step {config.fail_step}")
    say(f"fthsdp demo: {config.replicas} replicas of fthsdp.examples.gpt on the CPU, {config.steps} steps, "
        f"{what}; output in {out_dir}/")
    failure = None
    error: DemoFailed | None = None
    with _interruptible() as shield:
        etcd = scenario = None
        try:
            store = config.store
            if store == "etcd":
                etcd = _start_etcd()
                store = etcd.url
                say(f"started a private etcd at {etcd.endpoint} (data in {etcd.data_dir})")
            view = LiveView(rec, config.steps, config.victims) if config.live else PlainLog(rec, config.steps, out)
            with view:
                scenario = _Scenario(config, children, rec, store, out_dir.resolve() / "checkpoints")
                try:
                    scenario.start()
                    failure = scenario.play()
                except DemoFailed as e:
                    error = e
                    failure = scenario.failure
        except KeyboardInterrupt as e:
            shield()
            say(f"\ninterrupted ({e or 'SIGINT'}): stopping every process the demo started ...")
            raise
        finally:
            shield()
            if scenario is not None:
                scenario.close()
            killed = children.stop_all()
            if killed:
                say(f"(had to SIGKILL {len(killed)} leftover process(es): {' '.join(map(str, killed))})")
            if etcd is not None:
                etcd.close()

    summary = summarize(rec, failure, config.replicas, config.steps)
    summary["ok"] = error is None
    summary["error"] = str(error) if error else None
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    write_report(out_dir / "demo.png", rec, failure, summary)
    if any(rec.steps.values()):  # a demo that failed before training has nothing to sum up
        say(summary_text(summary, str(out_dir)))
    if error is not None:
        raise DemoFailed(f"{error}; see the logs in {logdir}")
    return 0


def _start_etcd():
    from fthsdp.testing.local_etcd import EtcdNotFound, EtcdServer

    try:
        server = EtcdServer()
    except EtcdNotFound as e:
        raise ConfigError(f"--store etcd: {e}") from e
    server.start()
    return server


def _latest(rec: Recorder) -> StatusSample:
    """The coordinator's latest status, asked for once a wait has seen one."""
    sample = rec.latest()
    if sample is None:
        raise DemoFailed("no status from the coordinator yet")
    return sample


def _last_step(rec: Recorder, replica: str) -> StepLine:
    """``replica``'s latest step, asked for once a wait has seen one."""
    line = rec.last_step(replica)
    if line is None:
        raise DemoFailed(f"no step from {replica} yet")
    return line


def _rank_lines(rec: Recorder, replica: str) -> Callable[[str, float], None]:
    """Where the stdout lines of ``replica``'s agent (its ranks' lines) go."""
    return lambda text, t: rec.rank_line(replica, text, t)


class _Scenario:
    def __init__(self, config: DemoConfig, children: Children, rec: Recorder, store: str,
                 checkpoint_dir: Path) -> None:
        self.config = config
        self.children = children
        self.rec = rec
        self.store = store
        self.checkpoint_dir = checkpoint_dir
        """kill-all: where the replicas write their checkpoints."""
        self.agents: dict[str, Child] = {}
        self.coordinator: Child | None = None
        self.client: CoordinatorClient | None = None
        self.poller: StatusPoller | None = None
        self.failure: Failure | None = None

    def close(self) -> None:
        if self.poller is not None:
            self.poller.stop()
        if self.client is not None:
            self.client.close()

    def _check(self) -> None:
        """Ends a wait early when a process the scenario needs has died."""
        if self.coordinator is not None and self.coordinator.proc.poll() is not None:
            raise DemoFailed(f"the coordinator exited ({self.coordinator.proc.returncode}):\n"
                             f"{self.coordinator.log_tail()}")
        for replica, agent in self.agents.items():
            code = agent.proc.poll()
            if code not in (None, 0):
                raise DemoFailed(f"the agent of {replica} exited with {code}:\n{agent.log_tail()}")

    def _wait(self, predicate, timeout: float, what: str):
        return self.rec.wait_for(predicate, timeout, what, check=self._check)

    def start(self) -> None:
        from fthsdp.client import CoordinatorClient

        cfg, rec = self.config, self.rec
        self.coordinator = self.children.start("coordinator", Children.python(
            "fthsdp", "coordinator", "--bind", "127.0.0.1:0", "--store", self.store,
            "--min-replicas", str(max(1, cfg.replicas - 1)), *COORDINATOR_FLAGS,
            *(DEADLOCK_FLAGS if cfg.fail_mode == "deadlock" else ()),
        ), on_line=rec.coordinator_line)
        address = self._wait(lambda: rec.coordinator_address, 60, "the coordinator's start")
        rec.event(f"coordinator serving on {address} (store: {self.store})")
        self.client = CoordinatorClient([address], timeout=2.0)
        self.poller = StatusPoller(self.client, rec).start()
        checkpoints = ("--checkpoint-dir", str(self.checkpoint_dir), "--checkpoint-every",
                       str(cfg.checkpoint_interval)) if cfg.fail_mode == "kill-all" else ()
        if checkpoints:
            self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        for replica in cfg.replica_ids:
            deadlock = ("--fail-at-step", str(cfg.fail_step), "--fail-how", "deadlock")
            self.agents[replica] = self.children.start(replica, Children.python(
                "fthsdp", "agent", "--coordinator", address, "--replica-id", replica,
                "--num-replicas", str(cfg.replicas), *AGENT_FLAGS, *checkpoints,
                "--", sys.executable, "-m", TRAIN_MODULE, "--steps", str(cfg.steps), "--log-every", "1",
                *(deadlock if cfg.fail_mode == "deadlock" and replica == cfg.victim else ()),
            ), on_line=_rank_lines(rec, replica), stops_first=True)
        rec.event(f"started {cfg.replicas} agents, each training {TRAIN_MODULE}"
                  + (f", a checkpoint every {cfg.checkpoint_interval} steps" if checkpoints else ""))

    def play(self) -> Failure:
        cfg, rec = self.config, self.rec
        victim = cfg.victim
        ids = set(cfg.replica_ids)
        self._wait(lambda: (s := rec.latest()) and set(s.members) == ids and all(rec.starts[r] for r in ids),
                   START_TIMEOUT, "the first quorum of every replica")
        if cfg.fail_mode == "kill-all":
            self.failure = failure = self._kill_all()
            self._restored(failure)
            self._finish()
            return failure
        if cfg.fail_mode == "deadlock":
            self.failure = failure = self._deadlocked(victim)
        else:
            self._wait(lambda: (line := rec.last_step(victim)) and line.step >= cfg.fail_step,
                       cfg.fail_step * SECONDS_PER_STEP_BOUND, f"{victim} reaching step {cfg.fail_step}")
            self.failure = failure = self._inject(victim)
        self._wait(lambda: (s := rec.latest()) and s.quorum_id > failure.quorum_before and victim not in s.members,
                   RECOVERY_TIMEOUT, f"the coordinator dropping {victim}")
        dropped = _latest(rec)
        rec.event(f"the coordinator dropped {victim}: quorum {dropped.quorum_id} of {', '.join(dropped.members)}")
        if cfg.fail_mode == "hang":
            self._kill_hung(failure)
        elif cfg.fail_mode == "deadlock":
            self._ended_by_agent(failure)

        def survivors_done() -> bool:
            return all(r in rec.done for r in ids - {victim})

        def rejoined():
            s = rec.latest()
            if s.quorum_id > dropped.quorum_id and victim in s.members:
                return s
            if survivors_done():
                raise DemoFailed(f"the other replicas finished before {victim} caught up: give more --steps "
                                 "after --fail-step")
            return None

        back = self._wait(rejoined, RECOVERY_TIMEOUT, f"{victim} catching up and rejoining")
        rec.event(f"{victim} rejoined: quorum {back.quorum_id} of {', '.join(back.members)}")
        self._finish()
        return failure

    def _finish(self) -> None:
        """Every agent ends once its replica trained to --steps."""
        cfg, rec = self.config, self.rec
        self._wait(lambda: all(agent.proc.poll() is not None for agent in self.agents.values()),
                   cfg.steps * SECONDS_PER_STEP_BOUND, f"every replica training to step {cfg.steps}")
        self._check()
        missing = [r for r in cfg.replica_ids if rec.done.get(r) != cfg.steps]
        if missing:
            raise DemoFailed(f"{', '.join(missing)} did not reach step {cfg.steps}")
        rec.event(f"every replica reached step {cfg.steps}")

    def _ours(self, path: str) -> bool:
        """Whether a checkpoint is one this run wrote (an existing etcd may hold older runs' records)."""
        return Path(path).is_relative_to(self.checkpoint_dir)

    def _kill_all(self) -> Failure:
        """Once the replicas committed --fail-step and the newest checkpoint before
        it (the first one if --fail-step is its step) is complete: SIGKILL every
        replica's training process at once. The steps committed after that
        checkpoint are lost with the state."""
        cfg, rec = self.config, self.rec
        every = cfg.checkpoint_interval
        wanted = max(every, (cfg.fail_step - 1) // every * every)

        def ready() -> bool:
            s = rec.latest()
            if s is None:
                return False
            line = rec.last_step(cfg.victim)
            if s.checkpoint_step >= wanted and self._ours(s.checkpoint_path) and line and line.step >= cfg.fail_step:
                return True
            if rec.done:
                raise DemoFailed(f"the replicas finished before the checkpoint of step {wanted} was complete")
            return False

        self._wait(ready, cfg.steps * SECONDS_PER_STEP_BOUND,
                   f"the checkpoint of step {wanted} complete and the replicas at step {cfg.fail_step}")
        sample = _latest(rec)
        pids = {r: rec.starts[r][-1].pid for r in cfg.replica_ids}
        step = max(_last_step(rec, r).step for r in cfg.replica_ids)
        t, wall = time.monotonic(), time.time()
        for pid in pids.values():
            os.kill(pid, signal.SIGKILL)
        failure = Failure("all", "kill-all", pids[cfg.replica_ids[-1]], step, t, wall, sample.quorum_id,
                          killed_t=t, pids=pids)
        rec.event(f"SIGKILL every replica's training process ({', '.join(f'{r} {p}' for r, p in pids.items())}) "
                  f"after step {step}; the newest complete checkpoint is of step {sample.checkpoint_step}")
        return failure

    def _restored(self, failure: Failure) -> None:
        """The agents restart their replicas, the coordinator restores the newest
        checkpoint, the replicas load it and form a quorum at its step, and train."""
        cfg, rec = self.config, self.rec
        ids = set(cfg.replica_ids)

        def restore():
            s = rec.latest()
            return s if s and s.restored_step and s.restore_unix_ms >= int(failure.wall * 1000) and \
                self._ours(s.restored_path) else None

        decided = self._wait(restore, RECOVERY_TIMEOUT, "the coordinator restoring the newest checkpoint")
        checkpoint = decided.restored_step
        last = max(decided.lost_step, failure.step)  # the coordinator's may lag the replicas' last commit
        lost = last - checkpoint
        lost_text = "no committed step lost" if lost <= 0 else \
            f"{lost} committed step{'s' if lost != 1 else ''} lost: {checkpoint + 1}-{last}"
        rec.event(f"the coordinator restores the checkpoint of step {checkpoint} ({lost_text}), "
                  f"{decided.restore_unix_ms / 1000 - failure.wall:.1f} s after the kill")

        def restarted(replica: str) -> RankStart | None:
            return next((start for start in rec.starts[replica] if start.t > failure.t), None)

        def reformed():
            s = _latest(rec)
            if s.quorum_id > failure.quorum_before and set(s.members) == ids and all(restarted(r) for r in ids):
                return s
            if rec.done:
                raise DemoFailed(f"{', '.join(sorted(rec.done))} finished before every replica was back")
            return None

        back = self._wait(reformed, RECOVERY_TIMEOUT, "every replica restarted and in one quorum again")
        starts = {r: start for r in cfg.replica_ids if (start := restarted(r))}
        loaded = [r for r, start in starts.items() if not start.catch_up]
        copied = [f"{r} caught up from {start.catch_up.get('source')}" for r, start in starts.items()
                  if start.catch_up]
        how = "every replica loaded it" if not copied else \
            "; ".join(([f"{', '.join(loaded)} loaded it"] if loaded else []) + copied)
        rec.event(f"{how}: quorum {back.quorum_id} of {', '.join(back.members)} at step {back.quorum_step}")

        def trained():  # each replica's first step since its restart
            firsts = [next((line for line in rec.steps[r] if line.t > start.t), None) for r, start in starts.items()]
            return firsts if all(firsts) else None

        firsts = self._wait(trained, RECOVERY_TIMEOUT, "every replica training again")
        first = min(line.step for line in firsts)
        rec.event(f"every replica trains again from step {first}, "
                  f"{max(line.t for line in firsts) - failure.t:.1f} s after the kill")

    def _inject(self, victim: str) -> Failure:
        rec = self.rec
        start, step, quorum = rec.starts[victim][-1], _last_step(rec, victim).step, _latest(rec).quorum_id
        sig = signal.SIGKILL if self.config.fail_mode == "kill" else signal.SIGSTOP
        t, wall = time.monotonic(), time.time()
        os.kill(start.pid, sig)
        failure = Failure(victim, self.config.fail_mode, start.pid, step, t, wall, quorum,
                          killed_t=t if sig == signal.SIGKILL else 0.0)
        rec.event(f"{signal.Signals(sig).name} {victim}'s training process (pid {start.pid}) after step {step}")
        return failure

    def _deadlocked(self, victim: str) -> Failure:
        """The victim's training loop blocked itself (train.py --fail-how
        deadlock, after its backward pass): the failure is its own line."""
        rec, cfg = self.rec, self.config
        line = self._wait(lambda: rec.failing.get(victim), cfg.fail_step * SECONDS_PER_STEP_BOUND,
                          f"{victim} deadlocking after step {cfg.fail_step}")
        start, quorum = rec.starts[victim][-1], _latest(rec).quorum_id
        t = float(line["t"])
        failure = Failure(victim, "deadlock", start.pid, int(line["step"]), t, t + rec.wall_offset, quorum)
        rec.event(f"{victim}'s training loop (pid {start.pid}) deadlocked after the backward pass of step "
                  f"{failure.step + 1}; the process and its heartbeats live on")
        return failure

    def _ended_by_agent(self, failure: Failure) -> None:
        """The coordinator took the deadlocked replica out as hung and told its
        agent, which ends the process (its stacks are dumped into its log first)."""
        def gone() -> bool:
            try:
                os.kill(failure.pid, 0)
            except ProcessLookupError:
                return True
            return False

        self._wait(gone, ENDED_TIMEOUT, f"{failure.replica}'s agent ending the hung process {failure.pid}")
        failure.killed_t = time.monotonic()
        log = self.children.logdir / f"{failure.replica}.log"
        if log.is_file() and "taken out by the coordinator" in log.read_text(errors="replace"):
            failure.stacks_in = f"logs/{log.name}"
        dump = f"; its stacks are in {failure.stacks_in}" if failure.stacks_in else ""
        self.rec.event(f"{failure.replica}'s agent ended the hung process {failure.pid}{dump}; it restarts it")

    def _kill_hung(self, failure: Failure) -> None:
        """The coordinator dropped the silent replica; its process is still
        stopped and would stay so: kill it, as a watchdog (or an operator) would
        (its agent, told by the coordinator, would too after --hang-grace)."""
        failure.killed_t = time.monotonic()
        try:
            os.kill(failure.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.rec.event(f"SIGKILL the hung process {failure.pid}; its agent restarts it")
