"""Import circles in libreyolo_core (issue #29): only the old type-only one may remain.

The graph is read from the source with ``ast``, not from ``sys.modules``: every import
counts, also those under ``if TYPE_CHECKING:`` and those inside functions, since each is a
dependency a reader must follow. An edge goes from a module to the module it names
(``from a.b import c`` names ``a.b.c`` when that is a module, ``a.b`` otherwise), and to
every package above it that the importer is not inside (importing ``a.b.c`` runs
``a/b/__init__.py``: a package ``__init__`` that imports back is a circle too); a circle is a
strongly connected component of more than one module.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# config -> models.registry -> models.family -> config (the last one under TYPE_CHECKING:
# a family's builders take the TrainConfig they are given); models.registry runs
# models/__init__, which registers the families, whose modules name config the same way
ALLOWED = {frozenset({"libreyolo_core.config", "libreyolo_core.models", "libreyolo_core.models.family",
                      "libreyolo_core.models.registry", "libreyolo_core.models.yolo9.family",
                      "libreyolo_core.models.yolox.family"})}


def _modules(root: Path, package: str) -> dict[str, tuple[Path, bool]]:
    """``{dotted name: (file, is a package)}`` of every module under ``root/package``."""
    mods = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        mods[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)
    return mods


def _named(node: ast.Import | ast.ImportFrom, base: str, mods: dict[str, tuple[Path, bool]]) -> list[str]:
    """The modules an import statement names (``base``: the package relative imports start from)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    src = node.module or ""
    if node.level:
        pkg = base
        for _ in range(node.level - 1):
            pkg = pkg.rpartition(".")[0]
        src = f"{pkg}.{src}" if src else pkg
    return [f"{src}.{a.name}" if f"{src}.{a.name}" in mods else src for a in node.names]


def _packages_run(target: str, importer_pkg: str, mods: dict[str, tuple[Path, bool]]) -> list[str]:
    """The packages above ``target`` whose ``__init__`` importing it runs: all but those
    ``importer_pkg`` (the importer's own package) is inside, which are already running."""
    out = []
    pkg = target.rpartition(".")[0]
    while pkg in mods:
        if importer_pkg != pkg and not importer_pkg.startswith(pkg + "."):
            out.append(pkg)
        pkg = pkg.rpartition(".")[0]
    return out


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """``{module: modules of the package it imports}``, every import statement counted, with
    the package ``__init__`` modules each import runs."""
    mods = _modules(root, package)
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, (path, is_pkg) in mods.items():
        base = name if is_pkg else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            for target in _named(node, base, mods):
                while target and target not in mods:  # a name inside a module: the module
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
                    graph[name].update(p for p in _packages_run(target, base, mods) if p != name)
    return graph


def circles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: set[frozenset[str]] = set()
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    w = stack.pop()
                    comp.add(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.add(frozenset(comp))
    return found


def test_only_the_type_only_circle_remains():
    found = circles(import_graph(ROOT, "libreyolo_core"))
    assert found == ALLOWED, "import circles in libreyolo_core:\n" + "\n".join(
        " <-> ".join(sorted(c)) for c in sorted(found, key=sorted))


def test_the_checker_sees_type_only_and_function_level_imports(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from pkg.sub.b import B\n")
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                              "    from pkg.sub import b\n")
    (pkg / "sub" / "b.py").write_text("class B:\n    def f(self):\n        from ..c import C\n")
    (pkg / "c.py").write_text("import pkg.a\n")
    (pkg / "d.py").write_text("from pkg import a\n")  # into the circle, not part of it
    graph = import_graph(tmp_path, "pkg")
    assert graph["pkg.a"] == {"pkg.sub.b", "pkg.sub"} and graph["pkg.sub.b"] == {"pkg.c"}
    assert graph["pkg.sub"] == {"pkg.sub.b"}
    # pkg.sub: importing pkg.sub.b runs its __init__
    assert circles(graph) == {frozenset({"pkg.a", "pkg.sub", "pkg.sub.b", "pkg.c"})}


def test_the_checker_sees_a_package_init_that_imports_back(tmp_path):
    """``pkg.e`` imports only ``pkg.hooks.base``, but that runs ``pkg/hooks/__init__.py``,
    which imports ``pkg.policy``, which imports ``pkg.e`` (the old hooks/policy circle)."""
    pkg = tmp_path / "pkg"
    (pkg / "hooks").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "hooks" / "__init__.py").write_text("from pkg.hooks.base import H\nfrom pkg.policy import p\n")
    (pkg / "hooks" / "base.py").write_text("class H:\n    pass\n")
    (pkg / "policy.py").write_text("def p():\n    from pkg.e import E\n")
    (pkg / "e.py").write_text("from pkg.hooks.base import H\nclass E(H):\n    pass\n")
    graph = import_graph(tmp_path, "pkg")
    assert graph["pkg.e"] == {"pkg.hooks.base", "pkg.hooks"}
    assert graph["pkg.hooks"] == {"pkg.hooks.base", "pkg.policy"}  # its own package: not again
    assert circles(graph) == {frozenset({"pkg.hooks", "pkg.policy", "pkg.e"})}
