"""The coordinator's Prometheus endpoint, scraped over HTTP from a real
coordinator with real (simulated-training) replica processes; and what it
shows of hangs and stragglers, from a runtime in this process fed with
progress reports (the simulated replicas report none).

``hung_runtime`` and ``straggler_runtime`` serve tests/test_cli.py and
tests/test_web.py too."""

from __future__ import annotations

import asyncio
import re
import urllib.error
import urllib.request

import prometheus_client
import pytest
from prometheus_client.exposition import choose_encoder
from prometheus_client.parser import text_string_to_metric_families

from fthsdp.coordinator.config import CoordinatorConfig
from fthsdp.coordinator.engine.metrics import FORMATION_BUCKETS, Metrics
from fthsdp.coordinator.engine.runtime import CoordinatorRuntime
from fthsdp.coordinator.serving.http_server import Request
from fthsdp.coordinator.serving.web import WebApp
from fthsdp.protos.v1 import coordinator_pb2 as pb
from tests.harness.processes import CoordinatorProcess, ReplicaProcess
from tests.harness.runtimes import hung_runtime, joined_runtime, report, straggler_runtime
from tests.harness.waiting import wait_until

SAMPLE = re.compile(r'^([a-z_]+)(\{[^}]*\})? (\S+)$')


def scrape(url: str) -> dict[str, float]:
    """{'name{labels}': value} of every sample."""
    with urllib.request.urlopen(url, timeout=5) as response:
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return samples_of(response.read().decode())


