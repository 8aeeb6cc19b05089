"""A rank's pings to its node agent's relay alone: it is alive, every second.

Under ``fthsdp agent`` a rank reaches the coordinator through its agent's
relay, on a Unix socket (fthsdp/agent/node/relay/). Its pings to the
coordinator come at the coordinator's pace, which stretches with the job's
size; these come every ``LOCAL_PING_EVERY`` seconds on a stream of their
own, are marked ``local_only`` and go no further than the relay, which
calls a rank that stops sending them stopped or hung
(fthsdp/agent/node/relay/liveness.py). Started only when the client's
address is a relay: run standalone, a script sends none.
"""

from __future__ import annotations

import logging
import threading

from fthsdp.agent.training.session.heartbeat import HeartbeatSender
from fthsdp.agent.training.session.pushes import start_thread
from fthsdp.client import CoordinatorClient
from fthsdp.core.errors import CoordinatorUnavailable, RequestRejected
from fthsdp.core.relay_address import LOCAL_PING_EVERY, through_relay
from fthsdp.protos.v1 import coordinator_pb2 as pb

log = logging.getLogger("fthsdp.agent.membership")


class LocalPings:
    """``start()`` (does nothing unless ``client`` speaks to a relay), ``close()``."""

    def __init__(self, client: CoordinatorClient, job: str, replica_id: str, shard_rank: int,
                 incarnation: str) -> None:
        self._ping = pb.HeartbeatRequest(job=job, replica_id=replica_id, shard_rank=shard_rank,
                                         incarnation=incarnation, local_only=True)
        self._client = client
        self._beats: HeartbeatSender | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if through_relay(self._client.addresses):
            self._beats = HeartbeatSender(self._client)
            self._thread = start_thread(self._loop, f"fthsdp-local-ping-{self._ping.shard_rank}")

    def _loop(self) -> None:
        assert self._beats is not None  # start() made it
        while True:
            try:
                self._beats.send(self._ping)
            except (RequestRejected, CoordinatorUnavailable) as e:  # the relay is going away with its agent
                log.debug("rank %d local ping: %s", self._ping.shard_rank, e)
            if self._stop.wait(LOCAL_PING_EVERY):
                return

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._beats is not None:
            self._beats.close()
