"""The engine inside ``torch.inference_mode()``, as library users call it.

Every public entry point, and ``Pipeline.run``, on an engine that was not prepared (loading then happens
inside the caller's inference mode) and on one prepared before: each gives what it gives outside
inference mode, and the model's weights stay ordinary tensors, so a later change of adapters or a
fusion planned again (which re-point and view the weights outside inference mode) still works.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dictation.asr import AsrEngine, EngineOptions
from tests.asr.test_variants import write_adapter
from tests.oracle import synth_audio

AUDIO = synth_audio(2.5, seed=7)
LONG = synth_audio(9.0, seed=8)  # one complete 8-s window for the stream to encode while fed
MAX_NEW = 6


def make(folder, prepared: bool, **options) -> AsrEngine:
    engine = AsrEngine(EngineOptions(model=str(folder), device="cpu", dtype="fp32", **options))
    if prepared:
        engine.prepare()  # outside inference mode
    return engine


def no_inference_weights(engine: AsrEngine) -> bool:
    model = engine.model
    tensors = [*model.parameters(), *model.buffers()]
    tensors += [t for layer in model.decoder.fused_layers() for t in (*layer.parameters(), *layer.buffers())]
    return not any(t.is_inference() for t in tensors)


@pytest.fixture(scope="module")
def adapter(tmp_path_factory):
    return write_adapter(tmp_path_factory.mktemp("adapter") / "a", seed=5)


@pytest.fixture(scope="module")
def reference(ckpt_untied):
    """Each entry point's result outside inference mode."""
    engine = make(ckpt_untied, prepared=True)
    stream = engine.stream(max_new_tokens=MAX_NEW)
    stream.feed(LONG)
    preview = stream.preview()
    return {
        "ids": engine.transcribe(AUDIO, max_new_tokens=MAX_NEW).token_ids,
        "long": engine.transcribe(LONG, max_new_tokens=MAX_NEW).token_ids,
        "preview": preview.token_ids,
        "stream": stream.finish().token_ids,
    }


@pytest.mark.parametrize("prepared", [False, True], ids=["unprepared", "prepared"])
def test_prepare_inside_inference_mode_builds_ordinary_weights(ckpt_untied, adapter, reference, prepared):
    engine = make(ckpt_untied, prepared)
    with torch.inference_mode():
        engine.prepare()
    assert no_inference_weights(engine)
    # Used outside inference mode afterwards: passes, and adapters on and off again.
    assert engine.transcribe(AUDIO, max_new_tokens=MAX_NEW).token_ids == reference["ids"]
    engine.set_adapters([str(adapter)])
    assert engine.transcribe(AUDIO, max_new_tokens=MAX_NEW).token_ids != reference["ids"]
    engine.set_adapters([])
    assert engine.transcribe(AUDIO, max_new_tokens=MAX_NEW).token_ids == reference["ids"]


@pytest.mark.parametrize("prepared", [False, True], ids=["unprepared", "prepared"])
def test_transcribe_inside_inference_mode(ckpt_untied, reference, prepared):
    engine = make(ckpt_untied, prepared)
    with torch.inference_mode():
        assert engine.transcribe(AUDIO, max_new_tokens=MAX_NEW).token_ids == reference["ids"]
    assert no_inference_weights(engine)


@pytest.mark.parametrize("prepared", [False, True], ids=["unprepared", "prepared"])
def test_transcribe_with_progress_inside_inference_mode(ckpt_untied, reference, prepared):
    engine = make(ckpt_untied, prepared)
    seen = []
    with torch.inference_mode():
        result = engine.transcribe_with_progress(AUDIO, max_new_tokens=MAX_NEW, on_progress=seen.append)
    assert result.token_ids == reference["ids"] and [p.chunk for p in seen] == [0, 1]
    assert no_inference_weights(engine)


@pytest.mark.parametrize("prepared", [False, True], ids=["unprepared", "prepared"])
def test_a_pipeline_pass_inside_inference_mode(ckpt_untied, reference, prepared):
    engine = make(ckpt_untied, prepared)
    with torch.inference_mode():
        assert engine.pipeline.run(AUDIO, None, "", MAX_NEW).ids == reference["ids"]
    assert no_inference_weights(engine)


@pytest.mark.parametrize("prepared", [False, True], ids=["unprepared", "prepared"])
def test_stream_inside_inference_mode(ckpt_untied, reference, prepared):
    engine = make(ckpt_untied, prepared)
    with torch.inference_mode():
        stream = engine.stream(max_new_tokens=MAX_NEW)
        for chunk in np.array_split(LONG, 5):
            stream.feed(chunk)
        assert stream.windows_done == 1
        assert stream.preview().token_ids == reference["preview"]
        assert stream.finish().token_ids == reference["stream"] == reference["long"]
    assert no_inference_weights(engine)


@pytest.mark.parametrize("prepared", [False, True], ids=["unprepared", "prepared"])
def test_warm_up_inside_inference_mode(ckpt_untied, reference, prepared):
    engine = make(ckpt_untied, prepared)
    with torch.inference_mode():
        assert engine.warm_up() > 0
        assert engine.transcribe(AUDIO, max_new_tokens=MAX_NEW).token_ids == reference["ids"]
    assert no_inference_weights(engine)
    assert engine.transcribe(AUDIO, max_new_tokens=MAX_NEW).token_ids == reference["ids"]


@pytest.fixture(scope="module")
def adapted(ckpt_untied, adapter):
    """(variant, prepared) -> (ids with the adapter, ids without), the same calls outside inference
    mode. The path matters for int8: an engine loaded without adapters kept no float weights, so an
    adapter set later runs unmerged beside the integer layers (not merged and quantized again as at
    load time), which may round differently."""

    def ids(variant, prepared):
        engine = make(ckpt_untied, prepared, variant=variant)
        engine.set_adapters([str(adapter)])
        with_adapter = engine.transcribe(AUDIO, max_new_tokens=MAX_NEW).token_ids
        engine.set_adapters([])
        return with_adapter, engine.transcribe(AUDIO, max_new_tokens=MAX_NEW).token_ids

    return {(v, p): ids(v, p) for v in ("fp32", "int8") for p in (False, True)}


@pytest.mark.parametrize("variant", ["fp32", "int8"])
@pytest.mark.parametrize("prepared", [False, True], ids=["unprepared", "prepared"])
def test_set_adapters_inside_inference_mode(ckpt_untied, adapter, adapted, prepared, variant):
    """Adapters set and removed inside inference mode give what the same calls give outside it."""
    with_adapter, plain = adapted[variant, prepared]
    assert with_adapter != plain
    engine = make(ckpt_untied, prepared, variant=variant)
    with torch.inference_mode():
        engine.set_adapters([str(adapter)])
        assert engine.transcribe(AUDIO, max_new_tokens=MAX_NEW).token_ids == with_adapter
        engine.set_adapters([])
        assert engine.transcribe(AUDIO, max_new_tokens=MAX_NEW).token_ids == plain
        engine.set_adapters([str(adapter)])
    assert no_inference_weights(engine)
    # Outside inference mode again: the adapters come off and the fusions are planned again.
    engine.set_adapters([])
    assert engine.transcribe(AUDIO, max_new_tokens=MAX_NEW).token_ids == plain
