"""Docs that must match the code."""

from __future__ import annotations

import re
from pathlib import Path

from deploy_files import known_variables, subcommand_flags

from fthsdp.cli.reference import README, render

OPERATIONS = README.parent / "docs" / "operations.md"
SUBCOMMAND = re.compile(
    r"\bfthsdp (coordinator|agent|status|drain|cordon|uncordon|give-up-state|reopen-job|demo)\b(.*?)(?:`|$| -- )")
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def test_readme_config_reference_is_current():
    text = README.read_text()
    assert render(text) == text, "README's configuration reference is stale: run python -m fthsdp.cli.reference"


def test_readme_first_screen_has_the_two_commands():
    first_screen = "\n".join(README.read_text().splitlines()[:20])
    assert "make demo" in first_screen and "make test" in first_screen


def flag_problems(text: str, where: str) -> list[str]:
    """Flags written after `fthsdp SUBCOMMAND` that the subcommand lacks, and
    any other --flag that no subcommand has."""
    flags = subcommand_flags()
    every = set().union(*flags.values())
    problems = []
    for number, line in enumerate(text.splitlines(), 1):
        for match in SUBCOMMAND.finditer(line):
            for flag in FLAG.findall(match.group(2)):
                if flag not in flags[match.group(1)]:
                    problems.append(f"{where}:{number}: fthsdp {match.group(1)} has no {flag}")
        problems += [f"{where}:{number}: no fthsdp command has {flag}"
                     for flag in FLAG.findall(line) if flag not in every]
    return problems


def test_operations_guide_names_only_real_flags_and_settings():
    text = OPERATIONS.read_text()
    assert flag_problems(text, "docs/operations.md") == []
    assert len(set(FLAG.findall(text))) >= 10, "the timeouts section names the flags"
    named = set(re.findall(r"\bFTHSDP_[A-Z_]*[A-Z]\b", text))
    assert named, "the guide names the ranks' settings"
    unknown = named - set(known_variables())
    assert not unknown, f"docs/operations.md names {sorted(unknown)}, which are not settings"


def test_flag_check_catches_made_up_flags():
    text = "`fthsdp coordinator --leader-ttl 3s --standby`\nthen `fthsdp agent --standby` and --no-such-flag"
    assert flag_problems(text, "x") == [
        "x:1: fthsdp coordinator has no --standby",
        "x:2: no fthsdp command has --no-such-flag",
    ]


def slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {slug(h) for h in re.findall(r"^#+ (.+)$", text, re.M)}


def test_slug_follows_github():
    assert slug("Goodput at 100,000 GPUs (`goodput_sim.py`)") == "goodput-at-100000-gpus-goodput_simpy"
    assert slug("Catch-up: how a returning replica rejoins") == "catch-up-how-a-returning-replica-rejoins"


def test_links_of_readme_and_operations_guide_lead_somewhere():
    for doc in (README, OPERATIONS):
        text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)
        for target in re.findall(r"\]\((?!https?:)([^)\s]+)\)", text):
            path, _, anchor = target.partition("#")
            linked = (doc.parent / path).resolve() if path else doc
            assert linked.exists(), f"{doc.name} links to {target}, which does not exist"
            if anchor and linked.suffix == ".md":
                assert anchor in anchors(linked), f"{doc.name} links to {target}: no such heading"
