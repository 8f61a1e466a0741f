"""``dictation train-adapter`` end to end on a tiny random checkpoint.

The checkpoint (``ckpt``) differs from the default tiny one in two ways, both for what training needs:

* its head lets the tokens of the two texts, ``<asr_text>``, ``language`` and ``<|im_end|>`` win the
  argmax (``extra_active``): the default head lets only 3000 random tokens win (rows of std 1, the
  rest 0.02), and LoRA on the decoder's projections cannot lift a row of std 0.02 above them. A real
  model's head can say every token; what the adapter must learn is nowhere in this base model, which
  says something else;
* its per-head q/k norm gain is 1 (the value Qwen3 initialises these norms to) instead of 4. The gain
  of 4 makes the default checkpoint's attention sharp, so sensitive that NF4's ~9 % weight error moves
  its logits far more than a trained model's (NF4 base against the float base, teacher-forced on the
  training clips: logit cosine 0.90, against 0.98 with gain 1): an adapter trained on its NF4 base
  reached margins of 11.6 there and -1.3 / -3.9 on the float base (gain 2: +3.7 / +3.9; gain 1:
  +6.6 / +7.7). QLoRA's promise, which this test holds us to, is about models whose outputs survive
  NF4.
"""

from __future__ import annotations

import json
import re

import pytest
import torch

from dictation import cli
from dictation.audio.wav import load_audio_16k, write_wav
from tests.oracle import synth_audio
from tests.oracle.checkpoints import EOS_IDS, cached_checkpoint

# torch on one thread (tests/conftest.py: one_torch_thread)
pytestmark = pytest.mark.usefixtures("one_torch_thread")


TEXTS = ["Hello Anna, the meeting moves to Tuesday.", "Kubernetes pods restart nightly."]
LINES = [f"language English<asr_text>{TEXTS[0]}", f"language None<asr_text>{TEXTS[1]}"]


def training_checkpoint(root):
    """The tiny checkpoint that can learn ``LINES`` (module docstring)."""
    from dictation.asr.text.prompt import PromptBuilder

    prompt = PromptBuilder.from_folder(cached_checkpoint(root, tie_word_embeddings=False))
    active = sorted({t for line in LINES for t in prompt.encode(line)} | {prompt.special.im_end})
    return cached_checkpoint(root, tie_word_embeddings=False, extra_active=tuple(active), qk_norm_gain=1.0)


@pytest.fixture(scope="module")
def ckpt(ckpt_root):
    return training_checkpoint(ckpt_root)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("clips")
    for i in range(2):
        write_wav(folder / f"clip{i}.wav", synth_audio(1.0 + 0.5 * i, seed=40 + i), 16000)
    path = folder / "train.jsonl"
    path.write_text("".join(json.dumps({"audio": f"clip{i}.wav", "text": LINES[i]}) + "\n" for i in range(2)))
    return path


def run(capsys, *argv):
    code = cli.main(list(map(str, argv)))
    out, err = capsys.readouterr()
    return code, out, err


def transcribe(capsys, ckpt, clips, *adapters):
    extra = [a for adapter in adapters for a in ("--adapter", adapter)]
    code, out, err = run(capsys, "transcribe", "--model", ckpt, "--device", "cpu", "--dtype", "fp32",
                         "--max-new-tokens", "24", "--json", *extra, *clips)  # fmt: skip
    assert code == 0, err
    return [json.loads(line) for line in out.splitlines()]


@pytest.fixture(scope="module")
def adapters(ckpt, data, tmp_path_factory):
    """bits -> adapter folder, trained once per module with rank 8 and 100 steps (the rest default).
    Both texts come out exactly from 60 steps on (40 do not): 100 leave room for other CPUs' rounding,
    in half the time of the 200 this took before."""
    root = tmp_path_factory.mktemp("adapters")
    made = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one_torch_thread's setting (tests/conftest.py): a module fixture comes before it
    try:
        for bits in (16, 4):
            out = root / f"bits{bits}"
            code = cli.main(["train-adapter", "--model", str(ckpt), "--data", str(data), "--out", str(out),
                             "--steps", "100", "--rank", "8", "--bits", str(bits), "--device", "cpu"])  # fmt: skip
            assert code == 0
            made[bits] = out
    finally:
        torch.set_num_threads(threads)
    return made


