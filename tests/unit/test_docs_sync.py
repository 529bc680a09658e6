"""The docs list every policy field and every metric alias the code defines."""

from __future__ import annotations

from pathlib import Path

from precision_plugin.mismatch import ALIASES
from precision_plugin.policy import field_help

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_policy_page_lists_every_field_with_its_default():
    text = (DOCS / "policy.md").read_text()
    for name, default, _ in field_help():
        assert f"| `{name}` | `{default!r}` |" in text, f"docs/policy.md misses {name}"


def test_concepts_page_lists_every_metric_and_alias():
    text = (DOCS / "concepts.md").read_text()
    rows = {
        line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| `")
    }
    for metric, aliases in ALIASES.items():
        row = rows.get(f"`{metric}`", "")
        for system, name in aliases:
            assert system in row and f"`{name}`" in row, f"docs/concepts.md misses {system} {name}"
