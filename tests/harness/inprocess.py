"""A real coordinator server in this process, on an event loop of its own
thread, and the tokens the auth tests configure it with."""

from __future__ import annotations

import asyncio
import threading

from fthsdp.coordinator.config import CoordinatorConfig
from fthsdp.coordinator.server import start_coordinator

JOB_TOKEN = "job-token-0123456789"


ADMIN_TOKEN = "admin-token-9876543210"


class InProcessCoordinator:
    """``start_coordinator`` on a loop of its own thread, so that the
    blocking client and the CLI can call it from the test's thread."""

    def __init__(self, config: CoordinatorConfig) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="test-coordinator", daemon=True)
        self._thread.start()
        self.running = asyncio.run_coroutine_threadsafe(start_coordinator(config), self._loop).result(30)
        self.address = f"127.0.0.1:{self.running.port}"

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.running.stop(grace=0.1), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
