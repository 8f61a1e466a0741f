"""benchmarks/bench_gemv.py: the one-row matrix-product microbenchmark (its GPU numbers come from a GPU;
here the shapes, the summary, and a smoke run of every candidate on the CPU, Triton's in its interpreter)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "benchmarks" / "bench_gemv.py"

sys.path.insert(0, str(REPO / "benchmarks"))
import bench_gemv  # noqa: E402


def test_the_layer_shapes_are_the_decoders_fused_products():
    shapes, layers = bench_gemv.layer_shapes("1.7B")
    assert layers == 28
    assert shapes == {
        "qkv": (4096, 2048),  # 16 query heads + 2 x 8 key/value heads of 128
        "o": (2048, 2048),
        "gate_up": (12288, 2048),
        "down": (2048, 6144),
        "head": (151936, 2048),
    }
    shapes, _ = bench_gemv.layer_shapes("0.6B")
    assert shapes["qkv"] == (4096, 1024) and shapes["o"] == (1024, 2048) and shapes["down"] == (1024, 3072)


def test_the_summary_adds_one_layers_products_per_layer_and_the_head():
    rows = [{"layer": "head", "kind": "bf16", "path": "cublas", "us": 100.0, "ok": True}]
    for kind, path, us in (("bf16", "cublas", 10.0), ("int4", "triton", 4.0), ("int4", "torch", 5.0)):
        for layer in ("qkv", "o", "gate_up", "down"):
            rows.append({"layer": layer, "kind": kind, "path": path, "us": us, "ok": True})
    rows.append({"layer": "o", "kind": "int4", "path": "triton", "us": 3.0, "ok": True})  # a faster block size
    rows.append({"layer": "o", "kind": "int4", "path": "torch", "us": 1.0, "ok": False})  # wrong: never counts
    step = bench_gemv._summary(rows, n_layers=2)["step"]
    assert step == {"bf16 cublas": 2 * 40 + 100, "int4 triton": 2 * 15 + 100, "int4 torch": 2 * 20 + 100}


def test_a_smoke_run_times_and_checks_every_candidate(tmp_path):
    out = tmp_path / "gemv.json"
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(REPO))
    cmd = [sys.executable, str(SCRIPT), "--size", "tiny", "--device", "cpu", "--repeats", "1", "--only", "down"]
    proc = subprocess.run([*cmd, "--json", str(out)], capture_output=True, text=True, timeout=600, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads(out.read_text())
    got = {(r["kind"], r["path"]) for r in result["rows"]}
    assert got == {("bf16", "cublas")} | {(k, p) for k in ("int8", "int4") for p in ("triton", "torch", "dequantize")}
    assert all(r["ok"] and r["us"] > 0 and r["bytes"] > 0 for r in result["rows"])
    int4 = {r["path"]: r["bytes"] for r in result["rows"] if r["kind"] == "int4"}
    # 64 x 128 weights (one group per row): 4 KiB of nibbles + 64 float32 scales and zeros (bf16 for
    # tinygemm's); dequantize + matmul also writes and reads the bf16 weights
    assert int4 == {"triton": 4096 + 64 * 8, "torch": 4096 + 64 * 4, "dequantize": 4096 + 64 * 8 + 2 * 2 * 8192}
    assert "down" in proc.stdout and "WRONG" not in proc.stdout
