"""Our model as GGUF: which file holds which tensor under which name and type, and the metadata, per layout.

The names and metadata keys are the tables ``names.py`` reads (so ``read_gguf`` reads back what is written
here), in the two layouts ``gguf/__init__`` describes:

* ``single``: one ``qwen3asr`` file, ``audio.*`` + ``blk.*`` / ``token_embd`` / ``output_norm`` / ``output``,
  hyper-parameters under ``qwen3asr.*``, the vocabulary under ``tokenizer.ggml.*``;
* ``pair``: a ``qwen3vl`` text model (llama.cpp's names and keys, with the vocabulary) and an ``mmproj``
  (``clip``, projector ``qwen3a``) with the audio tower, its conv biases ``[C, 1, 1]`` and the sinusoid
  position table llama.cpp's runtime reads (``a.position_embd.weight``).

Types: 1-D tensors (norms, biases) stay F32 and the conv kernels F16 (F32 when F32 is asked for), as both
converters store them. The decoder's matrices get the requested type. The audio tower's matrices, the
embeddings and the output head keep at least 8 bits (Q8_0 where a lower type is asked for) unless
``quantize_all``. A matrix whose rows are not a whole number of the type's blocks gets what llama.cpp's
quantizer stores instead (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0), else Q8_0, else F16.
A tied head is not stored (``read_gguf`` ties a model without ``output.weight``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from dictation.asr.checkpoints.gguf.names import (
    DECODER_NAMES,
    MMPROJ_AUDIO_NAMES,
    MMPROJ_KEYS,
    SINGLE_AUDIO_NAMES,
    SINGLE_KEYS,
    TEXT_KEYS,
)
from dictation.asr.checkpoints.gguf.quantize import BITS, K_FALLBACK, fits
from dictation.asr.checkpoints.gguf.reader import MMPROJ_ARCH, MMPROJ_PROJECTOR, SINGLE_ARCH
from dictation.asr.checkpoints.gguf.vocab import TOKEN_CONTROL, TOKEN_NORMAL, TOKEN_UNUSED, TOKEN_USER_DEFINED
from dictation.asr.checkpoints.gguf.writer import PlannedTensor
from dictation.asr.config import AsrConfig

TEXT_ARCH = "qwen3vl"  # what llama.cpp's converter writes for Qwen3-ASR's text model
IM_END = "<|im_end|>"
POSITION_TABLE = "a.position_embd.weight"
LAYOUTS = ("single", "pair")


@dataclass(frozen=True)
class GgufFilePlan:
    metadata: dict[str, Any]
    tensors: list[PlannedTensor]


def gguf_name(ours: str, layout: str) -> str:
    """The GGUF tensor name of our parameter ``ours``."""
    module, _, param = ours.rpartition(".")
    table = DECODER_NAMES + (SINGLE_AUDIO_NAMES if layout == "single" else MMPROJ_AUDIO_NAMES)
    layer = None
    parts = module.split(".")
    if len(parts) > 2 and parts[1] == "layers" and parts[2].isdigit():
        layer = parts[2]
        module = ".".join([*parts[:2], "{i}", *parts[3:]])
    for theirs, mine in table:
        if mine == module:
            return (theirs.format(i=layer) if layer is not None else theirs) + "." + param
    raise KeyError(ours)


def tensor_type(ours: str, shape: tuple[int, ...], requested: str, *, quantize_all: bool = False) -> str:
    """The type ``ours`` is stored as when ``requested`` is asked for (module docstring)."""
    if len(shape) == 1:
        return "F32"
    if len(shape) > 2:
        return "F32" if requested == "F32" else "F16"
    wanted = requested
    keep_8 = not ours.startswith("decoder.layers.")
    if keep_8 and BITS[requested] < 8 and not quantize_all:
        wanted = "Q8_0"
    if fits(wanted, shape):
        return wanted
    wanted = K_FALLBACK.get(wanted, wanted)
    if fits(wanted, shape):
        return wanted
    return "Q8_0" if BITS[wanted] <= 8 and fits("Q8_0", shape) else "F16"


def plan(
    cfg: AsrConfig,
    shapes: dict[str, tuple[int, ...]],
    vocab: dict[str, Any],
    requested: str,
    layout: str,
    *,
    name: str,
    quantize_all: bool = False,
) -> list[GgufFilePlan]:
    """The file(s) of ``layout`` for a model of ``cfg`` whose tensors (our names) have ``shapes``."""
    general = {"general.name": name}
    a, t, s = cfg.audio, cfg.text, cfg.special

    def planned(ours: str, layout_: str) -> PlannedTensor:
        shape = shapes[ours]
        kind = tensor_type(ours, shape, requested, quantize_all=quantize_all)
        if layout_ == "pair" and ours.startswith("audio_tower.conv2d") and ours.endswith(".bias"):
            shape = (shape[0], 1, 1)
        return PlannedTensor(gguf_name(ours, layout_), shape, kind, ours)

    values = {
        "audio.num_mel_bins": a.num_mel_bins, "audio.d_model": a.d_model, "audio.encoder_layers": a.encoder_layers,
        "audio.encoder_attention_heads": a.encoder_attention_heads, "audio.encoder_ffn_dim": a.encoder_ffn_dim,
        "audio.downsample_hidden_size": a.downsample_hidden_size, "audio.output_dim": a.output_dim,
        "audio.max_source_positions": a.max_source_positions, "text.vocab_size": t.vocab_size,
        "text.hidden_size": t.hidden_size, "text.intermediate_size": t.intermediate_size,
        "text.num_hidden_layers": t.num_hidden_layers, "text.num_attention_heads": t.num_attention_heads,
        "text.num_key_value_heads": t.num_key_value_heads, "text.head_dim": t.head_dim,
        "text.rms_norm_eps": float(t.rms_norm_eps), "text.rope_theta": float(t.rope_theta),
        "text.max_position_embeddings": t.max_position_embeddings, "special.audio_token_id": s.audio_token_id,
        "special.audio_start_token_id": s.audio_start_token_id, "special.audio_end_token_id": s.audio_end_token_id,
    }  # fmt: skip
    names = sorted(shapes, key=_order)
    if layout == "single":
        meta: dict[str, Any] = {"general.architecture": SINGLE_ARCH, **general}
        meta["qwen3asr.sample_rate"] = 16000
        meta["qwen3asr.audio.head_dim"] = a.head_dim
        meta |= {key: values[ours] for ours, key in SINGLE_KEYS.items()}
        if vocab.get("tokenizer.ggml.eos_token_id") is not None:
            meta["qwen3asr.eos_token_id"] = vocab["tokenizer.ggml.eos_token_id"]
        meta |= vocab
        return [GgufFilePlan(meta, [planned(n, "single") for n in names])]
    text_meta: dict[str, Any] = {"general.architecture": TEXT_ARCH, **general}
    text_meta |= {key.format(arch=TEXT_ARCH): values[ours] for ours, key in TEXT_KEYS.items()}
    text_meta[f"{TEXT_ARCH}.attention.value_length"] = t.head_dim
    text_meta[f"{TEXT_ARCH}.rope.dimension_sections"] = [24, 20, 20, 0]
    text_meta[f"{TEXT_ARCH}.n_deepstack_layers"] = 0
    text_meta |= vocab
    audio_meta: dict[str, Any] = {"general.architecture": MMPROJ_ARCH, **general}
    audio_meta |= {"clip.has_audio_encoder": True, "clip.has_vision_encoder": False}
    audio_meta["clip.audio.projector_type"] = MMPROJ_PROJECTOR
    audio_meta |= {key: values[ours] for ours, key in MMPROJ_KEYS.items()}
    audio_meta["clip.audio.attention.layernorm_epsilon"] = 1e-5
    text = [planned(n, "pair") for n in names if not n.startswith("audio_tower.")]
    audio = [planned(n, "pair") for n in names if n.startswith("audio_tower.")]
    audio.append(PlannedTensor(POSITION_TABLE, (a.max_source_positions, a.d_model), "F32", POSITION_TABLE))
    return [GgufFilePlan(text_meta, text), GgufFilePlan(audio_meta, audio)]


def _order(ours: str) -> tuple:
    """Tensors in model order (audio tower, embeddings, layers by number, norm, head)."""
    parts = ours.split(".")
    group = 0 if ours.startswith("audio_tower.") else 2 if ours.startswith("lm_head") else 1
    return (group, *[(int(p), "") if p.isdigit() else (-1, p) for p in parts])


def position_table(max_positions: int, d_model: int) -> np.ndarray:
    """The audio tower's sinusoid table (spec §4.2) as llama.cpp's converter stores it: [sin | cos]."""
    inv = np.exp(-math.log(10000.0) / (d_model // 2 - 1) * np.arange(d_model // 2))
    pos = np.arange(max_positions)[:, None] * inv[None, :]
    return np.concatenate([np.sin(pos), np.cos(pos)], axis=1).astype(np.float32)


def vocab_metadata(tokenizer: Tokenizer, vocab_size: int) -> dict[str, Any]:
    """``tokenizer.ggml.*`` for a byte-level BPE: every id up to ``vocab_size`` (``[PAD<id>]`` where the
    tokenizer has none), llama.cpp's token types, the merges in rank order, ``<|im_end|>`` as EOS."""
    model = json.loads(tokenizer.to_str())["model"]
    tokens = [f"[PAD{i}]" for i in range(vocab_size)]
    types = [TOKEN_UNUSED] * vocab_size
    for token, i in model["vocab"].items():
        if i < vocab_size:
            tokens[i], types[i] = token, TOKEN_NORMAL
    for i, added in tokenizer.get_added_tokens_decoder().items():
        if i < vocab_size and not added.content.startswith("<|unused_"):
            tokens[i] = added.content
            types[i] = TOKEN_CONTROL if added.special else TOKEN_USER_DEFINED
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    meta: dict[str, Any] = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "qwen2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": merges,
    }
    eos = tokenizer.token_to_id(IM_END)
    if eos is not None and eos < vocab_size:
        meta["tokenizer.ggml.eos_token_id"] = eos
        meta["tokenizer.ggml.padding_token_id"] = eos
    return meta


def pair_paths(out: Path) -> tuple[Path, Path]:
    """The text model at ``out`` and its ``mmproj-<name>`` beside it."""
    return out, out.with_name(f"mmproj-{out.name}")
