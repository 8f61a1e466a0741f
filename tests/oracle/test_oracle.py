"""Self-tests of the test oracle: the tiny checkpoints and the official model wrapper."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.oracle import synth_audio
from tests.oracle.checkpoints import (
    AUDIO_PAD_ID,
    EOS_BIAS_EARLY_STOP,
    EOS_BIAS_IMMEDIATE,
    IM_END_ID,
    cached_checkpoint,
    hf_tensor_name,
    load_tensors,
)
from tests.oracle.official import TRANSFORMERS5_PATH_ENV, WINDOWED_ATTENTION, hf_native_outputs, oracle_for

PROMPT_HEAD = [151644, 8948, 198, 151645, 198, 151644, 872, 198, 151669]  # <|im_start|>system\n<|im_end|>\n...
PROMPT_TAIL = [151670, 151645, 198, 151644, 77091, 198]  # <|audio_end|><|im_end|>\n<|im_start|>assistant\n
ENGLISH_SUFFIX = [11528, 6364, 151704]  # language English<asr_text>


def n_audio_tokens(n_frames: int) -> int:
    """Spec §4.3: 13 tokens per full 100-frame chunk + conv_len(remainder)."""

    def conv_len(n: int) -> int:
        for _ in range(3):
            n = (n - 1) // 2 + 1
        return n

    rem = n_frames % 100
    return 13 * (n_frames // 100) + (conv_len(rem) if rem else 0)


@pytest.fixture(scope="session")
def ckpt_root(tmp_path_factory):
    return tmp_path_factory.mktemp("oracle-checkpoints")


@pytest.fixture(scope="session")
def untied(ckpt_root):
    return cached_checkpoint(ckpt_root)


@pytest.fixture(scope="session")
def tied(ckpt_root):
    return cached_checkpoint(ckpt_root, tie_word_embeddings=True)


@pytest.fixture(scope="session")
def oracle(untied):
    return oracle_for(untied)


@pytest.fixture(scope="session")
def oracle_tied(tied):
    return oracle_for(tied)


# --- synthetic audio ------------------------------------------------------------------------------------------


def test_synth_audio_is_deterministic_and_seed_dependent():
    a, b, c = synth_audio(2.0, 0), synth_audio(2.0, 0), synth_audio(2.0, 1)
    assert a.dtype == np.float32 and a.shape == (32000,)
    assert np.array_equal(a, b)
    assert not np.allclose(a, c)
    assert 0.49 < np.abs(a).max() <= 0.5


# --- tokenizer and prompt (docs/model.md §7.1) -------------------------------------------------------------------


def test_prompt_ids_without_context(oracle):
    audio = synth_audio(1.3, 0)  # 20800 samples -> 130 frames -> 17 audio tokens
    ids = oracle.prompt_ids(audio)
    assert ids == PROMPT_HEAD + [AUDIO_PAD_ID] * 17 + PROMPT_TAIL
    assert n_audio_tokens(130) == 17


def test_prompt_ids_with_forced_language(oracle):
    audio = synth_audio(5.0, 1)
    n = n_audio_tokens(500)
    expected = PROMPT_HEAD + [AUDIO_PAD_ID] * n + PROMPT_TAIL + ENGLISH_SUFFIX
    assert oracle.prompt_ids(audio, language="English") == expected
    assert oracle.prompt_ids(audio, language="english") == expected  # the wrapper normalises the name
    assert oracle.prompt_text(language="English").endswith("<|im_start|>assistant\nlanguage English<asr_text>")
    with pytest.raises(ValueError):
        oracle.prompt_ids(audio, language="Klingon")


def test_tokenizer_ids_and_decoding(oracle):
    tok = oracle.tokenizer
    assert tok("language English").input_ids == [11528, 6364]
    assert len(tok) == 151706
    assert tok.convert_ids_to_tokens([151643, 151645, 151669, 151670, 151676, 151704, 151705]) == [
        "<|endoftext|>",
        "<|im_end|>",
        "<|audio_start|>",
        "<|audio_end|>",
        "<|audio_pad|>",
        "<asr_text>",
        "<timestamp>",
    ]
    assert (tok.audio_token, tok.audio_bos_token, tok.audio_eos_token) == (
        "<|audio_pad|>",
        "<|audio_start|>",
        "<|audio_end|>",
    )
    # <asr_text> is not special: it survives skip_special_tokens; EOS and audio tokens do not
    assert oracle.decode([11528, 6364, 151704, 9707, 151676, 151645]) == "language English<asr_text>Hello"


def test_tokenizer_json_variant_tokenizes_identically(ckpt_root, oracle):
    from transformers import AutoProcessor

    folder = cached_checkpoint(ckpt_root, tokenizer_json=True)
    assert (folder / "tokenizer.json").exists() and not (oracle.folder / "tokenizer.json").exists()
    tok = AutoProcessor.from_pretrained(str(folder), fix_mistral_regex=True).tokenizer
    for text in ["language English", "Hotwords: Qwen3-ASR, Tongyi, 通义千问", "getElementById"]:
        assert tok(text).input_ids == oracle.tokenizer(text).input_ids
    assert tok.decode([11528, 6364, 151704, 9707, 151645], skip_special_tokens=True) == oracle.decode(
        [11528, 6364, 151704, 9707, 151645]
    )


def test_context_tokenization_and_the_mistral_regex_quirk(untied, oracle):
    """Spec §2.4: the official loader (fix_mistral_regex=True) swaps the pre-tokenizer regex for a local folder
    saved by transformers 4.57.6; fix_mistral_regex=False keeps the original Qwen regex."""
    original = oracle_for(untied, fix_mistral_regex=False)
    context = "Hotwords: Qwen3-ASR, Tongyi, 通义千问"
    context_ids = [20170, 5761, 25, 1207, 16948, 18, 12, 1911, 49, 11, 50391, 38072, 11, 220, 31935, 64559]
    context_ids += [99320, 56007]
    audio = synth_audio(1.3, 0)
    expected = PROMPT_HEAD[:3] + context_ids + PROMPT_HEAD[3:] + [AUDIO_PAD_ID] * 17 + PROMPT_TAIL
    assert original.prompt_ids(audio, context=context) == expected
    assert oracle.prompt_ids(audio, context=context) == expected  # no CamelCase here: same either way
    assert original.tokenizer("getElementById").input_ids == [75657, 2720]
    assert oracle.tokenizer("getElementById").input_ids == [455, 1691, 1359, 764]  # "get|Element|By|Id"


# --- features and encoder -------------------------------------------------------------------------------------


def test_features_shape(oracle):
    feats = oracle.features(synth_audio(1.3, 0))
    assert feats.shape == (128, 130) and feats.dtype == torch.float32
    assert torch.isfinite(feats).all()


def test_encoder_windowing_hook_is_active(oracle):
    assert oracle.audio_attention == WINDOWED_ATTENTION
    long_clip = synth_audio(20.0, 5)  # 2000 frames -> 260 tokens -> windows 104, 104, 52
    windowed = oracle.encoder_output(long_clip)
    global_ = oracle.encoder_output(long_clip, windowed=False)
    assert windowed.shape == global_.shape == (n_audio_tokens(2000), 64)
    assert (windowed - global_).abs().max() > 1e-2
    assert oracle.audio_attention == WINDOWED_ATTENTION  # the context manager restored it

    short_clip = synth_audio(5.0, 3)  # one window: both paths are the same computation
    assert torch.equal(oracle.encoder_output(short_clip), oracle.encoder_output(short_clip, windowed=False))


def test_windowed_attention_function_matches_block_mask():
    from tests.oracle.official import windowed_sdpa_attention

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 10, 8) for _ in range(3))
    cu = torch.tensor([0, 4, 10], dtype=torch.int32)
    out, _ = windowed_sdpa_attention(None, q, k, v, None, scaling=8**-0.5, cu_seq_lens_q=cu, cu_seq_lens_k=cu)
    mask = torch.full((10, 10), float("-inf"))
    mask[:4, :4] = 0
    mask[4:, 4:] = 0
    ref = torch.softmax(q @ k.transpose(-1, -2) * 8**-0.5 + mask, dim=-1) @ v  # [1, heads, 10, 8]
    torch.testing.assert_close(out, ref.transpose(1, 2), rtol=1e-5, atol=1e-6)


# --- decoding -------------------------------------------------------------------------------------------------


def test_greedy_ids_are_audio_dependent_with_comfortable_margins(oracle):
    clips = [synth_audio(3.0, 1), synth_audio(3.0, 2), synth_audio(6.0, 4)]
    runs = [oracle.greedy_margins(clip, max_new_tokens=24) for clip in clips]
    for clip, (ids, margins) in zip(clips, runs, strict=True):
        assert len(ids) == 24 and IM_END_ID not in ids  # never stops on its own (eos_bias=0)
        assert len(set(ids)) >= 8
        logits = oracle.first_step_logits(clip)
        top2 = logits.topk(2).values
        assert ids[0] == int(logits.argmax())
        assert (top2[0] - top2[1]) / top2[0].abs() > 1e-3
        assert min(margins) > 1e-3  # absolute logit gap at every step (fp32 noise is ~1e-5)
    assert oracle.greedy_ids(clips[0], max_new_tokens=24) == runs[0][0]
    assert runs[0][0] != runs[1][0] and runs[0][0] != runs[2][0] and runs[1][0] != runs[2][0]
    assert runs[0][0][:2] != runs[1][0][:2]


def test_teacher_forced_logits_pick_the_greedy_ids(oracle):
    audio = synth_audio(3.0, seed=7)
    ids = oracle.greedy_ids(audio, max_new_tokens=6)
    forced = oracle.forced_logits(audio, ids[:-1])
    assert forced.shape[0] == len(ids)
    torch.testing.assert_close(forced[0], oracle.first_step_logits(audio), rtol=0, atol=1e-4)
    assert forced.argmax(-1).tolist() == ids  # row k, fed ids[:k], picks ids[k]


def test_eos_bias_stops_generation(ckpt_root):
    early = oracle_for(cached_checkpoint(ckpt_root, eos_bias=EOS_BIAS_EARLY_STOP))
    ids = early.greedy_ids(synth_audio(3.0, 1), max_new_tokens=32)
    assert ids[-1] == IM_END_ID and 3 <= len(ids) < 32  # EOS included in the returned ids
    lang, text = early.transcribe(synth_audio(3.0, 1), max_new_tokens=32)
    assert lang == "" and text == early.decode(ids).strip() and text

    immediate = oracle_for(cached_checkpoint(ckpt_root, eos_bias=EOS_BIAS_IMMEDIATE))
    assert immediate.greedy_ids(synth_audio(3.0, 1)) == [IM_END_ID]
    assert immediate.transcribe(synth_audio(3.0, 1)) == ("", "")


def test_transcribe_uses_official_decode_and_parse(oracle):
    clip = synth_audio(3.0, 1)
    raw = oracle.raw_output(clip, max_new_tokens=16)
    assert raw == oracle.decode(oracle.greedy_ids(clip, max_new_tokens=16))
    assert oracle.transcribe(clip, max_new_tokens=16) == oracle.parse(raw) == ("", raw.strip())
    forced_raw = oracle.raw_output(clip, language="English", max_new_tokens=16)
    assert oracle.transcribe(clip, language="English", max_new_tokens=16) == ("English", forced_raw.strip())
    assert forced_raw != raw


# --- tied head (docs/model.md §1) --------------------------------------------------------------------------------


def test_tied_head_uses_embeddings_and_ignores_stored_lm_head(tied, oracle_tied, oracle):
    stored = load_tensors(tied)
    embed = stored["thinker.model.embed_tokens.weight"]
    stored_head = stored["thinker.lm_head.weight"]
    assert not torch.equal(embed, stored_head)
    thinker = oracle_tied.thinker
    assert thinker.lm_head.weight.data_ptr() == thinker.model.embed_tokens.weight.data_ptr()

    captured = {}

    def keep_input(module, args, output):
        captured["h"] = args[0][0, -1].clone()

    hook = thinker.lm_head.register_forward_hook(keep_input)
    try:
        clip = synth_audio(3.0, 1)
        logits = oracle_tied.first_step_logits(clip)
    finally:
        hook.remove()
    hidden = captured["h"]
    torch.testing.assert_close(logits, hidden @ embed.T, rtol=1e-5, atol=1e-4)
    # the untied twin (same seed: same weights, its head is the stored lm_head) sees the same hidden state
    torch.testing.assert_close(oracle.first_step_logits(clip), hidden @ stored_head.T, rtol=1e-5, atol=1e-4)
    assert oracle_tied.greedy_ids(clip, max_new_tokens=8) != oracle.greedy_ids(clip, max_new_tokens=8)


# --- checkpoint files -----------------------------------------------------------------------------------------


def test_config_json_holds_the_real_constants(untied, tied):
    config = json.loads((untied / "config.json").read_text())
    assert config["model_type"] == "qwen3_asr" and len(config["support_languages"]) == 30
    thinker = config["thinker_config"]
    audio, text = thinker["audio_config"], thinker["text_config"]
    assert (thinker["audio_token_id"], thinker["audio_start_token_id"], thinker["audio_end_token_id"]) == (
        151676,
        151669,
        151670,
    )
    assert audio["d_model"] // audio["encoder_attention_heads"] == 64
    assert (audio["num_mel_bins"], audio["n_window"], audio["n_window_infer"], audio["conv_chunksize"]) == (
        128,
        50,
        800,
        500,
    )
    assert audio["output_dim"] == text["hidden_size"]
    assert (text["vocab_size"], text["head_dim"], text["num_attention_heads"], text["num_key_value_heads"]) == (
        151936,
        128,
        16,
        8,
    )
    assert text["rope_theta"] == 1e6 and text["rms_norm_eps"] == 1e-6
    assert text["rope_scaling"]["mrope_section"] == [24, 20, 20] and text["rope_scaling"]["interleaved"]
    assert text["tie_word_embeddings"] is False
    assert json.loads((tied / "config.json").read_text())["thinker_config"]["text_config"]["tie_word_embeddings"]
    pre = json.loads((untied / "preprocessor_config.json").read_text())
    assert pre["feature_extractor_type"] == "WhisperFeatureExtractor" and pre["feature_size"] == 128


@pytest.mark.parametrize("tie", [False, True])
def test_hf_layout_holds_the_renamed_tensors(ckpt_root, tie):
    thinker_dir = cached_checkpoint(ckpt_root, tie_word_embeddings=tie)
    hf_dir = cached_checkpoint(ckpt_root, tie_word_embeddings=tie, layout="hf")
    thinker, hf = load_tensors(thinker_dir), load_tensors(hf_dir)
    expected = {hf_tensor_name(name): t for name, t in thinker.items()}
    if tie:  # transformers 5 only ties when no (different) lm_head is stored: dropped by default
        del expected["lm_head.weight"]
    assert set(hf) == set(expected)
    assert all(torch.equal(hf[name], t) for name, t in expected.items())
    assert "model.multi_modal_projector.linear_1.weight" in hf and "model.audio_tower.conv2d1.weight" in hf
    assert "model.language_model.layers.1.self_attn.k_norm.weight" in hf

    config = json.loads((hf_dir / "config.json").read_text())
    assert config["model_type"] == "qwen3_asr" and "thinker_config" not in config
    assert config["tie_word_embeddings"] is tie and config["text_config"]["tie_word_embeddings"] is tie
    assert config["text_config"]["rope_parameters"] == {"rope_theta": 1e6, "rope_type": "default"}
    assert config["audio_config"]["model_type"] == "qwen3_asr_encoder"
    assert config["audio_token_id"] == AUDIO_PAD_ID
    assert (hf_dir / "tokenizer.json").exists() and (hf_dir / "chat_template.jinja").exists()


def test_sharded_checkpoint_loads_to_the_same_model(ckpt_root, untied, oracle):
    sharded = cached_checkpoint(ckpt_root, shards=3)
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert files == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    assert not (sharded / "model.safetensors").exists()
    single, parts = load_tensors(untied), load_tensors(sharded)
    assert set(single) == set(parts) == set(index["weight_map"])
    assert all(torch.equal(single[n], parts[n]) for n in single)
    clip = synth_audio(3.0, 1)
    assert torch.equal(oracle_for(sharded).first_step_logits(clip), oracle.first_step_logits(clip))


def transformers5_path() -> str:
    """Where the README's test command installs transformers>=5 (it cannot share the venv with qwen-asr)."""
    path = Path(os.environ.get(TRANSFORMERS5_PATH_ENV) or Path(sys.prefix) / "transformers5")
    if not (path / "transformers").is_dir():
        pytest.fail(
            f"transformers>=5 not found at {path}: run `pip install --target {path} transformers==5.23.0` "
            f"(or set {TRANSFORMERS5_PATH_ENV}); see README.md, 'Run the tests'"
        )
    return str(path)


