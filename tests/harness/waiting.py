"""Waiting for a condition in tests, instead of sleeping and hoping."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(
    predicate: Callable[[], object],
    timeout: float,
    interval: float = 0.02,
    message: str = "",
) -> None:
    """Poll ``predicate`` until it returns something truthy.

    Raises AssertionError with ``message`` (and the last exception the
    predicate raised, if any) when ``timeout`` seconds pass first. Exceptions
    from the predicate count as "not yet", so it may probe a service that is
    still starting.
    """
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while True:
        try:
            if predicate():
                return
            last_exc = None
        except Exception as e:  # noqa: BLE001 - "not yet"; reported on timeout
            last_exc = e
        if time.monotonic() >= deadline:
            detail = f" (last error: {last_exc!r})" if last_exc is not None else ""
            raise AssertionError(
                f"{message or 'condition not met'} within {timeout:g}s{detail}"
            ) from last_exc
        time.sleep(interval)
