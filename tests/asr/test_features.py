"""Log-mel frontend (docs/model.md §4) against the official feature extractor, and the token-count formula."""

import numpy as np
import pytest
import torch

from dictation.asr.nn.features import LogMel, mel_filters, n_audio_tokens, n_frames
from tests.oracle import synth_audio


@pytest.fixture(scope="module")
def official_extractor():
    from transformers import WhisperFeatureExtractor  # slow to import: only where it is used

    return WhisperFeatureExtractor(
        feature_size=128, sampling_rate=16000, hop_length=160, n_fft=400, chunk_length=30, padding_value=0.0
    )


def official_features(extractor, audio):
    out = extractor(
        audio, sampling_rate=16000, padding=True, truncation=False, return_attention_mask=True, return_tensors="pt"
    )
    return out["input_features"][0]


@pytest.mark.parametrize("n_samples", [400, 16000, 20801, 80000, 16000 * 13 + 77])
def test_features_match_official(official_extractor, n_samples):
    audio = synth_audio(n_samples / 16000, seed=n_samples)
    ours = LogMel(128)(audio)
    ref = official_features(official_extractor, audio)
    assert ours.shape == ref.shape == (128, n_samples // 160)
    torch.testing.assert_close(ours, ref, atol=2e-5, rtol=0)


def test_mel_filters_match_official(official_extractor):
    np.testing.assert_allclose(mel_filters(128), official_extractor.mel_filters, atol=1e-9)


def test_floor_is_clip_max_minus_eight():
    rng = np.random.default_rng(0)
    audio = np.concatenate([np.zeros(8000), rng.standard_normal(8000) * 0.5]).astype(np.float32)
    feats = LogMel(128)(audio)
    # log10 floor max-8, then (x + 4) / 4: the whole range is exactly 2.
    assert float(feats.max() - feats.min()) == pytest.approx(2.0, abs=1e-6)


def test_frame_count_drops_last_stft_frame():
    assert [n_frames(n) for n in (16000, 20800, 20801, 80000, 368000)] == [100, 130, 130, 500, 2300]


@pytest.mark.parametrize("frames", [1, 4, 30, 99, 100, 101, 130, 500, 799, 800, 2300, 120000])
def test_token_count_formula_matches_official(frames):
    from qwen_asr.core.transformers_backend.modeling_qwen3_asr import _get_feat_extract_output_lengths

    ref = int(_get_feat_extract_output_lengths(torch.tensor([frames]))[0])
    assert n_audio_tokens(frames) == ref


def test_token_count_examples():
    assert [n_audio_tokens(t) for t in (130, 500, 2300, 100, 30)] == [17, 65, 299, 13, 4]
