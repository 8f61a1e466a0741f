"""What makes a training step cheap (tune/train.py, tune/lora_forward.py, tune/nf4.py), each checked
against the slow way: the frozen decoder layers below the adapted ones run once per clip, the NF4 base
is dequantized once, gradient checkpointing only on a GPU; and the default length and learning-rate
schedule."""

from __future__ import annotations

import json

import pytest
import torch

from dictation.asr.nn.features import LogMel
from dictation.asr.tune import lora_forward
from dictation.asr.tune import nf4 as nf4_module
from dictation.asr.tune import train as train_module
from dictation.asr.tune.adapter_files import read_adapter
from dictation.asr.tune.lora_forward import add_lora, decoder_logits, example_loss, prepare
from dictation.asr.tune.train import TrainOptions, train_lora
from tests.asr.test_train import _examples, _load

# torch on one thread (tests/conftest.py: one_torch_thread)
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _random_b(lora, seed=1):
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in lora.values():
            module.lora_B.normal_(generator=generator)


def test_the_frozen_lower_layers_run_once_per_clip_and_give_the_same_loss_and_gradients(ckpt_untied):
    """``layers=1`` on the two-layer model: layer 0 is frozen, so prepare runs it once and each step
    starts at layer 1; the loss and gradients are those of the whole decoder run at every step."""
    model, prompt = _load(ckpt_untied)
    lora = add_lora(model, TrainOptions(rank=2, bits=16, layers=1))
    assert sorted({name.split(".")[2] for name in lora}) == ["1"]  # only the top layer is adapted
    _random_b(lora)
    mel = LogMel(model.cfg.audio.num_mel_bins)
    results = []
    for start in (0, 1):
        item = prepare(model, prompt, mel, _examples()[1], start)
        assert item.start == start
        for module in lora.values():
            module.lora_A.grad = module.lora_B.grad = None
        loss = example_loss(model, item)
        loss.backward()
        results.append((loss.detach(), {k: m.lora_A.grad.clone() for k, m in lora.items()}))
    (whole, whole_grads), (cached, cached_grads) = results
    torch.testing.assert_close(cached, whole, rtol=1e-5, atol=1e-6)
    for key, grad in whole_grads.items():
        torch.testing.assert_close(cached_grads[key], grad, rtol=1e-4, atol=1e-7)
        assert grad.abs().sum() > 0


def test_an_adapter_of_the_top_layers_names_only_them_and_the_engine_gives_its_logits(ckpt_untied, tmp_path):
    import re

    from dictation.asr import AsrEngine, EngineOptions

    out = tmp_path / "adapter"
    options = TrainOptions(steps=4, bits=16, rank=2, lr=1e-2, layers=1)
    result = train_module.train_adapter(ckpt_untied, _examples(), out, options)
    info = read_adapter(out)
    assert {layer.module.split(".")[2] for layer in info.layers} == {"1"} and len(info.layers) == 7
    pattern = json.loads((out / "adapter_config.json").read_text())["target_modules"]
    assert re.fullmatch(pattern, "thinker.model.layers.1.mlp.up_proj")  # as PEFT matches it
    assert not re.fullmatch(pattern, "thinker.model.layers.0.mlp.up_proj")
    clip = _examples()[0]
    model, prompt = _load(ckpt_untied)
    wrapped = add_lora(model, options)
    with torch.no_grad():
        for name, module in wrapped.items():
            module.lora_A.copy_(result.lora[name].lora_A)
            module.lora_B.copy_(result.lora[name].lora_B)
    item = prepare(model, prompt, LogMel(model.cfg.audio.num_mel_bins), clip)
    with torch.no_grad():
        expected = decoder_logits(model, item.embeds, item.first)[0]
    engine = AsrEngine(EngineOptions(model=str(ckpt_untied), device="cpu", dtype="fp32", adapters=[str(out)]))
    first = engine.pipeline.run(clip.audio, None, "", 2, keep_first_logits=True).first_logits.float()
    torch.testing.assert_close(first, expected, rtol=1e-4, atol=1e-3)


def _count_dequantize(monkeypatch):
    calls = []
    original = nf4_module.NF4Tensor.dequantize

    def counted(self, dtype=torch.float32):
        calls.append(1)
        return original(self, dtype)

    monkeypatch.setattr(nf4_module.NF4Tensor, "dequantize", counted)
    return calls


