"""benchmarks/bench_cpu_engines.py: ours against CrispASR on the CPU, each in a process of its own (the
figures come from a real run, benchmarks/results/; here the verdicts, the bytes a step reads, why
CrispASR is not run on a file, and a smoke run of ours on the tiny model)."""

from __future__ import annotations

import subprocess
import sys
import types
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "benchmarks" / "bench_cpu_engines.py"

sys.path.insert(0, str(REPO / "benchmarks"))
import bench_cpu_engines as bench  # noqa: E402


def figures(decode_ms, peak_mib, resident_gb=1.0, load_s=0.5, whole_s=4.0):
    return {
        "decode_ms": decode_ms,
        "peak": peak_mib * 2**20,
        "resident": resident_gb * 1e9 * 0.8,  # after the load: the target is judged after a transcription
        "in_use": resident_gb * 1e9,
        "load_s": load_s,
        "whole_s": whole_s,
    }


def test_each_target_is_met_or_not_on_its_own_figure():
    crisp = {"int8": figures(46.0, 1300, whole_s=4.2), "fp32": figures(57.0, 2100)}
    good = {"int8": figures(30.0, 1200, 1.4, 0.8, 4.0), "fp32": figures(90.0, 2000)}
    assert [ok for _, ok in bench.targets(good, crisp)] == ["met"] * 6
    bad = {"int8": figures(31.0, 1301, 1.6, 1.1, 4.3), "fp32": figures(90.0, 2101)}
    assert [ok for _, ok in bench.targets(bad, crisp)] == ["NOT met"] * 6
    text = [t for t, _ in bench.targets(bad, crisp)]
    assert text[0].startswith("int8 decode 0.67x") and "1301 MiB" in text[1] and "2101 MiB" in text[2]


def test_without_crispasr_only_our_own_targets_are_judged():
    rows = bench.targets({"int8": figures(30.0, 1200)}, {})
    assert [ok for _, ok in rows] == ["n/a", "met", "met"]


def _write_gguf(path, names):
    import gguf

    w = gguf.GGUFWriter(str(path), arch="qwen3asr")
    arrays = {n: np.zeros((4, 8), dtype=np.float32) for n in names}
    for name, array in arrays.items():
        w.add_tensor(name, array)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_a_step_reads_the_text_blocks_and_the_head(tmp_path):
    path = tmp_path / "m.gguf"
    _write_gguf(path, ["blk.0.attn_q.weight", "blk.1.ffn_up.weight", "audio.blk.0.attn_q.weight", "token_embd.weight"])
    assert bench.gguf_step_bytes(path) == 3 * 4 * 8 * 4  # two blocks and the (tied) embedding
    _write_gguf(path2 := tmp_path / "untied.gguf", ["blk.0.attn_q.weight", "token_embd.weight", "output.weight"])
    assert bench.gguf_step_bytes(path2) == 2 * 4 * 8 * 4


def test_a_file_crispasr_cannot_run_is_named_with_what_it_lacks(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "crispasr", types.ModuleType("crispasr"))
    path = tmp_path / "m.gguf"
    _write_gguf(path, ["blk.0.attn_q.weight", "token_embd.weight"])
    problem = bench.crisp_problem(path)
    assert str(path) in problem and "audio.mel_filters, audio.mel_window, output.weight" in problem
    _write_gguf(path, ["token_embd.weight", "output.weight", "audio.mel_filters", "audio.mel_window"])
    assert bench.crisp_problem(path) is None
    monkeypatch.setitem(sys.modules, "crispasr", None)  # not installed: import fails
    assert "pip install crispasr==0.8.45" in bench.crisp_problem(path)


def test_ours_runs_in_a_process_of_its_own(ckpt_untied):
    """The child a real run starts, on the tiny model: every figure the table prints is there."""
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--child", "ours", "--model", str(ckpt_untied), "--variant", "int8"]
        + ["--threads", "1", "--tokens", "4", "--seconds", "1.5", "--launched", "0"],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    )
    import json

    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(got) >= {"load_s", "whole_s", "resident", "in_use", "peak", "decode_ms", "step_bytes"}
    assert 0 < got["resident"] <= got["in_use"] <= got["peak"] and got["decode_ms"] > 0 and 1 <= got["tokens"] <= 4
    assert got["step_bytes"] > 0
