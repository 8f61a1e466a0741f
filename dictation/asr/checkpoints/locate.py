"""A checkpoint's files without torch: which safetensors file holds which tensor, and tensor headers.

Split from ``checkpoints/safetensors.py`` so that checking a model folder or a LoRA adapter (the settings window
does it while the user picks a folder) costs milliseconds: nothing here imports torch or numpy,
and no tensor data is read, only the JSON header at the start of each safetensors file.

Our parameter names are the checkpoint's with a prefix map (docs/architecture.md, principle 5), per layout:

- ``audio_tower.proj1/proj2.*``: ``thinker.audio_tower.proj1/proj2.*`` (original) or
  ``model.multi_modal_projector.linear_1/linear_2.*`` (``-hf``)
- ``audio_tower.*``: ``thinker.audio_tower.*`` or ``model.audio_tower.*``
- ``decoder.*``: ``thinker.model.*`` or ``model.language_model.*``
- ``lm_head.weight``: ``thinker.lm_head.weight`` or ``lm_head.weight``
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path, PureWindowsPath
from typing import TYPE_CHECKING

from dictation.asr.errors import ModelError, WeightsError
from dictation.files import open_regular

if TYPE_CHECKING:
    from dictation.asr.config import AsrConfig

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt")
FLOAT_DTYPES = ("F32", "F16", "BF16")  # safetensors' names for what load_model accepts

# (our prefix, checkpoint prefix) per layout; the first match wins, so specific entries come first.
PREFIXES: dict[str, tuple[tuple[str, str], ...]] = {
    "thinker": (
        ("audio_tower.", "thinker.audio_tower."),
        ("decoder.", "thinker.model."),
        ("lm_head.", "thinker.lm_head."),
    ),
    "hf": (
        ("audio_tower.proj1.", "model.multi_modal_projector.linear_1."),
        ("audio_tower.proj2.", "model.multi_modal_projector.linear_2."),
        ("audio_tower.", "model.audio_tower."),
        ("decoder.", "model.language_model."),
        ("lm_head.", "lm_head."),
    ),
}

_MAX_HEADER_BYTES = 100_000_000  # the safetensors format's own limit
_DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2}
_DTYPE_BYTES |= {"I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}


def checkpoint_name(ours: str, layout: str) -> str:
    """The checkpoint's name of our parameter ``ours`` in ``layout`` ("thinker" or "hf")."""
    for mine, theirs in PREFIXES[layout]:
        if ours.startswith(mine):
            return theirs + ours[len(mine) :]
    raise KeyError(ours)


def our_name(name: str, layout: str) -> str | None:
    """Our parameter name for the checkpoint tensor ``name`` in ``layout``; None if it has no place."""
    for mine, theirs in PREFIXES[layout]:
        if name.startswith(theirs):
            return mine + name[len(theirs) :]
    return None


@dataclass(frozen=True)
class TensorInfo:
    """A tensor as its safetensors header describes it: dtype name ("BF16", "F32", ...) and shape."""

    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class CheckpointFiles:
    folder: Path
    tensor_files: dict[str, Path]  # checkpoint tensor name -> file holding it

    @property
    def files(self) -> list[Path]:
        return sorted(set(self.tensor_files.values()))

    def headers(self) -> dict[str, TensorInfo]:
        """Every tensor's dtype and shape, from the files' headers; checks that each file holds
        the tensors the shard index assigns to it (a file from another download fails here)."""
        infos: dict[str, TensorInfo] = {}
        for path in self.files:
            header = read_header(path)
            for name, file in self.tensor_files.items():
                if file == path and name not in header:
                    raise WeightsError(f"{path}: tensor {name} listed in {INDEX_FILE} is not in this file")
            infos.update({name: info for name, info in header.items() if self.tensor_files.get(name) == path})
        return infos


