"""Qwen3-ASR models stored as GGUF files: parsing, name mapping, dequantization on the target device.

Two public layouts are read:

* **single file** (``general.architecture = "qwen3asr"``), as CrispASR's converter writes it
  (CrispStrobe/CrispASR ``models/convert-qwen3-asr-to-gguf.py``, loader ``src/qwen3_asr.cpp``):
  ``audio.*`` (encoder, convs, projector), ``blk.N.*`` / ``token_embd`` / ``output_norm`` /
  ``output`` (decoder), hyper-parameters under ``qwen3asr.*``, the vocabulary under
  ``tokenizer.ggml.*`` (tokens + merges; no token types in the files we know);
* **llama.cpp pair**: a text model (llama.cpp's converter registers ``Qwen3ASRForConditionalGeneration``
  as architecture ``qwen3vl``; a plain ``qwen3`` file is accepted too) with llama.cpp's standard
  decoder names and tokenizer, plus an ``mmproj`` file (``general.architecture = "clip"``,
  ``clip.audio.projector_type = "qwen3a"``) holding the audio tower under ``a.*`` / ``mm.a.*``
  (ggml-org/llama.cpp ``conversion/qwen3vl.py`` ``Qwen3ASRMmprojModel`` / ``Qwen3ASRTextModel``,
  ``gguf-py/gguf/tensor_mapping.py``, ``tools/mtmd/clip.cpp`` ``PROJECTOR_TYPE_QWEN3A``).

Neither converter permutes a weight that we use, except that llama.cpp stores the three conv
biases as ``[C, 1, 1]`` (they are flattened back); Qwen2/Qwen3 Q/K are not permuted for RoPE
(only llama.cpp's ``LlamaModel`` does that). GGUF lists dimensions fastest-first; shapes here are
torch order (reversed). Tensors a layout carries for its own runtime (CrispASR's mel filters and
window, llama.cpp's sinusoid table ``a.position_embd.weight``) are ignored.

The file format is parsed here (header, metadata, tensor table) instead of with gguf-py's
``GGUFReader``, which takes ~7 s to index the 300k vocabulary and merge strings of a Qwen file;
this parser takes well under a second and needs no extra package. Tensor data is memory-mapped
copy-on-write and dequantized with torch on the target device, vectorised over blocks; values are
computed in float32 exactly as ggml / gguf-py define them (bit-identical to ``gguf.quants.dequantize``),
then cast to the requested dtype. Types read (values per block / bytes per block):

==========  ======  =====  =====================================================================
type        values  bytes  layout (value = ...)
==========  ======  =====  =====================================================================
F32, F16,   1       4/2/2  plain floats
BF16
Q8_0        32      34     ``[d f16][32 x int8 q]``; ``d * q``
Q4_0        32      18     ``[d f16][16 B nibbles]``; ``d * (q - 8)``
Q4_1        32      20     ``[d f16][m f16][16 B nibbles]``; ``d * q + m``
Q5_0        32      22     ``[d f16][qh u32][16 B nibbles]``; ``d * (q - 16)``, bit i of qh = bit 4 of q_i
Q5_1        32      24     ``[d f16][m f16][qh u32][16 B nibbles]``; ``d * q + m``
Q3_K        256     110    ``[hmask 32][qs 64][scales 12][d f16]``; 16 x 16, ``d * (sc - 32) * q``,
                           q = 2 low bits - (4 where the hmask bit is 0), sc 6-bit
Q4_K        256     144    ``[d][dmin][scales 12][qs 128]``; 8 x 32, ``d * sc * q - dmin * m``
Q5_K        256     176    ``[d][dmin][scales 12][qh 32][qs 128]``; as Q4_K with a fifth bit
Q6_K        256     210    ``[ql 128][qh 64][scales 16 x int8][d]``; 16 x 16, ``d * sc * (q - 32)``
==========  ======  =====  =====================================================================

Nibble blocks of 32 (Q4_*/Q5_*) hold values 0-15 in the low nibbles of their 16 bytes and 16-31 in
the high nibbles. Other types (Q2_K, the IQ types, ...) are refused with a WeightsError naming the
file, the tensor and the type. CrispASR's quantizer falls back to Q4_0/Q5_0 (``Q4_K``/``Q5_K``
requests) for rows that are not a multiple of 256, e.g. the 0.6B audio encoder's width 896.
"""

from __future__ import annotations

import logging
import re
import struct
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tokenizers import AddedToken, Tokenizer, models

from dictation.asr.config import AsrConfig, AudioEncoderConfig, SpecialTokens, TextDecoderConfig, checked
from dictation.asr.errors import ModelError, WeightsError
from dictation.asr.model import AsrModel
from dictation.asr.prompt import END_OF_TEXT, PromptBuilder, byte_level_bpe
from dictation.asr.weights import check_finite, finite_flag

log = logging.getLogger(__name__)

GGUF_MAGIC = b"GGUF"
SINGLE_ARCH = "qwen3asr"
TEXT_ARCHS = ("qwen3vl", "qwen3")
MMPROJ_ARCH = "clip"
MMPROJ_PROJECTOR = "qwen3a"

# --- tensor names ------------------------------------------------------------------------------------
# (GGUF module name, our module name); "{i}" is a layer index. A GGUF tensor is "<module>.weight" or
# "<module>.bias" and maps to the same suffix on our side.

