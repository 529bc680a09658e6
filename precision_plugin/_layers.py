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

#: Layer of each unit: a top-level module or subpackage of ``precision_plugin`` (or a deeper
#: module where one package spans two layers, e.g. SGLang's slime/AReaL orchestrators).
#: The longest matching name wins.
LAYERS: dict[str, int] = {
    # 1: foundations
    "errors": 1,
    "dtypes": 1,
    "boundary": 1,
    "versions": 1,
    "patching": 1,
    "progress": 1,
    "provenance": 1,
    "report": 1,
    "shield": 1,
    "conflicts": 1,
    "_layers": 1,
    # 2: core
    "": 2,  # the package __init__: the public API
    "__main__": 5,
    "policy": 2,
    "hookspecs": 2,
    "manager": 2,
    "metrics": 2,
    "mismatch": 2,
    "consequence": 2,
    "frameworks": 2,
    "scaler": 2,
    "master_weights": 2,
    "buffers": 2,
    "sampling": 2,
    "rollout": 2,
    "serving": 2,
    "overflow": 2,
    "model_risks": 2,
    "builders": 2,
    "plugin_check": 2,
    "master_copy": 2,
    "train_guard": 2,
    "intervals": 2,
    "misfit": 2,
    "decision": 2,
    "scoring": 2,
    "canary": 2,
    "batch_invariance": 2,
    "config_lookup": 1,
    # the meaning constraints (imports nothing of the package: the checker builds on them),
    # writing outputs, the strict reader of other programs' configs
    "constraints": 1,
    "outputs": 1,
    # the one reader of files a user names (paths, size, UTF-8, YAML budget, depth, cycles)
    "userfiles": 1,
    "configs": 2,
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
    "sglang.slime": 4,
    "sglang.areal": 4,
    # 5: tools
    "probe": 5,
    # The one HF rollout engine: in the probe's package, but imports only layers 1-2 and is
    # driven by TRL's HFRollout (layer 4) too.
    "probe.engine": 2,
    "sanity": 5,
    "doctor": 5,
    "cli": 5,
}

#: Units that must not import each other: the learner and engine adapters, and the
#: orchestrators. (``callback`` and ``audit`` are layer-4 run-level modules the orchestrators
#: share: they read both sides of a run.)
INDEPENDENT: frozenset[str] = frozenset(
    {
        "transformers", "accelerate", "deepspeed", "vllm", "sglang",
        "trl", "verl", "openrlhf", "sglang.slime", "sglang.areal",
    }
)  # fmt: skip

#: Imports that still break the table, each with what fixing it takes. A ratchet, not an
#: allow-list: the layer test fails when this list is not exactly what the source holds, so it
#: can only shrink. Nothing new may be added.
KNOWN_VIOLATIONS: dict[tuple[str, str], str] = {}

#: The ONE allow-list: (importer, imported) unit pairs an import may join against the table.
#: Each is a lazy re-export (module ``__getattr__``) that keeps an old public path working where
#: the name now lives higher; nothing else belongs here.
ALLOWED: dict[tuple[str, str], str] = {
    ("transformers", "callback"): "precision_plugin.transformers.PrecisionCallback/bind_callback "
    "(public path; the callback imports transformers and reads both sides of a run)",
    ("sglang", "sglang.slime"): "precision_plugin.sglang.slime_args/check_slime_args "
    "(public path; slime is an orchestrator)",
    ("sglang", "sglang.areal"): "precision_plugin.sglang.areal_overrides/check_areal_config "
    "(public path; AReaL is an orchestrator)",
}


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
    """The entry of ``LAYERS`` that ``module`` belongs to (the longest matching name)."""
    name = module
    while True:
        if name in LAYERS:
            return name
        if "." not in name:
            # An unplaced top-level module is its own (unknown) unit, never the package's.
            return name
        name = name.rsplit(".", 1)[0]


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
            # A subpackage unit of the same top-level package (sglang.slime in sglang) is part
            # of that package's tree: the module imports its parent's helpers freely.
            if b_unit.split(".")[0] == a_unit.split(".")[0]:
                across = False
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
