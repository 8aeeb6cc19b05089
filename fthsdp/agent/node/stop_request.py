"""The node agent's stop request: SIGTERM or SIGINT, seen by its supervision loop at once."""

from __future__ import annotations

import logging
import os
import select
import signal

log = logging.getLogger("fthsdp.agent")


class StopRequest:
    """SIGTERM/SIGINT as a flag plus a self-pipe, so that waits wake at once.

    The handler runs on the main thread between bytecodes; setting a
    ``threading.Event`` there could deadlock on the event's own lock, writing
    to a non-blocking pipe cannot.
    """

    def __init__(self) -> None:
        self.signum: int | None = None
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)
        self._previous: dict[int, object] = {}

    def install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread (an embedding caller): no signal handling
                log.debug("not on the main thread: %s is not handled", signal.Signals(sig).name)

    def _handle(self, signum: int, frame) -> None:
        self.signum = signum
        try:
            os.write(self._w, b"\0")
        except BlockingIOError:  # pipe full: a wake-up is pending anyway
            pass

    def request(self, signum: int = signal.SIGTERM) -> None:
        """Ask for a stop from code (tests, embedding callers)."""
        self._handle(signum, None)

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; True (at once) if a stop was requested."""
        if not self.requested and seconds > 0:
            select.select([self._r], [], [], seconds)
        return self.requested

    def close(self) -> None:
        for sig, previous in self._previous.items():
            if previous is not None:  # None: a handler not set from Python, which cannot be put back
                signal.signal(sig, previous)  # type: ignore[arg-type]
        os.close(self._r)
        os.close(self._w)
