"""Our model as GGUF: which file holds which tensor under which name and type, and the metadata, per layout.

The names and metadata keys are the tables ``names.py`` reads (so ``read_gguf`` reads back what is written
here), in the two layouts ``gguf/__init__`` describes; what each engine's own converter writes and where we
differ: docs/engine.md, "GGUF".

* ``single``: one ``qwen3asr`` file (CrispASR), ``audio.*`` + ``blk.*`` / ``token_embd`` / ``output_norm`` /
  ``output``, hyper-parameters under ``qwen3asr.*``, the vocabulary under ``tokenizer.ggml.*``, and the mel
  frontend's constants CrispASR's runtime reads: ``audio.mel_filters`` (``[201, 128]`` Slaney filters) and
  ``audio.mel_window`` (periodic Hann, 400), F32. A tied head is stored too (a copy of the embeddings: CrispASR
  requires ``output.weight``; ``read_gguf`` ties a head byte-identical to the embeddings);
* ``pair`` (llama.cpp's mtmd): a ``qwen3vl`` text model (llama.cpp's names, keys, vocabulary and chat template)
  and an ``mmproj`` (``clip``, projector ``qwen3a``) with the audio tower, its conv biases ``[C, 1, 1]`` and the
  sinusoid position table llama.cpp's runtime reads (``a.position_embd.weight``). A tied head is not stored
  (llama.cpp falls back to the embeddings, as ``read_gguf`` does).

Both layouts carry llama.cpp's ``general.*`` keys (``type``, ``file_type``, ``quantization_version``,
``size_label``).

Types: 1-D tensors (norms, biases) stay F32; the conv kernels F16 (F32 in a single file when F32 is asked for;
always F16 in the mmproj, where llama.cpp's converter forces F16 on every ``.conv*`` weight, ``conv_out``
included). The decoder's matrices get the requested type. The audio tower's matrices, the embeddings and the
output head keep at least 8 bits (Q8_0 where a lower type is asked for) unless ``quantize_all``. A matrix whose
rows are not a whole number of the type's blocks gets what llama.cpp's quantizer stores instead
(Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0), else Q8_0, else F16.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

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
from dictation.asr.checkpoints.gguf.vocab import CHATML_TEMPLATE
from dictation.asr.checkpoints.gguf.writer import PlannedTensor
from dictation.asr.config import SAMPLE_RATE, AsrConfig
from dictation.asr.nn.encoder import sinusoid_table
from dictation.asr.nn.features import HOP_LENGTH, N_FFT, mel_filters
from dictation.asr.text.tokenizer import END_OF_TEXT

TEXT_ARCH = "qwen3vl"  # what llama.cpp's converter writes for Qwen3-ASR's text model
POSITION_TABLE = "a.position_embd.weight"
MEL_FILTERS, MEL_WINDOW = "audio.mel_filters", "audio.mel_window"
CONSTANTS = (POSITION_TABLE, MEL_FILTERS, MEL_WINDOW)  # tensors computed here, not read from the model
LAYOUTS = ("single", "pair")
AUDIO_LAYER_NORM_EPS = 1e-5  # the audio tower's LayerNorms (torch's default; llama.cpp's converter's default)
# general.file_type (llama.cpp's llama_ftype): what llama.cpp's converter or quantizer writes for each type
FILE_TYPES = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "Q4_K": 14, "Q5_K": 16}
FILE_TYPES |= {"Q6_K": 18, "BF16": 32}
QUANTIZATION_VERSION = 2  # ggml's GGML_QNT_VERSION


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


def tensor_type(
    ours: str, shape: tuple[int, ...], requested: str, *, quantize_all: bool = False, layout: str = "single"
) -> str:
    """The type ``ours`` is stored as in ``layout`` when ``requested`` is asked for (module docstring)."""
    if len(shape) == 1:
        return "F32"
    if layout == "pair" and ours.startswith("audio_tower.conv") and ours.endswith(".weight"):
        return "F16"
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
    a, t, s = cfg.audio, cfg.text, cfg.special

    def planned(ours: str) -> PlannedTensor:
        shape = shapes[ours]
        kind = tensor_type(ours, shape, requested, quantize_all=quantize_all, layout=layout)
        if layout == "pair" and ours.startswith("audio_tower.conv2d") and ours.endswith(".bias"):
            shape = (shape[0], 1, 1)
        return PlannedTensor(gguf_name(ours, layout), shape, kind, ours)

    def general(kind: str, tensors: list[PlannedTensor]) -> dict[str, Any]:
        return {
            "general.type": kind,
            "general.name": name,
            "general.size_label": size_label(sum(math.prod(x.shape) for x in tensors)),
            "general.file_type": FILE_TYPES[requested],
            "general.quantization_version": QUANTIZATION_VERSION,
        }

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
    tokens = vocab.get("tokenizer.ggml.tokens", [])
    end_of_text = tokens.index(END_OF_TEXT) if END_OF_TEXT in tokens else None
    names = sorted(shapes, key=_order)
    if layout == "single":
        tensors = [planned(n) for n in names]
        if "lm_head.weight" not in shapes:  # tied: CrispASR requires the head; a copy of the embeddings
            embed = next(x for x in tensors if x.source == "decoder.embed_tokens.weight")
            head = gguf_name("lm_head.weight", layout)
            tensors.append(PlannedTensor(head, embed.shape, embed.type_name, embed.source))
        tensors.append(PlannedTensor(MEL_FILTERS, (N_FFT // 2 + 1, a.num_mel_bins), "F32", MEL_FILTERS))
        tensors.append(PlannedTensor(MEL_WINDOW, (N_FFT,), "F32", MEL_WINDOW))
        meta: dict[str, Any] = {"general.architecture": SINGLE_ARCH, **general("model", tensors)}
        meta |= {"qwen3asr.sample_rate": SAMPLE_RATE, "qwen3asr.n_fft": N_FFT, "qwen3asr.win_length": N_FFT}
        meta |= {"qwen3asr.hop_length": HOP_LENGTH, "qwen3asr.audio.head_dim": a.head_dim}
        meta |= {key: values[ours] for ours, key in SINGLE_KEYS.items()}
        if vocab.get("tokenizer.ggml.eos_token_id") is not None:
            meta["qwen3asr.eos_token_id"] = vocab["tokenizer.ggml.eos_token_id"]
        if end_of_text is not None:
            meta["qwen3asr.pad_token_id"] = end_of_text
        meta |= vocab
        return [GgufFilePlan(meta, tensors)]
    text = [planned(n) for n in names if not n.startswith("audio_tower.")]
    audio = [planned(n) for n in names if n.startswith("audio_tower.")]
    audio.append(PlannedTensor(POSITION_TABLE, (a.max_source_positions, a.d_model), "F32", POSITION_TABLE))
    text_meta: dict[str, Any] = {"general.architecture": TEXT_ARCH, **general("model", text)}
    # (no {arch}.vocab_size: llama.cpp's converter writes none; the vocabulary's length is the count)
    text_meta |= {k.format(arch=TEXT_ARCH): values[ours] for ours, k in TEXT_KEYS.items() if ours != "text.vocab_size"}
    text_meta[f"{TEXT_ARCH}.attention.value_length"] = t.head_dim
    text_meta[f"{TEXT_ARCH}.rope.dimension_sections"] = [24, 20, 20, 0]
    text_meta[f"{TEXT_ARCH}.n_deepstack_layers"] = 0
    text_meta |= vocab
    text_meta["tokenizer.chat_template"] = CHATML_TEMPLATE
    audio_meta: dict[str, Any] = {"general.architecture": MMPROJ_ARCH, **general("mmproj", audio)}
    audio_meta["clip.has_audio_encoder"] = True
    audio_meta["clip.audio.projector_type"] = MMPROJ_PROJECTOR
    audio_meta |= {key: values[ours] for ours, key in MMPROJ_KEYS.items()}
    audio_meta["clip.audio.attention.layer_norm_epsilon"] = AUDIO_LAYER_NORM_EPS
    return [GgufFilePlan(text_meta, text), GgufFilePlan(audio_meta, audio)]


def size_label(n_params: int) -> str:
    """``general.size_label`` as gguf-py writes it: two significant digits at least, K/M/B/T ("20M", "0.6B")."""
    scale, suffix = next(((v, s) for v, s in ((1e12, "T"), (1e9, "B"), (1e6, "M")) if n_params > v), (1e3, "K"))
    value = n_params / scale
    return f"{value:.{max(2 - len(str(round(value)).lstrip('0')), 0)}f}{suffix}"


def constant(source: str, shape: tuple[int, ...]) -> np.ndarray:
    """The bytes of a tensor computed here (``CONSTANTS``), float32 in ``shape``."""
    if source == POSITION_TABLE:  # as our encoder computes it (docs/model.md §5.2), and llama.cpp's converter
        return sinusoid_table(*shape).numpy()
    if source == MEL_FILTERS:
        return mel_filters(shape[1]).astype(np.float32)
    if source == MEL_WINDOW:
        return torch.hann_window(shape[0], periodic=True, dtype=torch.float32).numpy()
    raise KeyError(source)


def _order(ours: str) -> tuple:
    """Tensors in model order (audio tower, embeddings, layers by number, norm, head)."""
    parts = ours.split(".")
    group = 0 if ours.startswith("audio_tower.") else 2 if ours.startswith("lm_head") else 1
    return (group, *[(int(p), "") if p.isdigit() else (-1, p) for p in parts])


def pair_paths(out: Path) -> tuple[Path, Path]:
    """The text model at ``out`` and its ``mmproj-<name>`` beside it."""
    return out, out.with_name(f"mmproj-{out.name}")
