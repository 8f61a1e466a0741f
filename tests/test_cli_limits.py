"""`dictation transcribe` within the engine's limits: bad devices, token budgets and
contexts are one error line, a budget beyond the audio is lowered with a warning, and a long
file shows its progress on stderr."""

from __future__ import annotations

import json

import pytest

from dictation import cli
from dictation.asr import limits
from dictation.asr.decode import longform
from dictation.asr.decode.pipeline import Progress
from dictation.audio.wav import write_wav
from dictation.cli import engine_commands
from dictation.cli.terminal import TranscribeProgress
from tests.oracle import synth_audio
from tests.test_cli import assert_one_line_error, run_cli_here


@pytest.fixture(scope="module")
def speech_wav(tmp_path_factory):
    path = tmp_path_factory.mktemp("wav") / "speech.wav"
    write_wav(path, synth_audio(2.5, seed=31), 16000)
    return path


@pytest.mark.parametrize("device", ["tpu:7", "gpu", ""])
def test_a_bad_device_is_one_error_line(ckpt_untied, speech_wav, device):
    proc = run_cli_here("transcribe", speech_wav, "--model", ckpt_untied, "--device", device)
    assert_one_line_error(proc, f"unknown device {device!r}; choose auto, cpu, cuda, cuda:N or mps")


def test_an_absurd_token_budget_is_refused_before_the_model_loads(ckpt_untied, speech_wav):
    proc = run_cli_here("transcribe", speech_wav, "--model", ckpt_untied, "--max-new-tokens", "1000000000")
    assert_one_line_error(proc, "--max-new-tokens: the token budget must be between 1 and 36,064")
    assert_one_line_error(
        run_cli_here("transcribe", speech_wav, "--model", ckpt_untied, "--max-new-tokens", "0"), "not 0"
    )


def test_a_context_over_the_settings_cap_is_refused(ckpt_untied, speech_wav):
    proc = run_cli_here("transcribe", speech_wav, "--model", ckpt_untied, "--context", "x" * 100_000)
    assert_one_line_error(proc, "--context: the context is 100,000 characters long, more than the 20,000 allowed")


def test_a_budget_beyond_the_audio_is_lowered_with_a_warning(ckpt_untied, speech_wav):
    proc = run_cli_here(
        "transcribe", speech_wav, "--model", ckpt_untied, "--device", "cpu", "--max-new-tokens", "5000", "--json"
    )
    assert proc.returncode == 0, proc.stderr
    most = limits.max_new_tokens_for(2.5)
    assert proc.stderr.splitlines()[0] == (
        f"dictation: warning: {speech_wav}: --max-new-tokens 5000 is more than 2.5 s of audio can need; "
        f"using at most {most} tokens a pass (30 a second)"
    )
    row = json.loads(proc.stdout)
    assert len(row["token_ids"]) == most and row["truncated"]  # the test model never ends its text


def test_a_long_file_shows_its_progress(ckpt_untied, tmp_path, monkeypatch, capsys):
    long_wav = tmp_path / "long.wav"
    write_wav(long_wav, synth_audio(13.0, seed=21), 16000)
    monkeypatch.setattr(longform, "MAX_PASS_SECONDS", 5.0)
    monkeypatch.setattr(engine_commands, "PROGRESS_SECONDS", 10.0)
    args = ["transcribe", str(long_wav), "--model", str(ckpt_untied), "--device", "cpu", "--max-new-tokens", "3"]
    assert cli.main(args) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith(f"{long_wav}: ")]
    n = len(lines) - 1
    assert n >= 3 and lines[0] == f"{long_wav}: 0:00 of 0:13 (0%), transcribing in {n} passes"
    assert [line.split(", ")[1] for line in lines[1:]] == [f"pass {i}/{n}" for i in range(1, n + 1)]
    assert all(line.endswith(" left") for line in lines[1:-1])
    assert lines[-1].startswith(f"{long_wav}: 0:13 of 0:13 (100%)")
    write_wav(short := tmp_path / "short.wav", synth_audio(2.0, seed=3), 16000)
    assert cli.main([*args[:1], str(short), *args[2:]]) == 0
    assert f"{short}: " not in capsys.readouterr().err  # a short file: no progress lines


def test_the_time_left_is_the_pace_so_far(monkeypatch, capsys):
    now = [100.0]
    bar = TranscribeProgress("talk.wav")
    bar.clock = lambda: now[0]
    bar.update(Progress(0.0, 7200.0, 0, 6, ""))
    now[0] += 150.0  # the first 20 minutes took 2.5 minutes: 100 minutes of audio are 12.5 minutes more
    bar.update(Progress(1200.0, 7200.0, 1, 6, "..."))
    assert capsys.readouterr().err.splitlines() == [
        "talk.wav: 0:00 of 2:00:00 (0%), transcribing in 6 passes",
        "talk.wav: 20:00 of 2:00:00 (17%), pass 1/6, about 12:30 left",
    ]


def test_vocabulary_gives_the_model_the_apps_vocabulary_and_learned_words(ckpt_untied, speech_wav, tmp_path):
    """``--vocabulary``: the context is the app's (the user's text, the learned words), then ``--context``."""
    from dictation.config.settings import LearnedWord, Settings
    from dictation.config.store import SettingsStore

    home = tmp_path / "home"
    settings = Settings()
    learned = (LearnedWord(word="kubectl", heard="cube cuddle", dictated="2026-11-30T14:03:00+00:00", entry_id=3),)
    transcription = settings.transcription.replace(context="PySide6, Dr. Nguyen", learned_words=learned)
    SettingsStore(home / "config" / "settings.json").save(settings.replace(transcription=transcription))
    env = {"DICTATION_HOME": str(home)}

    def text(*args):
        proc = run_cli_here(
            "transcribe", speech_wav, "--model", ckpt_untied, "--max-new-tokens", "12", "--json", *args, env=env
        )
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)["text"]

    with_vocabulary = text("--vocabulary", "--context", "Helm")
    assert with_vocabulary == text("--context", "PySide6, Dr. Nguyen\nkubectl\nHelm")
    assert with_vocabulary != text("--context", "Helm")  # the app's vocabulary really reached the model
    too_long = run_cli_here(
        "transcribe", speech_wav, "--model", ckpt_untied, "--vocabulary", "--context", "x" * 19_990, env=env
    )
    assert_one_line_error(too_long, "--vocabulary with --context: the context is")
