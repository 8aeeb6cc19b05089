"""The strided checksum history each heartbeat carries (pure)."""

from __future__ import annotations

from fthsdp.agent.training.state.checksum import StridedHistory


def test_history_keeps_the_latest_checksum_at_each_stride():
    history = StridedHistory(every=10)
    reported = {}
    for step in range(10, 1210, 10):
        reported = history.record(step, f"c{step}")
    # strides of 10, 100 and 1,000 steps: the latest multiple of each
    assert reported == {1200: "c1200", 1000: "c1000"}
    reported = history.record(1210, "c1210")
    assert reported == {1210: "c1210", 1200: "c1200", 1000: "c1000"}