@pytest.mark.parametrize("tie", [False, True])
def test_transformers5_native_model_agrees_on_the_hf_layout(ckpt_root, tie):
    """Second reference: transformers>=5's own qwen3_asr model on the hf folder = the official model (windowed
    encoder) on the thinker twin, for a > 8 s clip and a forced language too."""
    hf_dir = cached_checkpoint(ckpt_root, tie_word_embeddings=tie, layout="hf")
    twin = oracle_for(cached_checkpoint(ckpt_root, tie_word_embeddings=tie))
    cases = [(synth_audio(3.0, 1), None), (synth_audio(20.0, 5), None), (synth_audio(4.0, 7), "English")]
    native = hf_native_outputs(
        hf_dir,
        [clip for clip, _ in cases],
        [lang for _, lang in cases],
        transformers5_path=transformers5_path(),
        max_new_tokens=16,
    )
    assert native["tied"] is tie
    for (clip, lang), got in zip(cases, native["results"], strict=True):
        assert got["prompt_ids"] == twin.prompt_ids(clip, language=lang)
        torch.testing.assert_close(
            torch.tensor(got["first_step_logits"]), twin.first_step_logits(clip, language=lang), rtol=1e-5, atol=1e-4
        )
        assert got["greedy_ids"] == twin.greedy_ids(clip, language=lang, max_new_tokens=16)


def test_nagisa_is_imported_only_when_used():
    """tests/oracle defers the official package's nagisa import (about 200 MB and 1 s per process)
    until a name of it is used; then it is the real module, and it segments Japanese."""
    import subprocess

    script = (
        "import sys, tests.oracle, nagisa\n"
        "assert type(sys.modules['nagisa']).__name__ == '_Deferred', sys.modules['nagisa']\n"
        "assert not any(m.startswith('nagisa.') for m in sys.modules), 'nagisa was imported'\n"
        "print(nagisa.tagging('東京に行きます').words)\n"
        "assert type(sys.modules['nagisa']).__name__ == 'module'\n"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['東京', 'に', '行き', 'ます']"
