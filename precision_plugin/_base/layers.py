"""The layer table of the package and the import rules it implies, as data and pure functions.

Layers, from the ground up (an import may only point down; see docs/contributing.md):

1. foundations: errors, dtypes, the argument checker (``boundary``), versions, patching and
   the small shared utilities that import only errors and the checker;
2. core: policy, hookspecs, manager, metrics, learner numerics, the one framework spelling table;
3. adapters: learners (transformers, accelerate, deepspeed) and engines (vllm, sglang), which
   import layers 1-2 only and never each other;
4. orchestrators (trl, verl, openrlhf, slime, AReaL), which may import the learners and engines
   they drive, never each other;
5. tools: probe, sanity, doctor, the CLI.

``import_graph`` reads every ``import`` in the source with ``ast`` (imports inside functions and
``TYPE_CHECKING`` blocks included); ``import_cycles`` and ``cross_layer_imports`` are what
tests/unit/test_layers.py and scripts/import_graph.py assert on. Nothing here is imported by the
package at run time.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

PACKAGE = "precision_plugin"

#: The layer of each unit: a top-level module or folder of ``precision_plugin``, one line each.
#: Layers 1 and 2 are two internal folders (``_base``, ``_core``) beside the public face they
#: serve (``errors``; the package ``__init__``, ``policy``, ``hookspecs``); layers 3-5 are the
#: adapters, orchestrators and tools users import by name. A module's unit is its top-level
#: name. The import-linter contract in pyproject.toml and the table in docs/contributing.md are
#: generated from this (``import_linter_layers``, ``layers_table``).
LAYERS: dict[str, int] = {
    # 1: foundations
    "errors": 1,  # public: the exceptions
    "_base": 1,  # the checker, dtype names, versions, patching, user files, provenance
    # 2: core
    "": 2,  # the package __init__: the public API
    "policy": 2,  # public: PrecisionPolicy
    "hookspecs": 2,  # public: the pluggy hook specifications
    "_core": 2,  # the manager, the numerics, scoring, the canary, the HF engine
    # 3: learner and engine adapters
    "transformers": 3,
    "accelerate": 3,
    "deepspeed": 3,
    "vllm": 3,
    "sglang": 3,
    # 4: orchestrators
    "callback": 4,
    "trainer_hooks": 4,
    "audit": 4,
    "trl": 4,
    "verl": 4,
    "openrlhf": 4,
    "slime": 4,
    "areal": 4,
    # 5: tools
    "probe": 5,
    "sanity": 5,
    "doctor": 5,
    "cli": 5,
    "__main__": 5,
}

#: What each layer is, bottom up.
LAYER_NAMES: dict[int, str] = {
    1: "foundations",
    2: "core",
    3: "adapters",
    4: "orchestrators",
    5: "tools",
}

#: Units that must not import each other: the learner and engine adapters, and the
#: orchestrators. (``callback`` and ``audit`` are layer-4 run-level modules the orchestrators
#: share: they read both sides of a run.)
INDEPENDENT: frozenset[str] = frozenset(
    {
        "transformers", "accelerate", "deepspeed", "vllm", "sglang",
        "trl", "verl", "openrlhf", "slime", "areal",
    }
)  # fmt: skip

#: Imports that still break the table, each with what fixing it takes. A ratchet, not an
#: allow-list: the layer test fails when this list is not exactly what the source holds, so it
#: can only shrink. Nothing new may be added.
KNOWN_VIOLATIONS: dict[tuple[str, str], str] = {}

#: The ONE allow-list: (importer, imported) unit pairs an import may join against the table.
#: Each is a lazy re-export (module ``__getattr__``) that keeps an old public path working where
#: the name now lives higher; nothing else belongs here.
ALLOWED: dict[tuple[str, str], str] = {}


@dataclass
class ImportGraph:
    """Modules of the package (dotted names, without the ``precision_plugin.`` prefix; ``""`` is
    the package itself), their files, and for each the modules it imports with the line numbers."""

    paths: dict[str, str] = field(default_factory=dict)
    edges: dict[str, dict[str, int]] = field(default_factory=dict)
    #: The imports made only inside a module-level ``__getattr__`` (lazy re-exports).
    lazy: dict[str, set[str]] = field(default_factory=dict)


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _resolve(name: str, modules: set[str]) -> str | None:
    """The longest known module that ``name`` (relative, dotted) is or lies in."""
    while name not in modules:
        if "." not in name:
            return "" if "" in modules and name == "" else (name if name in modules else None)
        name = name.rsplit(".", 1)[0]
    return name


def import_graph(root: Path) -> ImportGraph:
    """Every import of ``precision_plugin`` modules under ``root`` (the package folder)."""
    graph = ImportGraph()
    files = sorted(root.rglob("*.py"))
    for path in files:
        graph.paths[_module_name(root, path)] = str(path.relative_to(root.parent))
    modules = set(graph.paths)
    for path in files:
        me = _module_name(root, path)
        is_pkg = path.name == "__init__.py"
        targets: dict[str, int] = {}
        tree = ast.parse(path.read_text(), filename=str(path))
        lazy_nodes = {
            id(sub)
            for top in tree.body
            if isinstance(top, ast.FunctionDef) and top.name == "__getattr__"
            for sub in ast.walk(top)
        }
        eager: set[str] = set()
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = me.split(".") if is_pkg else me.split(".")[:-1]
                    base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                    mod = ".".join([PACKAGE, *base, *([node.module] if node.module else [])])
                else:
                    mod = node.module or ""
                names = [f"{mod}.{a.name}" for a in node.names] + [mod]
            for full in names:
                if full != PACKAGE and not full.startswith(PACKAGE + "."):
                    continue
                rel = full[len(PACKAGE) + 1 :] if full != PACKAGE else ""
                target = _resolve(rel, modules)
                if target is None or target == me:
                    continue
                targets.setdefault(target, node.lineno)
                if id(node) not in lazy_nodes:
                    eager.add(target)
        graph.edges[me] = targets
        graph.lazy[me] = set(targets) - eager
    return graph


def unit_of(module: str) -> str:
    """The entry of ``LAYERS`` that ``module`` belongs to: its top-level name (an unplaced
    top-level module is its own, unknown, unit)."""
    return module.split(".", 1)[0]


def layer_of(module: str) -> int:
    """The layer of ``module`` (raises KeyError for a module the table does not place)."""
    unit = unit_of(module)
    if unit not in LAYERS:
        raise KeyError(module)
    return LAYERS[unit]


def _sccs(nodes: list[str], edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, it = work[-1]
            advanced = False
            for nxt in it:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(edges.get(nxt, ())))))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    comp.append(top)
                    if top == node:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return sorted(out)


def _is_ancestor(pkg: str, module: str) -> bool:
    return pkg == "" or module.startswith(pkg + ".")


def _allowed_lazy(graph: ImportGraph, importer: str, imported: str) -> bool:
    """An allow-listed lazy re-export: the pair is in ``ALLOWED`` and the import is made only
    inside the importer's module-level ``__getattr__`` (run on attribute access, after both
    modules are loaded, so it cannot take part in an import-time cycle)."""
    return (unit_of(importer), unit_of(imported)) in ALLOWED and imported in graph.lazy.get(
        importer, ()
    )


def import_cycles(graph: ImportGraph) -> list[list[str]]:
    """Module-level import cycles, imports inside functions included. An import of a package's
    own ``__init__`` by its submodules (or of a submodule by its package) is the package's
    normal shape and not counted, nor is an allow-listed lazy re-export."""
    edges = {
        m: {
            t
            for t in ts
            if not _is_ancestor(t, m) and not _is_ancestor(m, t) and not _allowed_lazy(graph, m, t)
        }
        for m, ts in graph.edges.items()
    }
    return _sccs(sorted(graph.paths), edges)


def package_cycles(graph: ImportGraph) -> list[list[str]]:
    """Cycles between units of the layer table (a subpackage counts as one node)."""
    edges: dict[str, set[str]] = {}
    for m, ts in graph.edges.items():
        a = unit_of(m)
        for t in ts:
            b = unit_of(t)
            if a != b and not _allowed_lazy(graph, m, t) and b != "":
                edges.setdefault(a, set()).add(b)
    return _sccs(sorted({unit_of(m) for m in graph.paths}), edges)


def cross_layer_imports(graph: ImportGraph) -> list[str]:
    """Every import that points up the layer table or across independent adapters, as
    ``"path:line: importer -> imported (layer a -> b)"`` lines; allow-listed pairs excluded."""
    bad = []
    for m, ts in sorted(graph.edges.items()):
        a_unit, a_layer = unit_of(m), layer_of(m)
        for t, line in sorted(ts.items()):
            b_unit, b_layer = unit_of(t), layer_of(t)
            if a_unit == b_unit or _allowed_lazy(graph, m, t):
                continue
            # The package __init__ is the public API: anything may import its names, and it may
            # import the names it re-exports lazily (it imports no adapter at module level).
            if b_unit == "" or a_unit == "":
                continue
            up = b_layer > a_layer
            across = a_unit in INDEPENDENT and b_unit in INDEPENDENT and a_layer == b_layer
            if up or across:
                known = " [known]" if (a_unit, b_unit) in KNOWN_VIOLATIONS else ""
                bad.append(
                    f"{graph.paths[m]}:{line}: {m or PACKAGE} -> {t} "
                    f"(layer {a_layer} -> {b_layer}){known}"
                )
    return bad


def unused_allowances(graph: ImportGraph) -> list[tuple[str, str]]:
    """Allow-list entries no lazy re-export uses any more (the list must not outlive its use)."""
    used = {
        (unit_of(m), unit_of(t))
        for m, ts in graph.edges.items()
        for t in ts
        if _allowed_lazy(graph, m, t)
    }
    return sorted(set(ALLOWED) - used)


def import_linter_contracts() -> list[dict[str, object]]:
    """The import-linter contracts of ``LAYERS`` and ``INDEPENDENT``, as pyproject.toml holds
    them (``[[tool.importlinter.contracts]]``): one layers contract, top layer first (units of
    one layer may import each other unless they are independent), and one independence
    contract each for the adapters (layer 3) and the orchestrators (layer 4)."""
    rows = []
    for layer in sorted(set(LAYERS.values()), reverse=True):
        units = [u for u, n in LAYERS.items() if n == layer and u]
        joint = " | " if all(u in INDEPENDENT for u in units) else " : "
        rows.append(joint.join(units))
    contracts: list[dict[str, object]] = [
        {
            "id": "layers",
            "name": "Layers: an import points down the table",
            "type": "layers",
            "containers": [PACKAGE],
            "layers": rows,
        }
    ]
    independent = (
        (3, "adapters", "Learner and engine adapters never import each other"),
        (4, "orchestrators", "Orchestrators never import each other"),
    )
    for layer, cid, name in independent:
        units = [u for u, n in LAYERS.items() if n == layer and u in INDEPENDENT]
        contracts.append({"id": cid, "name": name, "type": "independence",
                          "modules": [f"{PACKAGE}.{u}" for u in units]})  # fmt: skip
    return contracts


def import_linter_toml() -> str:
    """``import_linter_contracts`` in TOML, as pyproject.toml writes it."""
    out = []
    for contract in import_linter_contracts():
        out.append("[[tool.importlinter.contracts]]")
        for key, value in contract.items():
            if isinstance(value, list):
                out.append(f"{key} = [")
                out.extend(f'    "{item}",' for item in value)
                out.append("]")
            else:
                out.append(f'{key} = "{value}"')
        out.append("")
    return "\n".join(out)


def _summary(path: Path) -> str:
    """The first sentence of a module's (or a folder's ``__init__``'s) docstring."""
    file = path / "__init__.py" if path.is_dir() else path
    doc = ast.get_docstring(ast.parse(file.read_text())) or ""
    first = " ".join(doc.split("\n\n")[0].split())
    return first.split(". ")[0].rstrip(".").replace("|", "\\|")


def layers_table(root: Path) -> str:
    """The layer table as docs/contributing.md shows it: one row per unit, bottom layer first,
    with what the unit holds (its docstring's first sentence) and, for a folder, its modules.
    ``root`` is the package folder."""
    rows = ["| Layer | Unit | What it holds | Modules |", "|---|---|---|---|"]
    for layer in sorted(set(LAYERS.values())):
        for unit, n in LAYERS.items():
            if n != layer:
                continue
            path = root / unit if unit else root
            if not path.is_dir():
                path = path.with_suffix(".py")
            modules = ""
            if path.is_dir() and unit:
                modules = ", ".join(
                    f"`{p.stem if p.is_file() else p.name}`"
                    for p in sorted(path.iterdir())
                    if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()
                )
            name = f"`{unit}`" if unit else "the package `__init__`"
            rows.append(f"| {layer} {LAYER_NAMES[layer]} | {name} | {_summary(path)} | {modules} |")
    return "\n".join(rows)
