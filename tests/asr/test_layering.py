"""The engine's layout: no import circles, and each layer imports only the layers below it.

Layers, lowest first: the base modules (``errors``, ``config``, ``device``, ``limits``), ``text`` (tokenizer,
prompt, output parsing) and ``nn`` (the network), then ``checkpoints`` (files → a model and its
tokenizer), ``tune`` (quantizing, adapters, the folder writers) and ``decode`` (running a pass),
and ``engine`` on top. Every import counts, at module level or inside a function; only imports
under ``if TYPE_CHECKING:`` (annotations) do not.
"""

from __future__ import annotations

import ast
from pathlib import Path

import dictation
from tests.test_layout import import_cycles as cycles  # one cycle finder (Tarjan) for both layout tests

PACKAGE = Path(dictation.__file__).parent
BASE = {"dictation.asr.errors", "dictation.asr.config", "dictation.asr.device", "dictation.asr.limits"}
# layer -> the layers it must not import (its own and lower ones are fine)
FORBIDDEN = {
    "base": {"text", "nn", "checkpoints", "tune", "decode", "engine"},
    "text": {"nn", "checkpoints", "tune", "decode", "engine"},
    "nn": {"text", "checkpoints", "tune", "decode", "engine"},
    "checkpoints": {"tune", "decode", "engine"},
    "tune": {"decode", "engine"},
    "decode": {"checkpoints", "tune", "engine"},
    "engine": set(),
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def _type_checking_only(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules that ``name`` imports, resolved to modules (a name from a package's
    ``__init__`` counts as that package)."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _type_checking_only(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in known:
                    found.add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = name if path.name == "__init__.py" else name.rpartition(".")[0]
                for _ in range(node.level - 1):
                    package = package.rpartition(".")[0]
                base = f"{package}.{base}" if base else package
            for alias in node.names:
                full = f"{base}.{alias.name}"
                found.add(full if full in known else base)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return {m for m in found if m in known and m != name}


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: imports_of(name, path, known) for name, path in mods.items()}


def layer_of(module: str) -> str | None:
    if module in BASE:
        return "base"
    parts = module.split(".")
    if parts[:2] != ["dictation", "asr"] or len(parts) < 3:
        return None
    return {"engine": "engine"}.get(parts[2], parts[2] if parts[2] in FORBIDDEN else None)


def test_the_package_has_no_import_circles():
    found = cycles(graph())
    assert not found, "import circles: " + "; ".join(" <-> ".join(c) for c in found)


def test_each_engine_layer_imports_only_the_layers_below_it():
    wrong = []
    for module, targets in sorted(graph().items()):
        layer = layer_of(module)
        if layer is None:
            continue
        for target in sorted(targets):
            if layer_of(target) in FORBIDDEN[layer]:
                wrong.append(f"{module} ({layer}) imports {target} ({layer_of(target)})")
    assert not wrong, "\n".join(wrong)


def test_the_engine_imports_nothing_of_the_app():
    """The engine is a library: Qt, the app, the recorder and the session live above it."""
    wrong = [
        f"{module} imports {target}"
        for module, targets in sorted(graph().items())
        if module.startswith("dictation.asr")
        for target in sorted(targets)
        # the shared helpers below the engine and the app alike (each imports only the standard library)
        if not target.startswith("dictation.asr")
        and target not in {"dictation", "dictation.files", "dictation.spawn", "dictation.textclean"}
    ]
    assert not wrong, "\n".join(wrong)


def test_the_checker_sees_circles_and_layer_breaks(tmp_path):
    """The checks above can fail: a function-level import back up the layers is a circle and a break."""
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(edges) == [["a", "b", "c"]]
    module = tmp_path / "m.py"
    module.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from dictation.asr.engine import AsrEngine\n"
        "def f():\n    from dictation.asr.decode import greedy\n    from dictation.asr import engine\n"
    )
    known = {"dictation.asr.engine", "dictation.asr.decode.greedy", "dictation.asr.decode", "dictation.asr"}
    assert imports_of("dictation.asr.nn.m", module, known) == {"dictation.asr.decode.greedy", "dictation.asr.engine"}
    assert layer_of("dictation.asr.nn.m") == "nn" and "decode" in FORBIDDEN["nn"]
