"""The package's layout stays readable: no module of `dictation` is over 700 lines (a longer one is
a grab-bag to split by what its parts do)."""

from __future__ import annotations

from pathlib import Path

import dictation

PACKAGE = Path(dictation.__file__).parent
MAX_LINES = 700


def long_modules(root: Path, limit: int = MAX_LINES) -> dict[str, int]:
    """Every ``*.py`` below ``root`` with more than ``limit`` lines: its path relative to ``root``'s
    parent -> its line count."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > limit:
            found[path.relative_to(root.parent).as_posix()] = lines
    return found


def test_no_module_is_over_700_lines():
    found = long_modules(PACKAGE)
    assert not found, f"modules over {MAX_LINES} lines: " + ", ".join(f"{p} ({n})" for p, n in found.items())


def test_the_count_finds_a_long_module_anywhere_below_the_package(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "ok.py").write_text("x = 1\n" * MAX_LINES, encoding="utf-8")
    (package / "sub" / "long.py").write_text("x = 1\n" * (MAX_LINES + 1), encoding="utf-8")
    (package / "notes.txt").write_text("x\n" * 2000, encoding="utf-8")
    assert long_modules(package) == {"pkg/sub/long.py": MAX_LINES + 1}
