"""Keep the README's configuration reference in step with the config dataclasses.

``python -m fthsdp.cli.reference`` rewrites every block between
``<!-- config:NAME -->`` and ``<!-- /config:NAME -->`` in README.md;
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

README = Path(__file__).resolve().parents[2] / "README.md"
SECTIONS = {"coordinator": CoordinatorConfig, "agent": AgentConfig}


def render(text: str) -> str:
    """``text`` with every config block regenerated."""
    for name, cls in SECTIONS.items():
        pattern = re.compile(rf"(<!-- config:{name} -->\n).*?(<!-- /config:{name} -->)", re.S)
        if not pattern.search(text):
            raise ValueError(f"README has no <!-- config:{name} --> block")
        table = reference_markdown(cls, name)
        text = pattern.sub(functools.partial(_splice, table), text)
    return text


def _splice(table: str, block: re.Match[str]) -> str:
    """The config block ``block`` with ``table`` between its markers."""
    return block.group(1) + table + block.group(2)


def main() -> int:
    README.write_text(render(README.read_text()))
    print(f"updated {README}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
