"""benchmarks/bench_convert.py: each ``--code`` tree converts with its own ``dictation`` package, whatever the
working directory (``python -m`` puts it first on sys.path: a checkout there shadowed every tree)."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

sys.path.insert(0, str(REPO / "benchmarks"))
import bench_convert  # noqa: E402


def test_each_code_tree_converts_with_its_own_package(tmp_path, monkeypatch):
    tree = tmp_path / "before"
    (tree / "dictation").mkdir(parents=True)
    (tree / "dictation" / "__init__.py").write_text("")
    # this tree's "converter" writes a 3 MiB file where --out points
    main = "import sys; from pathlib import Path\nout = Path(sys.argv[sys.argv.index('--out') + 1])\n"
    main += "out.write_bytes(bytes(3 << 20))\n"
    (tree / "dictation" / "__main__.py").write_text(main)
    monkeypatch.chdir(REPO)  # a checkout with a real dictation package as the working directory
    out = tmp_path / "out" / "m.gguf"
    out.parent.mkdir()
    row = bench_convert.run_convert(tree, tmp_path / "model", "Q4_K", out, "single")
    assert row["output_mib"] == 3 and row["code"] == str(tree)
