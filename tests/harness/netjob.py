"""A training job in network namespaces (tests/harness/netns.py), for the network-fault tests.

``Job``: a coordinator on the control bridge (``--store`` etcd, ``--log-format
json``) and one replica per namespace under ``fthsdp agent``, running
tests/ftar_worker.py, each with a control link to the coordinator and a data
link to the others. ``jobs_in_lab`` is the body of the tests' ``job_in_lab``
fixture: it makes the lab and the job, and removes both at the end.

The checks every such test ends with: ``assert_one_state_per_step`` (over
every line, or the lines given: one lineage's, say) and ``assert_no_step_lost``.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable, Iterable, Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

from fthsdp.client import CoordinatorClient
from fthsdp.demo.record import json_objects
from fthsdp.protos.v1 import coordinator_pb2 as pb
from tests.harness.events import JsonLog
from tests.harness.netns import NetLab
from tests.harness.netns_state import netns_names

FOREVER = "1000000"
HANG_FLOOR = "3s"
"""The hang limit (coordinator --hang-floor): short, so that a stuck collective is acted on within seconds."""
COORDINATOR_ARGS = ("--min-replicas", "2", "--heartbeat-interval", "200ms", "--heartbeat-timeout", "2s",
                    "--join-timeout", "2s", "--hang-floor", HANG_FLOOR, "--log-format", "json")
"""Every Job's coordinator flags; a Job's ``coordinator_args`` come after them (the last of a flag given twice wins)."""
WORKER_ARGS = ("--steps", FOREVER, "--wait-for", "3", "--hidden", "64", "--slow", "0.01")
"""Every rank's tests/ftar_worker.py flags; a Job's ``worker_args`` come after them."""


class Job:
    """A coordinator on the control bridge and one replica per namespace of ``lab``.

    ``coordinator_args`` go to ``fthsdp coordinator`` after ``COORDINATOR_ARGS``,
    ``agent_args`` to every ``fthsdp agent`` (``--checkpoint-dir``, say: the agent
    passes its checkpoint settings to its ranks), ``worker_args`` to every rank's
    tests/ftar_worker.py after ``WORKER_ARGS``."""

    def __init__(self, lab: NetLab, tmp: Path, etcd_url: str, key_prefix: str, *worker_args: str,
                 coordinator_args: Iterable[str] = (), agent_args: Iterable[str] = ()) -> None:
        self.lab, self.tmp = lab, tmp
        self.coordinator = lab.coordinator(
            tmp, "--store", etcd_url, "--store-prefix", key_prefix.rstrip("/"), *COORDINATOR_ARGS,
            *coordinator_args).start()
        self.log = JsonLog(self.coordinator.log_path)
        self.agents = {}
        for i, name in enumerate(lab.names):
            self.agents[name] = lab.agent(name, tmp, self.coordinator.address, i, len(lab.names), *WORKER_ARGS,
                                          *worker_args, agent_args=tuple(agent_args)).start()

    def stop(self) -> None:
        """Stop every process; then every line the replicas printed is read (``drain``)."""
        for a in self.agents.values():
            a.signal(signal.SIGTERM)  # all at once: they drain together, not one quorum change each
        for a in self.agents.values():
            a.stop()
        self.coordinator.stop()
        for a in self.agents.values():
            a._pumper.join(timeout=10)  # its stdout closed: every line it printed is in the queue
        self.drain()

    def job_status(self) -> pb.StatusResponse:
        with CoordinatorClient([self.coordinator.address]) as client:
            return client.status()

    def status(self) -> dict:
        return {r.replica_id: r for r in self.job_status().replicas}

    def training(self, names, contributors: int, past: int = 0, steps: int = 5, timeout: float = 60.0,
                 quorum: int = 0) -> int:
        """Wait until every one of ``names`` committed ``steps`` steps with
        ``contributors`` contributors past step ``past`` (in quorum ``quorum``
        or a later one); returns the latest step seen."""
        last = 0
        for name in names:
            first = self.agents[name].read_until(
                lambda line: (line.get("step", 0) > past and line.get("contributors") == contributors
                              and line.get("quorum", 0) >= quorum), timeout=timeout)
            line = self.agents[name].read_until(
                lambda line, first=first: line.get("step", 0) >= first["step"] + steps, timeout=timeout)
            last = max(last, line["step"])
        return last

    def drain(self, *names: str) -> None:
        """Take in every line the replicas ``names`` (default: all) printed that
        has come through so far, without waiting for more; steps are recorded
        as ``read_until`` records them."""
        for name in names or list(self.agents):
            self.agents[name].drain()

    def rank_pid(self, name: str) -> int:
        """The pid of replica ``name``'s training process: its latest admission line's (read so far)."""
        admitted = [line for raw in self.agents[name].history for line in json_objects(raw) if "admitted" in line]
        assert admitted, f"{name}'s rank has not been admitted yet"
        return admitted[-1]["pid"]


def assert_one_state_per_step(job: Job, lines: Iterable[dict] | None = None, what: str = "") -> None:
    """Every step any process printed (every incarnation, killed, cut off or
    not; or every one of ``lines``: one lineage's, say) has one state and one
    count of contributors (fthsdp/agent/training/ftar/vote.py)."""
    if lines is None:
        lines = [line for a in job.agents.values() for line in a.step_lines]
    steps: dict[int, set[tuple[str, int]]] = {}
    for line in lines:
        steps.setdefault(line["step"], set()).add((line["checksum"], line["contributors"]))
    split = {s: c for s, c in steps.items() if len(c) > 1}
    assert not split, (f"{what + ': ' if what else ''}states differ at steps {sorted(split)[:5]}: "
                       f"{[sorted(split[s]) for s in sorted(split)[:3]]}")


def assert_no_step_lost(job: Job, names) -> None:
    """The members that trained on committed every step in order: none was lost or repeated."""
    for name in names:
        got = sorted(job.agents[name].steps)
        gaps = [(a, b) for a, b in pairwise(got) if b != a + 1]
        assert not gaps, f"{name} skipped steps {gaps[:3]}"


@contextlib.contextmanager
def labs(start: Callable) -> Iterator:
    """Yields ``make(names, *args, **kwargs)``, which opens a NetLab of
    ``names`` (a count or a list) and starts ``start(lab, *args, **kwargs)``
    in it (a job with a ``stop()``); at the end every job is stopped and every
    lab removed, none leaving a namespace behind. Skips where no lab can be made."""
    NetLab.skip_unless_possible()
    made: list[tuple[NetLab, Any]] = []

    def make(names, *args, **kwargs):
        lab = NetLab(names)
        lab.open()
        made.append((lab, None))
        job = start(lab, *args, **kwargs)
        made[-1] = (lab, job)
        return job

    try:
        yield make
    finally:
        for lab, job in made:
            try:
                if job is not None:
                    job.stop()
            finally:
                lab.close()
            assert not [ns for ns in netns_names() if ns.startswith(lab.prefix)], "namespaces left behind"


@contextlib.contextmanager
def jobs_in_lab(tmp: Path, etcd_url: str, key_prefix: str) -> Iterator:
    """The ``job_in_lab`` fixture's body: yields ``make(*worker_args, replicas=3,
    coordinator_args=(), agent_args=())``, which opens a NetLab and starts a
    ``Job`` in it (``labs``)."""
    def start(lab: NetLab, *worker_args: str, coordinator_args: Iterable[str] = (),
              agent_args: Iterable[str] = ()) -> Job:
        return Job(lab, tmp, etcd_url, key_prefix, *worker_args, coordinator_args=coordinator_args,
                   agent_args=agent_args)

    with labs(start) as make_in:
        def make(*worker_args: str, replicas: int = 3, **kwargs) -> Job:
            return make_in(replicas, *worker_args, **kwargs)

        yield make
