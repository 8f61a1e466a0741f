"""`dictation transcribe`: exit codes, one-line errors, JSON output."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import numpy as np
import pytest

from dictation.audio.wav import write_wav
from dictation.cli import main
from tests.oracle import synth_audio


def run_cli(*args, env=None):
    """`python -m dictation ARGS` in a process of its own, as a user runs it."""
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "dictation", *map(str, args)], capture_output=True, text=True, env=full_env, timeout=300
    )


def run_cli_here(*args, env=None) -> subprocess.CompletedProcess:
    """`dictation ARGS` run by the command's own `main` in this process: its exit code, stdout and
    stderr as run_cli gives them (logging set up by `main` on this stderr, as in a process of its
    own), without starting an interpreter that imports torch again (1-2 s of CPU each, more on a busy
    machine). The entry point itself (`python -m dictation`) is run_cli's (test_json_output,
    test_version_and_help)."""
    argv = [str(a) for a in args]
    out, err = io.StringIO(), io.StringIO()
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    root.handlers.clear()  # pytest's own: `main` sets up logging as it does in a fresh process
    try:
        # COLUMNS: argparse wraps --help to the terminal's width, which a process writing into a pipe does not have
        changes = {"HF_HUB_OFFLINE": "1", "COLUMNS": os.environ.get("COLUMNS", "80"), **(env or {})}
        with pytest.MonkeyPatch.context() as patch, redirect_stdout(out), redirect_stderr(err):
            for name, value in changes.items():
                patch.setenv(name, value)
            try:
                code = main(argv)
            except SystemExit as exc:  # argparse: --help, or a usage error (2)
                code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    finally:
        for handler in root.handlers:
            handler.close()
        root.handlers[:] = handlers
        root.setLevel(level)
    return subprocess.CompletedProcess(["dictation", *argv], code, out.getvalue(), err.getvalue())


@pytest.fixture(scope="module")
def speech_wav(tmp_path_factory):
    path = tmp_path_factory.mktemp("wav") / "speech.wav"
    write_wav(path, synth_audio(2.5, seed=31), 16000)
    return path


def assert_one_line_error(proc, *fragments):
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    for fragment in fragments:
        assert fragment in lines[0]


def test_json_output(ckpt_untied, speech_wav, tmp_path):
    stereo_44k = tmp_path / "stereo.wav"
    audio = synth_audio(1.5, seed=2)
    write_wav(stereo_44k, np.stack([audio, audio], axis=1), 16000)
    proc = run_cli(
        "transcribe",
        speech_wav,
        stereo_44k,
        "--model",
        ckpt_untied,
        "--device",
        "cpu",
        "--max-new-tokens",
        "7",
        "--json",
        "--language",
        "en",
    )
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [r["file"] for r in rows] == [str(speech_wav), str(stereo_44k)]
    first = rows[0]
    assert first["language"] == "English" and first["audio_seconds"] == pytest.approx(2.5)
    assert len(first["token_ids"]) == 7 and all(isinstance(t, int) for t in first["token_ids"])
    assert first["text"] and {"mel_s", "encoder_s", "prefill_s", "decode_s", "total_s"} <= set(first["timings"])


def test_plain_output_is_the_text(ckpt_untied, speech_wav):
    from dictation.asr import AsrEngine, EngineOptions
    from dictation.audio.wav import load_audio_16k

    proc = run_cli_here("transcribe", speech_wav, "--model", ckpt_untied, "--max-new-tokens", "5")
    assert proc.returncode == 0, proc.stderr
    engine = AsrEngine(EngineOptions(model=str(ckpt_untied), device="cpu"))
    assert proc.stdout.strip() == engine.transcribe(load_audio_16k(speech_wav), max_new_tokens=5).text


def test_missing_file(ckpt_untied, tmp_path):
    missing = tmp_path / "nope.wav"
    assert_one_line_error(run_cli_here("transcribe", missing, "--model", ckpt_untied), str(missing))


def test_not_audio(ckpt_untied, tmp_path):
    text = tmp_path / "notes.wav"
    text.write_text("this is not audio")
    assert_one_line_error(run_cli_here("transcribe", text, "--model", ckpt_untied), str(text), "not a WAV file")


def test_silent_and_empty_audio(ckpt_untied, tmp_path):
    silent, empty = tmp_path / "silent.wav", tmp_path / "empty.wav"
    write_wav(silent, np.zeros(16000, np.float32), 16000)
    write_wav(empty, np.zeros(0, np.float32), 16000)
    assert_one_line_error(run_cli_here("transcribe", silent, "--model", ckpt_untied), str(silent), "silent")
    assert_one_line_error(run_cli_here("transcribe", empty, "--model", ckpt_untied), str(empty), "no audio")


def test_wrong_model_folder(speech_wav, tmp_path):
    empty = tmp_path / "not-a-model"
    empty.mkdir()
    assert_one_line_error(run_cli_here("transcribe", speech_wav, "--model", empty), str(empty / "config.json"))
    assert_one_line_error(
        run_cli_here("transcribe", speech_wav, "--model", tmp_path / "absent"), "no such model folder"
    )


def test_bad_language(ckpt_untied, speech_wav):
    assert_one_line_error(
        run_cli_here("transcribe", speech_wav, "--model", ckpt_untied, "--language", "xx"), "unsupported language 'xx'"
    )


def test_one_bad_file_among_good_ones(ckpt_untied, speech_wav, tmp_path):
    missing = tmp_path / "gone.wav"
    proc = run_cli_here("transcribe", speech_wav, missing, "--model", ckpt_untied, "--max-new-tokens", "3")
    assert proc.returncode == 1
    assert str(missing) in proc.stderr and proc.stdout.startswith(f"{speech_wav}: ")


@pytest.mark.parametrize(
    "args",
    [
        ("transcribe", "{missing}", "--model", "{model}"),  # one error line, exit 1
        ("transcribe", "{wav}", "--model", "{model}", "--device", "tpu:7"),
        ("transcribe",),  # a usage error: argparse's exit 2
        ("quantize", "--help"),
    ],
    ids=["missing-file", "bad-device", "usage", "help"],
)
def test_running_main_here_gives_what_the_process_gives(ckpt_untied, speech_wav, tmp_path, args):
    """run_cli_here stands in for run_cli in most tests: the same exit code, stdout and stderr."""
    args = [a.format(missing=tmp_path / "nope.wav", model=ckpt_untied, wav=speech_wav) for a in args]
    here, there = run_cli_here(*args), run_cli(*args)
    assert (here.returncode, here.stdout, here.stderr) == (there.returncode, there.stdout, there.stderr)
    assert here.stdout or here.stderr


def test_version_and_help():
    proc = run_cli("--version")
    assert proc.returncode == 0 and proc.stdout.startswith("dictation ")
    assert "transcribe" in run_cli("--help").stdout


def test_quantize_says_what_it_does_and_what_it_wrote(ckpt_untied, tmp_path):
    """`quantize --help` describes the command; a run says where the folder is, its size and how to use it."""
    help_text = run_cli_here("quantize", "--help").stdout
    assert "Write a copy of a Qwen3-ASR model folder whose text decoder is stored as 8-bit" in help_text
    assert "choose it on the Model page" in help_text and "int4: smallest" in help_text
    out = tmp_path / "int4"
    proc = run_cli_here("quantize", "--model", ckpt_untied, "--variant", "int4", "--out", out)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == f"Wrote the int4 model to {out}"
    size = sum(p.stat().st_size for p in out.glob("*.safetensors"))
    source = sum(p.stat().st_size for p in Path(ckpt_untied).glob("*.safetensors"))
    shown = re.fullmatch(r"  weights: ([\d.]+) (kB|MB|GB) \((\d+)% of the source's ([\d.]+) (kB|MB|GB)\)", lines[1])
    assert shown is not None, lines[1]
    scale = {"kB": 1e3, "MB": 1e6, "GB": 1e9}
    assert float(shown[1]) * scale[shown[2]] == pytest.approx(size, rel=0.01)
    assert float(shown[4]) * scale[shown[5]] == pytest.approx(source, rel=0.01)
    assert int(shown[3]) == round(100 * size / source) < 100
    assert lines[2] == (
        f"  use it: choose this folder on the Model page, or `dictation transcribe --model {out} FILE.wav`"
    )
    assert proc.stderr == ""  # no progress bar when stderr is not a terminal


def test_an_adapter_whose_pattern_never_finishes_is_one_error_not_a_hang(
    ckpt_untied, speech_wav, tmp_path, short_pattern_deadline
):
    """target_modules "(.*)*X" hung `dictation transcribe` for ever; now it is refused
    before the model loads, within the matcher's deadline."""
    import time

    from tests.asr.test_lora import write_adapter

    adapter = write_adapter(tmp_path / "hangs", target_modules="(.*)*X")
    t0 = time.monotonic()
    proc = run_cli_here("transcribe", speech_wav, "--model", ckpt_untied, "--adapter", adapter)
    assert time.monotonic() - t0 < 120
    assert_one_line_error(
        proc, f"{adapter / 'adapter_config.json'}: its regular expressions did not finish matching", "'(.*)*X'"
    )
