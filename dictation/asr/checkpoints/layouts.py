"""The two checkpoint layouts' own files: config.json, the processor files and the chat template, per layout.

* original (``thinker``, ``Qwen/Qwen3-ASR-*``): ``config.json`` with ``thinker_config`` (``audio_config``,
  ``text_config`` with ``rope_scaling``), ``preprocessor_config.json`` (WhisperFeatureExtractor),
  ``chat_template.json``;
* transformers-native (``hf``, ``Qwen/Qwen3-ASR-*-hf``, transformers >= 5 ``qwen3_asr``): ``config.json``
  with ``audio_config`` (``qwen3_asr_encoder``) and ``text_config`` (a plain ``qwen3`` config with
  ``rope_parameters``) at the top, the head's tie flag at the top, ``processor_config.json``
  (Qwen3ASRFeatureExtractor), ``chat_template.jinja``, ``generation_config.json``.

Both use the same tokenizer files (``vocab.json``, ``merges.txt``, ``tokenizer_config.json``,
``tokenizer.json``), copied as they are. A config converted to the other layout carries every value
either reader uses; constants the -hf layout leaves out (the M-RoPE sections, which equal 1-D RoPE here,
``user_token_id``) come back with the real models' values. The tensor names are the prefix maps of
``checkpoints/locate.py``.
"""

from __future__ import annotations

import json
from typing import Any

from dictation.asr.config import AsrConfig

ENDOFTEXT_ID, IM_END_ID, TIMESTAMP_ID, USER_TOKEN_ID = 151643, 151645, 151705, 872
MROPE_SECTION = [24, 20, 20]  # every Qwen3-ASR text model (spec); with text positions only it is 1-D RoPE

# The chat templates (written for this project from the prompt format, docs/model.md §7.1): the system turn holds
# the context text, the user turn one audio placeholder per audio item; the -hf one also renders an
# assistant message (transformers 5 prefills "language X<asr_text>" as one, continue_final_message=True).
_COLLECT = (
    "{%- set acc = namespace(system='', audio='') -%}"
    "{%- for message in messages -%}"
    "{%- if message['content'] is string -%}"
    "{%- if message['role'] == 'system' -%}{%- set acc.system = acc.system + message['content'] -%}{%- endif -%}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'audio' or 'audio' in part or 'audio_url' in part -%}"
    "{%- set acc.audio = acc.audio + '<|audio_start|><|audio_pad|><|audio_end|>' -%}"
    "{%- elif message['role'] == 'system' and part['type'] == 'text' -%}"
    "{%- set acc.system = acc.system + part['text'] -%}"
    "{%- endif -%}{%- endfor -%}{%- endif -%}{%- endfor -%}"
    "{{- '<|im_start|>system\\n' + acc.system + '<|im_end|>\\n' -}}"
    "{{- '<|im_start|>user\\n' + acc.audio + '<|im_end|>\\n' -}}"
)
_ASSISTANT = (
    "{%- for message in messages if message['role'] == 'assistant' -%}"
    "{%- set reply = namespace(text='') -%}"
    "{%- if message['content'] is string -%}{%- set reply.text = message['content'] -%}"
    "{%- else -%}{%- for part in message['content'] if part['type'] == 'text' -%}"
    "{%- set reply.text = reply.text + part['text'] -%}{%- endfor -%}{%- endif -%}"
    "{{- '<|im_start|>assistant\\n' + reply.text + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
)
_GENERATION = "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
CHAT_TEMPLATE_THINKER = _COLLECT + _GENERATION
CHAT_TEMPLATE_HF = _COLLECT + _ASSISTANT + _GENERATION

_FEATURES = ("chunk_length", "dither", "feature_size", "hop_length", "n_fft", "n_samples", "nb_max_frames")
_FEATURES += ("padding_side", "padding_value", "return_attention_mask", "sampling_rate")
_FEATURE_DEFAULTS: dict[str, Any] = {
    "chunk_length": 30, "dither": 0.0, "feature_size": 128, "hop_length": 160, "n_fft": 400,
    "n_samples": 480000, "nb_max_frames": 3000, "padding_side": "right", "padding_value": 0.0,
    "return_attention_mask": True, "sampling_rate": 16000,
}  # fmt: skip