@pytest.mark.parametrize("bits", [16, 4])
def test_two_clips_are_learnt_exactly_and_carry_over_to_the_full_precision_base(capsys, ckpt, data, adapters, bits):
    clips = [data.parent / "clip0.wav", data.parent / "clip1.wav"]
    before = transcribe(capsys, ckpt, clips)
    assert all(r["text"] != text for r, text in zip(before, TEXTS, strict=True))
    after = transcribe(capsys, ckpt, clips, adapters[bits])
    assert [r["text"] for r in after] == TEXTS
    folder = adapters[bits]
    assert sorted(p.name for p in folder.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    assert folder.stat().st_mode & 0o777 == 0o700
    assert not (folder.parent / f".{folder.name}.training").exists()  # the work folder went with success


def test_real_peft_on_the_official_model_gives_our_ids_and_merged_equals_unmerged(capsys, ckpt, data, adapters,
                                                                                  tmp_path):  # fmt: skip
    from peft import PeftModel

    from tests.oracle.official import OfficialOracle

    clip = data.parent / "clip0.wav"
    ours = transcribe(capsys, ckpt, [clip], adapters[4])[0]["token_ids"]
    oracle = OfficialOracle(ckpt)
    oracle.model = PeftModel.from_pretrained(oracle.model, str(adapters[4]))
    oracle.model.eval()
    theirs = oracle.greedy_ids(load_audio_16k(clip), max_new_tokens=24)
    assert [t for t in theirs if t not in EOS_IDS] == ours
    merged = tmp_path / "merged"
    code, _, err = run(capsys, "merge-lora", "--model", ckpt, "--adapter", adapters[4], "--out", merged)
    assert code == 0, err
    assert transcribe(capsys, merged, [clip])[0]["token_ids"] == ours


def test_the_report_names_bits_per_parameter_and_the_held_out_scores(capsys, ckpt_stops, tmp_path):
    # the checkpoint that ends its transcripts after a few tokens: the report's figures are compared
    # with the engine's own transcripts, whatever they say, and the training checkpoint, which never
    # stops by itself, spent most of this test generating twelve transcripts' full token budget
    ckpt = ckpt_stops
    for i in range(4):  # three held out (the fewest that give figures), one trained on
        write_wav(tmp_path / f"clip{i}.wav", synth_audio(1.0 + 0.25 * i, seed=40 + i), 16000)
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"audio": f"clip{i}.wav", "text": LINES[i % 2]}) + "\n" for i in range(4)))
    out = tmp_path / "adapter"
    code, stdout, err = run(capsys, "train-adapter", "--model", ckpt, "--data", data, "--out", out, "--epochs", "2",
                            "--batch-size", "1", "--rank", "2", "--val", "0.75", "--device", "cpu")  # fmt: skip
    assert code == 0, err
    assert "2 steps on 1 clips" in stdout  # three clips held out: two epochs of the other
    assert re.search(r"base: NF4, 4\.1\d\d bits per parameter", stdout)  # 4.127 + the offset's 32 bits per layer
    assert "step 2/2  loss" in err and "transcribing 3 held-out clips without the adapter" in err
    # the figures are those of the engine's own transcripts of the held-out clips, without and with it
    from dictation.asr import AsrEngine, EngineOptions
    from dictation.training import score, split

    held = split(4, 0.75, seed=0)[1]
    clips, texts = [load_audio_16k(tmp_path / f"clip{i}.wav") for i in held], [TEXTS[i % 2] for i in held]
    expected = []
    for adapters in ([], [str(out)]):
        engine = AsrEngine(EngineOptions(model=str(ckpt), device="cpu", adapters=adapters))
        expected.append(score(texts, [engine.transcribe(clip).text for clip in clips]))
    assert f"held out: before {expected[0]}; after {expected[1]}" in stdout


def test_one_held_out_clip_gives_no_figure_and_the_report_says_why(capsys, ckpt, data, tmp_path):
    """One clip's WER said "960.0%": fewer than three held out are trained on, and no figure is given."""
    out = tmp_path / "adapter"
    code, stdout, err = run(capsys, "train-adapter", "--model", ckpt, "--data", data, "--out", out, "--steps", "1",
                            "--rank", "2", "--bits", "16", "--val", "0.5", "--device", "cpu")  # fmt: skip
    assert code == 0, err
    assert "1 steps on 2 clips" in stdout and "before" not in stdout and "transcribing" not in err
    assert (
        "  held out: no WER/CER: 1 held-out clip would give no meaningful figure (it takes 3), "
        "so all 2 clips were trained on\n"
    ) in stdout


