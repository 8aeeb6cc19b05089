"""Docs that must match the code."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from fthsdp.cli.reference import REFERENCE, render
from tests.harness.deploy_files import known_variables, subcommand_flags

ROOT = REFERENCE.parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
OPERATIONS = DOCS / "operations.md"
PAGES = (README, *sorted(DOCS.glob("*.md")))
"""The README and every docs page: their links and flags are checked."""
SCRIPTS = (ROOT / "fthsdp" / "examples" / "gpt" / "train.py", ROOT / "examples" / "nanogpt" / "train.py",
           ROOT / "benchmarks" / "goodput_sim.py", ROOT / "benchmarks" / "accuracy.py",
           ROOT / "benchmarks" / "relay_pings.py")
"""Scripts whose own flags the docs may name (`python -m fthsdp.examples.gpt.train --fail-at-step 100`)."""
SUBCOMMAND = re.compile(
    r"\bfthsdp (coordinator|agent|status|drain|cordon|uncordon|give-up-state|reopen-job|demo)\b(.*?)(?:`|$| -- )")
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def test_readme_config_reference_is_current():
    text = REFERENCE.read_text()
    assert render(text) == text, "docs/reference.md's configuration tables are stale: python -m fthsdp.cli.reference"


def test_readme_first_screen_has_the_two_commands():
    first_screen = "\n".join(README.read_text().splitlines()[:20])
    assert "make demo" in first_screen and "make test" in first_screen


def script_flags() -> set[str]:
    """The flags of the example training scripts and the benchmarks the docs run."""
    declared = re.compile(r"add_argument\(\s*\"(--[a-z][a-z0-9-]*)\"")
    return {flag for path in SCRIPTS for flag in declared.findall(path.read_text())}


def flag_problems(text: str, where: str, extra: set[str] | frozenset[str] = frozenset()) -> list[str]:
    """Flags written after `fthsdp SUBCOMMAND` that the subcommand lacks, and
    any other --flag that no subcommand has (nor ``extra``: a script's own)."""
    flags = subcommand_flags()
    every = set().union(*flags.values(), extra)
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


def test_readme_and_docs_name_only_real_flags():
    extra = script_flags()
    assert "--fail-at-step" in extra and "--global-batch" in extra
    problems = [p for page in PAGES for p in flag_problems(page.read_text(), str(page.relative_to(ROOT)), extra)]
    assert problems == []


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


def link_problems(doc: Path) -> list[str]:
    """Links of ``doc`` to a file that does not exist, or to a heading that
    the linked Markdown file lacks."""
    problems = []
    text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)
    for target in re.findall(r"\]\((?!https?:|mailto:)([^)\s]+)\)", text):
        path, _, anchor = target.partition("#")
        linked = (doc.parent / path).resolve() if path else doc
        if not linked.exists():
            problems.append(f"{doc.relative_to(ROOT)} links to {target}, which does not exist")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            problems.append(f"{doc.relative_to(ROOT)} links to {target}: no such heading")
    return problems


def test_links_of_readme_and_docs_lead_somewhere():
    assert len(PAGES) > 5, "the README and the docs pages"
    assert [p for page in PAGES for p in link_problems(page)] == []


def test_links_to_readme_and_docs_from_elsewhere_lead_somewhere():
    """The other Markdown files of the repository that link to the README or a
    docs page (deploy/, benchmarks/, examples/)."""
    others = [path for pattern in ("deploy/**/*.md", "benchmarks/**/*.md", "examples/**/*.md")
              for path in ROOT.glob(pattern)]
    assert others
    assert [p for page in others for p in link_problems(page)] == []


def test_link_check_catches_a_missing_heading(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "a.md").write_text("# Title\n\n[ok](#title) [bad](#nothing) [gone](b.md)\n")
    assert link_problems(tmp_path / "a.md") == ["a.md links to #nothing: no such heading",
                                                "a.md links to b.md, which does not exist"]


def test_readme_has_the_compatibility_block_and_the_loop_early():
    """A reader finds the commands, the compatibility block and how to adapt a
    loop within the first two screens."""
    lines = README.read_text().splitlines()
    first_two_screens = "\n".join(lines[:100])
    assert "## Compatibility" in first_two_screens and "adapt-your-training-loop" in first_two_screens
    assert len(lines) <= 320, f"the README leads; details go to docs/ ({len(lines)} lines)"


def test_docs_index_names_every_page():
    index = (DOCS / "README.md").read_text()
    missing = [p.name for p in DOCS.glob("*.md") if p.name != "README.md" and f"]({p.name})" not in index]
    assert not missing, f"docs/README.md does not list {missing}"
    readme = README.read_text()
    missing = [p.name for p in DOCS.glob("*.md") if f"](docs/{p.name})" not in readme]
    assert not missing, f"the README's read-next list lacks {missing}"
