"""`fthsdp inject` with real processes: two replicas of tests/ftar_worker.py
train under `fthsdp agent`, an operator injects a fault into r1 with the
command line, and the job recovers as from the real fault:

* kill: r1's agent SIGKILLs its rank, which is restarted once (a crash like
  any other to the coordinator), catches up, and trains on with one state
  per step;
* hang: r1's training thread blocks with its heartbeats alive; the
  coordinator takes it out as hung, its stacks are dumped, its agent ends
  and restarts it;
* slow: r1's next steps take the injected seconds longer, and so do r0's
  (they train in lockstep); then the pace is back, nobody restarted.

Each injection is in the coordinator's log, `fthsdp status` and the status
page's recent events (the page itself rendered by a headless Chromium).
"""

from __future__ import annotations

import time
from html.parser import HTMLParser

import pytest

from fthsdp.client import CoordinatorClient
from fthsdp.coordinator.serving.web import WebApp
from fthsdp.protos.v1 import coordinator_pb2 as pb
from tests.harness.cli import fthsdp
from tests.harness.events import JsonLog, like
from tests.harness.replicas import LONG_FTAR, TIGHT, members, status_of, train_on_and_stop
from tests.harness.runtimes import hung_runtime
from tests.harness.waiting import wait_until
from tests.harness.web import dump_dom, page_url
from tests.harness.web import status as page_status

ADMIN_TOKEN = "inject-admin-token-0123"


@pytest.fixture
def admin_token(tmp_path) -> str:
    path = tmp_path / "admin-token"
    path.write_text(ADMIN_TOKEN + "\n")
    return str(path)


def start(cluster, admin_token, *coordinator_args, r1_agent_args=()):
    coordinator, agent, _ = cluster
    c = coordinator("--min-replicas", "1", "--metrics-port", "0", "--admin-token-file", admin_token,
                    "--log-format", "json", *coordinator_args)
    r0 = agent(c, 0, 2, env=LONG_FTAR)
    r1 = agent(c, 1, 2, env=LONG_FTAR, agent_args=("--log-format", "json", *r1_agent_args))
    r1.read_until(lambda line: line.get("step", 0) >= 5)
    return c, r0, r1


def inject(c, admin_token, *argv: str) -> str:
    done = fthsdp("inject", "--coordinator", c.address, "--admin-token-file", admin_token, "--replica", "r1", *argv)
    assert done.returncode == 0, done.stderr
    assert "replica r1: fault injected: " in done.stdout, done.stdout
    return done.stdout


def assert_recorded(c, fault: str, **fields) -> None:
    """In the log (its ``fault_injected`` event: the fault's name, then ``fields``), in `fthsdp status` and on
    the status page's recent events (``fault`` as they say it: ``slow (+1s per step for 4 steps)``)."""
    assert JsonLog(c.log_path).find_event("fault_injected", job="default", replica="r1", fault=fault.split()[0],
                                          **fields)
    shown = fthsdp("status", "--coordinator", c.address)
    assert shown.returncode == 0 and f"replica r1: fault injected: {fault}" in shown.stdout, shown.stdout
    events = page_status(page_url(c))["events"]
    assert any(e["kind"] == "fault_injected" and e["replica"] == "r1" and fault in e["text"] for e in events), events


def back_after_restart(c, r1, count: int = 1, timeout: float = 60) -> None:
    # The first incarnation's "admitted" line was read before the injection: this one is the restarted one's.
    r1.read_until(lambda line: "admitted" in line, timeout)
    with CoordinatorClient([c.address]) as client:
        wait_until(lambda: members(client) == {"r0", "r1"} and status_of(client, "r1")[1].restart_count == count,
                   timeout, message="r1 restarted, caught up and back in the quorum")


@pytest.mark.slow  # about a minute here, mostly two cold starts of a rank (import torch) on 2 cores
def test_an_injected_kill_is_a_crash_restarted_once(cluster, admin_token):
    c, r0, r1 = start(cluster, admin_token)
    inject(c, admin_token, "kill")
    back_after_restart(c, r1)
    train_on_and_stop([r0, r1])
    text, agent_log = r1.log_path.read_text(), JsonLog(r1.log_path)
    # The agent carried it out: "fault injected: kill (asked by ...); SIGKILLing its ranks".
    assert agent_log.find_event("fault_injected", replica="r1", fault="kill"), text[-3000:]
    assert len(agent_log.events_named("agent_state", replica="r1", state="FAILED",
                                      detail="local rank 0 exited with signal SIGKILL")) == 1, text[-3000:]
    assert len(agent_log.events_named("agent_state", replica="r1", state="RESTARTING")) == 1
    assert JsonLog(c.log_path).find_event("agent_reported", replica="r1", node_rank=0, state="failed",
                                          detail="local rank 0 exited with signal SIGKILL")  # as any crash
    assert_recorded(c, "kill")


