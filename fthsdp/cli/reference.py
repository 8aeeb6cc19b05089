"""Keep the configuration reference (docs/reference.md) in step with the config dataclasses.

``python -m fthsdp.cli.reference`` rewrites every block between
``<!-- config:NAME -->`` and ``<!-- /config:NAME -->`` in docs/reference.md;
tests/test_docs.py fails when a block is stale.
"""

from __future__ import annotations

import functools
import re
import sys
from pathlib import Path

from fthsdp.agent.node.config import AgentConfig
from fthsdp.coordinator.config import CoordinatorConfig
from fthsdp.core.settings import reference_markdown

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "reference.md"
"""The page that holds the generated tables."""
SECTIONS = {"coordinator": CoordinatorConfig, "agent": AgentConfig}


def render(text: str) -> str:
    """``text`` with every config block regenerated."""
    for name, cls in SECTIONS.items():
        pattern = re.compile(rf"(<!-- config:{name} -->\n).*?(<!-- /config:{name} -->)", re.S)
        if not pattern.search(text):
            raise ValueError(f"{REFERENCE.name} has no <!-- config:{name} --> block")
        table = reference_markdown(cls, name)
        text = pattern.sub(functools.partial(_splice, table), text)
    return text


def _splice(table: str, block: re.Match[str]) -> str:
    """The config block ``block`` with ``table`` between its markers."""
    return block.group(1) + table + block.group(2)


def main() -> int:
    REFERENCE.write_text(render(REFERENCE.read_text()))
    print(f"updated {REFERENCE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