def read_header(path: str | os.PathLike) -> dict[str, TensorInfo]:
    """The tensors a safetensors file holds (name -> dtype and shape), reading only its header.

    Raises WeightsError naming the file if it is not safetensors, or is shorter than its header
    says (an interrupted download).
    """
    path = Path(path)
    try:
        with open_regular(path) as f:  # a FIFO named model.safetensors would block open()
            size = os.fstat(f.fileno()).st_size
            head = f.read(8)
            if len(head) < 8:
                raise WeightsError(f"{path}: not a readable safetensors file (only {len(head)} bytes)")
            (n,) = struct.unpack("<Q", head)
            if n < 2 or n > _MAX_HEADER_BYTES or 8 + n > size:
                raise WeightsError(f"{path}: not a readable safetensors file (invalid header length {n})")
            raw = f.read(n)
    except OSError as exc:
        raise WeightsError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise WeightsError(f"{path}: not a readable safetensors file (header is not JSON: {exc})") from None
    except RecursionError:
        raise WeightsError(f"{path}: not a readable safetensors file (header JSON nested too deeply)") from None
    if not isinstance(header, dict):
        raise WeightsError(f"{path}: not a readable safetensors file (header is not a JSON object)")
    data_bytes = size - 8 - n
    infos: dict[str, TensorInfo] = {}
    spans: list[tuple[int, int]] = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        span = _entry_span(entry)
        if span is None:
            raise WeightsError(f"{path}: not a readable safetensors file (bad header entry for {name})")
        infos[name] = TensorInfo(entry["dtype"], tuple(entry["shape"]))
        spans.append(span)
    spans.sort()
    end = 0
    for begin, stop in spans:  # the format stores tensors back to back, covering the data exactly
        if begin != end:
            raise WeightsError(f"{path}: not a readable safetensors file (tensor data overlaps or has gaps)")
        end = stop
    if end > data_bytes:
        raise WeightsError(f"{path}: truncated ({data_bytes} of {end} data bytes present; an interrupted download?)")
    if end < data_bytes:
        raise WeightsError(f"{path}: not a readable safetensors file ({data_bytes - end} bytes after the last tensor)")
    return infos


def _entry_span(entry: object) -> tuple[int, int] | None:
    """(begin, end) of a header entry's data if the entry is well formed, else None."""
    if not isinstance(entry, dict):
        return None
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not (isinstance(dtype, str) and isinstance(shape, list) and isinstance(offsets, list) and len(offsets) == 2):
        return None
    if not all(isinstance(d, int) and d >= 0 for d in [*shape, *offsets]) or offsets[0] > offsets[1]:
        return None
    itemsize = _DTYPE_BYTES.get(dtype)
    if itemsize is not None and offsets[1] - offsets[0] != math.prod(shape) * itemsize:
        return None
    return offsets[0], offsets[1]


def _shard_name(index: Path, shard: object) -> str:
    """``shard`` if it names a file directly in the model folder; anything else (``../../etc/passwd``,
    an absolute path, a subfolder) is refused, so an index cannot make us read files outside it.

    Checked by name, not by resolving links: the Hugging Face cache's model files are links into its
    blob store, which is outside the snapshot folder by design.
    """
    if (
        not isinstance(shard, str)
        or shard in ("", ".", "..")
        or any(sep in shard for sep in ("/", "\\", "\0"))
        or PureWindowsPath(shard).name != shard
    ):
        raise WeightsError(f"{index}: shard {shard!r} is not a file name in the model folder; refusing the index")
    return shard


def locate(folder: Path) -> CheckpointFiles:
    """Find the safetensors file(s) of a model folder and list which file holds each tensor."""
    folder = Path(folder)
    index, single = folder / INDEX_FILE, folder / SINGLE_FILE
    if index.exists():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            tensor_files = {str(name): folder / _shard_name(index, shard) for name, shard in weight_map.items()}
        except (OSError, KeyError, TypeError, AttributeError, ValueError, RecursionError) as exc:
            raise WeightsError(f"{index}: unreadable shard index ({exc})") from None
        for shard in sorted(set(tensor_files.values())):
            if not shard.exists():
                raise WeightsError(f"{shard}: shard listed in {INDEX_FILE} is missing")
        return CheckpointFiles(folder, tensor_files)
    if single.exists():
        names = read_header(single)
        return CheckpointFiles(folder, dict.fromkeys(names, single))
    pickles = sorted(p.name for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES) if folder.is_dir() else []
    if pickles:
        raise WeightsError(
            f"{folder / pickles[0]}: pickle checkpoints are refused because loading one can run arbitrary "
            "code; use the model's safetensors files (model.safetensors)"
        )
    raise WeightsError(f"{folder}: no {SINGLE_FILE} or {INDEX_FILE} in the model folder")


