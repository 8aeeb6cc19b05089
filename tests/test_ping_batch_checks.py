"""The checks of a ping batch (fthsdp/coordinator/validation.py), table-driven:
a batch's own fields (the hosts it speaks for), and a batched rank's ping,
of which only what the coordinator reads is checked, its replica id once
per batch."""

from __future__ import annotations

import pytest

from fthsdp.agent.node.relay.tree import Route
from fthsdp.coordinator import validation
from fthsdp.core.errors import InvalidRequest
from fthsdp.protos.v1 import coordinator_pb2 as pb


def rank_ping(**fields) -> pb.HeartbeatRequest:
    base = dict(job="default", replica_id="r0", shard_rank=3, step=7, incarnation="inc-1")
    return pb.HeartbeatRequest(**{**base, **fields})


@pytest.mark.parametrize(("fields", "refused"), [
    pytest.param({}, "", id="a rank's ping"),
    pytest.param({"checksum_step": -1, "state_checksum": "x" * 10_000}, "",
                 id="rank-0 fields are never read: not checked"),
    pytest.param({"shard_rank": 0}, "shard_rank", id="rank 0 heartbeats with its session"),
    pytest.param({"shard_rank": 1 << 20}, "shard_rank", id="past any world size"),
    pytest.param({"replica_id": "bad id!"}, "replica_id", id="a malformed replica id"),
    pytest.param({"step": -1}, "step", id="a negative step"),
    pytest.param({"local_only": True}, "local_only", id="for the relay alone"),
    pytest.param({"ack": True}, "ack", id="asks for an answer"),
])
def test_a_batched_rank_ping_is_checked_for_what_is_read_of_it(fields, refused):
    if not refused:
        validation.check_rank_ping(rank_ping(**fields), set())
        return
    with pytest.raises(InvalidRequest, match=refused):
        validation.check_rank_ping(rank_ping(**fields), set())


def test_a_replica_id_is_checked_once_per_batch():
    checked: set[str] = set()
    validation.check_rank_ping(rank_ping(), checked)
    assert checked == {"r0"}
    with pytest.raises(InvalidRequest):
        validation.check_rank_ping(rank_ping(replica_id="bad id!"), checked)
    assert checked == {"r0"}


@pytest.mark.parametrize(("batch", "refused"), [
    pytest.param(pb.PingBatch(job="default", hosts=["h-a", "h-b"]), "", id="a group's host 0 for two hosts"),
    pytest.param(pb.PingBatch(), "", id="no hosts: the ranks' pings alone"),
    pytest.param(pb.PingBatch(job="default", hosts=["bad host!"]), "hosts entry", id="a malformed host id"),
    pytest.param(pb.PingBatch(job="bad job!"), "job", id="a malformed job"),
    pytest.param(pb.PingBatch(job="default", hosts=[f"h{k}" for k in range(100_000)]), "at most",
                 id="more hosts than a group has"),
])
def test_a_batchs_own_fields(batch, refused):
    if not refused:
        validation.check_ping_batch(batch)
        return
    with pytest.raises(InvalidRequest, match=refused):
        validation.check_ping_batch(batch)


CERT = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


@pytest.mark.parametrize(("join", "refused"), [
    pytest.param(pb.HostJoin(round=1, store="10.0.0.1:5"), "", id="no relay"),
    pytest.param(pb.HostJoin(round=1, store="10.0.0.1:5", pings="10.0.0.1:6"), "", id="a plain relay"),
    pytest.param(pb.HostJoin(round=1, store="10.0.0.1:5", pings="10.0.0.1:6", pings_cert=CERT), "",
                 id="a relay under TLS"),
    pytest.param(pb.HostJoin(round=1, store="10.0.0.1:5", pings_cert=CERT), "without join.pings",
                 id="a certificate without its address"),
    pytest.param(pb.HostJoin(round=1, store="10.0.0.1:5", pings="10.0.0.1:6", pings_cert=b"x" * 100),
                 "not a PEM certificate", id="not a certificate"),
    pytest.param(pb.HostJoin(round=1, store="10.0.0.1:5", pings="10.0.0.1:6", pings_cert=CERT + b"x" * 5000),
                 "more than 4096", id="too long"),
])
def test_a_joins_relay_certificate_is_checked(join, refused):
    """What a host's join says of its relay (fthsdp/agent/node/relay/tree.py): the coordinator passes the
    certificate on to every other host of the round, so it is checked before it is kept."""
    request = pb.HostRequest(join=join)
    if not refused:
        validation.check_host_request(request)
        return
    with pytest.raises(InvalidRequest, match=refused):
        validation.check_host_request(request)


def test_under_tls_a_host_sends_nothing_to_a_host_0_without_a_certificate():
    secure = Route(secure=True)
    secure.to("10.0.0.1:6", "h0")  # host 0 serves plain gRPC (an older agent): the token would go in the clear
    assert secure.target(0.0) == ""
    secure.to("10.0.0.1:6", "h0", CERT)
    assert secure.target(0.0) == "10.0.0.1:6" and secure.cert == CERT
    plain = Route()
    plain.to("10.0.0.1:6", "h0")
    assert plain.target(0.0) == "10.0.0.1:6"
