"""The engine's build-time choices are per model (nn/options.py, docs/engine.md "Model options"): two
models in one process, built with different options, each run their own code paths, with no module
switch touched, and give the same ids."""

from __future__ import annotations

from dataclasses import replace

import torch

from dictation.asr import AsrEngine, EngineOptions
from dictation.asr.nn.graphs import StaticCall
from dictation.asr.nn.options import DEFAULT_OPTIONS, ModelOptions
from tests.oracle import synth_audio

BUCKETED = ModelOptions(prefill_bucketed=True, rows_bucketed=True, encoder_bucketed=True)


def engine_with(ckpt, options: ModelOptions, **kwargs) -> AsrEngine:
    engine = AsrEngine(EngineOptions(model=str(ckpt), device="cpu", dtype="fp32", model_options=options, **kwargs))
    engine.prepare()
    return engine


def test_two_engines_in_one_process_run_their_own_options(ckpt_untied, monkeypatch):
    plain = engine_with(ckpt_untied, DEFAULT_OPTIONS)
    bucketed = engine_with(ckpt_untied, BUCKETED)
    assert plain.model.options == DEFAULT_OPTIONS and bucketed.model.options == BUCKETED
    made = []
    real = StaticCall.__init__
    monkeypatch.setattr(StaticCall, "__init__", lambda self, *a, **k: made.append(k["name"]) or real(self, *a, **k))
    audio = synth_audio(6.5, seed=3)
    want = plain.transcribe(audio, max_new_tokens=8).token_ids
    assert made == []  # the CPU's default: nothing padded to a bucket
    got = bucketed.transcribe(audio, max_new_tokens=8).token_ids
    assert set(made) == {"audio encoder", "prefill"}  # the other model's encoder and prefill padded
    assert got == want
    made.clear()
    assert plain.transcribe(audio, max_new_tokens=8).token_ids == want and made == []


def test_unfused_and_fused_models_side_by_side_give_the_same_ids(ckpt_untied):
    fused = engine_with(ckpt_untied, DEFAULT_OPTIONS, variant="int8")
    plain = engine_with(ckpt_untied, replace(DEFAULT_OPTIONS, fuse_projections=False), variant="int8")
    done, groups = fused.model.decoder.fused_groups()
    assert done == groups > 0 and plain.model.decoder.fused_groups() == (0, groups)
    audio = synth_audio(4.3, seed=12)
    assert plain.transcribe(audio, max_new_tokens=8).token_ids == fused.transcribe(audio, max_new_tokens=8).token_ids


def test_options_reach_every_layer_that_reads_them_and_follow_a_change(ckpt_untied):
    engine = engine_with(ckpt_untied, DEFAULT_OPTIONS, variant="int8")
    model = engine.model
    readers = [m for m in model.modules() if "options" in m.__dict__]
    kinds = {type(m).__name__ for m in readers}
    assert {"AudioEncoder", "TextDecoder", "Attention", "MLP", "Int8Linear"} <= kinds
    assert all(m.options is DEFAULT_OPTIONS for m in readers)
    chosen = replace(DEFAULT_OPTIONS, cpu_bf16_compute=False, conv_batch_cpu=3)
    model.options = chosen
    assert all(m.options is chosen for m in model.modules() if "options" in m.__dict__)
    assert all(layer.options is chosen for layer in model.decoder.fused_layers())
    with torch.inference_mode():
        assert model.audio_tower.options.conv_batch_cpu == 3
