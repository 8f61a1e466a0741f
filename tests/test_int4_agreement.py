"""benchmarks/int4_agreement.py on the tiny random checkpoint: the experiments it reports run and
relate as they must (its 0.6B / 1.7B figures are in benchmarks/README.md)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
import int4_agreement  # noqa: E402


def test_the_experiments_relate_as_they_must(tmp_path):
    out = tmp_path / "agreement.json"
    experiments = ["folder:minmax:64", "modules:minmax:64", "minmax:64", "mse:64", "noise:0.0896", "int8"]
    options = ["--size", "tiny", "--workdir", str(tmp_path), "--seconds", "1", "--tokens", "2", "--json", str(out)]
    assert int4_agreement.main([*experiments, *options]) == 0
    rows = {r["experiment"]: r for r in json.loads(out.read_text())["rows"]}
    assert list(rows) == [e for e in experiments if not e.startswith("modules")] + ["modules:minmax:64"]
    # the folder read back by numpy is the minmax quantization quantized.py computes
    assert rows["folder:minmax:64"]["cosine"] == pytest.approx(rows["minmax:64"]["cosine"], abs=1e-6)
    assert rows["folder:minmax:64"]["layer_error"]["mean"] == pytest.approx(0.0896, abs=0.003)  # K = 64: group 64
    assert rows["mse:64"]["layer_error"]["mean"] < 0.96 * rows["minmax:64"]["layer_error"]["mean"]
    assert rows["int8"]["layer_error"]["max"] < 0.01
    assert rows["noise:0.0896"]["layer_error"]["mean"] == pytest.approx(0.0896, rel=0.05)
    # the real int4 layers compute what their weights in a float model compute
    assert rows["modules:minmax:64"]["cosine_to_float_twin"] > 0.99999
    assert rows["modules:minmax:64"]["cosine"] == pytest.approx(rows["minmax:64"]["cosine"], abs=1e-4)
    from dictation.asr.nn.options import DEFAULT_OPTIONS

    assert DEFAULT_OPTIONS.cpu_bf16_compute is None  # the script chose float32 for its model alone
