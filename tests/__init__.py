"""The test suite (docs/architecture.md, "Tests")."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]  # the checkout: where `tests` is importable
# What the tests keep between runs in this checkout: llama.cpp's converter, Triton's compiled kernels,
# the lock of tests/lanes.py `one_big_child_at_a_time` (pytest's own cache folder, ignored by git)
KEPT = REPO / ".pytest_cache" / "d"