DECODER_NAMES: tuple[tuple[str, str], ...] = (  # both layouts (llama.cpp's standard names)
    ("token_embd", "decoder.embed_tokens"),
    ("output_norm", "decoder.norm"),
    ("output", "lm_head"),
    ("blk.{i}.attn_norm", "decoder.layers.{i}.input_layernorm"),
    ("blk.{i}.attn_q", "decoder.layers.{i}.self_attn.q_proj"),
    ("blk.{i}.attn_k", "decoder.layers.{i}.self_attn.k_proj"),
    ("blk.{i}.attn_v", "decoder.layers.{i}.self_attn.v_proj"),
    ("blk.{i}.attn_output", "decoder.layers.{i}.self_attn.o_proj"),
    ("blk.{i}.attn_q_norm", "decoder.layers.{i}.self_attn.q_norm"),
    ("blk.{i}.attn_k_norm", "decoder.layers.{i}.self_attn.k_norm"),
    ("blk.{i}.ffn_norm", "decoder.layers.{i}.post_attention_layernorm"),
    ("blk.{i}.ffn_gate", "decoder.layers.{i}.mlp.gate_proj"),
    ("blk.{i}.ffn_up", "decoder.layers.{i}.mlp.up_proj"),
    ("blk.{i}.ffn_down", "decoder.layers.{i}.mlp.down_proj"),
)
SINGLE_AUDIO_NAMES: tuple[tuple[str, str], ...] = (  # CrispASR "qwen3asr"
    ("audio.conv.1", "audio_tower.conv2d1"),
    ("audio.conv.2", "audio_tower.conv2d2"),
    ("audio.conv.3", "audio_tower.conv2d3"),
    ("audio.conv_out", "audio_tower.conv_out"),
    ("audio.blk.{i}.attn_norm", "audio_tower.layers.{i}.self_attn_layer_norm"),
    ("audio.blk.{i}.attn_q", "audio_tower.layers.{i}.self_attn.q_proj"),
    ("audio.blk.{i}.attn_k", "audio_tower.layers.{i}.self_attn.k_proj"),
    ("audio.blk.{i}.attn_v", "audio_tower.layers.{i}.self_attn.v_proj"),
    ("audio.blk.{i}.attn_out", "audio_tower.layers.{i}.self_attn.out_proj"),
    ("audio.blk.{i}.ffn_norm", "audio_tower.layers.{i}.final_layer_norm"),
    ("audio.blk.{i}.ffn_up", "audio_tower.layers.{i}.fc1"),
    ("audio.blk.{i}.ffn_down", "audio_tower.layers.{i}.fc2"),
    ("audio.ln_post", "audio_tower.ln_post"),
    ("audio.proj1", "audio_tower.proj1"),
    ("audio.proj2", "audio_tower.proj2"),
)
MMPROJ_AUDIO_NAMES: tuple[tuple[str, str], ...] = (  # llama.cpp mmproj, projector "qwen3a"
    ("a.conv2d.1", "audio_tower.conv2d1"),
    ("a.conv2d.2", "audio_tower.conv2d2"),
    ("a.conv2d.3", "audio_tower.conv2d3"),
    ("a.conv_out", "audio_tower.conv_out"),
    ("a.blk.{i}.ln1", "audio_tower.layers.{i}.self_attn_layer_norm"),
    ("a.blk.{i}.attn_q", "audio_tower.layers.{i}.self_attn.q_proj"),
    ("a.blk.{i}.attn_k", "audio_tower.layers.{i}.self_attn.k_proj"),
    ("a.blk.{i}.attn_v", "audio_tower.layers.{i}.self_attn.v_proj"),
    ("a.blk.{i}.attn_out", "audio_tower.layers.{i}.self_attn.out_proj"),
    ("a.blk.{i}.ln2", "audio_tower.layers.{i}.final_layer_norm"),
    ("a.blk.{i}.ffn_up", "audio_tower.layers.{i}.fc1"),
    ("a.blk.{i}.ffn_down", "audio_tower.layers.{i}.fc2"),
    ("a.post_ln", "audio_tower.ln_post"),
    ("mm.a.mlp.1", "audio_tower.proj1"),
    ("mm.a.mlp.2", "audio_tower.proj2"),
)
SINGLE_IGNORED = frozenset({"audio.mel_filters", "audio.mel_window"})  # CrispASR's own frontend constants
MMPROJ_IGNORED = frozenset({"a.position_embd.weight"})  # the sinusoid table; we compute it

# --- hyper-parameters ---------------------------------------------------------------------------------
# our config field -> metadata key; absent keys fall back to tensor shapes or the config defaults.

SINGLE_KEYS = {
    "audio.num_mel_bins": "qwen3asr.n_mels",
    "audio.d_model": "qwen3asr.audio.d_model",
    "audio.encoder_layers": "qwen3asr.audio.n_layers",
    "audio.encoder_attention_heads": "qwen3asr.audio.n_heads",
    "audio.encoder_ffn_dim": "qwen3asr.audio.ff_dim",
    "audio.downsample_hidden_size": "qwen3asr.audio.conv_channels",
    "audio.output_dim": "qwen3asr.audio.proj_dim",
    "audio.max_source_positions": "qwen3asr.audio.max_source_pos",
    "text.vocab_size": "qwen3asr.llm.vocab_size",
    "text.hidden_size": "qwen3asr.llm.d_model",
    "text.intermediate_size": "qwen3asr.llm.ff_dim",
    "text.num_hidden_layers": "qwen3asr.llm.n_layers",
    "text.num_attention_heads": "qwen3asr.llm.n_heads",
    "text.num_key_value_heads": "qwen3asr.llm.n_kv_heads",
    "text.head_dim": "qwen3asr.llm.head_dim",
    "text.rms_norm_eps": "qwen3asr.llm.rms_norm_eps",
    "text.rope_theta": "qwen3asr.llm.rope_theta",
    "text.max_position_embeddings": "qwen3asr.llm.max_pos",
    "special.audio_token_id": "qwen3asr.audio_pad_token_id",
    "special.audio_start_token_id": "qwen3asr.audio_start_token_id",
    "special.audio_end_token_id": "qwen3asr.audio_end_token_id",
}
TEXT_KEYS = {  # "{arch}" is the text file's general.architecture
    "text.vocab_size": "{arch}.vocab_size",
    "text.hidden_size": "{arch}.embedding_length",
    "text.intermediate_size": "{arch}.feed_forward_length",
    "text.num_hidden_layers": "{arch}.block_count",
    "text.num_attention_heads": "{arch}.attention.head_count",
    "text.num_key_value_heads": "{arch}.attention.head_count_kv",
    "text.head_dim": "{arch}.attention.key_length",
    "text.rms_norm_eps": "{arch}.attention.layer_norm_rms_epsilon",
    "text.rope_theta": "{arch}.rope.freq_base",
    "text.max_position_embeddings": "{arch}.context_length",
}
MMPROJ_KEYS = {
    "audio.num_mel_bins": "clip.audio.num_mel_bins",
    "audio.d_model": "clip.audio.embedding_length",
    "audio.encoder_layers": "clip.audio.block_count",
    "audio.encoder_attention_heads": "clip.audio.attention.head_count",
    "audio.encoder_ffn_dim": "clip.audio.feed_forward_length",
    "audio.output_dim": "clip.audio.projection_dim",
}
AUDIO_HEAD_DIM = 64  # every Qwen3-ASR audio tower (spec §2.1); used only when a file omits the head count

# --- tensor types -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TensorType:
    name: str
    block_size: int  # values per block
    type_size: int  # bytes per block


SUPPORTED_TYPES: dict[int, TensorType] = {
    0: TensorType("F32", 1, 4),
    1: TensorType("F16", 1, 2),
    30: TensorType("BF16", 1, 2),
    8: TensorType("Q8_0", 32, 34),
    2: TensorType("Q4_0", 32, 18),
    3: TensorType("Q4_1", 32, 20),
    6: TensorType("Q5_0", 32, 22),
    7: TensorType("Q5_1", 32, 24),
    11: TensorType("Q3_K", 256, 110),
    12: TensorType("Q4_K", 256, 144),
    13: TensorType("Q5_K", 256, 176),
    14: TensorType("Q6_K", 256, 210),
}
# ggml type ids we cannot read: names for messages, (values, bytes) per block to find truncated files
_OTHER_TYPES = {
    9: ("Q8_1", 32, 40), 10: ("Q2_K", 256, 84), 15: ("Q8_K", 256, 292), 16: ("IQ2_XXS", 256, 66),
    17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98), 19: ("IQ1_S", 256, 50), 20: ("IQ4_NL", 32, 18),
    21: ("IQ3_S", 256, 110), 22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1),
    25: ("I16", 1, 2), 26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8), 29: ("IQ1_M", 256, 56),
    34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66), 39: ("MXFP4", 32, 17),
}  # fmt: skip
_FLOAT_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def type_name(ggml_type: int) -> str:
    known = SUPPORTED_TYPES.get(ggml_type)
    if known:
        return known.name
    return _OTHER_TYPES[ggml_type][0] if ggml_type in _OTHER_TYPES else f"ggml type {ggml_type}"


