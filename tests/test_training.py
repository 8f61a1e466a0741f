"""dictation/training.py: the public API the app's "Personalise" action calls: samples from
the corrected history entries, the held-out split, WER/CER, and a run that is cancelled and resumed."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors import safe_open

from dictation.asr.errors import AsrError
from dictation.audio.wav import write_wav
from dictation.config.history import History
from dictation.training import (
    Score,
    TrainingCancelled,
    TrainingError,
    TrainOptions,
    edit_distance,
    normalise,
    samples_from_history,
    score,
    split,
    train_adapter,
)
from tests.oracle import synth_audio
from tests.test_cli_train import training_checkpoint

# torch on one thread (tests/conftest.py: one_torch_thread)
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_scores_are_corpus_wer_and_cer_of_normalised_texts():
    assert normalise("  Hello, WORLD!  It's\tme. ") == "hello world it s me"
    assert edit_distance("kitten", "sitting") == 3 and edit_distance([], ["a"]) == 1
    s = score(["Hello world.", "One two three four"], ["hello, world", "one two tree"])
    assert s.clips == 2
    assert s.wer == pytest.approx(2 / 6)  # "tree" for "three", "four" dropped
    assert s.cer == pytest.approx(5 / 25)  # one "h" and the four letters of "four"
    assert str(Score(0.25, 0.125, 1)) == "WER 25.0%, CER 12.5% on 1 held-out clip"


def test_split_is_seeded_and_keeps_something_to_train_on():
    train, held = split(10, 0.2, seed=3)
    assert len(held) == 2 and sorted(train + held) == list(range(10))
    assert split(10, 0.2, seed=3) == (train, held) and split(10, 0.2, seed=4) != (train, held)
    assert split(3, 0.01, seed=0)[1] != [] and split(3, 0.0, seed=0) == ([0, 1, 2], [])
    with pytest.raises(TrainingError, match="too few to hold 1 out"):
        split(1, 0.5, seed=0)
    with pytest.raises(TrainingError, match="below 1"):
        split(4, 1.0, seed=0)


def test_samples_from_history_are_the_corrected_entries_with_their_recordings(tmp_path):
    path = tmp_path / "history.sqlite3"
    with pytest.raises(TrainingError, match=f"{path}: no dictation history yet"):
        samples_from_history(path)
    assert not path.exists()  # looking did not create one
    rec = tmp_path / "rec"
    rec.mkdir()
    with History(path) as history:
        ids = []
        for i, language in enumerate(["English", "de", None, "Klingon", None]):
            write_wav(rec / f"{i}.wav", synth_audio(0.5, seed=i), 16000)
            ids.append(history.add(f"model {i}", language=language, audio_path=rec / f"{i}.wav", outcome="typed"))
        ids.append(history.add("no recording", outcome="typed"))
        with pytest.raises(TrainingError, match="no corrected dictations yet; correct some transcripts"):
            samples_from_history(path)
        write_wav(rec / "long.wav", np.full(31 * 16000, 0.01, dtype=np.float32), 16000)
        long_id = history.add("a long one", audio_path=rec / "long.wav", outcome="typed")
        history.correct(long_id, "A long dictation.")  # longer than a training clip: left out
        (rec / "bad.wav").write_bytes(b"RIFF nonsense")
        bad_id = history.add("unreadable", audio_path=rec / "bad.wav", outcome="typed")
        history.correct(bad_id, "Unreadable.")  # left out
        with pytest.raises(TrainingError, match="no corrected dictation has a usable recording"):
            samples_from_history(path)
        for i, entry_id in enumerate(ids):
            if i != 4:  # entry 4 is left as the model wrote it
                history.correct(entry_id, f"Corrected {i}." + ("<asr_text>" if i == 1 else ""))
    (rec / "2.wav").unlink()  # its recording is gone: skipped
    samples = samples_from_history(path)
    assert [(s.source, s.target, s.audio) for s in samples] == [
        (f"history entry {ids[3]}", "language None<asr_text>Corrected 3.", rec / "3.wav"),  # unknown language
        (f"history entry {ids[1]}", "language German<asr_text>Corrected 1.", rec / "1.wav"),
        (f"history entry {ids[0]}", "language English<asr_text>Corrected 0.", rec / "0.wav"),
    ]
    assert samples[0].text == "Corrected 3."


def test_a_cancelled_run_resumes_to_the_adapter_of_an_uninterrupted_one(ckpt_root, tmp_path):
    """Through the API the app calls: should_stop keeps the checkpoint, resume gives the same tensors,
    progress says the steps and the time left (the held-out scores: test_cli_train's report test)."""
    from dictation.asr.tune.data import make_sample

    ckpt = training_checkpoint(ckpt_root)
    samples = []
    for i in range(3):
        write_wav(tmp_path / f"{i}.wav", synth_audio(1.0, seed=60 + i), 16000)
        samples.append(make_sample(tmp_path / f"{i}.wav", f"Clip number {i}.", "English", f"clip {i}"))
    options = TrainOptions(steps=5, rank=2, alpha=4, bits=4, save_every=2)
    whole = train_adapter(str(ckpt), samples, tmp_path / "whole", options, device="cpu")
    assert (whole.train_clips, whole.val_clips, whole.steps, whole.bits) == (3, 0, 5, 4)
    assert whole.before is None and whole.after is None
    assert 4.12 < whole.base_bits_per_parameter < 4.2 and whole.tokens_per_s > 0 and len(whole.losses) == 5

    out, seen, statuses = tmp_path / "adapter", [], []
    with pytest.raises(TrainingCancelled, match="step 4 of 5; its checkpoint is kept"):
        train_adapter(str(ckpt), samples, out, options, device="cpu", on_progress=seen.append,
                      on_status=statuses.append, should_stop=lambda: len(seen) == 3)  # fmt: skip
    assert [p.step for p in seen] == [1, 2, 3] and all(p.steps == 5 and p.seconds_left >= 0 for p in seen)
    assert statuses == ["training on 3 clips"]
    assert not out.exists() and (tmp_path / ".adapter.training" / "checkpoint.safetensors").is_file()
    with pytest.raises(TrainingError, match="made from other data or settings"):
        train_adapter(str(ckpt), samples[:2], out, options, device="cpu", resume=True)
    seen.clear()
    report = train_adapter(str(ckpt), samples, out, options, device="cpu", resume=True, on_progress=seen.append)
    assert [p.step for p in seen] == [4, 5] and report.steps == 5 and report.losses == whole.losses
    assert not (tmp_path / ".adapter.training").exists()
    with (
        safe_open(str(whole.out / "adapter_model.safetensors"), "pt") as a,
        safe_open(str(out / "adapter_model.safetensors"), "pt") as b,
    ):
        assert set(a.keys()) == set(b.keys())
        for key in a.keys():  # noqa: SIM118
            assert torch.equal(a.get_tensor(key), b.get_tensor(key)), key


def test_engine_errors_reach_the_caller_as_training_errors(ckpt_root, tmp_path):
    ckpt = training_checkpoint(ckpt_root)
    write_wav(tmp_path / "a.wav", synth_audio(0.5, seed=1), 16000)
    from dictation.asr.tune.data import make_sample

    samples = [make_sample(tmp_path / "a.wav", "Hi.", None, "clip a")]
    with pytest.raises(TrainingError, match="no such folder"):
        train_adapter(str(tmp_path / "nowhere"), samples, tmp_path / "o", TrainOptions(steps=1), device="cpu")
    with pytest.raises(TrainingError, match="rank and batch size must be positive"):
        train_adapter(str(ckpt), samples, tmp_path / "o", TrainOptions(rank=0), device="cpu")
    assert issubclass(TrainingError, AsrError) and issubclass(TrainingCancelled, AsrError)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.wav"]


def test_stopping_while_scoring_the_held_out_clips(ckpt_stops, tmp_path):
    """Before training: TrainingCancelled and nothing written; after it: the adapter stays, unscored.

    On the checkpoint that ends its transcripts after a few tokens: what is checked is where the run
    stops, not what is learnt, and the training checkpoint, which never stops by itself, spent most of
    this test generating the held-out transcripts' full token budget."""
    from dictation.asr.tune.data import make_sample

    ckpt = ckpt_stops
    samples = []
    for i in range(4):  # three held out: the fewest that are scored
        write_wav(tmp_path / f"{i}.wav", synth_audio(0.5, seed=70 + i), 16000)
        samples.append(make_sample(tmp_path / f"{i}.wav", f"Clip {i}.", None, f"clip {i}"))
    options = TrainOptions(steps=1, rank=2, bits=16)
    with pytest.raises(TrainingCancelled, match="before it began; nothing was written"):
        train_adapter(str(ckpt), samples, tmp_path / "a", options, device="cpu", val=0.75, should_stop=lambda: True)
    assert not (tmp_path / "a").exists() and not (tmp_path / ".a.training").exists()
    statuses = []

    def scoring_the_adapter():
        return "with the adapter" in statuses[-1]

    report = train_adapter(str(ckpt), samples, tmp_path / "b", options, device="cpu", val=0.75,
                           on_status=statuses.append, should_stop=scoring_the_adapter)  # fmt: skip
    assert report.before is not None and report.after is None and (tmp_path / "b" / "adapter_config.json").is_file()
    assert statuses[-1] == "scoring the adapter cancelled; the adapter is kept"


def test_fewer_than_three_held_out_clips_are_trained_on_and_give_no_figures(ckpt_root, tmp_path):
    """A figure on one or two clips is noise ("WER 960.0% on 1 held-out clip"): none is given, the
    report says why, and those clips are trained on instead of being set aside for nothing."""
    from dictation.asr.tune.data import make_sample
    from dictation.training import MIN_HELD_OUT

    ckpt = training_checkpoint(ckpt_root)
    samples = []
    for i in range(3):
        write_wav(tmp_path / f"{i}.wav", synth_audio(0.5, seed=80 + i), 16000)
        samples.append(make_sample(tmp_path / f"{i}.wav", f"Clip {i}.", None, f"clip {i}"))
    assert len(split(3, 0.5, seed=0)[1]) == 2 < MIN_HELD_OUT == 3
    statuses = []
    report = train_adapter(str(ckpt), samples, tmp_path / "a", TrainOptions(steps=1, rank=2, bits=16), device="cpu",
                           val=0.5, on_status=statuses.append)  # fmt: skip
    assert (report.before, report.after, report.val_clips, report.train_clips) == (None, None, 0, 3)
    why = "no WER/CER: 2 held-out clips would give no meaningful figure (it takes 3), so all 3 clips were trained on"
    assert report.unscored == why
    assert statuses == [why, "training on 3 clips"]  # nothing transcribed
