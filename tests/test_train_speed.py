"""benchmarks/train_speed.py: one short run on the tiny random checkpoint, as the GPU
check's dry run makes it, with the figures it reports."""

from __future__ import annotations

import json

import benchmarks.train_speed as train_speed


def test_a_short_run_reports_speed_and_the_nf4_base_size(tmp_path, capsys):
    out = tmp_path / "train.json"
    args = ["--size", "tiny", "--device", "cpu", "--steps", "2", "--clips", "1", "--seconds", "1"]
    assert train_speed.main([*args, "--workdir", str(tmp_path / "w"), "--json", str(out)]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("SUMMARY train tiny")]
    assert [line.split(" (")[0] for line in lines] == ["SUMMARY train tiny --bits 4", "SUMMARY train tiny --bits 16"]
    nf4, float32 = json.loads(out.read_text())["results"]
    # 4.127 bits as stored, plus the per-tensor mean's 4 bytes and the padding of the tiny layers' scales
    assert 4.127 / 8 <= nf4["base_bytes_per_parameter"] < 0.53 and float32["base_bytes_per_parameter"] == 4.0
    for r in (nf4, float32):
        assert r["s_per_step"] > 0 and r["tokens_per_s"] > 0 and r["steps_timed"] == 2 and "peak_gpu_bytes" not in r
    assert nf4["decoder_projection_parameters"] == float32["decoder_projection_parameters"] > 0
    assert float32["base_projection_bytes"] == 4 * float32["decoder_projection_parameters"]
