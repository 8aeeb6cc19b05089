"""The agent's events to the coordinator: in order, from a background
thread, sent again until taken (``ReportAgentEvent``)."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Sequence

from fthsdp.agent.node.agent_state import AgentState
from fthsdp.core.errors import RequestRejected
from fthsdp.protos.v1 import coordinator_pb2 as pb

log = logging.getLogger("fthsdp.agent")

REPORT_TIMEOUT = 2.0
"""Deadline of one ReportAgentEvent call (the coordinator answers in milliseconds)."""
FLUSH_TIMEOUT = 3.0
"""How long an exiting agent waits for its last reports to go out."""
RETRY_FIRST = 0.2
"""The wait before an event the coordinator did not take is sent again (doubling up to RETRY_CAP)."""
RETRY_CAP = 2.0


class Reporter:
    """Sends agent events to the coordinator in order, from a background thread,
    so that a slow or unreachable coordinator never holds up supervision.

    An event the coordinator did not take is sent again (backing off to
    ``RETRY_CAP``) until it does, and the events after it wait their turn:
    a FAILED lost to a coordinator's restart would leave the survivors to
    find the failure by a heartbeat timeout. Only ``close`` gives up, after
    its flush timeout, and says so."""

    def __init__(self, addresses: Sequence[str], token: str = "", tls=None, timeout: float = REPORT_TIMEOUT) -> None:
        self._addresses = list(addresses)
        self._token = token
        self._tls = tls
        self._timeout = timeout
        self._queue: queue.Queue[pb.AgentEventRequest | None] = queue.Queue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fthsdp-agent-reporter", daemon=True)
        self._thread.start()

    def __call__(self, request: pb.AgentEventRequest) -> None:
        self._queue.put(request)

    def _run(self) -> None:
        from fthsdp.client import CoordinatorClient  # gRPC only where it is used

        client = CoordinatorClient(self._addresses, timeout=self._timeout, token=self._token, tls=self._tls)
        try:
            while (request := self._queue.get()) is not None and self._deliver(client, request):
                pass
        finally:
            client.close()

    def _deliver(self, client, request: pb.AgentEventRequest) -> bool:
        """Send ``request`` until the coordinator takes it; False once ``close`` gave up."""
        state, delay, failing = AgentState(request.state).name, RETRY_FIRST, False
        while True:
            try:
                client.call("ReportAgentEvent", request)
            except RequestRejected as e:
                # Refused (not about this agent's processes, malformed): sending it again changes nothing.
                log.warning("the coordinator refused the report of %s: %s", state, e)
                return True
            except Exception as e:  # noqa: BLE001 - reporting must never end supervision
                # One warning per outage, not one per attempt.
                (log.debug if failing else log.warning)("could not report %s to the coordinator (%s); "
                                                        "sending it again until it answers", state, e)
                failing = True
                if self._stop.wait(delay):
                    return False
                delay = min(delay * 2, RETRY_CAP)
                continue
            if failing:
                log.info("reported %s to the coordinator (%s) after an outage", state, client.current_address())
            return True

    def close(self, timeout: float = FLUSH_TIMEOUT) -> None:
        """Send what is queued, waiting at most ``timeout``; the rest is dropped, with a warning."""
        self._queue.put(None)
        self._thread.join(timeout)
        if self._thread.is_alive():
            self._stop.set()
            log.warning("gave up reporting to the coordinator after %gs: the events not sent yet are dropped",
                        timeout)


__all__ = ["Reporter"]
