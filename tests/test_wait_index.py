"""The wait index (fthsdp/coordinator/decisions/wait_index.py): the oldest wait
in an all-reduce and the processes in a section, kept as reports come,
agree with a pass over every latest report, whatever the order of the
reports, the replicas forgotten and the heap's rebuilds."""

from __future__ import annotations

import random

import pytest

from fthsdp.coordinator.decisions import wait_index
from fthsdp.coordinator.decisions.hang import HangRules, Report
from fthsdp.coordinator.decisions.progress import ProgressBook
from fthsdp.coordinator.decisions.wait_index import WaitIndex
from fthsdp.protos.v1 import coordinator_pb2 as pb

PHASES = (pb.PHASE_COMPUTE, pb.PHASE_ALLREDUCE, pb.PHASE_UPDATE, pb.PHASE_SECTION, pb.PHASE_STARTING)


def scan(reports: dict[str, dict[int, Report]]) -> tuple[float, set[tuple[str, int]]]:
    """What the index stands for, by a pass over every report."""
    oldest = min((r.received - r.age for ranks in reports.values() for r in ranks.values()
                  if r.phase == pb.PHASE_ALLREDUCE), default=float("inf"))
    sections = {(rid, k) for rid, ranks in reports.items() for k, r in ranks.items() if r.phase == pb.PHASE_SECTION}
    return oldest, sections


def test_a_newer_report_of_a_process_ends_its_wait_and_a_forgotten_replica_waits_no_more():
    index, reports = WaitIndex(), {"a": {}, "b": {}}

    def put(rid: str, rank: int, phase: int, received: float, age: float) -> None:
        report = reports[rid][rank] = Report(phase, age, 3, received)
        index.saw(rid, rank, report)

    put("a", 1, pb.PHASE_ALLREDUCE, 10.0, 4.0)  # waiting since 6
    put("b", 1, pb.PHASE_ALLREDUCE, 10.0, 1.0)  # since 9
    put("b", 2, pb.PHASE_SECTION, 10.0, 1.0)
    assert index.oldest(reports) == 6.0 and set(index.sections) == {("b", 2)}
    put("a", 1, pb.PHASE_UPDATE, 11.0, 0.1)
    assert index.oldest(reports) == 9.0
    put("b", 2, pb.PHASE_COMPUTE, 11.0, 0.1)
    assert index.sections == {}
    del reports["b"]
    index.forget("b")
    assert index.oldest(reports) == float("inf")


@pytest.mark.parametrize("seed", range(5))
def test_the_index_agrees_with_a_pass_over_every_report(seed, monkeypatch):
    monkeypatch.setattr(wait_index, "COMPACT_SLACK", 16)  # rebuilt often, to test the rebuild too
    rng = random.Random(seed)
    book = ProgressBook(HangRules())
    now = 0.0
    for _ in range(3000):
        now += rng.random() * 0.1
        rid = f"r{rng.randrange(6)}"
        which = rng.random()
        if which < 0.02:
            book.forget(rid)
        elif which < 0.2:  # a group's ranks in columns: never in a section
            ranks = rng.sample(range(1, 9), rng.randrange(1, 5))
            phases = [rng.choice(PHASES[:3]) for _ in ranks]
            book.report_digest(rid, pb.RankDigest(
                replica_id=rid, ranks=ranks, phases=phases, phase_ages_s=[rng.random() * 5 for _ in ranks],
                steps=[1] * len(ranks), step_times_s=[1.0] * len(ranks), compute_times_s=[0.5] * len(ranks)), now)
        else:
            book.report(rid, rng.randrange(9), pb.Progress(phase=rng.choice(PHASES), phase_age_s=rng.random() * 5,
                                                           step=1, section_timeout_s=rng.random() * 20), now)
        if rng.random() < 0.1:
            oldest, sections = scan(book.reports)
            before = now - rng.random() * 5
            seen = book.waits.oldest(book.reports, before)
            assert seen == oldest if oldest <= before else before < seen <= oldest
            assert book.waits.oldest(book.reports) == oldest
            assert set(book.waits.sections) == sections
    book.waits.oldest(book.reports)
    processes = 6 * 9
    assert len(book.waits._heap) <= 2 * processes + 16, "stale entries do not pile up"
