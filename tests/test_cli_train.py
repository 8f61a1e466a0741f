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


def test_score_counts_word_and_character_errors():
    from dictation.training import normalise, score, split

    assert normalise("  Hello,   WORLD! ") == "hello world"
    s = score(["Hello world.", "Kubernetes pods"], ["hello word", "Kubernetes pods"])
    assert (s.wer, s.clips) == (1 / 4, 2)  # one substituted word of four
    assert s.cer == 1 / len("helloworldkubernetespods")  # one deleted character
    assert str(score(["a b"], ["a b"])) == "WER 0.0%, CER 0.0% on 1 held-out clip"
    train, held = split(10, 0.2, seed=0)
    assert len(held) == 2 and sorted(train + held) == list(range(10)) and split(10, 0.2, seed=0) == (train, held)
    assert split(3, 0.01, seed=0)[1] and split(3, 0.0, seed=0)[1] == []


def _corrected_history(home, tmp_path, texts):
    from dictation.config.history import History, Outcome

    (home / "data").mkdir(parents=True, exist_ok=True)
    with History(home / "data" / "history.sqlite3") as history:
        for i, text in enumerate(texts):
            audio = tmp_path / f"rec-{i}.wav"
            write_wav(audio, synth_audio(1.5, seed=10 + i), 16000)
            entry = history.add("model words", language="English", audio_path=audio, outcome=Outcome.PASTED)
            history.correct(entry, text)
        history.add("never corrected", audio_path=tmp_path / "rec-x.wav", outcome=Outcome.PASTED)


def test_from_history_with_a_held_out_share_prints_the_engines_scores(ckpt_untied, tmp_path):
    """--from-history trains on the corrected entries; --val holds one out and the WER/CER printed
    before and after are those of the engine's own transcripts of it, without and with the adapter."""
    from dictation.asr import AsrEngine, EngineOptions
    from dictation.training import samples_from_history, score, split

    home = tmp_path / "home"
    texts = ["Hello world.", "Personal words like Kubernetes.", "Ship it on Friday."]
    _corrected_history(home, tmp_path, texts)
    env = {"DICTATION_HOME": str(home)}
    out = tmp_path / "adapter"
    proc = run_cli(
        "train-adapter", "--model", ckpt_untied, "--from-history", "--out", out, "--bits", "16", "--steps", "4",
        "--rank", "2", "--val", "0.3", "--device", "cpu", env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "4 steps on 2 clips" in proc.stdout
    samples = samples_from_history(home / "data" / "history.sqlite3")
    assert [s.text for s in samples] == texts[::-1] and samples[0].target.startswith("language English<asr_text>")
    (held,) = split(3, 0.3, seed=0)[1]
    clip = samples[held]
    for label, adapters in (("Before:", []), ("After: ", [str(out)])):
        engine = AsrEngine(EngineOptions(model=str(ckpt_untied), device="cpu", adapters=adapters))
        expected = score([clip.text], [engine.transcribe(clip.audio).text])
        assert f"{label} {expected}" in proc.stdout


def test_from_history_without_corrections_or_recordings_is_one_error(ckpt_untied, tmp_path):
    from dictation.config.history import History

    home = tmp_path / "home"
    out = tmp_path / "adapter"
    args = ("train-adapter", "--model", ckpt_untied, "--from-history", "--out", out, "--steps", "2")
    proc = run_cli(*args, env={"DICTATION_HOME": str(home)})
    assert proc.returncode == 1 and "no dictation history yet" in proc.stderr and not out.exists()
    _corrected_history(home, tmp_path, ["Hello."])
    (tmp_path / "rec-0.wav").unlink()  # the recording is gone
    proc = run_cli(*args, env={"DICTATION_HOME": str(home)})
    assert proc.returncode == 1 and not out.exists()
    assert "no corrected dictation has its recording any more" in proc.stderr.strip().splitlines()[-1]
    with History(home / "data" / "history.sqlite3") as history:
        assert len(history.corrected_entries()) == 1  # nothing in the history changed