def _n_bytes(ggml_type: int, n_values: int) -> int | None:
    """Bytes of ``n_values`` values of a ggml type; None for a type id we do not know."""
    known = SUPPORTED_TYPES.get(ggml_type)
    block, size = (known.block_size, known.type_size) if known else _OTHER_TYPES.get(ggml_type, (None, 0, 0))[1:]
    return None if block is None else -(-n_values // block) * size


# --- file parsing -------------------------------------------------------------------------------------

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_NUMPY = {
    0: "<u1",
    1: "<i1",
    2: "<u2",
    3: "<i2",
    4: "<u4",
    5: "<i4",
    6: "<f4",
    7: "<u1",
    10: "<u8",
    11: "<i8",
    12: "<f8",
}
_STRING, _ARRAY, _FLOAT32 = 8, 9, 6
MAX_ARRAY_DEPTH = 16  # arrays of arrays: real files nest one level at most
_U64 = struct.Struct("<Q")


@dataclass(frozen=True)
class GgufTensor:
    name: str
    ggml_type: int
    shape: tuple[int, ...]  # torch order (GGUF's dims reversed)
    offset: int  # absolute byte offset in the file

    @property
    def type_name(self) -> str:
        return type_name(self.ggml_type)

    @property
    def n_values(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass
class GgufFile:
    """One parsed GGUF file: metadata, tensor table, and its memory-mapped bytes."""

    path: Path
    version: int
    metadata: dict[str, Any]
    tensors: dict[str, GgufTensor]
    data: np.ndarray = field(repr=False)  # uint8 memmap (copy-on-write) of the whole file

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    def raw(self, tensor: GgufTensor, kind: TensorType) -> np.ndarray:
        """The tensor's bytes (a view of the mapping); WeightsError if the file is too short."""
        n_blocks, rest = divmod(tensor.n_values, kind.block_size)
        if rest or (tensor.shape and tensor.shape[-1] % kind.block_size):
            raise WeightsError(
                f"{self.path}: tensor {tensor.name} has shape {tensor.shape}, not a whole number of "
                f"{kind.name} blocks of {kind.block_size}"
            )
        end = tensor.offset + n_blocks * kind.type_size
        if end > self.data.shape[0]:
            raise WeightsError(
                f"{self.path}: truncated (tensor {tensor.name} ends at byte {end}, the file has "
                f"{self.data.shape[0]}; an interrupted download?)"
            )
        return self.data[tensor.offset : end]


class _Cursor:
    def __init__(self, buf: memoryview, path: Path) -> None:
        self.buf, self.pos, self.path = buf, 0, path

    def scalar(self, fmt: str) -> Any:
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.scalar("<Q")
        if n > len(self.buf) - self.pos:
            raise ValueError(f"string of {n} bytes at offset {self.pos} runs past the end")
        text = str(self.buf[self.pos : self.pos + n], "utf-8")
        self.pos += n
        return text

    def strings(self, count: int) -> list[str]:
        """``count`` strings (a tight loop: a Qwen vocabulary + merges are 300k strings)."""
        buf, pos, end = self.buf, self.pos, len(self.buf)
        unpack = _U64.unpack_from
        out: list[str] = []
        append = out.append
        for _ in range(count):
            (n,) = unpack(buf, pos)
            pos += 8
            if n > end - pos:
                raise ValueError(f"string of {n} bytes at offset {pos} runs past the end")
            append(str(buf[pos : pos + n], "utf-8"))
            pos += n
        self.pos = pos
        return out

    def value(self, vtype: int, depth: int = 0) -> Any:
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            item, count = self.scalar("<I"), self.scalar("<Q")
            if item == _STRING:
                return self.strings(count)
            if item == _ARRAY:
                if depth >= MAX_ARRAY_DEPTH:
                    raise ValueError(f"arrays nested more than {MAX_ARRAY_DEPTH} deep at offset {self.pos}")
                return [self.value(_ARRAY, depth + 1) for _ in range(count)]
            if item not in _NUMPY:
                raise ValueError(f"unknown array item type {item}")
            arr = np.frombuffer(self.buf, dtype=_NUMPY[item], count=count, offset=self.pos)
            self.pos += arr.nbytes
            values = arr.tolist()
            return [bool(v) for v in values] if item == 7 else values
        if vtype not in _SCALARS:
            raise ValueError(f"unknown value type {vtype}")
        value = self.scalar(_SCALARS[vtype])
        return _shortest_f32(value) if vtype == _FLOAT32 else value


def _shortest_f32(x: float) -> float:
    """A float32 metadata value as the shortest decimal that rounds to it (1e-06, not 9.99999997e-07)."""
    return float(str(np.float32(x)))


def read_gguf_file(path: str | Path, *, architecture_only: bool = False) -> GgufFile:
    """Parse a GGUF file's header, metadata and tensor table; no tensor data is read.

    With ``architecture_only`` parsing stops once ``general.architecture`` is known (cheap).
    Raises WeightsError naming the file if it is not a readable GGUF file.
    """
    path = Path(path)
    try:
        if path.exists() and not path.is_file() and not path.is_dir():
            raise WeightsError(f"{path}: not a regular file (a FIFO, socket or device), so not a GGUF file")
        size = path.stat().st_size
        if size < 24:
            raise WeightsError(f"{path}: not a GGUF file ({size} bytes)")
        data = np.memmap(path, dtype=np.uint8, mode="c")
    except OSError as exc:
        raise WeightsError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    cur = _Cursor(memoryview(data), path)
    if bytes(cur.buf[:4]) != GGUF_MAGIC:
        raise WeightsError(f"{path}: not a GGUF file (no GGUF magic bytes)")
    cur.pos = 4
    try:
        version = cur.scalar("<I")
        if version not in (2, 3):
            what = "a big-endian GGUF file" if version > 0xFFFF else f"GGUF version {version}"
            raise WeightsError(f"{path}: {what} is not supported (little-endian GGUF v2/v3 only)")
        n_tensors, n_kv = cur.scalar("<Q"), cur.scalar("<Q")
        if n_tensors > size or n_kv > size:
            raise ValueError(f"implausible counts ({n_tensors} tensors, {n_kv} metadata keys)")
        metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key = cur.string()
            metadata[key] = cur.value(cur.scalar("<I"))
            if architecture_only and key == "general.architecture":
                return GgufFile(path, version, metadata, {}, data)
        if architecture_only:
            return GgufFile(path, version, metadata, {}, data)
        infos = []
        for _ in range(n_tensors):
            name = cur.string()
            n_dims = cur.scalar("<I")
            if n_dims > 8:
                raise ValueError(f"tensor {name} has {n_dims} dimensions")
            dims = struct.unpack_from(f"<{n_dims}Q", cur.buf, cur.pos)
            cur.pos += 8 * n_dims
            ggml_type, offset = cur.scalar("<I"), cur.scalar("<Q")
            infos.append((name, ggml_type, tuple(reversed(dims)), offset))
    except (struct.error, ValueError, UnicodeDecodeError) as exc:
        raise WeightsError(f"{path}: not a readable GGUF file ({exc})") from None
    alignment = metadata.get("general.alignment", 32)
    if type(alignment) is not int or alignment < 1 or alignment & (alignment - 1) or alignment > 1 << 20:
        raise WeightsError(f"{path}: not a readable GGUF file (general.alignment {alignment!r} is not a power of two)")
    start = -(-cur.pos // alignment) * alignment
    tensors: dict[str, GgufTensor] = {}
    for name, ggml_type, shape, offset in infos:
        if name in tensors:
            raise WeightsError(f"{path}: tensor {name} appears twice")
        tensor = tensors[name] = GgufTensor(name, ggml_type, shape, start + offset)
        n_bytes = _n_bytes(ggml_type, tensor.n_values)
        if n_bytes is not None and tensor.offset + n_bytes > size:
            raise WeightsError(
                f"{path}: truncated (tensor {name} ends at byte {tensor.offset + n_bytes}, the file has {size}; "
                "an interrupted download?)"
            )
    return GgufFile(path, version, metadata, tensors, data)


def is_gguf(path: str | Path) -> bool:
    """True for a GGUF file, or a folder holding at least one ``.gguf`` GGUF file."""
    path = Path(path)
    if path.is_dir():
        return any(_has_magic(p) for p in sorted(path.glob("*.gguf")))
    return _has_magic(path)


def _has_magic(path: Path) -> bool:
    if not path.is_file():  # a FIFO or a device would block the read, and is no model
        return False
    try:
        with open(path, "rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError:
        return False


# --- dequantization -----------------------------------------------------------------------------------


def _f16_column(blocks: torch.Tensor, start: int) -> torch.Tensor:
    """The fp16 field at byte ``start`` of every block → float32 ``[n_blocks, 1]``."""
    return blocks[:, start : start + 2].contiguous().view(torch.float16).float()


def _shifts(values: Iterable[int], shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
    return torch.tensor(list(values), dtype=torch.uint8, device=device).view(shape)


def _k_scales(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The 12-byte field of Q4_K/Q5_K → 6-bit (scale, min) per 32-value sub-block, ``[n, 8]`` each.

    Bytes 0-3 hold scales 0-3 (low 6 bits), 4-7 mins 0-3, 8-11 the low nibbles of scales 4-7 and
    (high nibble) of mins 4-7; the top two bits of bytes 0-3 / 4-7 are bits 4-5 of scales / mins 4-7.
    """
    a, b, c = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    scales = torch.cat([a & 63, (c & 15) | ((a >> 2) & 48)], dim=1)
    mins = torch.cat([b & 63, (c >> 4) | ((b >> 2) & 48)], dim=1)
    return scales.float(), mins.float()


def _dequant_q8_0(blocks: torch.Tensor, dst: torch.Tensor) -> None:
    # [d: f16][32 x int8]; value = q * d
    dst.copy_(blocks[:, 2:].view(torch.int8))
    dst.mul_(_f16_column(blocks, 0))


def _nibbles32(qs: torch.Tensor) -> torch.Tensor:
    """16 bytes per block → its 32 4-bit values ``uint8 [n, 32]``: low nibbles first, then high nibbles."""
    n = qs.shape[0]
    return ((qs.reshape(n, 1, 16) >> _shifts((0, 4), (1, 2, 1), qs.device)) & 15).view(n, 32)


def _bits32(qh: torch.Tensor) -> torch.Tensor:
    """A little-endian 32-bit field (4 bytes per block) → its bits ``uint8 [n, 32]``, bit i at index i."""
    n = qh.shape[0]
    return ((qh.reshape(n, 4, 1) >> _shifts(range(8), (1, 1, 8), qh.device)) & 1).view(n, 32)


def _dequant_q4_0(blocks: torch.Tensor, dst: torch.Tensor) -> None:
    # [d: f16][qs: 16]; value = d * (q - 8)
    dst.copy_(_nibbles32(blocks[:, 2:18]))
    dst.sub_(8.0).mul_(_f16_column(blocks, 0))


def _dequant_q4_1(blocks: torch.Tensor, dst: torch.Tensor) -> None:
    # [d: f16][m: f16][qs: 16]; value = d * q + m (two roundings, as gguf-py: no fused multiply-add)
    dst.copy_(_nibbles32(blocks[:, 4:20]))
    dst.mul_(_f16_column(blocks, 0)).add_(_f16_column(blocks, 2))


def _dequant_q5_0(blocks: torch.Tensor, dst: torch.Tensor) -> None:
    # [d: f16][qh: u32][qs: 16]; bit i of qh is bit 4 of value i; value = d * (q - 16)
    dst.copy_(_nibbles32(blocks[:, 6:22]) | (_bits32(blocks[:, 2:6]) << 4))
    dst.sub_(16.0).mul_(_f16_column(blocks, 0))


def _dequant_q5_1(blocks: torch.Tensor, dst: torch.Tensor) -> None:
    # [d: f16][m: f16][qh: u32][qs: 16]; value = d * q + m
    dst.copy_(_nibbles32(blocks[:, 8:24]) | (_bits32(blocks[:, 4:8]) << 4))
    dst.mul_(_f16_column(blocks, 0)).add_(_f16_column(blocks, 2))


def _dequant_q3_k(blocks: torch.Tensor, dst: torch.Tensor) -> None:
    # [hmask: 32][qs: 64][scales: 12][d: f16]; 16 sub-blocks of 16: value = (d*(sc-32)) * q, q in -4..3.
    # Each half of 128 values takes qs[32h:32h+32], 2-bit pairs from bit 0 upwards in 32-value runs;
    # bit j of hmask[l] belongs to value 32j+l: set → q = low bits, clear → q = low bits - 4.
    # Scales: bytes 0-7 low nibbles = low 4 bits of scales 0-7, high nibbles of scales 8-15; bytes 8-11
    # hold bits 4-5, 2-bit pairs from bit 0 upwards (pair k of byte b is scale 4k+b).
    n = blocks.shape[0]
    dev = blocks.device
    low = (blocks[:, 32:96].reshape(n, 2, 1, 32) >> _shifts((0, 2, 4, 6), (1, 1, 4, 1), dev)) & 3
    high = (blocks[:, 0:32].reshape(n, 1, 32) >> _shifts(range(8), (1, 8, 1), dev)) & 1
    lo_sc, hi_sc = blocks[:, 96:104], blocks[:, 104:108]
    sc = torch.cat([lo_sc & 15, lo_sc >> 4], dim=1) | (
        ((hi_sc.reshape(n, 1, 4) >> _shifts((0, 2, 4, 6), (1, 4, 1), dev)) & 3).view(n, 16) << 4
    )
    out = dst.view(n, 16, 16)
    out.copy_((low.view(n, 8, 32) | (high << 2)).view(n, 16, 16))
    d = _f16_column(blocks, 108)
    out.sub_(4.0).mul_((d * sc.float().sub_(32.0)).unsqueeze(-1))


def _dequant_q4_k(blocks: torch.Tensor, dst: torch.Tensor) -> None:
    # [d: f16][dmin: f16][scales: 12][qs: 128]; 8 sub-blocks of 32: value = (d*sc)*q - dmin*m.
    # Sub-block 2j takes the low nibbles of qs[32j:32j+32], sub-block 2j+1 the high nibbles.
    n = blocks.shape[0]
    d, dmin = _f16_column(blocks, 0), _f16_column(blocks, 2)
    sc, m = _k_scales(blocks[:, 4:16])
    q = (blocks[:, 16:144].reshape(n, 4, 1, 32) >> _shifts((0, 4), (1, 1, 2, 1), blocks.device)) & 15
    out = dst.view(n, 8, 32)
    out.copy_(q.view(n, 8, 32))
    out.mul_((d * sc).unsqueeze(-1)).sub_((dmin * m).unsqueeze(-1))


def _dequant_q5_k(blocks: torch.Tensor, dst: torch.Tensor) -> None:
    # [d][dmin][scales: 12][qh: 32][qs: 128]; like Q4_K with a fifth bit: bit j of qh[l] is the
    # high bit of value l of sub-block j.
    n = blocks.shape[0]
    d, dmin = _f16_column(blocks, 0), _f16_column(blocks, 2)
    sc, m = _k_scales(blocks[:, 4:16])
    low = (blocks[:, 48:176].reshape(n, 4, 1, 32) >> _shifts((0, 4), (1, 1, 2, 1), blocks.device)) & 15
    high = (blocks[:, 16:48].reshape(n, 1, 32) >> _shifts(range(8), (1, 8, 1), blocks.device)) & 1
    out = dst.view(n, 8, 32)
    out.copy_(low.view(n, 8, 32) | (high << 4))
    out.mul_((d * sc).unsqueeze(-1)).sub_((dmin * m).unsqueeze(-1))


def _dequant_q6_k(blocks: torch.Tensor, dst: torch.Tensor) -> None:
    # [ql: 128][qh: 64][scales: 16 x int8][d: f16]; 16 sub-blocks of 16: value = (d*sc)*(q - 32).
    # Each half of 128 values: ql[64h:64h+64] low nibbles then high nibbles, 2-bit pairs of
    # qh[32h:32h+32] from bit 0 upwards, in 32-value runs.
    n = blocks.shape[0]
    low = (blocks[:, 0:128].reshape(n, 2, 1, 64) >> _shifts((0, 4), (1, 1, 2, 1), blocks.device)) & 15
    high = (blocks[:, 128:192].reshape(n, 2, 1, 32) >> _shifts((0, 2, 4, 6), (1, 1, 4, 1), blocks.device)) & 3
    out = dst.view(n, 16, 16)
    out.copy_((low.view(n, 8, 32) | (high.view(n, 8, 32) << 4)).view(n, 16, 16))
    d = _f16_column(blocks, 208)
    out.sub_(32.0).mul_((d * blocks[:, 192:208].view(torch.int8).float()).unsqueeze(-1))


_DEQUANT = {
    "Q8_0": _dequant_q8_0,
    "Q4_0": _dequant_q4_0,
    "Q4_1": _dequant_q4_1,
    "Q5_0": _dequant_q5_0,
    "Q5_1": _dequant_q5_1,
    "Q3_K": _dequant_q3_k,
    "Q4_K": _dequant_q4_k,
    "Q5_K": _dequant_q5_k,
    "Q6_K": _dequant_q6_k,
}
_CHUNK_VALUES = 1 << 22  # values per dequantization step (float32 temporaries of 16 MB)


def dequantize_blocks(blocks: torch.Tensor, type_name: str) -> torch.Tensor:
    """Quantized blocks ``uint8 [n_blocks, type_size]`` (any device) → float32 values, flat.

    Exactly the values gguf-py's ``gguf.quants.dequantize`` computes (the same float32 operations
    in the same order).
    """
    kind = next((t for t in SUPPORTED_TYPES.values() if t.name == type_name and t.name in _DEQUANT), None)
    if kind is None:
        raise ValueError(f"no dequantizer for {type_name}")
    dst = torch.empty(blocks.shape[0], kind.block_size, dtype=torch.float32, device=blocks.device)
    _DEQUANT[type_name](blocks, dst)
    return dst.view(-1)


def dequantize(raw: np.ndarray, kind: TensorType, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """A tensor's bytes (host memory) → a new flat tensor of ``dtype`` on ``device``."""
    src = torch.from_numpy(raw)
    if kind.name in _FLOAT_DTYPES:
        return src.view(_FLOAT_DTYPES[kind.name]).to(device, copy=True).to(dtype)
    blocks = src.view(-1, kind.type_size)
    out = torch.empty(blocks.shape[0], kind.block_size, dtype=dtype, device=device)
    step = max(1, _CHUNK_VALUES // kind.block_size)
    scratch = None if dtype == torch.float32 else torch.empty(step, kind.block_size, device=device)
    for first in range(0, blocks.shape[0], step):
        part = blocks[first : first + step].to(device)
        rows = out[first : first + part.shape[0]]
        if scratch is None:
            _DEQUANT[kind.name](part, rows)  # straight into the result
        else:
            _DEQUANT[kind.name](part, scratch[: part.shape[0]])
            rows.copy_(scratch[: part.shape[0]])
    return out.view(-1)


# --- vocabulary ---------------------------------------------------------------------------------------

TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6
# Ids the app needs, patched in where a file without token types left "[PAD<id>]" (older CrispASR
# files did, their runtime patches the same ids): id -> (content, special).
_FALLBACK_ADDED = {
    151643: ("<|endoftext|>", True),
    151644: ("<|im_start|>", True),
    151645: ("<|im_end|>", True),
    151669: ("<|audio_start|>", True),
    151670: ("<|audio_end|>", True),
    151676: ("<|audio_pad|>", True),
    151704: ("<asr_text>", False),
    151705: ("<timestamp>", True),
}
_SPECIAL_WITHOUT_BARS = frozenset({"<timestamp>"})


@dataclass(frozen=True)
class GgufVocab:
    """The tokenizer a GGUF file carries (``tokenizer.ggml.*``)."""

    source: Path
    model: str  # "gpt2" = byte-level BPE
    tokens: list[str]
    token_types: list[int] | None  # llama.cpp's token types; None if the file has none
    merges: list[str]  # "left right", rank order
    eos_id: int | None

    @classmethod
    def from_metadata(cls, gguf: GgufFile) -> GgufVocab:
        meta = gguf.metadata
        tokens = meta.get("tokenizer.ggml.tokens")
        if not isinstance(tokens, list) or not tokens:
            raise ModelError(f"{gguf.path}: no tokenizer in the file (tokenizer.ggml.tokens is missing)")
        types = meta.get("tokenizer.ggml.token_type")
        merges = meta.get("tokenizer.ggml.merges") or []
        if not all(isinstance(t, str) for t in tokens) or not isinstance(merges, list):
            raise ModelError(f"{gguf.path}: tokenizer.ggml.tokens / merges are not lists of strings")
        if types is not None and (not isinstance(types, list) or not all(type(t) is int for t in types)):
            raise ModelError(f"{gguf.path}: tokenizer.ggml.token_type is not a list of integers")
        if types is not None and len(types) != len(tokens):
            raise ModelError(f"{gguf.path}: {len(types)} token types for {len(tokens)} tokens")
        eos = meta.get("tokenizer.ggml.eos_token_id")
        if eos is not None and (type(eos) is not int or not 0 <= eos < len(tokens)):
            raise ModelError(f"{gguf.path}: tokenizer.ggml.eos_token_id {eos!r} is not a token id")
        return cls(
            source=gguf.path,
            model=str(meta.get("tokenizer.ggml.model", "")),
            tokens=tokens,
            token_types=types,
            merges=list(merges),
            eos_id=eos,
        )

    def token_id(self, content: str) -> int | None:
        try:
            return self.tokens.index(content)
        except ValueError:
            return None

    def build(self) -> tuple[Tokenizer, list[str]]:
        """The byte-level BPE tokenizer with every added token at its id, and the added strings.

        Regular tokens (type NORMAL/BYTE) must come first and be contiguous (as in every Qwen file);
        CONTROL tokens become special added tokens, USER_DEFINED ones plain added tokens (``<asr_text>``
        survives decoding), UNUSED ``[PAD<id>]`` slots placeholders (dropped after the last real one).
        Without token types, the regular tokens are those before ``<|endoftext|>`` / the first
        ``[PAD<id>]``, and an added token is special if it reads ``<|...|>``.
        """
        src = self.source
        if self.model != "gpt2":
            raise ModelError(
                f"{src}: tokenizer.ggml.model is {self.model!r}; only Qwen's byte-level BPE ('gpt2') is supported"
            )
        tokens, types = self.tokens, self.token_types
        regular = (TOKEN_NORMAL, TOKEN_BYTE)

        def placeholder(i: int) -> bool:
            return tokens[i] == f"[PAD{i}]"

        if types is None:
            n_regular = next((i for i in range(len(tokens)) if placeholder(i) or tokens[i] == END_OF_TEXT), len(tokens))
        else:
            n_regular = next((i for i, t in enumerate(types) if t not in regular), len(tokens))
            stray = next((i for i in range(n_regular, len(tokens)) if types[i] in regular), None)
            if stray is not None:
                raise ModelError(
                    f"{src}: regular token {tokens[stray]!r} (id {stray}) after the added tokens; "
                    "this vocabulary layout is not supported"
                )
        vocab = {tokens[i]: i for i in range(n_regular)}
        if len(vocab) != n_regular:
            raise ModelError(f"{src}: the vocabulary lists a token twice")
        merges = []
        for line in self.merges:
            left, sep, right = line.partition(" ") if isinstance(line, str) else ("", "", "")
            if not sep or not left or not right:
                raise ModelError(f"{src}: malformed BPE merge {line!r}")
            merges.append((left, right))
        tok = byte_level_bpe(models.BPE(vocab=vocab, merges=merges))

        entries: list[tuple[int, str, bool, bool]] = []  # (id, content, special, is_placeholder)
        for i in range(n_regular, len(tokens)):
            content = tokens[i]
            if placeholder(i) and i in _FALLBACK_ADDED:
                content, special = _FALLBACK_ADDED[i]
                log.warning("%s: token %d is a placeholder; using %s", src, i, content)
                entries.append((i, content, special, False))
            elif placeholder(i) or (types is not None and types[i] == TOKEN_UNUSED):
                entries.append((i, content, True, True))
            elif types is None:
                special = (content.startswith("<|") and content.endswith("|>")) or content in _SPECIAL_WITHOUT_BARS
                entries.append((i, content, special, False))
            else:
                entries.append((i, content, types[i] != TOKEN_USER_DEFINED, False))
        while entries and entries[-1][3]:
            entries.pop()
        for i, content, special, _ in entries:
            token = AddedToken(content, special=special, normalized=False)
            if special:
                tok.add_special_tokens([token])
            else:
                tok.add_tokens([token])
            if tok.token_to_id(content) != i:
                raise ModelError(f"{src}: could not place added token {content!r} at id {i}")
        return tok, [content for _, content, _, _ in entries]


# --- the model ----------------------------------------------------------------------------------------


@dataclass
class GgufModel:
    """A Qwen3-ASR model read from GGUF: config, our tensors (dequantized), vocabulary, provenance."""

    cfg: AsrConfig
    tensors: dict[str, torch.Tensor]  # our parameter names (AsrModel.state_dict()) -> values
    vocab: GgufVocab
    source_types: dict[str, str]  # our parameter name -> GGUF type name ("Q4_K", "F16", ...)
    file_paths: tuple[Path, ...]
    layout: str  # "qwen3asr" (single file) or "llama.cpp" (text model + mmproj)
    eos_ids: tuple[int, ...] = ()  # EOS ids the files declare (the prompt builder adds <|im_end|>, <|endoftext|>)

    def build_model(self) -> AsrModel:
        """An ``AsrModel`` whose parameters ARE ``self.tensors`` (assigned, not copied), in eval mode."""
        with torch.device("meta"):
            model = AsrModel(self.cfg)
        model.load_state_dict(self.tensors, strict=True, assign=True)
        model.eval().requires_grad_(False)
        model.audio_tower.reset_buffers()
        return model

    def tokenizer(self) -> tuple[Tokenizer, list[str]]:
        return self.vocab.build()

    def prompt_builder(self) -> PromptBuilder:
        tokenizer, added = self.vocab.build()
        return PromptBuilder.from_tokenizer(
            tokenizer,
            added,
            source=str(self.vocab.source),
            audio_token_id=self.cfg.special.audio_token_id,
            eos_ids=self.eos_ids,
        )


@dataclass(frozen=True)
class _Entry:
    file: GgufFile
    tensor: GgufTensor
    ours: str


def resolve_files(path: str | Path, mmproj: str | Path | None = None) -> tuple[GgufFile, GgufFile | None]:
    """The model file(s) for ``path``: (single file, None) or (text model, mmproj).

    ``path`` is a ``.gguf`` file (a single-file model, a text model whose mmproj file lies next to it,
    or an mmproj whose text model lies next to it) or a folder holding one model; files are told
    apart by ``general.architecture``, not by name. ``mmproj`` names the audio file explicitly.
    """
    main, audio = _resolve(Path(path), mmproj)
    if audio is not None:
        _check_role(main, TEXT_ARCHS)
        _check_role(audio, (MMPROJ_ARCH,))
    return main, audio


def _resolve(path: Path, mmproj: str | Path | None) -> tuple[GgufFile, GgufFile | None]:
    if mmproj is not None:
        return read_gguf_file(path), read_gguf_file(mmproj)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix.lower() == ".gguf" and p.is_file())
        if not files:
            raise WeightsError(f"{path}: no .gguf file in the folder")
        archs = {p: read_gguf_file(p, architecture_only=True).architecture for p in files}
        singles = [p for p, a in archs.items() if a == SINGLE_ARCH]
        texts = [p for p, a in archs.items() if a in TEXT_ARCHS]
        projs = [p for p, a in archs.items() if a == MMPROJ_ARCH]
        if len(singles) == 1 and not texts:
            return read_gguf_file(singles[0]), None
        if not singles and len(texts) == 1 and len(projs) == 1:
            return read_gguf_file(texts[0]), read_gguf_file(projs[0])
        listing = ", ".join(f"{p.name} ({a or '?'})" for p, a in archs.items())
        raise WeightsError(
            f"{path}: expected one Qwen3-ASR GGUF model (one qwen3asr file, or one qwen3/qwen3vl text model "
            f"+ one mmproj), found: {listing}; choose the file"
        )
    first = read_gguf_file(path)
    arch = first.architecture
    if arch == SINGLE_ARCH:
        return first, None
    if arch in TEXT_ARCHS:
        return first, read_gguf_file(_sibling(path, MMPROJ_ARCH, "the audio encoder (mmproj)"))
    if arch == MMPROJ_ARCH:
        return read_gguf_file(_sibling(path, TEXT_ARCHS, "the text model")), first
    raise WeightsError(
        f"{path}: general.architecture {arch!r} is not Qwen3-ASR (expected {SINGLE_ARCH!r}, or "
        f"{' / '.join(TEXT_ARCHS)} with an mmproj file)"
    )


def _sibling(path: Path, archs: str | tuple[str, ...], what: str) -> Path:
    archs = (archs,) if isinstance(archs, str) else archs
    found = [
        p
        for p in sorted(path.parent.glob("*.gguf"))
        if p != path and read_gguf_file(p, architecture_only=True).architecture in archs
    ]
    if len(found) != 1:
        names = ", ".join(p.name for p in found) or "none"
        raise WeightsError(
            f"{path}: {what} is a separate GGUF file; expected exactly one next to it, found {names} "
            "(pass both files explicitly)"
        )
    return found[0]


def _check_role(gguf: GgufFile, archs: tuple[str, ...]) -> None:
    arch = gguf.architecture
    if arch not in archs:
        raise WeightsError(f"{gguf.path}: general.architecture {arch!r}, expected {' or '.join(archs)}")
    if arch == MMPROJ_ARCH:
        meta = gguf.metadata
        proj = meta.get("clip.audio.projector_type") or meta.get("clip.projector_type")
        if proj != MMPROJ_PROJECTOR or not meta.get("clip.has_audio_encoder", True):
            raise WeightsError(
                f"{gguf.path}: mmproj projector {proj!r} is not a Qwen3 audio tower ({MMPROJ_PROJECTOR!r})"
            )


def _compile(table: tuple[tuple[str, str], ...]) -> list[tuple[re.Pattern[str], str]]:
    out = []
    for theirs, ours in table:
        pattern = re.escape(theirs).replace(re.escape("{i}"), r"(?P<i>\d+)")
        out.append((re.compile(pattern + r"\.(?P<param>weight|bias)"), ours))
    return out


_SINGLE_TABLE = _compile(SINGLE_AUDIO_NAMES + DECODER_NAMES)
_TEXT_TABLE = _compile(DECODER_NAMES)
_MMPROJ_TABLE = _compile(MMPROJ_AUDIO_NAMES)


def _map_names(gguf: GgufFile, table: list[tuple[re.Pattern[str], str]], ignored: frozenset[str]) -> list[_Entry]:
    entries = []
    for name, tensor in gguf.tensors.items():
        if name in ignored:
            continue
        for pattern, ours in table:
            match = pattern.fullmatch(name)
            if match:
                layer = match.group("i") if "i" in pattern.groupindex else None
                module = ours.format(i=int(layer)) if layer is not None else ours
                entries.append(_Entry(gguf, tensor, f"{module}.{match.group('param')}"))
                break
        else:
            raise WeightsError(f"{gguf.path}: unexpected tensor {name}; not a Qwen3-ASR GGUF in this layout?")
    return entries


def _derive_config(
    values: dict[str, Any], shapes: dict[str, tuple[int, ...]], vocab: GgufVocab, source: Path
) -> AsrConfig:
    """The config from metadata ``values`` (our field -> value), shapes where a key is absent."""

    def dim(name: str, axis: int) -> int | None:
        shape = shapes.get(name)
        return shape[axis] if shape and len(shape) > axis else None

    def layer_ids(prefix: str) -> set[int]:
        return {int(m.group(1)) for n in shapes for m in [re.match(re.escape(prefix) + r"(\d+)\.", n)] if m}

    def layers(prefix: str) -> int | None:
        ids = layer_ids(prefix)
        return len(ids) if ids else None

    def pick(key: str, derived: Any = None) -> Any:
        value = values.get(key)
        return derived if value is None else value

    d_model = pick("audio.d_model", dim("audio_tower.conv_out.weight", 0))
    audio_raw = {
        "num_mel_bins": pick("audio.num_mel_bins"),
        "d_model": d_model,
        "encoder_layers": pick("audio.encoder_layers", layers("audio_tower.layers.")),
        "encoder_attention_heads": pick(
            "audio.encoder_attention_heads", d_model // AUDIO_HEAD_DIM if d_model else None
        ),
        "encoder_ffn_dim": pick("audio.encoder_ffn_dim", dim("audio_tower.layers.0.fc1.weight", 0)),
        "output_dim": pick("audio.output_dim", dim("audio_tower.proj2.weight", 0)),
        "downsample_hidden_size": pick("audio.downsample_hidden_size", dim("audio_tower.conv2d1.weight", 0)),
        "max_source_positions": pick("audio.max_source_positions"),
    }
    head_dim = pick("text.head_dim", dim("decoder.layers.0.self_attn.q_norm.weight", 0))
    q_rows, k_rows = (
        dim("decoder.layers.0.self_attn.q_proj.weight", 0),
        dim("decoder.layers.0.self_attn.k_proj.weight", 0),
    )
    text_raw = {
        "vocab_size": pick("text.vocab_size", dim("decoder.embed_tokens.weight", 0)),
        "hidden_size": pick("text.hidden_size", dim("decoder.embed_tokens.weight", 1)),
        "intermediate_size": pick("text.intermediate_size", dim("decoder.layers.0.mlp.gate_proj.weight", 0)),
        "num_hidden_layers": pick("text.num_hidden_layers", layers("decoder.layers.")),
        "num_attention_heads": pick("text.num_attention_heads", q_rows // head_dim if q_rows and head_dim else None),
        "num_key_value_heads": pick("text.num_key_value_heads", k_rows // head_dim if k_rows and head_dim else None),
        "head_dim": head_dim,
        "rms_norm_eps": pick("text.rms_norm_eps"),
        "rope_theta": pick("text.rope_theta"),
        "max_position_embeddings": pick("text.max_position_embeddings"),
        "tie_word_embeddings": "lm_head.weight" not in shapes,
    }
    special_raw = {
        "audio_token_id": pick("special.audio_token_id", vocab.token_id("<|audio_pad|>")),
        "audio_start_token_id": pick("special.audio_start_token_id", vocab.token_id("<|audio_start|>")),
        "audio_end_token_id": pick("special.audio_end_token_id", vocab.token_id("<|audio_end|>")),
    }
    try:
        audio = checked(AudioEncoderConfig, audio_raw, str(source), "audio.")
        text = checked(TextDecoderConfig, text_raw, str(source), "text.")
        special = checked(SpecialTokens, special_raw, str(source), "", minimum=0)
    except ModelError as exc:
        raise WeightsError(f"{exc} (unusable hyper-parameters)") from None
    for part, prefix, n in (
        ("text decoder", "decoder.layers.", text.num_hidden_layers),
        ("audio encoder", "audio_tower.layers.", audio.encoder_layers),
    ):
        ids = layer_ids(prefix)
        if ids != set(range(n)):  # checked before the model is built: its size follows from n
            held = f"layers {min(ids)} to {max(ids)} ({len(ids)} in all)" if ids else "no layers"
            raise WeightsError(f"{source}: the metadata says the {part} has {n} layers, but the tensors hold {held}")
    if audio.output_dim != text.hidden_size:
        raise WeightsError(f"{source}: audio output_dim {audio.output_dim} != text hidden_size {text.hidden_size}")
    if audio.d_model % audio.encoder_attention_heads:
        raise WeightsError(f"{source}: audio d_model not divisible by the audio head count")
    if text.num_attention_heads % text.num_key_value_heads:
        raise WeightsError(f"{source}: num_attention_heads not a multiple of num_key_value_heads")
    return AsrConfig(audio=audio, text=text, special=special, layout="thinker")


def _metadata_values(gguf: GgufFile, keys: dict[str, str]) -> dict[str, Any]:
    arch = gguf.architecture
    out = {}
    for ours, key in keys.items():
        value = gguf.metadata.get(key.format(arch=arch))
        if value is not None:
            out[ours] = value
    return out


def _same_bytes(a: np.ndarray, b: np.ndarray, step: int = 1 << 26) -> bool:
    if a.shape != b.shape:
        return False
    return all(np.array_equal(a[i : i + step], b[i : i + step]) for i in range(0, a.shape[0], step))


def read_gguf(
    path: str | Path,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    *,
    mmproj: str | Path | None = None,
) -> GgufModel:
    """Read a Qwen3-ASR GGUF model and dequantize every tensor to ``dtype`` on ``device``.

    ``path``: a single-file model, a llama.cpp text model (its ``mmproj`` found next to it, or given
    as ``mmproj``), or a folder holding one model. Errors are WeightsError / ModelError naming the
    file and the tensor: unknown tensor names, unsupported tensor types, missing tensors, shapes
    that do not fit the hyper-parameters. Without an ``output.weight`` (or with one byte-identical
    to ``token_embd.weight``) the head is tied to the embeddings.
    """
    t0 = time.perf_counter()
    device = torch.device(device)
    main, audio_file = resolve_files(path, mmproj)
    if audio_file is None:
        layout = "qwen3asr"
        entries = _map_names(main, _SINGLE_TABLE, SINGLE_IGNORED)
        values = _metadata_values(main, SINGLE_KEYS)
        eos = main.metadata.get("qwen3asr.eos_token_id")
    else:
        layout = "llama.cpp"
        entries = _map_names(main, _TEXT_TABLE, frozenset()) + _map_names(audio_file, _MMPROJ_TABLE, MMPROJ_IGNORED)
        values = _metadata_values(main, TEXT_KEYS) | _metadata_values(audio_file, MMPROJ_KEYS)
        eos = None
    vocab = GgufVocab.from_metadata(main)
    if eos is not None and (type(eos) is not int or not 0 <= eos < len(vocab.tokens)):
        raise WeightsError(f"{main.path}: qwen3asr.eos_token_id {eos!r} is not a token id")
    eos_ids = tuple(sorted({e for e in (eos, vocab.eos_id) if e is not None}))
    by_ours = {e.ours: e for e in entries}
    embed, head = by_ours.get("decoder.embed_tokens.weight"), by_ours.get("lm_head.weight")
    if embed is not None and head is not None and _tied_copy(embed, head):
        log.info("%s: output.weight is a copy of token_embd.weight; tying the head", head.file.path)
        del by_ours["lm_head.weight"]
    shapes = {name: e.tensor.shape for name, e in by_ours.items()}
    cfg = _derive_config(values, shapes, vocab, main.path)

    with torch.device("meta"):
        expected = {name: tuple(t.shape) for name, t in AsrModel(cfg).state_dict().items()}
    unexpected = [name for name in by_ours if name not in expected]
    if unexpected:
        e = by_ours[unexpected[0]]
        more = f" (and {len(unexpected) - 1} more)" if len(unexpected) > 1 else ""
        raise WeightsError(
            f"{e.file.path}: unexpected tensor {e.tensor.name} ({e.ours}){more}; it does not fit the "
            f"model the metadata describes ({cfg.text.num_hidden_layers} decoder / {cfg.audio.encoder_layers} "
            "encoder layers)"
        )
    missing = [name for name in expected if name not in by_ours]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        where = main.path if missing[0].startswith(("decoder.", "lm_head.")) or audio_file is None else audio_file.path
        raise WeightsError(
            f"{where}: missing tensor {_gguf_name(missing[0], layout)} ({missing[0]}, expected shape "
            f"{expected[missing[0]]}){more}"
        )
    plan: list[tuple[str, _Entry, TensorType]] = []
    for name, shape in expected.items():
        e = by_ours[name]
        kind = SUPPORTED_TYPES.get(e.tensor.ggml_type)
        if kind is None:
            supported = ", ".join(t.name for t in SUPPORTED_TYPES.values())
            raise WeightsError(
                f"{e.file.path}: tensor {e.tensor.name} has type {e.tensor.type_name}, which is not supported "
                f"(supported: {supported})"
            )
        if e.tensor.shape != shape and _squeezed(e.tensor.shape) != _squeezed(shape):
            raise WeightsError(f"{e.file.path}: tensor {e.tensor.name} has shape {e.tensor.shape}, expected {shape}")
        plan.append((name, e, kind))

    tensors: dict[str, torch.Tensor] = {}
    source_types: dict[str, str] = {}
    finite = []
    for name, e, kind in plan:
        raw = e.file.raw(e.tensor, kind)
        tensors[name] = dequantize(raw, kind, device, dtype).view(expected[name])
        source_types[name] = kind.name
        finite.append((e.file.path, e.tensor.name, finite_flag(tensors[name])))
    check_finite(finite)  # NaN or infinity in the file (or a scale that overflows the dtype): named
    paths = (main.path,) if audio_file is None else (main.path, audio_file.path)
    counts: dict[str, int] = {}
    for kind_name in source_types.values():
        counts[kind_name] = counts.get(kind_name, 0) + 1
    log.info(
        "read %s (%s layout, %s) to %s %s in %.2f s",
        " + ".join(p.name for p in paths),
        layout,
        ", ".join(f"{n} {k}" for k, n in sorted(counts.items())),
        device,
        str(dtype).removeprefix("torch."),
        time.perf_counter() - t0,
    )
    return GgufModel(cfg, tensors, vocab, source_types, paths, layout, eos_ids)


def _tied_copy(embed: _Entry, head: _Entry) -> bool:
    a, b = embed.tensor, head.tensor
    kind = SUPPORTED_TYPES.get(a.ggml_type)
    if kind is None or a.ggml_type != b.ggml_type or a.shape != b.shape:
        return False
    return _same_bytes(embed.file.raw(a, kind), head.file.raw(b, kind))


def _squeezed(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(d for d in shape if d != 1)


def _gguf_name(ours: str, layout: str) -> str:
    """The GGUF name of our parameter ``ours`` in ``layout`` (for messages)."""
    table = DECODER_NAMES + (SINGLE_AUDIO_NAMES if layout == "qwen3asr" else MMPROJ_AUDIO_NAMES)
    module, _, param = ours.rpartition(".")
    for theirs, mine in table:
        pattern = re.escape(mine).replace(re.escape("{i}"), r"(?P<i>\d+)")
        match = re.fullmatch(pattern, module)
        if match:
            return (theirs.format(i=match.group("i")) if "{i}" in theirs else theirs) + "." + param
    return ours
