"""benchmarks/gpu_check.py, the helpers of the GPU check: which carried wheels go in, the
install without pip, the stand-in modules, the summary. (The whole script: `GPU_CHECK_DRY=1 bash
benchmarks/gpu_check.sh`, described in benchmarks/README.md.)"""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import benchmarks.gpu_check as gpu_check

REPO = Path(__file__).resolve().parent.parent


def fake_wheel(folder: Path, dist: str, module: str) -> Path:
    """A minimal wheel holding ``module/__init__.py`` (and one file under .data/purelib)."""
    path = folder / f"{dist}-1.0-py3-none-any.whl"
    info = f"{dist}-1.0.dist-info"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{module}/__init__.py", f"NAME = {module!r}\n")
        archive.writestr(f"{dist}-1.0.data/purelib/{module}_extra.py", "EXTRA = True\n")
        archive.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
        archive.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
    return path


def test_the_contender_always_goes_in_and_a_fill_in_only_where_the_machine_lacks_it(tmp_path):
    wheels = [
        tmp_path / "transformers-4.57.6-py3-none-any.whl",
        tmp_path / "huggingface_hub-0.36.0-py3-none-any.whl",
        tmp_path / "PyYAML-6.0.4-cp312-cp312-manylinux2014_x86_64.whl",
        tmp_path / "requests-2.34.2-py3-none-any.whl",
        tmp_path / "something_else-1.0-py3-none-any.whl",
    ]
    present = {"yaml", "transformers"}  # the machine has pyyaml and (another) transformers
    chosen, skipped = gpu_check.choose_wheels(wheels, lambda module: module in present)
    assert [gpu_check.dist_name(w) for w in chosen] == ["huggingface_hub", "requests", "transformers"]
    assert skipped == ["pyyaml"]


