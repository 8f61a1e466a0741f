"""The vocabulary reaches the model as the official implementation passes a context, token for token.

The context the app gives the engine is built from the user's own text and the words learned from
corrections (`dictation.vocabulary.model_context`), and handed over by `Takes.language_context` for every
take. Here that context, taken from the real `Takes`, goes through our prompt builder, decoder and streaming
path on tiny random checkpoints and is compared with the official qwen-asr package (the oracle of
tests/oracle/): the prompt ids and the greedy output ids are the same, and the context really is in the
prompt (inside the system turn) and changes what the model computes.
"""

from __future__ import annotations

import pytest
import torch

from dictation.asr.nn.features import n_audio_tokens
from dictation.config.settings import LearnedWord, Settings
from dictation.takes import Takes
from dictation.vocabulary import model_context
from tests.asr.test_parity import MAX_NEW, checkpoint, clip, strip_eos
from tests.oracle.official import oracle_for
from tests.session.test_takes import FakePort

LEARNED = tuple(
    LearnedWord(word=word, heard=heard, dictated="2026-11-30T14:03:00+00:00", entry_id=4)
    for word, heard in (("kubectl", "cube cuddle"), ("Dr. Nguyen", "doctor when"), ("Anneliese Brückner", ""))
)
OWN_TEXT = "PySide6, HbA1c, 通义千问"


def app_context(own: str = OWN_TEXT, learned: tuple[LearnedWord, ...] = LEARNED) -> str:
    """The context the app hands the engine for a take with these settings (through the real `Takes`)."""
    settings = Settings()
    settings = settings.replace(transcription=settings.transcription.replace(context=own, learned_words=learned))
    port = FakePort(settings=settings)
    language, context = Takes(port, port.workers).language_context()
    assert language is None
    return context


def test_the_app_context_is_the_users_text_then_the_learned_words():
    assert app_context() == "PySide6, HbA1c, 通义千问\nkubectl, Dr. Nguyen, Anneliese Brückner"
    assert app_context(own="") == "kubectl, Dr. Nguyen, Anneliese Brückner"
    assert app_context(learned=()) == OWN_TEXT
    transcription = Settings().transcription.replace(context=OWN_TEXT, learned_words=LEARNED)
    assert app_context() == model_context(transcription)


@pytest.mark.parametrize("own", [OWN_TEXT, ""])
def test_prompt_ids_with_learned_words_equal_the_official_ones(ckpt_untied, engine_factory, own):
    audio = clip("medium")
    engine = engine_factory(ckpt_untied)
    oracle = oracle_for(ckpt_untied)
    context = app_context(own)
    n = n_audio_tokens(len(audio) // 160)
    ours = engine.prompt.prompt_ids(n, context=context)
    assert ours == oracle.prompt_ids(audio, context)

    # it is really passed: the prompt without it is the same minus the context's own tokens, in the system turn
    bare = engine.prompt.prompt_ids(n, context="")
    assert bare == oracle.prompt_ids(audio, "")
    context_ids = engine.prompt.encode(context)
    assert len(ours) == len(bare) + len(context_ids)
    system_head = engine.prompt.encode("<|im_start|>system\n")
    assert ours[: len(system_head)] == bare[: len(system_head)] == system_head
    assert ours[len(system_head) : len(system_head) + len(context_ids)] == context_ids
    assert ours[len(system_head) + len(context_ids) :] == bare[len(system_head) :]
    # the learned words are tokens of the prompt: the prompt with the user's text alone is shorter
    assert len(engine.prompt.prompt_ids(n, context=app_context(own, learned=()))) < len(ours)


@pytest.mark.parametrize(("kind", "name"), [("untied", "medium"), ("hf", "long")])
def test_greedy_ids_with_learned_words_equal_the_official_ones(ckpt_root, engine_factory, kind, name):
    ours_dir, twin = checkpoint(ckpt_root, kind)
    engine = engine_factory(ours_dir)
    oracle = oracle_for(twin)
    audio = clip(name)
    context = app_context()
    result = engine.pipeline.run(audio, None, context, MAX_NEW, keep_first_logits=True)
    ref_ids, margins = oracle.greedy_margins(audio, context, None, MAX_NEW)
    assert min(margins) > 1e-3, "the reference's own top-2 margin is too thin for an exact-id comparison"
    assert len(ref_ids) >= 5
    assert result.ids == strip_eos(ref_ids)

    # what the context does: the first step's logits move, for both implementations alike
    bare = engine.pipeline.run(audio, None, "", MAX_NEW, keep_first_logits=True)
    ref_bare = oracle.first_step_logits(audio, "", None)
    ref_with = oracle.first_step_logits(audio, context, None)
    moved = float((result.first_logits.float() - bare.first_logits.float()).abs().max())
    ref_moved = float((ref_with.float() - ref_bare.float()).abs().max())
    assert moved > 1e-2 and ref_moved > 1e-2
    assert moved == pytest.approx(ref_moved, rel=1e-2)


def test_the_streamed_take_gets_the_same_context_and_ids(ckpt_untied, engine_factory):
    """The app transcribes while recording: the stream with the learned words gives the official ids too."""
    engine = engine_factory(ckpt_untied)
    audio = clip("long")
    context = app_context()
    stream = engine.stream(language=None, context=context, max_new_tokens=MAX_NEW)
    for start in range(0, len(audio), 24_000):
        stream.feed(audio[start : start + 24_000])
    got = stream.finish()
    ref_ids = oracle_for(ckpt_untied).greedy_ids(audio, context, None, MAX_NEW)
    assert got.token_ids == strip_eos(ref_ids)
    with torch.inference_mode():
        whole = engine.transcribe(audio, context=context, max_new_tokens=MAX_NEW)
    assert (got.text, got.language) == (whole.text, whole.language)
