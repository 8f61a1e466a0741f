"""The package's layout stays readable: no module of `dictation` is over 600 lines (a longer one is
a grab-bag to split by what its parts do), and no modules import each other in a circle, not even
through imports made only for type checking (docs/architecture.md)."""

from __future__ import annotations

import ast
from pathlib import Path

import dictation

PACKAGE = Path(dictation.__file__).parent
MAX_LINES = 600


def long_modules(root: Path, limit: int = MAX_LINES) -> dict[str, int]:
    """Every ``*.py`` below ``root`` with more than ``limit`` lines: its path relative to ``root``'s
    parent -> its line count."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > limit:
            found[path.relative_to(root.parent).as_posix()] = lines
    return found


def test_no_module_is_over_600_lines():
    found = long_modules(PACKAGE)
    assert not found, f"modules over {MAX_LINES} lines: " + ", ".join(f"{p} ({n})" for p, n in found.items())


def test_the_count_finds_a_long_module_anywhere_below_the_package(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "ok.py").write_text("x = 1\n" * MAX_LINES, encoding="utf-8")
    (package / "sub" / "long.py").write_text("x = 1\n" * (MAX_LINES + 1), encoding="utf-8")
    (package / "notes.txt").write_text("x\n" * 2000, encoding="utf-8")
    assert long_modules(package) == {"pkg/sub/long.py": MAX_LINES + 1}


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports, anywhere in its text (inside functions and
    `if TYPE_CHECKING:` too); `from a import b` imports `a` and, when it is a module, `a.b`."""
    paths = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    graph = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                targets.add(base)
                targets.update(f"{base}.{alias.name}" for alias in node.names)
        graph[name] = {t for t in targets if t in paths and t != name}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for after in sorted(graph[node]):
            if after not in index:
                visit(after)
                low[node] = min(low[node], low[after])
            elif after in stack:
                low[node] = min(low[node], index[after])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return cycles


def test_no_import_cycle_in_the_package():
    cycles = import_cycles(import_graph(PACKAGE))
    assert not cycles, "import cycles (type-only imports count): " + "; ".join(" <-> ".join(c) for c in cycles)


def test_the_cycle_finder_sees_type_only_relative_and_package_imports(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    files = {
        "__init__.py": "from pkg.sub import c\n",
        "a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import b\n",
        "b.py": "def f():\n    from . import a\n",
        "sub/__init__.py": "",
        "sub/c.py": "from .. import VALUE\n",
        "sub/d.py": "import pkg.a\n",
    }
    for name, text in files.items():
        (package / name).write_text(text, encoding="utf-8")
    assert import_cycles(import_graph(package)) == [["pkg", "pkg.sub.c"], ["pkg.a", "pkg.b"]]
