"""The layers stay layered: engine/ never imports app/, and no two modules import each other
(directly or round a longer loop), counting imports inside functions and those under
``if TYPE_CHECKING:`` too (a type-only loop is still a loop a reader must untangle).
Only the command line imports the App; widgets never import screens."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("engine", "app")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    return _imports_of(path.read_text(encoding="utf-8"), _module_name(path), path.name == "__init__.py", modules)


def _imports_of(source: str, me: str, is_package: bool, modules: set[str]) -> set[str]:
    """The modules of ``modules`` that module ``me`` (of text ``source``) imports."""
    tree = ast.parse(source)
    package = me if is_package else me.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != me:
                found.add(name)
    return found


def graph() -> dict[str, set[str]]:
    files = [p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")]
    modules = {_module_name(p) for p in files}
    return {_module_name(p): _imports(p, modules) for p in files}


def _is_package_of(a: str, b: str) -> bool:
    return b.startswith(a + ".")


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in g[v]:
            if _is_package_of(v, w):  # a package's __init__ re-exporting its own modules is not a loop
                continue
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
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def test_engine_never_imports_app() -> None:
    bad = {m: sorted(i for i in deps if i.split(".")[0] == "app") for m, deps in graph().items() if m.startswith("engine")}
    assert not {m: d for m, d in bad.items() if d}


def test_no_import_cycles() -> None:
    assert cycles(graph()) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_import_reader_counts_type_only_imports() -> None:
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .api import ChatBackend\n"
    assert _imports_of(source, "engine.probe", False, {"engine.api"}) == {"engine.api"}


def test_only_the_command_line_imports_the_app() -> None:
    assert sorted(m for m, deps in graph().items() if "app.ui.app" in deps) == ["app.cli"]


def test_widgets_never_import_screens() -> None:
    g = graph()
    bad = {m: sorted(d for d in deps if d.startswith("app.ui.screens")) for m, deps in g.items()
           if m.startswith("app.ui.widgets")}
    assert not {m: d for m, d in bad.items() if d}


ENGINE_ROOMS = ("config", "fetch", "quant", "model", "decode", "chat", "remote", "load", "child")
"""The engine's subpackages, each depending only on those before it (and on the boundary
modules at the top of ``engine/``: api, events, errors, progress, paths, sizes)."""


def _room(module: str) -> int:
    parts = module.split(".")
    return ENGINE_ROOMS.index(parts[1]) + 1 if len(parts) > 2 or parts[-1] in ENGINE_ROOMS else 0


def test_engine_rooms_depend_one_way() -> None:
    g = graph()
    backward = sorted(f"{m} -> {d}" for m, deps in g.items() if m.startswith("engine.")
                      for d in deps if d.startswith("engine.") and _room(d) > _room(m))
    assert backward == []
