"""`dictation bench` on a tiny random checkpoint: every variant measured, weight memory ordered by
precision, the reference agrees with itself, the table prints; the CLI and the script parse the options."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import benchmarks.official_contender as official
from dictation.bench import main as bench_main

REPO = Path(__file__).resolve().parent.parent
STAGES = ("mel_ms", "encoder_ms", "prefill_ms", "decode_ms_per_token", "e2e_ms")
TINY = ["--sizes", "tiny", "--device", "cpu", "--seconds", "1", "2", "--tokens", "4", "--repeats", "1", "--warmup", "0"]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("bench")


@pytest.fixture(scope="module")
def variants_run(workdir):
    """One run of ours with fp32, int8 and int4 (fp32 is the CPU's default reference)."""
    import contextlib
    import io

    out = workdir / "variants.json"
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        code = bench_main(
            [*TINY, "--variants", "fp32", "int8", "int4", "--impl", "ours", "--workdir", str(workdir)]
            + ["--json", str(out)]
        )
    assert code == 0, buffer.getvalue()
    return json.loads(out.read_text(encoding="utf-8")), buffer.getvalue()


def test_every_variant_is_timed_with_positive_stages(variants_run):
    data, _ = variants_run
    assert data["meta"]["variants"] == ["fp32", "int8", "int4"]
    assert data["meta"]["reference_variant"] == "fp32"
    (res,) = data["results"]
    assert res["size"] == "tiny" and res["random_weights"] and res["official"] is None
    assert list(res["ours"]) == ["fp32", "int8", "int4"]
    for variant, info in res["ours"].items():
        assert info["variant"] == variant and info["load_s"] > 0
    assert [c["seconds"] for c in res["clips"]] == [1.0, 2.0]
    for clip in res["clips"]:
        assert clip["audio_tokens"] == clip["prompt_tokens"] - 15 > 0
        for variant, stats in clip["ours"].items():
            for stage in STAGES:
                assert stats[stage] > 0, (variant, stage)
            assert len(stats["tokens"]) == 4 and len(stats["runs"]) == 1


def test_weight_memory_shrinks_with_precision(variants_run):
    res = variants_run[0]["results"][0]
    weights = {v: res["ours"][v]["weight_bytes"] for v in ("fp32", "int8", "int4")}
    steps = {v: res["ours"][v]["decode_weight_bytes"] for v in ("fp32", "int8", "int4")}
    assert steps["int4"] < steps["int8"] < steps["fp32"]  # what a decode step reads
    # Held in all: the tiny model is mostly its table (151936 x 64), and on a CPU computing quantized
    # models in bf16 their int8 head adds an int8 copy of it (nn/int8_table.py), more than the
    # tiny int8 layers save; without that head int8 holds less than fp32.
    assert weights["int4"] < weights["int8"]
    if steps["fp32"] - steps["int8"] < 151936 * 64:  # the int8 variant's head is its float table
        assert weights["int8"] < weights["fp32"]
    for variant in ("int8", "int4"):  # the pre-quantized folder loads to the same weights
        pre = res["ours"][variant]["prequantized"]
        assert pre["load_s"] > 0 and pre["weight_bytes"] == weights[variant] and pre["disk_bytes"] > 0
    assert "prequantized" not in res["ours"]["fp32"]


def test_reference_agrees_with_itself_and_others_are_compared(variants_run):
    res = variants_run[0]["results"][0]
    for clip in res["clips"]:
        ref = clip["ours"]["fp32"]["agreement"]
        assert ref["reference"] == "fp32"
        assert ref["greedy_same_ids"] == 1.0 and ref["teacher_forced_top1"] == 1.0
        assert ref["first_logits_cosine"] == pytest.approx(1.0, abs=1e-9)
        for variant in ("int8", "int4"):
            agreement = clip["ours"][variant]["agreement"]
            assert 0.0 <= agreement["greedy_same_ids"] <= 1.0 and 0.0 <= agreement["teacher_forced_top1"] <= 1.0
            assert 0.5 < agreement["first_logits_cosine"] < 1.0  # quantized: close, never identical


def test_table_prints_every_variant_and_the_random_weights_caveat(variants_run):
    _, text = variants_run
    assert "ours fp32" in text and "ours int8" in text and "ours int4" in text
    for row in ("load (s)", "load, pre-quantized (s)", "weights (GB)", "decode (ms/token)", "end-to-end (ms)"):
        assert row in text
    for row in ("warm-up (s)", "decode kernels / layer", "on the CPU one operator call each"):
        assert row in text
    assert "teacher-forced top-1" in text and "first-logit cosine" in text
    assert "only a sanity check" in text
    # The real-time factor is the end-to-end time over the clip's length, per variant and clip.
    res = variants_run[0]["results"][0]
    for clip in res["clips"]:
        block = text.split(f"{clip['seconds']:>5g}s  ")[1]
        line = next(ln for ln in block.splitlines() if ln.strip().startswith("real-time factor"))
        cells = [float(c) for c in line.split()[2:]]
        want = [clip["ours"][v]["e2e_ms"] / (1000 * clip["seconds"]) for v in res["ours"]]
        assert cells == [round(w, 3) for w in want]
    assert "official" not in text.split("Qwen3-ASR-tiny")[1]  # --impl ours: no official column


def test_every_contender_is_warmed_up_and_its_decode_kernels_counted(variants_run):
    res = variants_run[0]["results"][0]
    for variant, info in res["ours"].items():
        assert info["warm_up_s"] > 0 and info["step"] == "default"
        kernels = info["decode_kernels"]
        if variant == "int8":  # the native CPU step: one C call for all layers, the head's ops outside
            assert kernels["path"] == "native" and kernels["per_layer"] == 1 / info["decode_kernels"]["layers"], kernels
            assert "one native call for all" in kernels["describe"]
            continue
        assert kernels["path"] == "plain" and kernels["per_layer"] >= 40, (variant, kernels)  # the CPU's torch ops
        assert "per layer" in kernels["describe"]
    assert res["ours"]["fp32"]["decode_kernels"]["first_layer"]["linear.default"] == 4


def test_other_decode_steps_get_columns_of_their_own(workdir, capsys):
    out = workdir / "steps.json"
    code = bench_main(
        [*TINY, "--impl", "ours", "--no-prequantized", "--no-release", "--decode-steps", "unfused"]
        + ["--workdir", str(workdir), "--json", str(out)]
    )
    assert code == 0
    res = json.loads(out.read_text(encoding="utf-8"))["results"][0]
    assert list(res["ours"]) == ["fp32", "fp32/unfused"]
    unfused = res["ours"]["fp32/unfused"]
    assert unfused["variant"] == "fp32" and unfused["step"] == "unfused" and unfused["decode_kernels"]["per_layer"] > 0
    for clip in res["clips"]:
        assert clip["ours"]["fp32/unfused"]["agreement"]["greedy_same_ids"] == 1.0  # the CPU's step either way
    text = capsys.readouterr().out
    header = next(line for line in text.splitlines() if "ours fp32/unfused" in line and "[" not in line)
    assert header.split() == ["ours", "fp32", "ours", "fp32/unfused"]


def test_reference_outside_the_variants_is_loaded_for_agreement_only(workdir, capsys):
    out = workdir / "ref.json"
    code = bench_main(
        [*TINY, "--variants", "int8", "--reference-variant", "fp32", "--impl", "ours", "--no-prequantized"]
        + ["--workdir", str(workdir), "--json", str(out)]
    )
    assert code == 0
    res = json.loads(out.read_text(encoding="utf-8"))["results"][0]
    assert list(res["ours"]) == ["int8"] and res["reference_only"]["variant"] == "fp32"
    assert "prequantized" not in res["ours"]["int8"]
    assert res["clips"][0]["ours"]["int8"]["agreement"]["reference"] == "fp32"
    assert "loaded for the agreement figures only" in capsys.readouterr().out


def test_without_the_official_packages_ours_runs_and_one_line_says_so(workdir, capsys, monkeypatch):
    monkeypatch.setattr(official, "unavailable_reason", lambda: "ModuleNotFoundError: No module named 'qwen_asr'")
    out = workdir / "no_official.json"
    code = bench_main([*TINY, "--no-prequantized", "--workdir", str(workdir), "--json", str(out)], official=official)
    assert code == 0
    text = capsys.readouterr().out
    missing = [line for line in text.splitlines() if line.startswith("official numbers missing")]
    assert len(missing) == 1 and "qwen-asr" in missing[0] and "pip install" in missing[0]
    data = json.loads(out.read_text(encoding="utf-8"))
    assert data["meta"]["impls"] == ["ours"] and data["results"][0]["official"] is None
    assert list(data["results"][0]["ours"]) == ["fp32"]  # default: the dtype's own variant


def test_dictation_bench_itself_never_loads_the_reference(workdir, capsys):
    out = workdir / "package_only.json"
    code = bench_main([*TINY, "--no-prequantized", "--workdir", str(workdir), "--json", str(out)])
    assert code == 0
    assert "run benchmarks/bench_asr.py from a checkout" in capsys.readouterr().out
    assert json.loads(out.read_text(encoding="utf-8"))["meta"]["impls"] == ["ours"]


def test_official_side_by_side(workdir):  # the test extra installs the official implementation
    assert official.unavailable_reason() is None
    out = workdir / "official.json"
    code = bench_main([*TINY, "--no-prequantized", "--workdir", str(workdir), "--json", str(out)], official=official)
    assert code == 0
    res = json.loads(out.read_text(encoding="utf-8"))["results"][0]
    assert res["official"]["load_s"] > 0 and res["official"]["weight_bytes"] > 0
    for clip in res["clips"]:
        assert clip["same_prompt"] is True
        assert all(clip["official"][stage] > 0 for stage in STAGES)
        assert clip["official"]["agreement"]["teacher_forced_top1"] is None  # greedy figures only


def _run(*args):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True, env=env, timeout=300)


