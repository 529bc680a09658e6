"""The package's import graph, read from the source (AST), imports inside functions included.

``python scripts/import_graph.py`` prints the module count, the largest module, every import
cycle (strongly connected components of the module graph, and of the top-level package graph) and
every import that breaks the layer table in ``precision_plugin/_base/layers.py``. The layer test
(tests/unit/test_layers.py) runs the same functions.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from precision_plugin._base.layers import (  # noqa: E402
    cross_layer_imports,
    import_cycles,
    import_graph,
    package_cycles,
)


def main() -> int:
    """Print the figures; exit 1 on a cycle or a cross-layer import."""
    graph = import_graph(ROOT / "precision_plugin")
    sizes = {m: len((ROOT / p).read_text().splitlines()) for m, p in graph.paths.items()}
    largest = max(sizes, key=sizes.__getitem__)
    print(f"modules: {len(sizes)}")
    print(f"largest: {largest} ({sizes[largest]} lines)")
    cycles = import_cycles(graph)
    pcycles = package_cycles(graph)
    bad = cross_layer_imports(graph)
    print(f"module cycles: {len(cycles)}")
    for c in cycles:
        print("  " + " <-> ".join(c))
    print(f"package cycles: {len(pcycles)}")
    for c in pcycles:
        print("  " + " <-> ".join(c))
    print(f"cross-layer imports: {len(bad)}")
    for line in bad:
        print("  " + line)
    new = [line for line in bad if not line.endswith("[known]")]
    return 1 if cycles or pcycles or new else 0


if __name__ == "__main__":
    raise SystemExit(main())