def test_the_nf4_base_is_dequantized_once_where_it_fits_with_the_same_training(ckpt_untied, monkeypatch):
    calls = _count_dequantize(monkeypatch)
    runs = {}
    for memory in (1 << 40, 0):  # plenty: kept; none: dequantized at every forward, as before
        monkeypatch.setattr(train_module, "available_memory", lambda device, memory=memory: memory)
        model, prompt = _load(ckpt_untied)
        at_step: list[int] = []
        options = TrainOptions(steps=3, bits=4, rank=2, lr=1e-2, batch_size=1)
        result = train_lora(
            model, prompt, _examples(), options, progress=lambda p, seen=at_step: seen.append(len(calls))
        )
        runs[memory] = (result.losses, at_step)
        kept = model.decoder.layers[1].mlp.up_proj.base.__dict__.get("_dequantized")
        assert (kept is not None) == bool(memory)
    (kept_losses, kept_calls), (plain_losses, plain_calls) = runs[1 << 40], runs[0]
    assert kept_calls[0] == kept_calls[-1]  # no dequantizing during the steps
    assert plain_calls[-1] > plain_calls[0]
    assert kept_losses == plain_losses


def test_the_frozen_layers_below_run_on_the_loaded_weights_and_only_the_adapted_ones_go_to_nf4(
    ckpt_untied, monkeypatch
):
    """``bits=4, layers=1``: layer 0 runs once per clip, in prepare, before any NF4 (no dequantizing
    there; the adapted layer's input is the float model's) and stays as loaded; only layer 1 is NF4,
    each of its projections dequantized once (kept). Quantizing all first made prepare dequantize
    every frozen weight again for every clip."""
    calls = _count_dequantize(monkeypatch)
    monkeypatch.setattr(train_module, "available_memory", lambda device: 1 << 40)
    prepared = []
    original = train_module.prepare
    monkeypatch.setattr(
        train_module, "prepare", lambda *a, **k: prepared.append((len(calls), original(*a, **k))) or prepared[-1][1]
    )
    model, prompt = _load(ckpt_untied)
    at_step: list[int] = []
    options = TrainOptions(steps=2, bits=4, rank=2, layers=1, batch_size=1)
    result = train_lora(model, prompt, _examples(), options, progress=lambda p: at_step.append(len(calls)))
    assert [n for n, _ in prepared] == [0] * len(_examples())  # no dequantizing while preparing
    assert at_step == [7, 7]  # layer 1's seven projections, once each
    layer0, layer1 = model.decoder.layers
    assert type(layer0.mlp.up_proj) is torch.nn.Linear and type(layer0.self_attn.q_proj) is torch.nn.Linear
    assert type(layer1.mlp.up_proj.base) is nf4_module.NF4Linear
    assert sorted({name.split(".")[2] for name in result.lora}) == ["1"]
    float_model, _ = _load(ckpt_untied)
    mel = LogMel(float_model.cfg.audio.num_mel_bins)
    for (_, item), example in zip(prepared, _examples(), strict=True):
        torch.testing.assert_close(item.embeds, prepare(float_model, prompt, mel, example, 1).embeds)


def test_gradient_checkpointing_is_on_only_on_a_gpu_by_default(ckpt_untied, monkeypatch):
    calls = []
    original = lora_forward.checkpoint
    monkeypatch.setattr(lora_forward, "checkpoint", lambda *a, **k: calls.append(1) or original(*a, **k))
    for options, expected in (
        (TrainOptions(steps=1, bits=16, rank=2), False),  # the default, on the CPU
        (TrainOptions(steps=1, bits=16, rank=2, checkpointing=True), True),
    ):
        calls.clear()
        model, prompt = _load(ckpt_untied)
        train_lora(model, prompt, _examples(), options)
        assert bool(calls) == expected


def test_the_default_length_and_the_learning_rate_schedule(ckpt_untied, monkeypatch):
    options = TrainOptions()
    assert options.total_steps(16) == 64  # 8 epochs of 16 clips, two a step
    assert options.total_steps(2) == 40 and options.total_steps(100) == 160  # within 40 .. 160
    assert TrainOptions(steps=7).total_steps(16) == 7 and TrainOptions(epochs=1).total_steps(16) == 8
    lrs = [options.lr_at(step, 64) for step in range(1, 65)]
    warm = round(0.1 * 64)
    assert lrs[:warm] == pytest.approx([options.lr * s / warm for s in range(1, warm + 1)])
    assert all(a >= b for a, b in zip(lrs[warm - 1 :], lrs[warm:], strict=False))  # decays from the peak
    assert lrs[warm - 1] == options.lr and lrs[-1] == pytest.approx(options.lr / 10)
    used = []  # the rate of every optimizer step
    original = torch.optim.AdamW.step
    monkeypatch.setattr(
        torch.optim.AdamW, "step", lambda self, *a: used.append(self.param_groups[0]["lr"]) or original(self, *a)
    )
    model, prompt = _load(ckpt_untied)
    options = TrainOptions(steps=5, bits=16, rank=2)
    train_lora(model, prompt, _examples(), options)
    assert used == [options.lr_at(step, 5) for step in range(1, 6)]
