"""A replica admitted as up to date keeps the source the coordinator named for
its last gap (fthsdp/coordinator/quorum.py, rule 7; fthsdp/agent/training/last_gap.py)."""

from __future__ import annotations

import types

from fthsdp.agent.training.joiner import Joiner
from fthsdp.protos.v1 import coordinator_pb2 as pb
from tests.test_job_finished import FakeMembership, OneRank


def joiner_for(event: pb.WatchEvent, connected: list[str]) -> Joiner:
    def connect(address: str):
        connected.append(address)
        return f"client of {address}"

    return Joiner(types.SimpleNamespace(), job="default", replica_id="r2", structure=0, group=OneRank(),
                  membership=FakeMembership(event), lifecycle=types.SimpleNamespace(drain_requested=False),
                  connect=connect)


def admission(**catch_up) -> pb.WatchEvent:
    return pb.WatchEvent(quorum=pb.Quorum(id=4, member_count=3), place=pb.QuorumPlace(rank=2),
                         catch_up=pb.CatchUp(**catch_up))


def test_admitted_up_to_date_into_members_that_train_on_it_closes_its_gap_from_the_named_member():
    connected: list[str] = []
    joiner = joiner_for(admission(source_replica_id="r0", source_catch_up_addresses=["h0:1"]), connected)
    assert joiner.run(0.05, min_members=3, until_admitted=True) is True
    assert joiner.report is None and connected == []  # no catch-up: it trains its first step itself
    assert joiner.gap_client() == "client of h0:1" and joiner.source == "r0"  # only if the members are ahead


def test_admitted_into_a_first_quorum_it_has_no_source():
    connected: list[str] = []
    joiner = joiner_for(admission(), connected)
    assert joiner.run(0.05, min_members=3, until_admitted=True) is True
    assert joiner.gap_client() is None and connected == []


def test_a_source_for_another_group_size_is_not_taken():
    connected: list[str] = []
    joiner = joiner_for(admission(source_replica_id="r0", source_catch_up_addresses=["h0:1", "h0:2"]), connected)
    assert joiner.run(0.05, min_members=3, until_admitted=True) is True
    assert joiner.gap_client() is None