@pytest.mark.slow
def test_an_injected_hang_is_taken_out_as_hung_dumped_and_restarted(cluster, admin_token):
    c, r0, r1 = start(cluster, admin_token, *TIGHT, r1_agent_args=("--hang-grace", "1s"))
    inject(c, admin_token, "hang")
    back_after_restart(c, r1)
    train_on_and_stop([r0, r1])
    log = JsonLog(c.log_path)
    assert log.find_event("hang", replica="r1", reason=like(r"^hung: no progress at step")), log.tail()
    text = r1.log_path.read_text()
    assert "fault injected (hang" in text and "taken out by the coordinator (hung" in text, text[-3000:]
    assert "Stacks of every thread" in text and "in at_step" in text  # blocked where the fault put it
    assert_recorded(c, "hang")


@pytest.mark.slow
def test_an_injected_slow_fault_slows_the_steps_while_it_lasts(cluster, admin_token):
    c, r0, r1 = start(cluster, admin_token)
    before = time.monotonic()  # the steps' "t" is the same clock (CLOCK_MONOTONIC), in every process
    inject(c, admin_token, "slow", "--seconds", "1", "--steps", "4")
    injected = time.monotonic()  # the push reached r1 between the two
    r0.read_until(lambda line: sum(1 for s in r0.steps.values() if s["t"] > injected) >= 12, timeout=90)
    after = [s for s in sorted(r0.steps) if r0.steps[s]["t"] > before]
    gaps = [r0.steps[s]["t"] - r0.steps[s - 1]["t"] for s in after if s - 1 in r0.steps]
    slowed = [g for g in gaps if g >= 0.8]  # 1 s, less the skew between the two replicas
    assert len(slowed) == 4, f"r0's step times after the injection: {[round(g, 2) for g in gaps]}"
    tail = sorted(gaps[-5:])
    assert tail[2] < 0.5, f"the pace is not back after the slow steps: {[round(g, 2) for g in gaps]}"
    with CoordinatorClient([c.address]) as client:
        assert members(client) == {"r0", "r1"}  # a slow replica, no take-out (the straggler policy is off)
    train_on_and_stop([r0, r1])
    text = r1.log_path.read_text()
    # No event for this line (a rank carries the fault out, saying so): its text.
    assert "fault injected: slow (+1s per step for 4 steps)" in text, text[-3000:]
    assert not JsonLog(r1.log_path).events_named("agent_state", state="FAILED"), text[-3000:]
    assert_recorded(c, "slow (+1s per step for 4 steps)", seconds=1, steps=4)


class _Events(HTMLParser):
    """The items of the page's "Recent events" list: (kind, replica, text)."""

    def __init__(self) -> None:
        super().__init__()
        self.items: list[list[str]] = []
        self._open = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "li" and "data-event" in a:
            self.items.append([a["data-event"], a.get("data-event-replica", ""), ""])
            self._open = True

    def handle_endtag(self, tag):
        if tag == "li":
            self._open = False

    def handle_data(self, data):
        if self._open:
            self.items[-1][2] += data


def test_the_page_lists_an_injected_fault_among_the_recent_events(tmp_path):  # a few seconds: in the default suite
    runtime = hung_runtime()
    runtime.inject(pb.InjectRequest(replica_id="r1", kind=pb.FAULT_KIND_SLOW, seconds=2, steps=5,
                                    requested_by="alice@box"), "")
    page = _Events()
    page.feed(dump_dom(WebApp(runtime, runtime.config, "").handle, tmp_path / "profile"))
    injected = [item for item in page.items if item[0] == "fault_injected"]
    assert len(injected) == 1 and injected[0][1] == "r1", page.items
    assert "replica r1: fault injected: slow (+2s per step for 5 steps) (asked by alice@box)" in injected[0][2]
    assert any(kind == "quorum_change" and "quorum #" in text for kind, _, text in page.items), page.items
