"""TLS for the catch-up transport: on whenever the control plane uses TLS.

Three modes, from the replica's own TLS files (``mode``):

* **mutual** (the replica has a certificate: ``--tls-cert``/``--tls-key``
  with ``--tls-ca``): each catch-up server serves HTTPS with that
  certificate and requires joiners to present one signed by the same CA;
  joiners verify the source's certificate against the CA and its address
  (so each node's certificate must name the host its replicas advertise).
* **pinned** (server-only TLS: a CA file to trust the coordinator by, no
  certificate of its own): each catch-up server makes an ephemeral
  self-signed certificate at start (``ephemeral_server``) and the replica
  registers its SHA-256 fingerprint beside its catch-up address; the
  coordinator, reached over verified TLS, hands it to the joiner with the
  address (``CatchUp.source_catch_up_fingerprints``), and the joiner pins
  the source's certificate by it (``SourceClient`` checks it after the
  handshake; no CA, no host name: the fingerprint is the whole identity).
* **plain** (no TLS to the coordinator, or ``FTHSDP_CATCH_UP_TLS=0``): plain
  HTTP, for networks the job trusts.

In every mode each request carries a short-lived transfer token
(fthsdp/agent/training/catchup/transfer_token.py), never the job token.
With TLS the torch.distributed push channel stays off: it would send the
state unencrypted.

The cost is the bulk transfer's throughput: benchmarks/catchup.py
``--tls`` measures it against plain HTTP in the same run.
"""

from __future__ import annotations

import enum
import os
import ssl
import tempfile

from fthsdp.core import self_signed
from fthsdp.core.credentials import TlsFiles
from fthsdp.core.self_signed import fingerprint


class Mode(enum.Enum):
    PLAIN = "plain"
    MUTUAL = "mutual"
    PINNED = "pinned"


def mode(tls: TlsFiles) -> Mode:
    """Which catch-up TLS the replica's files give (the module's docstring)."""
    if tls.cert and tls.key:
        return Mode.MUTUAL
    if tls.ca:
        return Mode.PINNED
    return Mode.PLAIN


def uses_tls(tls: TlsFiles) -> bool:
    return mode(tls) is not Mode.PLAIN


def _context_with(cert_pem: bytes, key_pem: bytes) -> ssl.SSLContext:
    """A server context with this certificate and key. ``ssl`` loads them
    from files only: a private folder that lives for the call."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    with tempfile.TemporaryDirectory(prefix="fthsdp-catchup-") as folder:  # mode 0700
        path = os.path.join(folder, "ephemeral.pem")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(key_pem + cert_pem)
        context.load_cert_chain(path)
    return context


def ephemeral_server() -> tuple[ssl.SSLContext, str]:
    """A fresh self-signed certificate (fthsdp/core/self_signed.py) as a server context, and its fingerprint."""
    made = self_signed.make("fthsdp catch-up (ephemeral)")
    return _context_with(made.cert_pem, made.key_pem), made.fingerprint


def server_context(tls: TlsFiles) -> ssl.SSLContext | None:
    """The catch-up server's context with the replica's own certificate
    (mutual TLS), or None (pinned: ``serving``; plain)."""
    if mode(tls) is not Mode.MUTUAL:
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(tls.cert, tls.key)
    if tls.ca:
        context.load_verify_locations(tls.ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def serving(tls: TlsFiles) -> tuple[ssl.SSLContext | None, str]:
    """What a catch-up server serves in the files' mode: its context (None:
    plain HTTP) and the fingerprint to register ('' unless pinned)."""
    if mode(tls) is Mode.PINNED:
        return ephemeral_server()
    return server_context(tls), ""


def client_context(tls: TlsFiles) -> ssl.SSLContext | None:
    """A joiner's context, or None for plain HTTP. Mutual: verifies the
    source against the CA and presents this replica's certificate. Pinned:
    verifies nothing by itself (no CA signed the source's certificate), so a
    ``SourceClient`` with it must be given the fingerprint to pin, and
    refuses to talk without one."""
    which = mode(tls)
    if which is Mode.PLAIN:
        return None
    if which is Mode.PINNED:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    else:
        context = ssl.create_default_context(cafile=tls.ca or None)
        context.load_cert_chain(tls.cert, tls.key)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


__all__ = ["Mode", "client_context", "ephemeral_server", "fingerprint", "mode", "server_context", "serving",
           "uses_tls"]
