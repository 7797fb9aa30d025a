"""The package's import structure, read from the source (ast; no module is imported).

Data flows one way: ``cli`` -> ``engine`` -> ``model`` -> (``dist``) -> ``kernels``. Every import
counts, the ones inside functions too (a function-local import is a dependency that is only paid later).
"""

from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "tritree"
AOT = "tritree.kernels.aot"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@lru_cache(maxsize=None)
def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _imports_of(name: str, path: Path) -> set[str]:
    """The tritree modules ``name`` imports anywhere in its file. ``from P import n`` counts as
    ``P.n`` when that is a module, else as ``P`` (the package whose ``__init__`` defines ``n``)."""
    mods = _modules()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.split(".")[0] == "tritree")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                src = ".".join(base + ([node.module] if node.module else []))
            else:
                src = node.module or ""
            if src.split(".")[0] != "tritree":
                continue
            for a in node.names:
                sub = f"{src}.{a.name}"
                out.add(sub if sub in mods else src)
    out.discard(name)
    return out


@lru_cache(maxsize=None)
def _graph() -> dict[str, frozenset[str]]:
    return {m: frozenset(_imports_of(m, p)) for m, p in _modules().items()}


def _within(mod: str, *prefixes: str) -> bool:
    return any(mod == p or mod.startswith(p + ".") for p in prefixes)


def _violations(importers, allowed) -> list[str]:
    """``importer -> imported`` for every import of a module in ``importers`` that ``allowed`` refuses."""
    return sorted(f"{m} -> {d}" for m, deps in _graph().items() if importers(m) for d in deps if not allowed(d))


def _cycles(graph: dict[str, frozenset[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, comps = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return comps


def test_the_parser_sees_the_package():
    g = _graph()
    assert {"tritree", "tritree.kernels", "tritree.kernels.tree", "tritree.model.layers", "tritree.engine",
            "tritree.cli", "tritree.dist"} <= set(g)
    assert "tritree.kernels.tree" in g["tritree.kernels"]  # module level, relative
    assert "tritree.engine" in g["tritree.bench_accept"]  # function-local
    assert "tritree.kernels" in g["tritree.engine"]  # ``from .kernels import <function>``


def test_no_import_cycle():
    """No cycle among tritree modules."""
    assert _cycles(_graph()) == []


def test_kernels_import_only_kernels():
    assert _violations(lambda m: _within(m, "tritree.kernels"), lambda d: _within(d, "tritree.kernels")) == []


def test_model_imports_only_kernels_model_and_dist():
    """The model's layers take a :class:`tritree.dist.TPGroup` and call its collectives (all-reduce after
    ``o_proj`` and the MLPs, the vocabulary-parallel embedding and head): ``tritree.dist`` is the one
    module outside kernels/model it may import."""
    assert _violations(lambda m: _within(m, "tritree.model"),
                       lambda d: _within(d, "tritree.kernels", "tritree.model", "tritree.dist")) == []


def test_dist_imports_only_kernels():
    """In particular not the engine: the engine registers its teardown with dist instead."""
    assert _violations(lambda m: m == "tritree.dist", lambda d: _within(d, "tritree.kernels")) == []


def test_engine_does_not_import_the_entry_points():
    upper = ("tritree.cli", "tritree.__main__", "tritree.bench_accept", "tritree.bench_decode", "tritree.train")
    assert _violations(lambda m: m == "tritree.engine", lambda d: d not in upper) == []


def test_cli_and_bench_accept_do_not_import_each_other():
    """The command line dispatches to ``bench_accept`` (one way); nothing but ``__main__`` imports the
    command line."""
    assert "tritree.cli" not in _graph()["tritree.bench_accept"]
    assert _violations(lambda m: m != "tritree.__main__", lambda d: d != "tritree.cli") == []


def test_kernels_do_not_import_aot():
    """``aot`` (the ahead-of-time compile report) sits above the kernels it compiles."""
    assert _violations(lambda m: _within(m, "tritree.kernels") and m != AOT, lambda d: d != AOT) == []


def _gluon_modules() -> set[str]:
    return {m for m in _modules() if m.rpartition(".")[2].startswith("_gluon") or _within(m, "tritree.kernels.verify")}


def test_gluon_kernels_do_not_import_aot():
    """The verify family (``kernels.verify``: its Gluon kernels and their launcher) and ``_gluon_common`` in
    particular: ``aot`` compiles them, they do not import it."""
    gluon = _gluon_modules()
    assert {"tritree.kernels.verify.gluon_launch", "tritree.kernels.verify.gluon_ws",
            "tritree.kernels._gluon_common"} <= gluon
    assert _violations(lambda m: m in gluon, lambda d: d != AOT) == []


def test_engine_registers_its_teardown_with_dist():
    """``dist.shutdown_tp`` frees every engine's graphs before destroying the group, through the hook the
    engine registers (dist does not import the engine)."""
    from tritree import dist, engine

    assert engine.close_all_engines in dist._TEARDOWN_HOOKS


def test_cited_docs_are_in_the_repository():
    """Every ``docs/*.md`` the code cites exists; the specification is cited by its path in the repository."""
    import re

    repo = ROOT.parent
    sources = [*ROOT.rglob("*.py"), *(repo / "bench").glob("*.py")]
    cited = {m for p in sources for m in re.findall(r"docs/[\w./-]+\.md", p.read_text())}
    assert "docs/SPEC.md" in cited
    assert [c for c in sorted(cited) if not (repo / c).is_file()] == []
    bare = [f"{p.relative_to(repo)}:{i}" for p in sources for i, line in enumerate(p.read_text().splitlines(), 1)
            if re.search(r"(?<![\w/])SPEC\.md", line)]
    assert bare == []