_LAYER = re.compile(r"(decoder|audio_tower)\.layers\.(\d+)\.")
# The decoder's linear layers: stored as integer codes plus scales in a pre-quantized folder.
QUANTIZED_LINEAR = re.compile(r"^decoder\.layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj)\.")


def check_sizes(files: CheckpointFiles, headers: dict[str, TensorInfo], cfg: AsrConfig) -> None:
    """Raise ModelError unless config.json's sizes agree with the checkpoint's headers: the layer
    counts and the shapes the sizes determine (embeddings, attention, MLP, encoder, projector, head).

    Run before anything is built or allocated, so a config from another model, or one whose sizes
    are absurd (``num_hidden_layers`` 1e7, ``vocab_size`` 1e12), is one error naming the file and
    the tensor instead of a model that grows without end. Tensors that have no place in the layout
    are left to the caller.
    """
    a, t = cfg.audio, cfg.text
    n_layers = {"decoder": t.num_hidden_layers, "audio_tower": a.encoder_layers}
    last_text, last_audio = f"decoder.layers.{t.num_hidden_layers - 1}", f"audio_tower.layers.{a.encoder_layers - 1}"
    expected = {  # tensors whose shapes follow from config.json: a config from another model shows here
        "decoder.embed_tokens.weight": (t.vocab_size, t.hidden_size),
        f"{last_text}.self_attn.q_proj.weight": (t.num_attention_heads * t.head_dim, t.hidden_size),
        f"{last_text}.self_attn.k_proj.weight": (t.num_key_value_heads * t.head_dim, t.hidden_size),
        f"{last_text}.mlp.down_proj.weight": (t.hidden_size, t.intermediate_size),
        f"{last_audio}.fc1.weight": (a.encoder_ffn_dim, a.d_model),
        "audio_tower.proj2.weight": (a.output_dim, a.d_model),
    }
    if not t.tie_word_embeddings:
        expected["lm_head.weight"] = (t.vocab_size, t.hidden_size)
    ours: dict[str, tuple[str, TensorInfo]] = {}
    for name, info in headers.items():
        mine = our_name(name, cfg.layout)
        if mine is None:
            continue
        layer = _LAYER.match(mine)
        if layer is not None and int(layer.group(2)) >= n_layers[layer.group(1)]:
            part, n = "text decoder" if layer.group(1) == "decoder" else "audio encoder", n_layers[layer.group(1)]
            raise ModelError(
                f"{files.tensor_files[name]}: tensor {name} is in layer {layer.group(2)} of the {part}, but "
                f"config.json says it has {n} layer{'' if n == 1 else 's'}; the weights and config.json come "
                "from different models"
            )
        ours[mine] = (name, info)
    for mine, shape in expected.items():
        if cfg.quantization is not None and QUANTIZED_LINEAR.search(mine):
            continue  # stored as integer codes plus scales (dictation.asr.nn.quantized); load_model checks them
        if mine not in ours:
            packed = ours.get(mine.removesuffix(".weight") + ".qweight")
            if packed is not None:  # int4 codes where config.json promises floats
                raise WeightsError(
                    f"{files.tensor_files[packed[0]]}: unexpected tensor {packed[0]}; a quantized folder whose "
                    "config.json lacks quantization_config?"
                )
            raise ModelError(f"{files.folder}: the weights have no tensor for {mine} (expected shape {shape})")
        name, info = ours[mine]
        if info.shape != shape:
            raise ModelError(
                f"{files.tensor_files[name]}: tensor {name} has shape {info.shape}, but config.json implies {shape}; "
                "the weights and config.json come from different models"
            )
