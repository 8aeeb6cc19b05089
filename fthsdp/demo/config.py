"""Settings of ``fthsdp demo``, validated before anything is started."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from fthsdp.core.errors import ConfigError

FAIL_MODES = ("kill", "hang", "deadlock", "kill-all")
STEPS_AFTER_FAILURE = 20
"""Steps the survivors must still have to take after the failure: the
restarted replica needs a few seconds (a few steps) to catch up before they
finish and leave (kill-all: steps to train after the restore)."""
CHECKPOINT_EVERY = 10
"""--fail-mode kill-all: the replicas write a checkpoint every this many steps
(unless --checkpoint-every says otherwise)."""


@dataclasses.dataclass(frozen=True)
class DemoConfig:
    """What the demo runs and where it writes its report."""

    replicas: int = 3
    """Replica groups of the example model, each one ``fthsdp agent`` with one rank."""

    steps: int = 100
    """Steps every replica trains (the example's --steps)."""

    fail_step: int = 30
    """The failure is injected once the failing replica has committed this step."""

    fail_replica: int = -1
    """Index of the replica that fails; -1: the last one."""

    fail_mode: str = "kill"
    """kill: SIGKILL the replica's training process (its agent restarts it, it
    catches up from a peer). hang: SIGSTOP it (the coordinator finds it silent
    after the heartbeat timeout), then SIGKILL it once the survivors went on
    without it, as a watchdog would. deadlock: its training loop blocks after
    the backward pass (fthsdp.examples.gpt.train --fail-how deadlock), the process
    and its heartbeat threads alive; the coordinator takes it out as hung once
    the others waited for it past the hang limit, and its agent ends it (after
    a stack dump into its log) and restarts it. kill-all: the replicas write a
    checkpoint every ``checkpoint_every`` steps; once the newest one before
    ``fail_step`` is complete and the replicas committed ``fail_step``, every
    training process is SIGKILLed at once; their agents restart them, the
    coordinator restores that checkpoint (the steps committed after it are
    lost), they load it and train on from its step."""

    checkpoint_every: int | None = None
    """kill-all only: a checkpoint every this many steps (None: CHECKPOINT_EVERY)."""

    live: bool = True
    """A live terminal view (rich); False: plain log lines."""

    out: str = ""
    """Folder for the PNG report, the JSON summary and the process logs; empty:
    a fresh ./fthsdp-demo-YYYYmmdd-HHMMSS/ in the current directory."""

    store: str = "memory"
    """The coordinator's store: memory (embedded), etcd (a private etcd started
    for the demo) or etcd://HOST:PORT (an existing one)."""

    def __post_init__(self) -> None:
        if self.replicas < 2:
            raise ConfigError(f"--replicas: the demo needs at least 2 replicas (one fails, one goes on), "
                              f"got {self.replicas}")
        if self.replicas > 16:
            raise ConfigError(f"--replicas: at most 16 on one machine, got {self.replicas}")
        if self.fail_step < 1:
            raise ConfigError(f"--fail-step must be at least 1, got {self.fail_step}")
        if self.steps < self.fail_step + STEPS_AFTER_FAILURE:
            why = "the replicas need steps to train after the restore" if self.fail_mode == "kill-all" else \
                "the failed replica needs time to catch up before the others finish"
            raise ConfigError(
                f"--steps {self.steps} leaves too little after --fail-step {self.fail_step}: {why}; "
                f"give --steps {self.fail_step + STEPS_AFTER_FAILURE} or more"
            )
        if not -1 <= self.fail_replica < self.replicas:
            raise ConfigError(f"--fail-replica must be in [0, {self.replicas}) (or -1 for the last), "
                              f"got {self.fail_replica}")
        if self.fail_mode not in FAIL_MODES:
            raise ConfigError(f"--fail-mode must be kill, hang, deadlock or kill-all, got {self.fail_mode!r}")
        if self.fail_mode == "kill-all":
            if self.fail_replica != -1:
                raise ConfigError("--fail-replica: --fail-mode kill-all kills every replica; leave it out")
            if self.checkpoint_interval < 1:
                raise ConfigError(f"--checkpoint-every must be at least 1, got {self.checkpoint_interval}")
            if self.fail_step < self.checkpoint_interval:
                raise ConfigError(
                    f"--fail-step {self.fail_step} comes before the first checkpoint (--checkpoint-every "
                    f"{self.checkpoint_interval}): there would be nothing to restore; give --fail-step "
                    f"{self.checkpoint_interval} or more"
                )
        elif self.checkpoint_every is not None:
            raise ConfigError(f"--checkpoint-every is for --fail-mode kill-all (--fail-mode {self.fail_mode} "
                              "writes no checkpoint)")
        if self.store not in ("memory", "etcd") and not self.store.startswith("etcd://"):
            raise ConfigError(f"--store: expected memory, etcd or etcd://HOST:PORT, got {self.store!r}")
        if self.out and Path(self.out).exists() and not Path(self.out).is_dir():
            raise ConfigError(f"--out {self.out}: exists and is not a folder")

    @property
    def replica_ids(self) -> list[str]:
        return [f"r{i}" for i in range(self.replicas)]

    @property
    def victim(self) -> str:
        """The replica that fails; kill-all: the one whose step the kill waits for (the last)."""
        return self.replica_ids[self.fail_replica]

    @property
    def victims(self) -> list[str]:
        """Every replica the failure hits."""
        return self.replica_ids if self.fail_mode == "kill-all" else [self.victim]

    @property
    def checkpoint_interval(self) -> int:
        """kill-all: steps between checkpoints (0 for the other modes, which write none)."""
        if self.fail_mode != "kill-all":
            return 0
        return CHECKPOINT_EVERY if self.checkpoint_every is None else self.checkpoint_every
