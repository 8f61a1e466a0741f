"""LoRA training (tune/train.py and the modules it runs, tune/data.py): the training forward, the data
file, the exported PEFT folder as the engine loads it, determinism, cancel, and the NF4 base."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors import safe_open

from dictation.asr.checkpoints.safetensors import load_model
from dictation.asr.config import AsrConfig
from dictation.asr.errors import AdapterError
from dictation.asr.nn.features import LogMel
from dictation.asr.text.prompt import PromptBuilder
from dictation.asr.tune.adapter_files import read_adapter
from dictation.asr.tune.data import Example, read_examples
from dictation.asr.tune.lora_forward import add_lora, decoder_logits, example_loss, prepare
from dictation.asr.tune.nf4 import bits_per_parameter
from dictation.asr.tune.train import (
    TrainingCancelled,
    TrainOptions,
    train_adapter,
    train_lora,
    work_folder,
)
from dictation.audio.wav import load_audio_16k, write_wav
from tests.oracle import synth_audio

# torch on one thread (tests/conftest.py: one_torch_thread)
pytestmark = pytest.mark.usefixtures("one_torch_thread")

TEXTS = ("language English<asr_text>Hello world.", "language English<asr_text>Kubernetes pods.")


def _examples():
    return [Example(synth_audio(1.0, seed=i), t, f"x:{i}") for i, t in enumerate(TEXTS)]


def _load(folder):
    cfg = AsrConfig.from_file(folder / "config.json")
    model = load_model(folder, cfg, torch.device("cpu"), torch.float32)
    prompt = PromptBuilder.from_folder(folder, audio_token_id=cfg.special.audio_token_id)
    return model, prompt


def test_training_forward_matches_inference(ckpt_untied):
    model, prompt = _load(ckpt_untied)
    item = prepare(model, prompt, LogMel(model.cfg.audio.num_mel_bins), _examples()[0])
    s = item.embeds.shape[1]
    with torch.no_grad():
        ours = decoder_logits(model, item.embeds, 0)
    with torch.inference_mode():
        model.ensure_capacity(s)
        cos, sin = model._rope
        h = model.decoder(item.embeds, cos[:s], sin[:s], model.cache, 0, last_only=False)
        ref = (h @ model.output_weight.T).reshape(s, -1)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-4)
    assert item.labels[-1] == prompt.special.im_end and item.labels[2] == prompt.special.asr_text


def test_the_loss_scores_each_target_token_by_the_logits_that_predict_it(ckpt_untied):
    """Labels against logits: the training loss equals the cross-entropy of each target token under
    the inference path's next-token logits, teacher-forced (the prompt's last position predicts the
    first target token, each target token's position the one after it). Labels shifted by one
    position either way give another loss, which this test tells apart."""
    model, prompt = _load(ckpt_untied)
    example = _examples()[1]
    item = prepare(model, prompt, LogMel(model.cfg.audio.num_mel_bins), example)
    target = prompt.encode(example.target) + [prompt.special.im_end]
    assert item.labels.tolist() == target
    n_prompt = item.embeds.shape[1] - len(target)
    rows = [model.prefill(item.embeds[:, :n_prompt], len(target))]  # after the prompt: predicts target[0]
    for k, token in enumerate(target[:-1]):  # after target[: k + 1]: predicts target[k + 1]
        rows.append(model.step(torch.tensor([token]), n_prompt + k))
    logits = torch.stack(rows).float()
    per_token = F.cross_entropy(logits, torch.tensor(target), reduction="none")
    with torch.no_grad():
        ours = example_loss(model, item)
    torch.testing.assert_close(ours, per_token.mean(), rtol=1e-5, atol=1e-5)
    labels = torch.tensor(target)
    for shifted in (F.cross_entropy(logits[1:], labels[:-1]), F.cross_entropy(logits[:-1], labels[1:])):
        assert abs(float(shifted) - float(ours)) > 1e-2  # the check above would notice a shift


def test_read_examples_formats_and_errors(tmp_path):
    write_wav(tmp_path / "a.wav", synth_audio(0.5, seed=1), 16000)
    (tmp_path / "sub").mkdir()
    write_wav(tmp_path / "sub" / "b.wav", synth_audio(0.5, seed=2), 16000)
    good = tmp_path / "train.jsonl"
    lines = [
        {"audio": "a.wav", "text": "language English<asr_text>The transcript."},
        {"audio": str(tmp_path / "sub" / "b.wav"), "text": "Plain text.", "language": "de"},
        {"audio": "sub/b.wav", "text": "No language."},
    ]
    good.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n", encoding="utf-8")
    got = read_examples(good, load_audio_16k)
    assert [e.target for e in got] == [
        "language English<asr_text>The transcript.",
        "language German<asr_text>Plain text.",
        "language None<asr_text>No language.",
    ]
    assert got[0].text == "The transcript." and got[0].audio.dtype == np.float32 and len(got[0].audio) == 8000
    bad_cases = {
        '{"audio": "missing.wav", "text": "x"}': "missing.wav does not exist",
        '{"audio": "/dev/zero", "text": "x"}': r"audio /dev/zero is not a regular file \(a device, pipe or folder\)",
        '{"audio": "sub", "text": "x"}': r"sub is not a regular file",
        '{"audio": "a.wav", "text": "language English<asr_text>  "}': "empty text",
        '{"audio": "a.wav", "text": ""}': "empty text",
        '{"audio": "a.wav"}': 'no "text"',
        '{"text": "x"}': 'no "audio"',
        "not json": "not JSON",
        '{"audio": "a.wav", "text": "x", "language": "Klingon"}': "unsupported language",
    }
    for line, message in bad_cases.items():
        path = tmp_path / "bad.jsonl"
        path.write_text(json.dumps(lines[0]) + "\n" + line + "\n", encoding="utf-8")
        with pytest.raises(AdapterError, match=message) as info:
            read_examples(path, load_audio_16k)
        assert f"{path}:2:" in str(info.value)
    path = tmp_path / "long.jsonl"
    path.write_text(json.dumps(lines[0]) + "\n", encoding="utf-8")
    with pytest.raises(AdapterError, match=rf"{path}:1: audio .* 0.5 s long, more than 0.25 s"):
        read_examples(path, load_audio_16k, max_seconds=0.25)


def _lora_tensors(result):
    return {k: (m.lora_A.detach().clone(), m.lora_B.detach().clone()) for k, m in result.lora.items()}


def test_deterministic_with_seed(ckpt_untied):
    runs = []
    for seed in (3, 3, 4):
        model, prompt = _load(ckpt_untied)
        runs.append(
            _lora_tensors(train_lora(model, prompt, _examples(), TrainOptions(steps=3, bits=16, rank=2, seed=seed)))
        )
    for key, (a, b) in runs[0].items():
        assert torch.equal(a, runs[1][key][0]) and torch.equal(b, runs[1][key][1])
        assert b.abs().sum() > 0  # trained
    assert any(not torch.equal(a, runs[2][k][0]) for k, (a, _) in runs[0].items())


def test_exported_adapter_loads_in_engine_and_gives_the_trained_logits(ckpt_untied, engine_factory, tmp_path):
    from dictation.asr import AsrEngine, EngineOptions

    out = tmp_path / "adapter"
    seen = []
    options = TrainOptions(steps=6, bits=16, rank=4, alpha=8, lr=1e-2)
    result = train_adapter(ckpt_untied, _examples(), out, options, progress=seen.append)
    assert [p.step for p in seen] == list(range(1, 7)) and seen[-1].seconds_left == 0
    assert all(np.isfinite(p.loss) for p in seen)
    info = read_adapter(out)
    assert info.rank == 4 and info.alpha == 8 and len(info.layers) == 7 * 2
    assert set(info.target_modules) == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    with safe_open(str(out / "adapter_model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert "base_model.model.thinker.model.layers.0.self_attn.q_proj.lora_A.weight" in keys
    assert "base_model.model.thinker.model.layers.1.mlp.down_proj.lora_B.weight" in keys
    assert (out.stat().st_mode & 0o777) == 0o700
    assert all((p.stat().st_mode & 0o777) == 0o600 for p in out.iterdir())
    # what the engine computes with the adapter is what training ended with
    model = result.lora  # the trained modules live in the training model; recompute its logits
    clip = _examples()[0]
    trained_model, prompt = _load(ckpt_untied)
    wrapped = add_lora(trained_model, options)
    with torch.no_grad():
        for name, module in wrapped.items():
            module.lora_A.copy_(model[name].lora_A)
            module.lora_B.copy_(model[name].lora_B)
    item = prepare(trained_model, prompt, LogMel(trained_model.cfg.audio.num_mel_bins), clip)
    with torch.no_grad():
        expected = decoder_logits(trained_model, item.embeds, item.first)[0]
    engine = AsrEngine(EngineOptions(model=str(ckpt_untied), device="cpu", dtype="fp32", adapters=[str(out)]))
    first = engine.pipeline.run(clip.audio, None, "", 2, keep_first_logits=True).first_logits.float()
    base = engine_factory(ckpt_untied)  # the session's fp32 engine without adapters
    before = base.pipeline.run(clip.audio, None, "", 2, keep_first_logits=True).first_logits.float()
    torch.testing.assert_close(first, expected, rtol=1e-4, atol=1e-3)
    assert (first - before).abs().max() > 1e-2  # the adapter changed something
    with pytest.raises(AdapterError, match="already exists"):
        train_adapter(ckpt_untied, _examples(), out, options)


def test_cancel_keeps_a_checkpoint_and_resume_gives_the_uninterrupted_adapter(ckpt_untied, tmp_path):
    options = TrainOptions(steps=7, bits=16, rank=2, lr=1e-2, save_every=2)
    whole = tmp_path / "whole"
    train_adapter(ckpt_untied, _examples(), whole, options)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["whole"]  # no work folder left after success

    out = tmp_path / "adapter"
    calls = []

    def cancel():
        calls.append(1)
        return len(calls) == 4  # before step 4: steps 1-3 done

    with pytest.raises(TrainingCancelled, match="step 4 of 7; its checkpoint is kept"):
        train_adapter(ckpt_untied, _examples(), out, options, cancel=cancel)
    work = work_folder(out)
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == [work.name, "whole"]
    assert (work.stat().st_mode & 0o777) == 0o700
    assert [(p.name, p.stat().st_mode & 0o777) for p in work.iterdir()] == [("checkpoint.safetensors", 0o600)]
    # other settings or data: refused, nothing written
    with pytest.raises(AdapterError, match="made from other data or settings"):
        train_adapter(ckpt_untied, _examples()[:1], out, options, resume=True)
    seen = []
    train_adapter(ckpt_untied, _examples(), out, options, resume=True, progress=seen.append)
    assert [p.step for p in seen] == [4, 5, 6, 7] and not work.exists()
    with (
        safe_open(str(whole / "adapter_model.safetensors"), "pt") as a,
        safe_open(str(out / "adapter_model.safetensors"), "pt") as b,
    ):
        assert set(a.keys()) == set(b.keys())
        for key in a.keys():  # noqa: SIM118
            assert torch.equal(a.get_tensor(key), b.get_tensor(key)), key
    with pytest.raises(AdapterError, match="no checkpoint to resume from"):
        train_adapter(ckpt_untied, _examples(), tmp_path / "other", options, resume=True)


def test_gradient_checkpointing_gives_the_same_gradients(ckpt_untied):
    grads = []
    for checkpointing in (False, True):
        model, prompt = _load(ckpt_untied)
        options = TrainOptions(steps=1, bits=16, rank=2, checkpointing=checkpointing)
        lora = add_lora(model, options)
        with torch.no_grad():
            for module in lora.values():
                module.lora_B.normal_(generator=torch.Generator().manual_seed(1))
        item = prepare(model, prompt, LogMel(model.cfg.audio.num_mel_bins), _examples()[1])
        example_loss(model, item, checkpointing).backward()
        grads.append({k: (m.lora_A.grad.clone(), m.lora_B.grad.clone()) for k, m in lora.items()})
    for key, (a, b) in grads[0].items():
        torch.testing.assert_close(grads[1][key][0], a, rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(grads[1][key][1], b, rtol=1e-5, atol=1e-7)
        assert a.abs().sum() > 0


def test_epochs_set_the_steps_and_out_of_memory_is_one_error(ckpt_untied, tmp_path, monkeypatch):
    assert TrainOptions(epochs=3, batch_size=2).total_steps(5) == 8  # ceil(3 * 5 / 2)
    assert TrainOptions(steps=7).total_steps(5) == 7
    with pytest.raises(AdapterError, match="epochs must be at least 1"):
        TrainOptions(epochs=0).check()
    seen = []
    model, prompt = _load(ckpt_untied)
    train_lora(model, prompt, _examples(), TrainOptions(epochs=2, bits=16, rank=2, batch_size=1), progress=seen.append)
    assert [p.steps for p in seen] == [4] * 4

    from dictation.asr.tune import lora_forward

    def exhausted(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(lora_forward, "decoder_logits", exhausted)
    out = tmp_path / "adapter"
    with pytest.raises(AdapterError) as info:
        train_adapter(ckpt_untied, _examples(), out, TrainOptions(steps=3, bits=16, rank=2))
    message = str(info.value)
    assert message.startswith("out of memory while training step 1 on cpu") and "\n" not in message
    assert not out.exists()


def test_nf4_base_trains(ckpt_untied, tmp_path):
    model, prompt = _load(ckpt_untied)
    result = train_lora(model, prompt, _examples(), TrainOptions(steps=8, bits=4, rank=4, lr=1e-2, batch_size=2))
    assert result.losses[-1] < result.losses[0]
    # the tiny model's decoder linears are whole 64-blocks; the per-tensor mean adds a few bytes
    assert bits_per_parameter() / 8 <= result.base_bytes_per_parameter < bits_per_parameter() / 8 * 1.01
    assert type(model.decoder.layers[0].self_attn.q_proj.base).__name__ == "NF4Linear"


def _bf16_training_checks(model, prompt):
    """What training a bfloat16 base must keep: float32 LoRA matrices, gradients and AdamW moments."""
    lora = add_lora(model, TrainOptions(rank=2, bits=16))
    item = prepare(model, prompt, LogMel(model.cfg.audio.num_mel_bins, model.device), _examples()[0])
    assert item.embeds.dtype == torch.bfloat16
    loss = example_loss(model, item, checkpointing=True)
    loss.backward()
    params = [p for m in lora.values() for p in (m.lora_A, m.lora_B)]
    optimizer = torch.optim.AdamW(params, lr=1e-3)
    optimizer.step()
    assert all(p.dtype == p.grad.dtype == torch.float32 for p in params)
    assert all(v.dtype == torch.float32 for s in optimizer.state.values() for k, v in s.items() if k != "step")
    assert any(p.grad.abs().sum() > 0 for p in params) and torch.isfinite(loss)


def test_a_bf16_base_trains_float32_lora(ckpt_untied):
    """The GPU's recipe (bf16 base, fp32 LoRA and optimizer state), run on the CPU."""
    from dictation.asr.tune.train import training_dtype

    assert training_dtype(torch.device("cuda", 0)) == torch.bfloat16
    assert training_dtype(torch.device("cpu")) == torch.float32
    cfg = AsrConfig.from_file(ckpt_untied / "config.json")
    model = load_model(ckpt_untied, cfg, torch.device("cpu"), torch.bfloat16)
    _bf16_training_checks(model, PromptBuilder.from_folder(ckpt_untied, audio_token_id=cfg.special.audio_token_id))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_training_on_the_gpu_gives_an_adapter_the_cpu_engine_reads(ckpt_untied, tmp_path):
    """--device cuda: the base in bf16, LoRA in fp32; the adapter loads in the CPU engine and changes it."""
    from dictation.asr import AsrEngine, EngineOptions

    out = tmp_path / "adapter"
    result = train_adapter(
        ckpt_untied, _examples(), out, TrainOptions(steps=30, bits=4, rank=4, lr=1e-2), device="cuda"
    )
    assert result.losses[-1] < result.losses[0] / 4
    assert all(m.lora_A.dtype == torch.float32 and m.lora_A.device.type == "cuda" for m in result.lora.values())
    engine = AsrEngine(EngineOptions(model=str(ckpt_untied), device="cpu", dtype="fp32", adapters=[str(out)]))
    base = AsrEngine(EngineOptions(model=str(ckpt_untied), device="cpu", dtype="fp32"))
    clip = _examples()[0].audio
    assert engine.transcribe(clip, max_new_tokens=8).token_ids != base.transcribe(clip, max_new_tokens=8).token_ids


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_issues_defaults_trained_on_the_gpu_carry_over_to_the_float_base_on_the_cpu(ckpt_root, tmp_path):
    """The overfit check of tests/test_cli_train.py (--steps 200 --rank 8, NF4 base) trained on the GPU
    (bf16 base, fp32 LoRA): the CPU engine with the adapter on the float32 base says both texts."""
    from dictation.asr import AsrEngine, EngineOptions
    from tests.test_cli_train import LINES, TEXTS, training_checkpoint

    ckpt = training_checkpoint(ckpt_root)
    clips = [synth_audio(1.0 + 0.5 * i, seed=40 + i) for i in range(2)]
    examples = [Example(clip, line, f"clip {i}") for i, (clip, line) in enumerate(zip(clips, LINES, strict=True))]
    out = tmp_path / "adapter"
    train_adapter(ckpt, examples, out, TrainOptions(steps=200, rank=8, alpha=16), device="cuda")
    engine = AsrEngine(EngineOptions(model=str(ckpt), device="cpu", dtype="fp32", adapters=[str(out)]))
    assert [engine.transcribe(clip, max_new_tokens=24).text for clip in clips] == TEXTS