# The files each layout has of its own (the converted folder gets the other layout's instead).
OWN_FILES = {
    "thinker": ("config.json", "preprocessor_config.json", "chat_template.json"),
    "hf": ("config.json", "processor_config.json", "chat_template.jinja", "generation_config.json"),
}


def layout_files(raw: dict[str, Any], cfg: AsrConfig, layout: str, *, tied: bool, dtype: str) -> dict[str, str]:
    """The files (name -> text) of ``layout`` for the model whose config.json is ``raw`` (either layout)."""
    if layout == "hf":
        config = hf_config(raw, cfg, tied=tied, dtype=dtype)
        feature = {"feature_extractor_type": "Qwen3ASRFeatureExtractor", **_FEATURE_DEFAULTS}
        feature |= {"min_length": 8000, "n_window": cfg.audio.n_window}
        processor = {"feature_extractor": feature, "processor_class": "Qwen3ASRProcessor", "timestamp_segment_time": 80}
        generation = {
            "do_sample": False,
            "eos_token_id": [ENDOFTEXT_ID, IM_END_ID],
            "max_new_tokens": 512,
            "pad_token_id": IM_END_ID,
        }
        return {
            "config.json": _json(config),
            "processor_config.json": _json(processor),
            "chat_template.jinja": CHAT_TEMPLATE_HF,
            "generation_config.json": _json(generation),
        }
    feature = {"feature_extractor_type": "WhisperFeatureExtractor", **_FEATURE_DEFAULTS}
    return {
        "config.json": _json(thinker_config(raw, cfg, tied=tied, dtype=dtype)),
        "preprocessor_config.json": _json(feature | {"processor_class": "Qwen3ASRProcessor"}),
        "chat_template.json": _json({"chat_template": CHAT_TEMPLATE_THINKER}),
    }


def _json(obj: Any) -> str:
    return json.dumps(obj, indent=2, ensure_ascii=False) + "\n"


def _inner(raw: dict[str, Any]) -> dict[str, Any]:
    return raw.get("thinker_config", raw) if isinstance(raw.get("thinker_config"), dict) else raw


def hf_config(raw: dict[str, Any], cfg: AsrConfig, *, tied: bool, dtype: str) -> dict[str, Any]:
    """config.json of the transformers-native layout (as transformers 5's converter + save_pretrained write it)."""
    a, t, s = cfg.audio, cfg.text, cfg.special
    src_audio = _inner(raw).get("audio_config") or {}
    src_text = _inner(raw).get("text_config") or {}
    audio = {
        "activation_dropout": src_audio.get("activation_dropout", 0.0),
        "activation_function": src_audio.get("activation_function", "gelu"),
        "attention_dropout": src_audio.get("attention_dropout", 0.0),
        "conv_chunksize": a.conv_chunksize,
        "d_model": a.d_model,
        "downsample_hidden_size": a.downsample_hidden_size,
        "dropout": src_audio.get("dropout", 0.0),
        "encoder_attention_heads": a.encoder_attention_heads,
        "encoder_ffn_dim": a.encoder_ffn_dim,
        "encoder_layers": a.encoder_layers,
        "initializer_range": src_audio.get("initializer_range", 0.02),
        "max_position_embeddings": 13,
        "model_type": "qwen3_asr_encoder",
        "n_window": a.n_window,
        "n_window_infer": a.n_window_infer,
        "num_key_value_heads": a.encoder_attention_heads,
        "num_mel_bins": a.num_mel_bins,
        "output_dim": a.output_dim,
        "scale_embedding": src_audio.get("scale_embedding", False),
    }
    text = {
        "attention_bias": src_text.get("attention_bias", False),
        "attention_dropout": src_text.get("attention_dropout", 0.0),
        "bos_token_id": None,
        "eos_token_id": None,
        "head_dim": t.head_dim,
        "hidden_act": src_text.get("hidden_act", "silu"),
        "hidden_size": t.hidden_size,
        "initializer_range": src_text.get("initializer_range", 0.02),
        "intermediate_size": t.intermediate_size,
        "max_position_embeddings": t.max_position_embeddings,
        "max_window_layers": t.num_hidden_layers,
        "model_type": "qwen3",
        "num_attention_heads": t.num_attention_heads,
        "num_hidden_layers": t.num_hidden_layers,
        "num_key_value_heads": t.num_key_value_heads,
        "pad_token_id": None,
        "rms_norm_eps": t.rms_norm_eps,
        "rope_parameters": {"rope_theta": t.rope_theta, "rope_type": "default"},
        "sliding_window": None,
        "tie_word_embeddings": tied,
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": t.vocab_size,
    }
    out = {
        "architectures": ["Qwen3ASRForConditionalGeneration"],
        "audio_config": audio,
        "audio_token_id": s.audio_token_id,
        "dtype": dtype,
        "eos_token_id": [ENDOFTEXT_ID, IM_END_ID],
        "initializer_range": _inner(raw).get("initializer_range", 0.02),
        "model_type": "qwen3_asr",
        "pad_token_id": IM_END_ID,
        "text_config": text,
        "tie_word_embeddings": tied,
        "timestamp_token_id": raw.get("timestamp_token_id", TIMESTAMP_ID),
        "token_classification_bias": False,
    }
    if cfg.support_languages:
        out["support_languages"] = list(cfg.support_languages)  # read by this app; transformers keeps it
    return out