def test_cli_bench_help_and_a_tiny_run(workdir):
    proc = _run("-m", "dictation", "bench", "--help")
    assert proc.returncode == 0, proc.stderr
    for option in ("--variants", "--reference-variant", "--sizes", "--json", "--model"):
        assert option in proc.stdout
    assert "bench" in _run("-m", "dictation", "--help").stdout
    out = workdir / "cli.json"
    proc = _run(
        "-m", "dictation", "bench", *TINY, "--variants", "fp32", "int8", "--impl", "ours", "--no-prequantized",
        "--workdir", workdir, "--json", out,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert list(json.loads(out.read_text(encoding="utf-8"))["results"][0]["ours"]) == ["fp32", "int8"]
    bad = _run("-m", "dictation", "bench", "--tokens", "1")
    assert bad.returncode == 1 and "--tokens must be at least 2" in bad.stderr


def test_installed_bench_help_sends_the_official_comparison_to_a_source_checkout():
    """An installed copy has no benchmarks/ folder and never runs the official implementation: its help
    says where both are, while the checkout's script offers the official side."""
    installed = _run("-m", "dictation", "bench", "--help")
    assert installed.returncode == 0, installed.stderr
    text = " ".join(installed.stdout.split())
    assert "measures our engine only" in text
    assert "source checkout of the project with the test extra installed" in text
    assert "python benchmarks/bench_asr.py" in text
    assert "benchmarks/README.md of the source repository (an installed copy does not include it)" in text
    assert "next to the official implementation" not in text
    impl_help = text[text.rindex("--impl {ours,official}") :].split("--workdir")[0]
    assert "official runs only from a source checkout" in impl_help
    assert "dictation bench --quick" in text
    script = _run(REPO / "benchmarks" / "bench_asr.py", "--help")
    assert script.returncode == 0, script.stderr
    text = " ".join(script.stdout.split())
    assert "next to the official implementation when it is installed" in text
    assert "measures our engine only" not in text and "bench_asr.py --quick" in text


def test_script_keeps_its_options():
    proc = _run(REPO / "benchmarks" / "bench_asr.py", "--help")
    assert proc.returncode == 0, proc.stderr
    for option in ("--sizes", "--seconds", "--tokens", "--repeats", "--warmup", "--device", "--dtype", "--impl"):
        assert option in proc.stdout
    for option in ("--workdir", "--interleave", "--threads", "--json", "--quick", "--variants", "--decode-steps"):
        assert option in proc.stdout


def test_release_to_text_streams_the_clip_and_checks_the_ids(workdir, capsys):
    out = workdir / "release.json"
    args = ["--sizes", "tiny", "--device", "cpu", "--seconds", "9", "--tokens", "4", "--repeats", "1"]
    code = bench_main(
        [*args, "--warmup", "0", "--impl", "ours", "--no-prequantized", "--workdir", str(workdir), "--json", str(out)]
    )
    assert code == 0
    release = json.loads(out.read_text(encoding="utf-8"))["results"][0]["clips"][0]["ours"]["fp32"]["release"]
    for key in ("release_ms", "release_preview_ms", "release_draft_ms", "release_best_ms"):
        assert release[key] > 0, key
    assert release["speech_work_ms"] > 0  # the first 8-s window was encoded while the clip played
    assert 0 <= release["preview_accepted"] <= 4
    text = capsys.readouterr().out
    for row in ("release→text, streamed (ms)", "+ draft 85% right", "work during speech (ms)"):
        assert row in text
    # --no-release leaves it out
    code = bench_main([*args, "--warmup", "0", "--impl", "ours", "--no-prequantized", "--no-release"])
    assert code == 0 and "release→text" not in capsys.readouterr().out


def test_kernel_layouts_include_the_fused_projections(variants_run, workdir):
    """The int4 kernels' packed copies of q/k/v and gate/up live in the fused layers, not submodules."""
    import numpy as np
    import torch

    from dictation.asr.nn import quant_rows, quantized
    from dictation.bench.ours import OursBench

    (folder,) = [p for p in workdir.iterdir() if p.is_dir() and p.name.endswith("tiny-random")]
    bench = OursBench(folder, torch.device("cpu"), "int4", "fp32", 128)
    bench.load()
    bench.run(np.random.default_rng(0).standard_normal(16000).astype(np.float32) * 0.1, 4)
    model = bench.engine.model
    submodules_only = sum(
        t.numel() * t.element_size()
        for m in model.modules()
        if isinstance(m, quantized.QUANT_MODULES)
        for tensors in m._cache.values()
        for t in tensors
    )
    fused = sum(
        t.numel() * t.element_size() for f in model.decoder.fused_layers() for v in f._cache.values() for t in v
    )
    assert fused > 0 and bench.kernel_cache_bytes() == quant_rows.kernel_cache_bytes(model) == submodules_only + fused
    bench.unload()


def test_loads_are_timed_from_a_warm_page_cache(tmp_path, monkeypatch):
    """Every contender's timed load comes after the checkpoint's files were read once."""
    import torch

    from dictation.bench import runner

    (tmp_path / "sub").mkdir()
    (tmp_path / "model.safetensors").write_bytes(b"x" * 3000)
    (tmp_path / "sub" / "vocab.json").write_bytes(b"y" * 500)
    assert runner.warm_page_cache(tmp_path) == 3500
    events = []
    real = runner.warm_page_cache
    monkeypatch.setattr(runner, "warm_page_cache", lambda folder: events.append(("warm", folder)) or real(folder))

    class Contender:
        folder, label, weight_bytes = tmp_path, "fake", 1

        def load(self):
            events.append(("load", self.folder))
            return 0.5

    assert runner._load(Contender(), torch.device("cpu"))["load_s"] == 0.5
    assert events == [("warm", tmp_path), ("load", tmp_path)]


@pytest.mark.parametrize(
    ("name", "label"),
    [
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H100 NVL", "H100 NVL"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA GH200 480GB", "GH200 96GB HBM3"),
        ("NVIDIA A100-SXM4-80GB", "A100 80GB"),
        ("NVIDIA A100-SXM4-40GB", "A100 40GB"),
        ("NVIDIA GeForce RTX 4090", "RTX 4090"),
        ("NVIDIA GeForce RTX 3090 Ti", "RTX 3090 Ti"),
        ("NVIDIA GeForce RTX 3090", "RTX 3090"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA A10G", "A10G"),
        ("NVIDIA A10", "A10"),
        ("Tesla T4", "T4"),
        ("NVIDIA GeForce GTX 1080", None),
    ],
)
def test_the_bandwidth_floor_knows_the_gpu_by_its_reported_name(name, label):
    """The more specific names must win (GH200 is not an H200, an A100 not an A10, an L40S not an L4)."""
    from dictation.bench.measure import gpu_bandwidth

    found = gpu_bandwidth(name)
    assert (found[0] if found else None) == label


def test_the_int4_method_is_an_option_and_reaches_the_quantizer(monkeypatch):
    from dictation.asr import ModelError, device
    from dictation.asr.nn import quant_format
    from dictation.bench import parse_args, runner

    seen = []

    def no_device(name):
        seen.append(quant_format.INT4_METHOD)
        raise ModelError("no such device")

    assert parse_args([]).int4_method == quant_format.INT4_METHOD == "mse"
    monkeypatch.setattr(quant_format, "INT4_METHOD", "mse")
    monkeypatch.setattr(device, "resolve_device", no_device)
    assert runner.run(parse_args(["--int4-method", "minmax"])) == 1  # stops at the device, method set
    assert seen == ["minmax"]
    assert quant_format.INT4_METHOD == "mse"  # put back for the caller


def test_a_bench_run_in_process_gives_the_callers_logging_threads_and_warnings_back(monkeypatch):
    import logging
    import warnings

    import torch

    from dictation.asr import ModelError, device
    from dictation.bench import parse_args, runner

    inside = []

    def no_device(name):
        inside.append((logging.getLogger("dictation").level, torch.get_num_threads()))
        raise ModelError("no such device")

    monkeypatch.setattr(device, "resolve_device", no_device)
    logging.getLogger("dictation").setLevel(logging.NOTSET)
    threads = torch.get_num_threads()
    filters = list(warnings.filters)
    assert runner.run(parse_args(["--threads", "1"])) == 1
    assert inside == [(logging.ERROR, 1)]
    assert logging.getLogger("dictation").level == logging.NOTSET
    assert torch.get_num_threads() == threads and warnings.filters == filters


@pytest.mark.parametrize("variant", ["fp32", "int8"])
def test_a_streamed_text_that_differs_stops_fp32_and_is_counted_otherwise(workdir, monkeypatch, variant):
    """fp32 streaming must equal the whole clip; bf16 and quantized rounding depends on the chunking."""
    from dictation.asr.decode.streaming import StreamingTranscription

    real = StreamingTranscription.finish

    def off_by_one(self, *args, **kwargs):
        got = real(self, *args, **kwargs)
        got.token_ids = [*got.token_ids[:-1], got.token_ids[-1] + 1]
        return got

    monkeypatch.setattr(StreamingTranscription, "finish", off_by_one)
    out = workdir / f"differs-{variant}.json"
    args = ["--sizes", "tiny", "--device", "cpu", "--seconds", "9", "--tokens", "4", "--repeats", "1", "--warmup", "0"]
    args += ["--impl", "ours", "--no-prequantized", "--variants", variant, "--workdir", str(workdir)]
    args += ["--json", str(out)]
    if variant == "fp32":
        with pytest.raises(RuntimeError, match="streamed transcript differs"):
            bench_main(args)
        return
    assert bench_main(args) == 0
    release = json.loads(out.read_text(encoding="utf-8"))["results"][0]["clips"][0]["ours"][variant]["release"]
    assert release["streamed_same_ids"] == 0.0 and release["release_ms"] > 0


def test_random_checkpoints_are_drawn_on_all_cores_with_the_serial_values(monkeypatch):
    """The GPU check draws 1.7B and 0.6B checkpoints (~2.8 G normal draws) on the GPU machine's CPU
    cores: each tensor from its own generator, so the checkpoint is the one a serial draw gives."""
    import threading

    import torch

    from dictation.asr.config import AsrConfig
    from dictation.asr.nn.model import AsrModel
    from dictation.bench import checkpoints

    with torch.device("meta"):
        model = AsrModel(AsrConfig.from_dict(checkpoints.config_dict("tiny")))
    shapes = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    threads = set()
    serial = checkpoints._fill
    monkeypatch.setattr(checkpoints, "_fill", lambda *a: threads.add(threading.get_ident()) or serial(*a))
    drawn = checkpoints.draw(shapes, 7)
    assert list(drawn) == list(shapes)
    assert all(torch.equal(drawn[name], serial(name, shape, 7)) for name, shape in shapes.items())
    assert len(threads) >= min(2, os.cpu_count() or 1)


def test_the_decode_profile_script_lists_what_one_step_runs(workdir, capsys):
    import benchmarks.profile_decode as profile_decode

    code = profile_decode.main(
        ["--sizes", "tiny", "--device", "cpu", "--steps", "unfused", "--tokens", "3", "--repeats", "1"]
        + ["--position", "20", "--top", "3", "--workdir", str(workdir)]
    )
    assert code == 0
    lines = capsys.readouterr().out.splitlines()
    head = next(line for line in lines if line.startswith("[tiny fp32 unfused]"))
    assert "ms/token" in head and "operators per step" in head and "per layer" in head
    listed = lines[lines.index(head) + 1 : lines.index(head) + 4]
    assert len(listed) == 3 and all("aten::" in line and "ms" in line for line in listed)


def test_profile_decode_repeats_a_step_per_attention_split_and_restores_the_default(tmp_path, capsys, monkeypatch):
    import benchmarks.profile_decode as profile_decode
    from dictation.asr.nn.kernels import fused

    seen = []
    load = profile_decode.load

    def recording_load(folder, args, step):
        seen.append(fused.ATTENTION_SPLITS)  # what the step's capture (and its key) will see
        return load(folder, args, step)

    monkeypatch.setattr(profile_decode, "load", recording_load)
    code = profile_decode.main(
        ["--sizes", "tiny", "--device", "cpu", "--steps", "unfused", "--tokens", "3", "--repeats", "1"]
        + ["--position", "20", "--top", "0", "--splits", "0", "4", "--workdir", str(tmp_path)]
    )
    assert code == 0
    assert seen == [None, 4] and fused.ATTENTION_SPLITS is None
    heads = [line for line in capsys.readouterr().out.splitlines() if "ms/token" in line]
    assert [h.split("]")[0] for h in heads] == ["[tiny splits=auto fp32 unfused", "[tiny splits=4 fp32 unfused"]


def test_the_cpu_profile_is_of_the_plain_step_decoding_runs(tmp_path, capsys, monkeypatch):
    """On the CPU decoding runs the plain step (attention over the filled cache only), so the profile
    must too: the static step's whole-cache attention is another, slower step there."""
    import benchmarks.profile_decode as profile_decode

    def no_static_step(*args, **kwargs):
        raise AssertionError("the CPU profile ran the static step")

    monkeypatch.setattr(profile_decode.graphs, "DecodeGraph", no_static_step)
    code = profile_decode.main(
        ["--sizes", "tiny", "--device", "cpu", "--steps", "unfused", "--tokens", "3", "--repeats", "1"]
        + ["--position", "20", "--top", "3", "--workdir", str(tmp_path)]
    )
    assert code == 0 and "aten::" in capsys.readouterr().out


def test_the_bench_times_the_engines_own_pass(variants_run, workdir):
    """The bench runs the stages of the engine's pass pipeline, not a copy of them: its forced tokens
    begin with the ids a transcription of the same clip produces (fp32, bit for bit)."""
    import numpy as np
    import torch

    from dictation.bench.ours import OursBench

    (folder,) = [p for p in workdir.iterdir() if p.is_dir() and p.name.endswith("tiny-random")]
    bench = OursBench(folder, torch.device("cpu"), "fp32", "fp32", 128)
    bench.load()
    audio = np.random.default_rng(5).standard_normal(24000).astype(np.float32) * 0.1
    run = bench.run(audio, 6)
    want = bench.engine.pipeline.run(audio, None, "", 6)
    assert len(run.tokens) == 6 and want.ids and run.tokens[: len(want.ids)] == want.ids
    assert run.mel_ms > 0 and run.encoder_ms > 0 and run.prefill_ms > 0
    bench.unload()
