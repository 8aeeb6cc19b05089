"""Docs that must match the code."""

from __future__ import annotations

from coordinator.reference import README, render


def test_readme_config_reference_is_current():
    text = README.read_text()
    assert render(text) == text, "README's configuration reference is stale: run python -m coordinator.reference"


def test_readme_first_screen_has_the_two_commands():
    first_screen = "\n".join(README.read_text().splitlines()[:20])
    assert "make demo" in first_screen and "make test" in first_screen
