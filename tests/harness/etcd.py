"""Coordinators whose state is in etcd: fresh key prefixes, the committed step as
stored, and the log line of the leader election."""

from __future__ import annotations

import re
import uuid

from fthsdp.coordinator.ledger.keys import JobKeys
from fthsdp.coordinator.store import open_store
from fthsdp.protos.v1 import coordinator_pb2 as pb


def fresh_prefix() -> str:
    return f"/fthsdp-test/{uuid.uuid4().hex[:12]}"


HEARTBEAT_TIMEOUT = 3.0


def committed_stored(etcd_url: str, prefix: str) -> int:
    """The job's committed step as stored (it is written about once a second)."""
    store = open_store(etcd_url)
    try:
        item = store.get(JobKeys(prefix, "default").committed)
        return pb.CommittedStep.FromString(item.value).step if item is not None else 0
    finally:
        store.close()


LEADS = re.compile(r"leader election: this coordinator \(\S+\) leads")