def test_without_pip_the_wheels_are_unpacked_and_the_stand_ins_fail_on_use(tmp_path, monkeypatch):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for dist in gpu_check.ALWAYS:
        fake_wheel(wheels, dist, f"fake_{dist}")
    site, standins = tmp_path / "site", tmp_path / "standins"
    real_present = gpu_check.module_present
    monkeypatch.setattr(gpu_check, "module_present", lambda m: False if m == "pip" else real_present(m))
    path = list(sys.path)
    assert gpu_check.install(wheels, site, standins, force_standins=True) == 0
    assert sys.path == path  # nothing of the wheels leaks into this process (later tests import tokenizers)
    assert (site / "fake_transformers" / "__init__.py").exists() and (site / "fake_gguf_extra.py").exists()
    assert not list(site.glob("*.data"))
    script = (
        "import fake_transformers, fake_gguf_extra, nagisa, librosa, soundfile\n"
        "assert fake_transformers.NAME == 'fake_transformers' and fake_gguf_extra.EXTRA\n"
        "try:\n    soundfile.read\nexcept AttributeError as exc:\n    print(exc)\n"
    )
    env = {"PYTHONPATH": f"{site}:{standins}", "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert "soundfile is a stand-in written by benchmarks/gpu_check.sh ('read'" in done.stdout


def test_a_missing_contender_wheel_is_one_clear_error(tmp_path, capsys):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    fake_wheel(wheels, "transformers", "fake_transformers")
    assert gpu_check.install(wheels, tmp_path / "site", tmp_path / "standins", force_standins=False) == 1
    assert "lacks wheels for accelerate, gguf, huggingface_hub" in capsys.readouterr().out


def test_the_summary_has_the_tests_the_diagnosis_and_each_variants_decode_and_end_to_end(tmp_path, capsys):
    (tmp_path / "gpu-tests.xml").write_text(
        '<testsuites><testsuite tests="3" failures="1" errors="0" skipped="0" time="61.2">'
        '<testcase classname="tests.asr.test_cuda" name="test_a"/>'
        '<testcase classname="tests.asr.test_cuda" name="test_b"><failure message="assert 1 == 2&#10;more"/>'
        "</testcase>"
        '<testcase classname="tests.asr.test_cuda" name="test_c"/></testsuite></testsuites>',
        encoding="utf-8",
    )
    (tmp_path / "diagnosis.txt").write_text("noise\nSUMMARY bf16 step: graph == static on 6/6 clips\n")
    (tmp_path / "steps.txt").write_text("gpu-tests=61s(rc=1)\ntotal=300s\n")
    stats = {"decode_ms_per_token": 1.234, "floor_ms_per_token": 1.03, "e2e_ms": 80.4}
    bench = {
        "meta": {"device": "NVIDIA H100 80GB HBM3", "official_missing": None},
        "results": [
            {
                "size": "1.7B",
                "clips": [
                    {
                        "seconds": 10.0,
                        "ours": {"bf16": stats, "int4": {**stats, "decode_ms_per_token": 0.61}},
                        "official": {"e2e_ms": 737.0},
                        "ratio": {"e2e_ms": 9.17},
                    }
                ],
            }
        ],
    }
    (tmp_path / "bench-1.7B.json").write_text(json.dumps(bench), encoding="utf-8")
    (tmp_path / "bench-0.6B.txt").write_text("device: ...\nTraceback: out of time\n", encoding="utf-8")
    (tmp_path / "splits-1.7B.txt").write_text(
        "[1.7B] built random checkpoint\n"
        "[1.7B splits=auto bf16 fused] warm-up 4.10 s · decode 3.050 ms/token (floor 1.1 ms) · 224 GPU kernels\n"
        "      0.9 ms   28x  _decode_attention\n"
        "[1.7B splits=4 bf16 fused] warm-up 4.20 s · decode 2.400 ms/token (floor 1.1 ms) · 252 GPU kernels\n",
        encoding="utf-8",
    )
    (tmp_path / "train-0.6B.txt").write_text(
        "[0.6B] reusing random checkpoint\nSUMMARY train 0.6B --bits 4 (NF4 + double quant base) on cuda: 0.1 s/step\n",
        encoding="utf-8",
    )
    (tmp_path / "train-tiny.txt").write_text("Traceback\nRuntimeError: boom\n", encoding="utf-8")
    assert gpu_check.summary(tmp_path) == 0
    out = capsys.readouterr().out
    assert "\nSUMMARY train 0.6B --bits 4 (NF4 + double quant base) on cuda: 0.1 s/step\n" in out
    assert "train-tiny: no result (RuntimeError: boom)" in out and "reusing" not in out
    assert "steps: gpu-tests=61s(rc=1), total=300s" in out
    assert "gpu tests: 2 passed, 1 failed, 0 skipped (61 s)" in out
    assert "FAILED test_cuda::test_b: assert 1 == 2" in out and "more" not in out
    assert "SUMMARY bf16 step: graph == static on 6/6 clips" in out and "noise" not in out
    assert "bench 1.7B on NVIDIA H100 80GB HBM3" in out
    assert "1.7B 10 s: bf16 1.23/1.03 ms/tok e2e 80; int4 0.61/1.03 ms/tok e2e 80; official e2e 737 ms (9.2x)" in out
    assert "bench-0.6B: no JSON (Traceback: out of time)" in out
    assert "splits-1.7B:\n[1.7B splits=auto bf16 fused] warm-up 4.10 s · decode 3.050 ms/token (floor 1.1 ms)\n" in out
    assert "[1.7B splits=4 bf16 fused] warm-up 4.20 s · decode 2.400 ms/token (floor 1.1 ms)" in out
    assert "_decode_attention" not in out
    assert (tmp_path / "summary.txt").read_text(encoding="utf-8").strip() == out.strip()


def test_a_test_step_cut_at_its_limit_is_summed_up_from_its_verbose_lines(tmp_path):
    (tmp_path / "gpu-tests.txt").write_text(
        "bringing up nodes...\n"
        "[gw0] [ 10%] PASSED tests/asr/test_cuda.py::test_a \n"
        "[gw1] [ 20%] FAILED tests/asr/test_fast_paths_cuda.py::test_b[bf16] \n"
        "[gw2] [ 30%] SKIPPED tests/asr/test_cuda.py::test_c \n"
        "[gw3] [ 40%] PASSED tests/asr/test_cuda.py::test_d \n",
        encoding="utf-8",
    )
    assert gpu_check.test_summary(tmp_path) == [
        "gpu tests (cut at the step's limit, no report): 2 passed, 1 failed, 1 skipped before the cut",
        "  FAILED tests/asr/test_fast_paths_cuda.py::test_b[bf16]",
    ]
    (tmp_path / "gpu-tests.txt").write_text("bringing up nodes...\nsomething else\n", encoding="utf-8")
    assert gpu_check.test_summary(tmp_path) == ["gpu tests: something else"]
    (tmp_path / "gpu-tests.txt").unlink()
    assert gpu_check.test_summary(tmp_path) == ["gpu tests: not run"]


def test_the_wheel_lists_of_both_scripts_agree():
    fetch = (REPO / "benchmarks" / "fetch_gpu_wheels.sh").read_text(encoding="utf-8")

    def listed(name: str) -> set[str]:
        block = fetch.split(f"{name}=(", 1)[1].split(")", 1)[0]
        names = [line.split("==")[0] for line in block.split()]
        return {gpu_check.dist_name(Path(name.replace("-", "_") + "-0-py3-none-any.whl")) for name in names}

    assert listed("ALWAYS") == set(gpu_check.ALWAYS)
    assert listed("FILL_INS") == set(gpu_check.FILL_INS)
