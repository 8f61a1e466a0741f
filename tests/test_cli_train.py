"""`dictation train-adapter` (issue 18): the overfit check through the command line, and its errors."""

from __future__ import annotations

import json

from dictation.audio.wav import load_audio_16k, write_wav
from tests.oracle import synth_audio
from tests.test_cli import run_cli

TEXTS = ("Hello world.", "Personal words like Kubernetes.")


def _data(tmp_path):
    lines = []
    for i, text in enumerate(TEXTS):
        write_wav(tmp_path / f"clip{i}.wav", synth_audio(1.5, seed=i), 16000)
        lines.append(json.dumps({"audio": f"clip{i}.wav", "text": f"language English<asr_text>{text}"}))
    data = tmp_path / "train.jsonl"
    data.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return data


def test_overfit_two_clips_then_transcribe_says_their_texts(ckpt_untied, tmp_path):
    """Rank 16 on the decoder and the head (the tiny checkpoint's head lets only ~3000 ordinary tokens win:
    "<asr_text>", "language" and <|im_end|> are reachable through a head adapter only), float base."""
    from dictation.asr import AsrEngine, EngineOptions

    out = tmp_path / "adapter"
    proc = run_cli(
        "train-adapter", "--model", ckpt_untied, "--data", _data(tmp_path), "--out", out, "--bits", "16",
        "--steps", "200", "--rank", "16", "--alpha", "32", "--lr", "3e-3", "--batch-size", "2",
        "--targets", "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj,lm_head",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "Wrote the adapter" in proc.stdout and "step 200/200" in proc.stderr
    engine = AsrEngine(EngineOptions(model=str(ckpt_untied), device="cpu", dtype="fp32", adapters=[str(out)]))
    base = AsrEngine(EngineOptions(model=str(ckpt_untied), device="cpu", dtype="fp32", max_new_tokens=12))
    for i, text in enumerate(TEXTS):
        audio = load_audio_16k(tmp_path / f"clip{i}.wav")
        assert engine.transcribe(audio).text == text
        assert base.transcribe(audio).text != text


def test_errors_name_the_line_and_write_nothing(ckpt_untied, tmp_path):
    data = tmp_path / "bad.jsonl"
    write_wav(tmp_path / "a.wav", synth_audio(0.5, seed=1), 16000)
    data.write_text('{"audio": "a.wav", "text": "ok"}\n{"audio": "gone.wav", "text": "x"}\n', encoding="utf-8")
    out = tmp_path / "adapter"
    proc = run_cli("train-adapter", "--model", ckpt_untied, "--data", data, "--out", out, "--steps", "2")
    assert proc.returncode == 1
    assert f"{data}:2" in proc.stderr and "gone.wav does not exist" in proc.stderr
    assert not out.exists()
    data.write_text('{"audio": "a.wav", "text": "ok"}\n', encoding="utf-8")
    not_a_model = tmp_path / "empty"
    not_a_model.mkdir()
    proc = run_cli("train-adapter", "--model", not_a_model, "--data", data, "--out", out)
    assert proc.returncode == 1 and str(not_a_model) in proc.stderr and not out.exists()