def test_from_history_trains_on_the_corrected_dictations(capsys, ckpt, tmp_path, monkeypatch):
    from dictation.config.history import History, default_path

    monkeypatch.setenv("DICTATION_HOME", str(tmp_path / "home"))
    out = tmp_path / "adapter"
    code, _, err = run(capsys, "train-adapter", "--model", ckpt, "--from-history", "--out", out, "--steps", "1")
    assert code == 1 and err == f"dictation: error: {default_path()}: no dictation history yet\n"
    recordings = tmp_path / "home" / "recordings"
    recordings.mkdir(parents=True)
    with History(default_path()) as history:
        for i in (1, 2, 3):  # the entries' ids
            write_wav(recordings / f"{i}.wav", synth_audio(1.0, seed=i), 16000)
            history.add(f"model text {i}", language="English", audio_path=recordings / f"{i}.wav", outcome="typed")
        code, _, err = run(capsys, "train-adapter", "--model", ckpt, "--from-history", "--out", out, "--steps", "1")
        assert code == 1 and "no corrected dictations yet" in err
        history.correct(1, "Kubernetes pods.")
        history.correct(3, "Hello Anna.")
        (recordings / "3.wav").unlink()  # pruned or deleted by the user: skipped
    code, stdout, err = run(capsys, "train-adapter", "--model", ckpt, "--from-history", "--out", out,
                            "--steps", "2", "--rank", "2", "--bits", "16", "--device", "cpu")  # fmt: skip
    assert code == 0, err
    assert "2 steps on 1 clips" in stdout and out.is_dir()
    assert "  held out: none, so no WER/CER can be given yet (--val: it takes 3 held-out clips)\n" in stdout
    with History(default_path()) as history:  # training changed nothing in the history
        assert [(e.id, e.text, e.corrected) for e in history.corrected_entries()] == [
            (3, "Hello Anna.", True),
            (1, "Kubernetes pods.", True),
        ]


def test_errors_are_one_line_naming_the_file_and_nothing_is_written(capsys, ckpt, data, tmp_path):
    out = tmp_path / "adapter"
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"audio": "missing.wav", "text": "Hello."}) + "\n")
    code, _, err = run(capsys, "train-adapter", "--model", ckpt, "--data", bad, "--out", out)
    assert code == 1 and err == f"dictation: error: {bad}:1: audio file {tmp_path / 'missing.wav'} does not exist\n"
    bad.write_text(json.dumps({"audio": str(data.parent / "clip0.wav"), "text": "language English<asr_text>"}) + "\n")
    code, _, err = run(capsys, "train-adapter", "--model", ckpt, "--data", bad, "--out", out)
    assert code == 1 and err == f"dictation: error: {bad}:1: empty text\n"
    code, _, err = run(capsys, "train-adapter", "--model", tmp_path, "--data", data, "--out", out)
    assert code == 1 and str(tmp_path) in err and err.count("\n") == 1
    code, _, err = run(capsys, "train-adapter", "--model", ckpt, "--data", data, "--out", out, "--targets", "fc1")
    assert code == 1 and "unknown LoRA targets fc1" in err and err.count("\n") == 1
    code, _, err = run(capsys, "train-adapter", "--model", ckpt, "--data", data, "--out", out, "--val", "0.9")
    assert code == 1 and "too few to hold 2 out" in err
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    code, _, err = run(capsys, "train-adapter", "--model", ckpt, "--data", data, "--out", out, "--steps", "1")
    assert code == 1 and "already exists" in err and (out / "keep.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adapter", "bad.jsonl"]


def test_lora_alone_changes_nothing_before_training(ckpt):
    """B starts at zero: the wrapped model computes what the base computes."""
    from dictation.asr.checkpoints.safetensors import load_model
    from dictation.asr.config import AsrConfig
    from dictation.asr.tune.lora_forward import add_lora
    from dictation.asr.tune.train import TrainOptions

    cfg = AsrConfig.from_file(ckpt / "config.json")
    model = load_model(ckpt, cfg, torch.device("cpu"), torch.float32)
    x = torch.randn(1, 3, cfg.text.hidden_size)
    before = model.decoder.layers[0].mlp.up_proj(x)
    add_lora(model, TrainOptions(rank=4))
    torch.testing.assert_close(model.decoder.layers[0].mlp.up_proj(x), before)


def test_ctrl_c_keeps_a_checkpoint_and_resume_finishes_the_run(ckpt, data, tmp_path):
    """A real process: SIGINT after the first step stops training with a checkpoint; --resume ends it."""
    import os
    import signal
    import subprocess
    import sys

    out = tmp_path / "adapter"
    argv = [sys.executable, "-m", "dictation", "train-adapter", "--model", str(ckpt), "--data", str(data),
            "--out", str(out), "--steps", "16", "--rank", "2", "--bits", "16", "--device", "cpu"]  # fmt: skip
    # 16 steps: the signal goes the moment step 1 is reported, fifteen steps before the run could end by
    # itself; the resume runs the rest to the end
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}  # one thread: one_torch_thread
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    lines = []
    for line in proc.stderr:
        lines.append(line)
        if line.startswith("step 1/16"):
            proc.send_signal(signal.SIGINT)
            break
    _, rest = proc.communicate(timeout=120)
    err = "".join(lines) + rest
    assert proc.returncode == 1, err
    assert re.search(r"error: training cancelled at step \d+ of 16; its checkpoint is kept .*--resume goes on", err)
    assert not out.exists() and (tmp_path / ".adapter.training" / "checkpoint.safetensors").is_file()
    done = subprocess.run([*argv, "--resume"], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "16 steps" in done.stdout and "step 16/16" in done.stderr and "step 1/16" not in done.stderr
    assert out.is_dir() and not (tmp_path / ".adapter.training").exists()
