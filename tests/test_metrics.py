"""The coordinator's Prometheus endpoint, scraped over HTTP from a real
coordinator with real (simulated-training) replica processes."""

from __future__ import annotations

import re
import urllib.error
import urllib.request

import pytest

from tests.processes import CoordinatorProcess, ReplicaProcess
from tests.waiting import wait_until

SAMPLE = re.compile(r'^([a-z_]+)(\{[^}]*\})? (\S+)$')


def scrape(url: str) -> dict[str, float]:
    """{'name{labels}': value} of every sample."""
    with urllib.request.urlopen(url, timeout=5) as response:
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = response.read().decode()
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
        assert m['fthsdp_quorum_formation_seconds_count{job="default"}'] == m['fthsdp_quorum_changes_total{job="default"}']
        assert m['fthsdp_leader_changes_total{job="default"}'] == 1
        assert m['fthsdp_watch_streams{job="default"}'] == 2
        assert m['fthsdp_state_lost_step{job="default"}'] == 0  # the replicas never step: nothing to lose
        assert m['fthsdp_committed_step{job="default"}'] == 0
        beats = m['fthsdp_heartbeats_total{job="default"}']
        wait_until(lambda: scrape(url)['fthsdp_heartbeats_total{job="default"}'] > beats, 10, message="heartbeats counted")

        changes = m['fthsdp_quorum_changes_total{job="default"}']
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
