"""Reading the job's bearer token (no gRPC here: the agent imports this at start-up).

See coordinator/auth.py for how the coordinator checks it.
"""

from __future__ import annotations

from coordinator.errors import ConfigError


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