def samples_of(text: str) -> dict[str, float]:
    samples = {}
    for line in text.splitlines():
        if line.startswith("#") or not line:
            continue
        m = SAMPLE.match(line)
        assert m, f"not in the exposition format: {line!r}"
        samples[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return samples


def test_metrics_follow_the_quorum(tmp_path):
    c = CoordinatorProcess(tmp_path, "--metrics-port", "0", "--min-replicas", "1", "--heartbeat-interval", "100ms",
                           "--heartbeat-timeout", "1s").start()
    replicas = [ReplicaProcess(tmp_path, c.address, f"r{i}").start() for i in range(2)]
    try:
        url = c.metrics_url
        assert url.endswith("/metrics")
        healthy = 'fthsdp_replicas{job="default",state="healthy"}'
        wait_until(lambda: scrape(url).get(healthy) == 2, 20, message="two healthy replicas in the metrics")
        m = scrape(url)
        assert m['fthsdp_quorum_id{job="default"}'] >= 1
        assert m['fthsdp_quorum_changes_total{job="default"}'] >= 1
        changes = m['fthsdp_quorum_changes_total{job="default"}']
        assert m['fthsdp_quorum_formation_seconds_count{job="default"}'] == changes
        assert m['fthsdp_leader_changes_total{job="default"}'] == 1
        assert m['fthsdp_watch_streams{job="default"}'] == 2
        assert m['fthsdp_state_lost_step{job="default"}'] == 0  # the replicas never step: nothing to lose
        assert m['fthsdp_committed_step{job="default"}'] == 0
        assert m['fthsdp_hang_limit_seconds{job="default"}'] == 300  # the ceiling: no step time reported
        assert m['fthsdp_median_step_seconds{job="default"}'] == 0
        assert m['fthsdp_replicas_taken_out_total{job="default",reason="hung"}'] == 0  # there from the start
        # Simulated replicas report progress but no compute: a series each, no score.
        scores = {name: v for name, v in m.items() if name.startswith("fthsdp_straggler_score")}
        assert len(scores) == 2 and set(scores.values()) == {0}
        beats = m['fthsdp_heartbeats_total{job="default"}']
        wait_until(lambda: scrape(url)['fthsdp_heartbeats_total{job="default"}'] > beats, 10,
                   message="heartbeats counted")

        replicas[1].kill()
        wait_until(lambda: scrape(url).get(healthy) == 1, 20, message="the killed replica out of the healthy count")
        after = scrape(url)
        assert after['fthsdp_quorum_changes_total{job="default"}'] == changes + 1
        assert after['fthsdp_quorum_id{job="default"}'] == m['fthsdp_quorum_id{job="default"}'] + 1
        assert after['fthsdp_quorum_formation_seconds_bucket{job="default",le="+Inf"}'] == changes + 1
    finally:
        for r in replicas:
            r.stop()
        c.stop()


def test_metrics_endpoint_is_read_only(tmp_path):
    c = CoordinatorProcess(tmp_path, "--metrics-port", "0").start()
    try:
        base = c.metrics_url.removesuffix("/metrics")
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(urllib.request.Request(c.metrics_url, data=b"x", method="POST"), timeout=5)
        assert e.value.code == 405
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(base + "/admin", timeout=5)
        assert e.value.code == 404
    finally:
        c.stop()


# ----- hangs and stragglers, in process ------------------------------------------------











def test_metrics_show_the_hang_limit_step_times_and_a_hung_replica_taken_out():
    m = samples_of(hung_runtime().metrics.render())
    assert m['fthsdp_hang_limit_seconds{job="default"}'] == 2.0  # 5 x 0.2 s, at the floor
    assert m['fthsdp_median_step_seconds{job="default"}'] == 0.2
    assert m['fthsdp_replica_step_seconds{job="default",replica="r2"}'] == 0.2
    # 0.35 s over the others' 0.1 s; shown in full (0.35 / 0.1 is 3.4999999999999996), no longer rounded to 6 digits.
    assert m['fthsdp_straggler_score{job="default",replica="r2"}'] == pytest.approx(3.5)
    assert m['fthsdp_straggler_score{job="default",replica="r0"}'] == pytest.approx(0.1 / 0.225, rel=1e-5)
    assert m['fthsdp_replicas_taken_out_total{job="default",reason="hung"}'] == 1
    assert m['fthsdp_replicas_taken_out_total{job="default",reason="straggler"}'] == 0


def test_metrics_count_a_straggler_taken_out():
    m = samples_of(straggler_runtime().metrics.render())
    assert m['fthsdp_replicas_taken_out_total{job="default",reason="straggler"}'] == 1
    assert m['fthsdp_replicas_taken_out_total{job="default",reason="hung"}'] == 0
    assert m['fthsdp_straggler_score{job="default",replica="r2"}'] == pytest.approx(3.5)
    assert m['fthsdp_median_step_seconds{job="default"}'] == pytest.approx(0.4)


def test_a_replica_that_left_takes_its_series_with_it():
    async def scenario() -> CoordinatorRuntime:
        runtime, clock, sessions = await joined_runtime(n=2)
        clock.t = 1.0
        for rid in sessions:
            report(runtime, sessions, rid, 1, pb.Progress(phase=pb.PHASE_COMPUTE, step=1, step_time_s=0.2))
        assert 'fthsdp_replica_step_seconds{job="default",replica="r1"}' in samples_of(runtime.metrics.render())
        await runtime.leave(pb.LeaveRequest(job="default", replica_id="r1", session_id=sessions["r1"]))
        return runtime

    m = samples_of(asyncio.run(scenario()).metrics.render())
    assert 'fthsdp_replica_step_seconds{job="default",replica="r0"}' in m
    assert not any('replica="r1"' in name for name in m)


def test_each_metric_is_one_group_with_several_jobs():
    """The exposition format wants a metric's samples together under one
    HELP and TYPE; the gauges are produced job by job."""
    runtime, _, _ = asyncio.run(joined_runtime(jobs=("a", "b")))
    names = [line.split("{")[0].split(" ")[0] for line in runtime.metrics.render().splitlines()
             if not line.startswith("#")]
    families = [re.sub(r"_(bucket|sum|count)$", "", n) if n.startswith("fthsdp_quorum_formation") else n for n in names]
    groups = [name for i, name in enumerate(families) if i == 0 or families[i - 1] != name]
    assert len(groups) == len(set(groups)), groups
    assert families.count("fthsdp_hang_limit_seconds") == 2


# ----- the exposition, read back by prometheus_client's own parser ---------------------

def families_of(text: str) -> dict:
    """{family name: (type, help, {(sample name, sorted labels): value})}."""
    return {f.name: (f.type, f.documentation, {(s.name, tuple(sorted(s.labels.items()))): s.value for s in f.samples})
            for f in text_string_to_metric_families(text)}


def test_the_exposition_parses_back_with_its_names_labels_and_values():
    metrics = Metrics()
    for job in ("a", "b"):  # as the runtime starts them
        metrics.heartbeats.inc(0, job=job)
        metrics.taken_out.inc(0, job=job, reason="hung")
    for _ in range(3):
        metrics.heartbeats.inc(job="a")
    metrics.heartbeats.inc(2, job="b")
    metrics.taken_out.inc(job="a", reason="straggler")
    metrics.formation.observe(0.3, job="a")
    metrics.formation.observe(1.0, job="a")  # on a bound: counted in it (le means <=)
    metrics.formation.observe(40.0, job="a")  # past the last bound: only in +Inf
    odd = 'r"1\\x\ny'  # a replica id the exposition must escape
    metrics.gauges = lambda: [
        ("fthsdp_quorum_id", "The current quorum id, by job.", {"job": "a"}, 7),
        ("fthsdp_straggler_score", "Score, by job and replica.", {"job": "a", "replica": odd}, 3.5),
        ("fthsdp_quorum_id", "The current quorum id, by job.", {"job": "b"}, 2),
        ("fthsdp_event_loop_lag_seconds", "Lag.", {}, 0.25),
    ]
    families = families_of(metrics.render())

    assert list(families) == [  # counters lose their _total in the family name, not in the samples
        "fthsdp_heartbeats", "fthsdp_quorum_changes", "fthsdp_quorum_formation_seconds", "fthsdp_leader_changes",
        "fthsdp_replicas_taken_out", "fthsdp_quorum_id", "fthsdp_straggler_score", "fthsdp_event_loop_lag_seconds"]
    kind, help_text, samples = families["fthsdp_heartbeats"]
    assert (kind, help_text) == ("counter", "Heartbeats received, by job.")
    assert samples == {("fthsdp_heartbeats_total", (("job", "a"),)): 3, ("fthsdp_heartbeats_total", (("job", "b"),)): 2}
    assert families["fthsdp_quorum_changes"][2] == {}  # no series until the runtime starts one
    assert families["fthsdp_replicas_taken_out"][2] == {
        ("fthsdp_replicas_taken_out_total", (("job", "a"), ("reason", "hung"))): 0,
        ("fthsdp_replicas_taken_out_total", (("job", "a"), ("reason", "straggler"))): 1,
        ("fthsdp_replicas_taken_out_total", (("job", "b"), ("reason", "hung"))): 0}

    kind, help_text, samples = families["fthsdp_quorum_formation_seconds"]
    assert kind == "histogram" and help_text.startswith("From the first decision")
    buckets = {float(dict(labels)["le"]): v for (name, labels), v in samples.items() if name.endswith("_bucket")}
    assert list(buckets) == [*FORMATION_BUCKETS, float("inf")]
    assert (buckets[0.25], buckets[0.5], buckets[1.0], buckets[30.0], buckets[float("inf")]) == (0, 1, 2, 2, 3)
    assert samples[("fthsdp_quorum_formation_seconds_count", (("job", "a"),))] == 3
    assert samples[("fthsdp_quorum_formation_seconds_sum", (("job", "a"),))] == pytest.approx(41.3)
    assert {name for name, _ in samples} == {f"fthsdp_quorum_formation_seconds_{s}" for s in ("bucket", "count", "sum")}

    assert families["fthsdp_quorum_id"] == ("gauge", "The current quorum id, by job.", {
        ("fthsdp_quorum_id", (("job", "a"),)): 7, ("fthsdp_quorum_id", (("job", "b"),)): 2})
    assert families["fthsdp_straggler_score"][2] == {("fthsdp_straggler_score", (("job", "a"), ("replica", odd))): 3.5}
    assert families["fthsdp_event_loop_lag_seconds"][2] == {("fthsdp_event_loop_lag_seconds", ()): 0.25}
    assert not any(name.endswith("_created") for name in families)  # prometheus_client's extra series: left out


def test_each_coordinator_counts_in_its_own_registry():
    first, second = Metrics(), Metrics()
    first.heartbeats.inc(job="default")
    assert samples_of(first.render())['fthsdp_heartbeats_total{job="default"}'] == 1
    assert 'fthsdp_heartbeats_total{job="default"}' not in samples_of(second.render())
    assert prometheus_client.REGISTRY.get_sample_value("fthsdp_heartbeats_total", {"job": "default"}) is None


def test_metrics_are_served_with_the_content_type_of_their_format():
    runtime, _, _ = asyncio.run(joined_runtime())
    response = asyncio.run(WebApp(runtime, CoordinatorConfig(), "").handle(Request("GET", "/metrics", {}, {})))
    encoder, content_type = choose_encoder("")  # what prometheus_client serves to a scraper that asks for nothing
    assert encoder is prometheus_client.generate_latest
    assert (response.status, response.content_type) == (200, content_type)
    assert response.content_type == "text/plain; version=0.0.4; charset=utf-8"
    families = families_of(response.body.decode())
    assert families["fthsdp_leader_changes"][2] == {("fthsdp_leader_changes_total", (("job", "default"),)): 0}
    assert families["fthsdp_replicas"][2][("fthsdp_replicas", (("job", "default"), ("state", "healthy")))] == 3
