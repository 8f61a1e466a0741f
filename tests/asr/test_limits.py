"""What the engine takes: device strings, the context and token budget limits of
asr/limits.py at the engine's public face, and the budget a pass's audio and the model's positions allow."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dictation.asr import AsrEngine, EngineOptions, ModelError, RequestError, limits
from dictation.asr.decode.pipeline import Pipeline
from dictation.asr.device import resolve_device
from tests.oracle import synth_audio


@pytest.mark.parametrize("name", ["tpu:7", "gpu", "", "cuda:x", "cuda:-1", "meta", "xpu"])
def test_an_unknown_device_is_one_clear_error(name):
    with pytest.raises(ModelError) as exc:
        resolve_device(name)
    assert str(exc.value) == f"unknown device {name!r}; choose auto, cpu, cuda, cuda:N or mps"


def test_a_gpu_index_this_machine_lacks_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ModelError, match=r"^device 'cuda:9' requested but torch sees one CUDA GPU, cuda:0$"):
        resolve_device("cuda:9")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(ModelError, match=r"torch sees 2 CUDA GPUs, cuda:0 to cuda:1$"):
        resolve_device("cuda:2")
    assert resolve_device("cuda:1") == torch.device("cuda", 1)


def test_the_budget_never_passes_what_the_audio_justifies():
    pipe = Pipeline(None, None, None)  # budget() reads nothing of the model
    one_second = 16_000
    assert pipe.budget(one_second, 10**9) == limits.max_new_tokens_for(1.0) == 94
    assert pipe.budget(one_second, 7) == 7
    assert pipe.budget(one_second) == limits.auto_budget(1.0) < 94
    assert pipe.budget(20 * 60 * one_second, limits.MAX_NEW_TOKENS) == limits.MAX_NEW_TOKENS


def test_a_budget_beyond_the_audio_generates_only_what_it_justifies(ckpt_untied, engine_factory):
    # the test model never ends its text: it runs to whatever budget it gets
    result = engine_factory(ckpt_untied).transcribe(synth_audio(1.0, seed=5), max_new_tokens=5_000)
    assert len(result.token_ids) == limits.max_new_tokens_for(1.0) and result.truncated


def test_the_output_stops_at_the_models_last_position(ckpt_untied):
    engine = AsrEngine(EngineOptions(model=str(ckpt_untied), device="cpu"))
    audio = synth_audio(1.0, seed=5)
    prompt = len(engine.pipeline.prompt_embeds(audio).ids)
    model = engine.model
    model.cfg = dataclasses.replace(
        model.cfg, text=dataclasses.replace(model.cfg.text, max_position_embeddings=prompt + 9)
    )
    result = engine.transcribe(audio, max_new_tokens=50)
    assert len(result.token_ids) == 9 and result.truncated


def test_the_engine_refuses_requests_beyond_its_limits(ckpt_untied, engine_factory):
    engine = engine_factory(ckpt_untied)
    audio = synth_audio(1.0, seed=5)
    too_long = "x" * (limits.MAX_CONTEXT_CHARS + 1)
    with pytest.raises(RequestError, match=r"^the context is 20,001 characters long, more than the 20,000 allowed$"):
        engine.transcribe(audio, context=too_long)
    with pytest.raises(RequestError, match="more than the 20,000 allowed"):
        engine.stream(context=too_long)
    with pytest.raises(RequestError, match=r"between 1 and 36,064 .*, not 1,000,000,000$"):
        engine.transcribe(audio, max_new_tokens=10**9)
    for bad in (0, -3, 2.5):
        with pytest.raises(RequestError):
            engine.transcribe(audio, max_new_tokens=bad)
    with pytest.raises(RequestError, match="not 0$"):
        AsrEngine(EngineOptions(model=str(ckpt_untied), max_new_tokens=0))
    assert engine.transcribe(audio, context="y" * limits.MAX_CONTEXT_CHARS, max_new_tokens=2).token_ids


def test_the_settings_cap_the_context_where_the_engine_does():
    from dictation.config.schema import field_info

    (context,) = [f for f in field_info() if f.key == "transcription.context"]
    assert context.max_length == limits.MAX_CONTEXT_CHARS
