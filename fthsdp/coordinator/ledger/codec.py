"""Conversions between the domain dataclasses and their protobuf messages.

Protobuf is both the wire format and the storage format (never pickle): the
same ``Quorum`` message is pushed to replicas and written to etcd.
"""

from __future__ import annotations

from typing import overload

from fthsdp.coordinator.decisions.quorum_types import Member, Quorum
from fthsdp.protos.v1 import coordinator_pb2 as pb


@overload
def quorum_to_pb(q: Quorum) -> pb.Quorum: ...
@overload
def quorum_to_pb(q: None) -> None: ...
@overload
def quorum_to_pb(q: Quorum | None) -> pb.Quorum | None: ...
def quorum_to_pb(q: Quorum | None) -> pb.Quorum | None:
    if q is None:
        return None
    return pb.Quorum(
        id=q.id,
        members=[
            pb.QuorumMember(
                replica_id=m.replica_id,
                address=m.address,
                world_size=m.world_size,
                step=m.step,
                joined_quorum_id=m.joined_quorum_id,
            )
            for m in q.members
        ],
        step=q.step,
        created_unix_ms=q.created_unix_ms,
        reason=q.reason,
        epoch=q.epoch,
        member_count=len(q.members),
        first_member_address=q.members[0].address if q.members else "",
        last_drop_id=q.last_drop_id,
        generation=q.generation,
    )


def quorum_from_pb(msg: pb.Quorum) -> Quorum:
    return Quorum(
        id=msg.id,
        members=tuple(
            Member(m.replica_id, m.address, m.world_size, m.step, m.joined_quorum_id) for m in msg.members
        ),
        step=msg.step,
        created_unix_ms=msg.created_unix_ms,
        reason=msg.reason,
        epoch=msg.epoch,
        last_drop_id=msg.last_drop_id,
        generation=msg.generation,
    )


def decode(message_type, data: bytes, what: str):
    """Parse stored bytes; a corrupt record is a StoreError, not a crash."""
    from google.protobuf.message import DecodeError

    from fthsdp.core.errors import StoreError

    msg = message_type()
    try:
        msg.ParseFromString(data)
    except DecodeError as e:
        raise StoreError(f"corrupt {what} in the store: {e}") from e
    return msg
