"""Token-for-token parity with the official implementation (fp32, CPU) on tiny random checkpoints.

The oracle is qwen-asr 0.0.6 on transformers 4.57.6 with windowed encoder attention (docs/model.md §5.5).
Clips: under 1 s, between 1 and 8 s, and over 8 s (three attention windows).
"""

from __future__ import annotations

import pytest
import torch

from dictation.asr.nn.features import n_audio_tokens
from dictation.asr.text.prompt import normalize_language
from tests.oracle import strip_eos, synth_audio
from tests.oracle.checkpoints import EOS_IDS, cached_checkpoint
from tests.oracle.official import oracle_for

CLIPS = {"short": (0.62, 11), "medium": (4.3, 12), "long": (19.5, 13)}
MAX_NEW = 24
CONTEXT = "Hotwords: Qwen3-ASR, Tongyi, 通义千问"


def clip(name):
    seconds, seed = CLIPS[name]
    return synth_audio(seconds, seed=seed)


def checkpoint(root, kind):
    """(folder our engine loads, thinker-layout twin the oracle loads)."""
    tied = kind.endswith("tied") and not kind.endswith("untied")
    layout = "hf" if kind.startswith("hf") else "thinker"
    shards = 3 if kind == "sharded" else 1
    ours = cached_checkpoint(root, tie_word_embeddings=tied, layout=layout, shards=shards)
    twin = cached_checkpoint(root, tie_word_embeddings=tied)
    return ours, twin


def assert_close_scaled(ours, ref, rel=1e-4):
    """Allclose relative to the tensor's scale (fp32 summation order differs between implementations)."""
    scale = float(ref.abs().max())
    torch.testing.assert_close(ours.float(), ref.float(), atol=rel * max(scale, 1.0), rtol=0)


@pytest.mark.parametrize("name", list(CLIPS))
def test_features(ckpt_untied, engine_factory, name):
    audio = clip(name)
    ours = engine_factory(ckpt_untied).pipeline.mel(audio)
    ref = oracle_for(ckpt_untied).features(audio)
    assert ours.shape == ref.shape
    torch.testing.assert_close(ours, ref, atol=2e-5, rtol=0)


@pytest.mark.parametrize("name", list(CLIPS))
def test_encoder_output(ckpt_untied, engine_factory, name):
    audio = clip(name)
    engine = engine_factory(ckpt_untied)
    with torch.inference_mode():
        ours = engine.model.audio_tower(engine.pipeline.mel(audio))
    ref = oracle_for(ckpt_untied).encoder_output(audio)
    assert ours.shape == ref.shape == (n_audio_tokens(len(audio) // 160), ref.shape[1])
    assert_close_scaled(ours, ref)


def test_long_clip_uses_windowed_attention(ckpt_untied, engine_factory):
    """Over 8 s our encoder matches the windowed reference and differs from global attention."""
    audio = clip("long")
    engine = engine_factory(ckpt_untied)
    with torch.inference_mode():
        ours = engine.model.audio_tower(engine.pipeline.mel(audio))
    global_ref = oracle_for(ckpt_untied).encoder_output(audio, windowed=False)
    assert float((ours - global_ref).abs().max()) > 1e-2


PROMPT_CASES = [("", None), (CONTEXT, None), ("", "English"), ("交易 停滞", "zh"), ("", "fr")]


@pytest.mark.parametrize(("context", "language"), PROMPT_CASES)
def test_prompt_ids(ckpt_untied, engine_factory, context, language):
    audio = clip("medium")
    engine = engine_factory(ckpt_untied)
    ours = engine.prompt.prompt_ids(
        n_audio_tokens(len(audio) // 160), context=context, language=normalize_language(language)
    )
    assert ours == oracle_for(ckpt_untied).prompt_ids(audio, context, normalize_language(language))


GREEDY_CASES = [
    ("untied", "short", "", None),
    ("untied", "medium", "", None),
    ("untied", "long", "", None),
    ("untied", "medium", CONTEXT, None),
    ("untied", "long", "", "English"),
    ("untied", "short", "交易 停滞", "zh"),
    ("tied", "short", "", None),
    ("tied", "medium", "", None),
    ("tied", "long", "", None),
    ("hf", "medium", "", None),
    ("hf", "long", CONTEXT, None),
    ("hf_tied", "medium", "", "German"),
    ("sharded", "long", "", None),
]


@pytest.mark.parametrize(("kind", "name", "context", "language"), GREEDY_CASES)
def test_first_logits_and_greedy_ids(ckpt_root, engine_factory, kind, name, context, language):
    ours_dir, twin = checkpoint(ckpt_root, kind)
    engine = engine_factory(ours_dir)
    oracle = oracle_for(twin)
    audio = clip(name)
    language = normalize_language(language)  # the official API takes names only, not ISO codes
    result = engine.pipeline.run(audio, language, context, MAX_NEW, keep_first_logits=True)
    ref_logits = oracle.first_step_logits(audio, context, language)
    assert_close_scaled(result.first_logits, ref_logits)
    ref_ids, margins = oracle.greedy_margins(audio, context, language, MAX_NEW)
    assert min(margins) > 1e-3, "the reference's own top-2 margin is too thin for an exact-id comparison"
    assert len(ref_ids) >= 5
    assert result.ids == strip_eos(ref_ids)


def test_greedy_ids_depend_on_audio(ckpt_untied, engine_factory):
    engine = engine_factory(ckpt_untied)
    a = engine.pipeline.run(clip("medium"), None, "", MAX_NEW).ids
    b = engine.pipeline.run(synth_audio(4.3, seed=99), None, "", MAX_NEW).ids
    assert a != b


def test_stops_on_eos_like_the_reference(ckpt_stops, engine_factory):
    audio = clip("medium")
    engine = engine_factory(ckpt_stops)
    ref = oracle_for(ckpt_stops).greedy_ids(audio, max_new_tokens=64)
    assert ref[-1] in EOS_IDS and len(ref) < 64
    result = engine.transcribe(audio, max_new_tokens=64)
    assert result.token_ids == ref[:-1]
    assert not result.truncated


@pytest.mark.parametrize(("name", "context", "language"), [("medium", "", None), ("long", CONTEXT, "en")])
def test_transcript_matches_official_pipeline(ckpt_untied, engine_factory, name, context, language):
    audio = clip(name)
    ours = engine_factory(ckpt_untied).transcribe(audio, context=context, language=language, max_new_tokens=MAX_NEW)
    ref_language, ref_text = oracle_for(ckpt_untied).transcribe(audio, context, normalize_language(language), MAX_NEW)
    assert (ours.language, ours.text) == (ref_language, ref_text)
    assert ours.text


def test_tied_head_ignores_stored_lm_head(ckpt_root, engine_factory):
    tied_dir, _ = checkpoint(ckpt_root, "tied")
    engine = engine_factory(tied_dir)
    model = engine.model
    assert model.lm_head is None
    assert model.output_weight.data_ptr() == model.decoder.embed_tokens.weight.data_ptr()


def test_context_uses_the_original_qwen_split_not_the_patched_one(ckpt_untied, engine_factory):
    """transformers 4.57.6 swaps in a "fixed Mistral" regex for local folders (docs/model.md §2); we tokenise
    free text with the original Qwen regex the model was trained with."""
    audio = clip("short")
    context = "HelloWorld, don't you'll CamelCaseNames"
    ours = engine_factory(ckpt_untied).prompt.prompt_ids(n_audio_tokens(len(audio) // 160), context=context)
    assert ours == oracle_for(ckpt_untied, fix_mistral_regex=False).prompt_ids(audio, context)
