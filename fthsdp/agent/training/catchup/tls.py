"""TLS for the catch-up transport, from the same files as the control plane.

A replica that presents a certificate to the coordinator (mutual TLS:
``--tls-cert``/``--tls-key`` with ``--tls-ca``) serves its catch-up HTTP
with that certificate and requires joiners to present one signed by the
same CA; joiners verify the source's certificate against the CA and its
address (so each node's certificate must name the host its replicas
advertise). Without a certificate of its own a replica has nothing to serve
TLS with, and the transport stays plain HTTP guarded by the bearer token.

The cost is the bulk transfer's throughput: benchmarks/catchup.py
``--tls`` measures it against plain HTTP in the same run.
"""

from __future__ import annotations

import ssl

from fthsdp.core.credentials import TlsFiles


def uses_tls(tls: TlsFiles) -> bool:
    return bool(tls.cert and tls.key)


def server_context(tls: TlsFiles) -> ssl.SSLContext | None:
    """The catch-up server's context, or None for plain HTTP."""
    if not uses_tls(tls):
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(tls.cert, tls.key)
    if tls.ca:
        context.load_verify_locations(tls.ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def client_context(tls: TlsFiles) -> ssl.SSLContext | None:
    """A joiner's context (verifies the source, presents this replica's
    certificate), or None for plain HTTP."""
    if not uses_tls(tls):
        return None
    context = ssl.create_default_context(cafile=tls.ca or None)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(tls.cert, tls.key)
    return context
