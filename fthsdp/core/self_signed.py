"""Ephemeral self-signed certificates, trusted by pin rather than by a CA.

A process that serves its peers under TLS without a certificate of its own
(an agent has a client certificate at most: deploy/make-certs.sh) makes one
at start and hands it, or its fingerprint, to its peers through the
coordinator, which they reach over verified TLS: the pin is the whole
identity, so the certificate needs no CA and names no real host. Used by the
catch-up servers (fthsdp/agent/training/catchup/tls.py, pinned by
fingerprint) and the relays' tree (fthsdp/agent/node/relay/tree.py, pinned
by gRPC as the only root, under one fixed name).
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib


@dataclasses.dataclass(frozen=True)
class SelfSigned:
    cert_pem: bytes
    key_pem: bytes
    fingerprint: str
    """The certificate's SHA-256 fingerprint (lower-case hex of its DER bytes)."""


def fingerprint(der: bytes) -> str:
    """A certificate's SHA-256 fingerprint (lower-case hex of its DER bytes)."""
    return hashlib.sha256(der).hexdigest()


def make(common_name: str, dns_name: str = "") -> SelfSigned:
    """A fresh P-256 key and a certificate for it, signed by itself, naming
    ``dns_name`` (if given) as its subject's alternative name. Its validity
    is not what makes it trusted (the pin is), so it is long enough to
    outlive any process that made it."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(days=1))
               .not_valid_after(now + datetime.timedelta(days=3650)))
    if dns_name:
        builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName(dns_name)]), critical=False)
    cert = builder.sign(key, hashes.SHA256())
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return SelfSigned(cert.public_bytes(serialization.Encoding.PEM), key_pem,
                      fingerprint(cert.public_bytes(serialization.Encoding.DER)))


__all__ = ["SelfSigned", "fingerprint", "make"]
