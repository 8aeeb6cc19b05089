"""The committed stubs match the .proto files."""

from __future__ import annotations

import filecmp

from fthsdp.protos.generate import ROOT, generate


def test_committed_stubs_are_current(tmp_path):
    written = generate(tmp_path)
    assert written
    for path in written:
        committed = ROOT / path.relative_to(tmp_path)
        assert committed.exists(), f"{committed} is missing: run python -m fthsdp.protos.generate"
        assert filecmp.cmp(path, committed, shallow=False), (
            f"{committed} is stale: run python -m fthsdp.protos.generate")
