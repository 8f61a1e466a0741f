"""Splitting of audio longer than one pass (docs/model.md §8) against the official splitter."""

import numpy as np
import pytest

from dictation.asr.decode.longform import join_texts, merge_languages, split_long_audio


def speechy(seconds: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n = int(seconds * 16000)
    envelope = np.repeat(rng.uniform(0.0, 1.0, n // 1600 + 1), 1600)[:n]
    return (rng.standard_normal(n) * envelope * 0.3).astype(np.float32)


@pytest.mark.parametrize(
    ("seconds", "limit", "seed"), [(25.0, 10.0, 0), (31.0, 10.0, 1), (12.0, 6.0, 2), (20.2, 10.0, 3), (9.0, 10.0, 4)]
)
def test_split_matches_official(seconds, limit, seed):
    audio = speechy(seconds, seed)
    ours = split_long_audio(audio, 16000, limit, search_seconds=2.0)
    from qwen_asr.inference.utils import split_audio_into_chunks  # the official package: slow to import

    ref = split_audio_into_chunks(audio, 16000, limit, search_expand_sec=2.0)
    assert len(ours) == len(ref)
    for (a, off_a), (b, off_b) in zip(ours, ref, strict=True):
        np.testing.assert_array_equal(a, b)
        assert off_a == pytest.approx(off_b)


def test_split_cuts_at_the_quiet_point_and_loses_nothing():
    audio = speechy(30.0, 5)
    quiet_at = int(11.3 * 16000)
    audio[quiet_at - 800 : quiet_at + 800] = 0.0  # 100 ms of silence 1.3 s after the 10-s mark
    pieces = split_long_audio(audio, 16000, 10.0, search_seconds=2.0)
    first_cut = len(pieces[0][0])
    assert abs(first_cut - quiet_at) <= 800
    assert np.array_equal(np.concatenate([p for p, _ in pieces])[: len(audio)], audio)


def test_short_clip_is_one_unpadded_piece():
    audio = speechy(0.3, 6)
    [(piece, offset)] = split_long_audio(audio, 16000, 10.0)
    assert piece is audio and offset == 0.0


def test_join_texts_spaces_only_between_spaced_scripts():
    assert join_texts(["Hello there.", "How are you?"]) == "Hello there. How are you?"
    assert join_texts(["你好。", "再见"]) == "你好。再见"
    assert join_texts(["", "alone", ""]) == "alone"


def test_merge_languages_drops_consecutive_repeats():
    assert merge_languages(["Chinese", "English", "English", "", "Chinese"]) == "Chinese,English,Chinese"
