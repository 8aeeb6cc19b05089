"""Test certificates made with the openssl command line (Debian's openssl):
a CA, a server certificate for 127.0.0.1, and client certificates that are
valid, expired, or signed by another CA."""

from __future__ import annotations

import subprocess
from pathlib import Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _key_and_csr(name: str, subject: str, cwd: Path) -> None:
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", f"{name}.key",
             "-out", f"{name}.csr", "-subj", subject, cwd=cwd)


def _ca(name: str, cwd: Path) -> None:
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout",
             f"{name}.key", "-out", f"{name}.pem", "-days", "2", "-subj", f"/CN={name}", cwd=cwd)


def _sign(name: str, ca: str, days: int, cwd: Path, ext: str = "") -> None:
    args = ["x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key", "-CAcreateserial",
            "-out", f"{name}.pem", "-days", str(days)]
    if ext:
        (cwd / f"{name}.ext").write_text(ext)
        args += ["-extfile", f"{name}.ext"]
    _openssl(*args, cwd=cwd)


def make_certificates(folder: Path) -> Path:
    """Writes ca.pem, server.{pem,key}, client.{pem,key}, expired.{pem,key},
    stranger.{pem,key} (signed by other-ca) and node.{pem,key} (a client
    certificate that also names 127.0.0.1) into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    _ca("ca", folder)
    _ca("other-ca", folder)
    _key_and_csr("server", "/CN=coordinator", folder)
    _sign("server", "ca", 2, folder, "subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name, ca, days in (("client", "ca", 2), ("expired", "ca", -1), ("stranger", "other-ca", 2)):
        _key_and_csr(name, f"/CN={name}", folder)
        _sign(name, ca, days, folder)
    # A node's certificate: its replicas present it to the coordinator and
    # serve catch-up with it, so it names the host they advertise.
    _key_and_csr("node", "/CN=node", folder)
    _sign("node", "ca", 2, folder, "subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    return folder
