"""Typed model configuration, read from a checkpoint's ``config.json``.

Two layouts exist (docs/architecture.md, principle 5): the original one, where everything lives under
``thinker_config``, and the transformers-native ``-hf`` one, where ``audio_config`` and
``text_config`` sit at the top level. Both become the same frozen dataclasses.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dictation.asr.errors import ModelError
from dictation.files import read_json

SAMPLE_RATE = 16_000
"""What the engine consumes: mono float32 samples at 16 kHz (the model's mel frontend, docs/model.md §4).
Every part of the app that records, reads or trims audio uses this one constant, re-exported by
``dictation.asr``."""

MAX_CONFIG_BYTES = 16 << 20  # config.json; a real one is a few kB
MAX_INT = 2**31 - 1  # any size or id beyond this is not a model's (and would overflow int32 indices)
MAX_N_WINDOW = 10_000  # audio chunk of 2 x n_window mel frames (the real models: 50, one second)


@dataclass(frozen=True)
class AudioEncoderConfig:
    num_mel_bins: int = 128
    d_model: int = 1024
    encoder_layers: int = 24
    encoder_attention_heads: int = 16
    encoder_ffn_dim: int = 4096
    output_dim: int = 2048
    downsample_hidden_size: int = 480
    n_window: int = 50
    n_window_infer: int = 800
    conv_chunksize: int = 500
    max_source_positions: int = 1500

    @property
    def head_dim(self) -> int:
        return self.d_model // self.encoder_attention_heads

    @property
    def chunk_frames(self) -> int:
        """Mel frames per conv chunk (100 = 1 s, docs/model.md §5.1)."""
        return 2 * self.n_window


@dataclass(frozen=True)
class TextDecoderConfig:
    vocab_size: int = 151936
    hidden_size: int = 2048
    intermediate_size: int = 6144
    num_hidden_layers: int = 28
    num_attention_heads: int = 16
    num_key_value_heads: int = 8
    head_dim: int = 128
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 65536


@dataclass(frozen=True)
class SpecialTokens:
    audio_token_id: int = 151676
    audio_start_token_id: int = 151669
    audio_end_token_id: int = 151670


@dataclass(frozen=True)
class AsrConfig:
    audio: AudioEncoderConfig
    text: TextDecoderConfig
    special: SpecialTokens
    layout: str  # "thinker" or "hf"
    support_languages: tuple[str, ...] = ()
    # config.json's quantization_config of a pre-quantized folder (see dictation.asr.nn.quantized), validated;
    # None for a floating-point model. The variant comes from here, never from the folder's name.
    quantization: dict[str, Any] | None = dataclasses.field(default=None, hash=False)

    @classmethod
    def from_dict(cls, raw: dict[str, Any], *, source: str = "config.json") -> AsrConfig:
        model_type = raw.get("model_type", "")
        if not isinstance(model_type, str):
            raise ModelError(f"{source}: model_type is {_shown(model_type)}; expected 'qwen3_asr'")
        if "thinker_config" in raw:
            layout = "thinker"
            inner = raw["thinker_config"]
        elif "audio_config" in raw and "text_config" in raw:
            layout = "hf"
            inner = raw
        else:
            raise ModelError(
                f"{source}: not a Qwen3-ASR config (model_type={model_type!r}; "
                "expected thinker_config or audio_config + text_config)"
            )
        if model_type and "qwen3_asr" not in model_type:
            raise ModelError(f"{source}: model_type {model_type!r} is not Qwen3-ASR (expected 'qwen3_asr')")
        inner = _section(inner, "thinker_config", source)
        if inner.get("model_type") == "qwen3_forced_aligner":
            raise ModelError(f"{source}: this is Qwen3-ForcedAligner, not a Qwen3-ASR transcription model")
        audio_raw = _section(inner.get("audio_config"), "audio_config", source)
        text_raw = dict(_section(inner.get("text_config"), "text_config", source))
        # Old configs keep rope settings in rope_scaling, newer ones in rope_parameters.
        rope = _section(text_raw.get("rope_parameters"), "text_config.rope_parameters", source)
        if "rope_theta" not in text_raw and "rope_theta" in rope:
            text_raw["rope_theta"] = rope["rope_theta"]
        if layout == "hf" and "tie_word_embeddings" in raw:
            # transformers >= 5 ties the head by the top-level flag for this layout.
            text_raw["tie_word_embeddings"] = raw["tie_word_embeddings"]
        special = checked(SpecialTokens, inner, source, "", minimum=0)
        audio = checked(AudioEncoderConfig, audio_raw, source, "audio_config.")
        text = checked(TextDecoderConfig, text_raw, source, "text_config.")
        if audio.output_dim != text.hidden_size:
            raise ModelError(f"{source}: audio output_dim {audio.output_dim} != text hidden_size {text.hidden_size}")
        if audio.d_model % audio.encoder_attention_heads:
            raise ModelError(f"{source}: audio d_model not divisible by encoder_attention_heads")
        if text.num_attention_heads % text.num_key_value_heads:
            raise ModelError(f"{source}: num_attention_heads not a multiple of num_key_value_heads")
        if not audio.chunk_frames <= audio.n_window_infer or audio.n_window > MAX_N_WINDOW:
            raise ModelError(
                f"{source}: audio n_window {audio.n_window} / n_window_infer {audio.n_window_infer} are not usable "
                f"(n_window at most {MAX_N_WINDOW}, n_window_infer at least 2 x n_window)"
            )
        langs = raw.get("support_languages") or ()
        if not isinstance(langs, (list, tuple)) or not all(isinstance(lang, str) for lang in langs):
            raise ModelError(f"{source}: support_languages is not a list of language names")
        langs = tuple(langs)
        quantization = _quantization(raw.get("quantization_config"), source)
        return cls(
            audio=audio, text=text, special=special, layout=layout, support_languages=langs, quantization=quantization
        )

    @classmethod
    def from_file(cls, path: Path) -> AsrConfig:
        try:
            raw = read_json(path, MAX_CONFIG_BYTES)
        except FileNotFoundError:
            raise ModelError(f"{path}: missing (not a model folder?)") from None
        except ValueError as exc:  # too large, not UTF-8, not JSON, nested too deeply
            raise ModelError(f"{path}: {exc}") from None
        except OSError as exc:
            raise ModelError(f"{path}: unreadable config ({exc.strerror or exc})") from None
        if not isinstance(raw, dict):
            raise ModelError(f"{path}: not a JSON object")
        return cls.from_dict(raw, source=str(path))


# Kept here (not imported from dictation.asr.nn.quantized) so that reading a config never imports torch.
_QUANT_METHOD = "dictation"
_QUANT_FORMAT_VERSION = 1
_QUANT_VARIANTS = ("int8", "int4")
_INT4_GROUP_SIZES = (32, 64, 128, 256)


def _quantization(q: Any, source: str) -> dict[str, Any] | None:
    """Validate a ``quantization_config``: only this app's own pre-quantized folders load."""
    if q is None:
        return None
    where = f"{source}: quantization_config"
    if not isinstance(q, dict):
        raise ModelError(f"{where} is not a JSON object")
    method = q.get("quant_method")
    if method != _QUANT_METHOD:
        raise ModelError(
            f"{where} has quant_method {method!r}: this model was quantized by another tool (bitsandbytes, "
            f"GPTQ, AWQ, ...); only this app's own quantized folders (quant_method {_QUANT_METHOD!r}) load, "
            "so use the unquantized model and quantize it with this app"
        )
    version = q.get("format_version")
    if type(version) is not int or version < 1:
        raise ModelError(f"{where} has no valid format_version ({version!r})")
    if version > _QUANT_FORMAT_VERSION:
        raise ModelError(
            f"{where} has format_version {version}, newer than this app reads ({_QUANT_FORMAT_VERSION}); update the app"
        )
    variant = q.get("variant")
    if variant not in _QUANT_VARIANTS:
        raise ModelError(f"{where} has variant {variant!r}; expected one of {', '.join(_QUANT_VARIANTS)}")
    group_size = q.get("group_size")
    if variant == "int4" and (type(group_size) is not int or group_size not in _INT4_GROUP_SIZES):
        raise ModelError(
            f"{where} has group_size {group_size!r}; int4 needs an integer, one of "
            f"{', '.join(map(str, _INT4_GROUP_SIZES))}"
        )
    if variant == "int8" and group_size is not None and type(group_size) is not int:
        raise ModelError(f"{where} has group_size {group_size!r}; expected an integer or null")
    return dict(q)


def checked(cls: type, raw: dict[str, Any], source: str, prefix: str, minimum: int = 1) -> Any:
    """Build a dataclass from the keys it knows, each checked against its declared type: whole numbers
    (an integral float such as 1e3 is accepted) of at least ``minimum``, positive finite floats,
    true/false. A value of another type is a ModelError naming ``source`` and the key."""
    kwargs = {}
    for name, field in cls.__dataclass_fields__.items():
        if name in raw and raw[name] is not None:
            kwargs[name] = _value(raw[name], type(field.default), f"{prefix}{name}", source, minimum)
    return cls(**kwargs)


def _section(value: Any, key: str, source: str) -> dict[str, Any]:
    """A nested object of the config (``{}`` when absent); ModelError if it is something else."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ModelError(f"{source}: {key} is {_shown(value)}; expected a JSON object")
    return value


def _value(value: Any, kind: type, key: str, source: str, minimum: int) -> Any:
    if kind is bool:
        if isinstance(value, bool):
            return value
        raise ModelError(f"{source}: {key} is {value!r}; expected true or false")
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:
        if not number or not math.isfinite(value) or value != int(value):
            raise ModelError(f"{source}: {key} is {_shown(value)}; expected a whole number")
        if not minimum <= value <= MAX_INT:
            raise ModelError(f"{source}: {key} is {_shown(value)}; expected {minimum} to {MAX_INT}")
        return int(value)
    if not number or not math.isfinite(value) or value <= 0:
        raise ModelError(f"{source}: {key} is {_shown(value)}; expected a positive number")
    return float(value)


def _shown(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, (str, int, float)) else type(value).__name__
    return text if len(text) <= 40 else text[:40] + "..."
