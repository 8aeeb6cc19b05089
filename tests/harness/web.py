"""The coordinator's web page and JSON API from outside: HTTP calls, what a
status says, and the page as headless Chromium renders it."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from fthsdp.coordinator.serving.http_server import serve_http
from tests.harness.processes import CoordinatorProcess

FAST = ("--metrics-port", "0", "--heartbeat-interval", "100ms", "--heartbeat-timeout", "1s")


def http(url: str, method: str = "GET", token: str | None = None, auth: str | None = None) -> tuple[int, dict, bytes]:
    """(status, headers, body); errors are answers too."""
    headers = {"Authorization": auth or f"Bearer {token}"} if (token or auth) else {}
    request = urllib.request.Request(url, method=method, headers=headers, data=b"" if method == "POST" else None)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def status(base: str, job: str = "") -> dict:
    code, _, body = http(base + "api/status" + (f"?job={job}" if job else ""))
    assert code == 200, body
    return json.loads(body)


def drain(base: str, replica: str, **auth) -> tuple[int, dict]:
    code, _, body = http(f"{base}api/replicas/{replica}/drain", "POST", **auth)
    return code, json.loads(body)


def page_url(c: CoordinatorProcess) -> str:
    url = c.metrics_url.removesuffix("metrics")
    assert url.endswith("/"), c.metrics_url
    return url


def members(s: dict) -> list[str]:
    return sorted(s["quorum"]["members"])


def states(s: dict) -> dict[str, str]:
    return {r["id"]: r["state"] for r in s["replicas"]}


def steps(s: dict) -> dict[str, int]:
    return {r["id"]: r["step"] for r in s["replicas"]}


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    message = "no chromium on PATH: `make etcd` installs Debian's chromium (apt-get install chromium)"
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


def run_chromium(binary: str, profile: Path, *args: str) -> subprocess.CompletedProcess:
    # A first start unpacks and initialises a profile: slow on a loaded machine.
    argv = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
            f"--user-data-dir={profile}", "--virtual-time-budget=5000", *args]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, f"chromium failed ({result.returncode}):\n{result.stderr[-3000:]}"
    return result


def dump_dom(handle, profile: Path) -> str:
    """The page that ``handle`` (a WebApp's, or one around it) serves on a
    port of its own, as Chromium dumps its DOM. Chromium runs in a thread:
    the server answers it meanwhile, on this loop."""
    binary = chromium()

    async def render() -> str:
        server = await serve_http(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            return (await asyncio.to_thread(run_chromium, binary, profile, "--dump-dom",
                                            f"http://127.0.0.1:{port}/")).stdout
        finally:
            server.close()
            await server.wait_closed()

    return asyncio.run(render())
