"""The docs list every policy field and every metric alias the code defines."""

from __future__ import annotations

import re
from pathlib import Path

from precision_plugin._core.metrics.consequence import CONSEQUENCE_METRICS
from precision_plugin._core.metrics.mismatch import ALIASES, alias_table, compute_mismatch
from precision_plugin.policy import field_help

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_policy_page_lists_every_field_with_its_default():
    text = (DOCS / "policy.md").read_text()
    for name, default, _ in field_help():
        assert f"| `{name}` | `{default!r}` |" in text, f"docs/policy.md misses {name}"


def test_concepts_page_shows_the_alias_table_as_the_code_has_it():
    """The alias table in docs/concepts.md is alias_table() verbatim (edit ALIASES, then paste)."""
    text = (DOCS / "concepts.md").read_text()
    found = re.search(r"<!-- alias-table:[^>]*-->\n(.*?)<!-- /alias-table -->", text, re.S)
    assert found, "docs/concepts.md lost its alias-table markers"
    assert found.group(1) == alias_table(), (
        "docs/concepts.md's alias table differs from precision_plugin._core.metrics.mismatch.alias_table(); "
        "replace the lines between the alias-table markers with the output of python -c "
        "'from precision_plugin._core.metrics.mismatch import alias_table; print(alias_table(), end=\"\")'"
    )
    for metric, aliases in ALIASES.items():
        for alias in aliases:
            assert f"| `{metric}` | {alias.system} | `{alias.name}` |" in found.group(1)


def test_concepts_page_defines_every_metric():
    text = (DOCS / "concepts.md").read_text()
    defined = {line.split("|")[1].strip() for line in text.splitlines() if line.startswith("| `")}
    scalar = set(compute_mismatch([-0.1], [-0.2]).to_dict()) - {"tokens", "nan_tokens", "sequences"}
    scalar |= set(CONSEQUENCE_METRICS)
    missing = {m for m in scalar if f"`{m}`" not in defined}
    assert not missing, f"docs/concepts.md's metric table misses {sorted(missing)}"


def test_contributing_page_shows_the_layer_table_as_the_tree_has_it():
    """docs/contributing.md's layer table is layers_table() verbatim (edit LAYERS, then paste)."""
    from precision_plugin._base.layers import layers_table

    text = (DOCS / "contributing.md").read_text()
    found = re.search(r"<!-- layers-table:[^>]*-->\n(.*?)\n<!-- /layers-table -->", text, re.S)
    assert found, "docs/contributing.md lost its layers-table markers"
    package = Path(__file__).resolve().parents[2] / "precision_plugin"
    assert found.group(1) == layers_table(package), (
        "docs/contributing.md's layer table differs from the tree; replace the lines between the "
        "layers-table markers with the output of python -c 'from pathlib import Path; from "
        'precision_plugin._base.layers import layers_table; print(layers_table(Path("precision_plugin")))\''
    )
