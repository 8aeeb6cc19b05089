"""The job's credentials: its bearer token and TLS files (no gRPC here: the agent imports this at start-up).

See fthsdp/core/auth.py for how the coordinator checks it.
"""

from __future__ import annotations

import dataclasses

from fthsdp.core.errors import ConfigError


def read_token_file(path: str, what: str = "--token-file") -> str:
    """The token in ``path`` (surrounding whitespace stripped); '' for no path."""
    if not path:
        return ""
    try:
        with open(path, encoding="utf-8") as f:
            token = f.read().strip()
    except OSError as e:
        raise ConfigError(f"{what}: cannot read {path}: {e.strerror or e}") from e
    except UnicodeDecodeError as e:
        raise ConfigError(f"{what}: {path} is not UTF-8 text") from e
    if not token:
        raise ConfigError(f"{what}: {path} is empty")
    if any(c.isspace() for c in token) or not token.isprintable():
        raise ConfigError(f"{what}: the token in {path} must be one line of printable characters without spaces")
    return token


def bearer_metadata(token: str) -> tuple[tuple[str, str], ...]:
    """The call metadata that presents ``token`` (none for an empty token)."""
    return (("authorization", f"Bearer {token}"),) if token else ()


@dataclasses.dataclass(frozen=True)
class TlsFiles:
    """PEM files of one side of a TLS connection to or from the coordinator.

    A server uses ``cert`` and ``key`` as its identity and, with ``ca``,
    requires clients to present a certificate signed by it (mutual TLS). A
    client trusts ``ca`` (the system roots when empty) and, with ``cert`` and
    ``key``, presents that identity to a server that asks for one.
    """

    ca: str = ""
    cert: str = ""
    key: str = ""

    @property
    def enabled(self) -> bool:
        return bool(self.ca or self.cert)

    def check(self, flag: str = "--tls") -> None:
        """Clear errors for a half-given pair and for files that cannot be read."""
        if bool(self.cert) != bool(self.key):
            raise ConfigError(f"{flag}-cert and {flag}-key go together: give both or neither")
        for name in ("ca", "cert", "key"):
            self.read(name, flag)

    def read(self, name: str, flag: str = "--tls") -> bytes | None:
        path = getattr(self, name)
        if not path:
            return None
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as e:
            raise ConfigError(f"{flag}-{name}: cannot read {path}: {e.strerror or e}") from e
        if b"-----BEGIN" not in data:
            raise ConfigError(f"{flag}-{name}: {path} is not a PEM file")
        return data
