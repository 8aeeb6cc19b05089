"""The one check of a checkpoint folder, shared by the node agent and its ranks."""

from __future__ import annotations

import os
import tempfile

from fthsdp.core.errors import ConfigError


def check_checkpoint_dir(path: str, setting: str) -> None:
    """A folder this process can create files in (made if missing), else one ConfigError line."""
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".fthsdp-write-test-"):
            pass
    except OSError as e:
        raise ConfigError(f"{setting} {path}: cannot write there ({e.strerror or e})") from e