def thinker_config(raw: dict[str, Any], cfg: AsrConfig, *, tied: bool, dtype: str) -> dict[str, Any]:
    """config.json of the original layout (the keys the official config classes read)."""
    a, t, s = cfg.audio, cfg.text, cfg.special
    src_audio = _inner(raw).get("audio_config") or {}
    src_text = _inner(raw).get("text_config") or {}
    audio = {
        "activation_dropout": src_audio.get("activation_dropout", 0),
        "activation_function": src_audio.get("activation_function", "gelu"),
        "attention_dropout": src_audio.get("attention_dropout", 0),
        "conv_chunksize": a.conv_chunksize,
        "d_model": a.d_model,
        "downsample_hidden_size": a.downsample_hidden_size,
        "dropout": src_audio.get("dropout", 0),
        "encoder_attention_heads": a.encoder_attention_heads,
        "encoder_ffn_dim": a.encoder_ffn_dim,
        "encoder_layers": a.encoder_layers,
        "initializer_range": src_audio.get("initializer_range", 0.02),
        "max_source_positions": a.max_source_positions,
        "model_type": "qwen3_asr_audio_encoder",
        "n_window": a.n_window,
        "n_window_infer": a.n_window_infer,
        "num_hidden_layers": a.encoder_layers,
        "num_mel_bins": a.num_mel_bins,
        "output_dim": a.output_dim,
        "scale_embedding": src_audio.get("scale_embedding", False),
    }
    text = {
        "attention_bias": src_text.get("attention_bias", False),
        "attention_dropout": src_text.get("attention_dropout", 0.0),
        "head_dim": t.head_dim,
        "hidden_act": src_text.get("hidden_act", "silu"),
        "hidden_size": t.hidden_size,
        "initializer_range": src_text.get("initializer_range", 0.02),
        "intermediate_size": t.intermediate_size,
        "max_position_embeddings": t.max_position_embeddings,
        "model_type": "qwen3_asr_text",
        "num_attention_heads": t.num_attention_heads,
        "num_hidden_layers": t.num_hidden_layers,
        "num_key_value_heads": t.num_key_value_heads,
        "rms_norm_eps": t.rms_norm_eps,
        "rope_scaling": {
            "interleaved": True,
            "mrope_interleaved": True,
            "mrope_section": MROPE_SECTION,
            "rope_type": "default",
            "type": "default",
        },
        "rope_theta": t.rope_theta,
        "tie_word_embeddings": tied,
        "use_cache": True,
        "vocab_size": t.vocab_size,
    }
    thinker = {
        "audio_config": audio,
        "audio_end_token_id": s.audio_end_token_id,
        "audio_start_token_id": s.audio_start_token_id,
        "audio_token_id": s.audio_token_id,
        "initializer_range": _inner(raw).get("initializer_range", 0.02),
        "model_type": "qwen3_asr_thinker",
        "text_config": text,
        "user_token_id": _inner(raw).get("user_token_id", USER_TOKEN_ID),
    }
    out: dict[str, Any] = {"architectures": ["Qwen3ASRForConditionalGeneration"], "model_type": "qwen3_asr"}
    if cfg.support_languages:
        out["support_languages"] = list(cfg.support_languages)
    out |= {"thinker_config": thinker, "torch_dtype": dtype}
    return out
