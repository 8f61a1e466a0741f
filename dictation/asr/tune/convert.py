"""``dictation convert``: a model folder (adapters merged first, as ``merge-lora`` does) written as GGUF or in
the other checkpoint layout, for other runtimes (llama.cpp-family, transformers) to read.

The conversion streams: one tensor is read (and merged) at a time and written out before the next, so
memory stays near the largest tensor plus the adapters, whatever the model's size. Outputs are written
under temporary names and renamed at the end (``checkpoints/output.py``): an error, a full disk or an
interruption leaves nothing behind, and an existing output is refused.

* ``hf`` / ``original``: ``model.safetensors`` with the target layout's names (the source's dtypes, or
  ``type`` F32/F16/BF16), the target layout's config.json, processor files and chat template
  (``checkpoints/layouts.py``), the tokenizer files copied. Without adapters or a type, the tensors are
  copied bit for bit, so original -> hf -> original gives back the same weights file.
* ``gguf``: ``checkpoints/gguf/export.py`` (names, metadata, types), ``quantize.py`` (encoding) and
  ``writer.py`` (the file).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import struct
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from safetensors import safe_open

from dictation.asr.checkpoints.gguf import export
from dictation.asr.checkpoints.gguf.quantize import WRITABLE, encode_chunks
from dictation.asr.checkpoints.gguf.vocab import vocab_metadata
from dictation.asr.checkpoints.gguf.writer import PlannedTensor, write_gguf
from dictation.asr.checkpoints.hub import resolve_model
from dictation.asr.checkpoints.layouts import OWN_FILES, layout_files
from dictation.asr.checkpoints.locate import INDEX_FILE, check_sizes, checkpoint_name, locate
from dictation.asr.checkpoints.output import ST_DTYPES, atomic_outputs, refuse_existing, write_safetensors
from dictation.asr.checkpoints.safetensors import FLOAT_DTYPES, WEIGHT_SUFFIXES, match_tensors
from dictation.asr.config import AsrConfig
from dictation.asr.errors import ModelError, WeightsError
from dictation.asr.nn.model import AsrModel
from dictation.asr.text.tokenizer import load_tokenizer
from dictation.asr.tune.adapters import changed_params, load_adapters, merged_weights

log = logging.getLogger(__name__)

TARGETS = ("gguf", "hf", "original")
LAYOUT_OF = {"hf": "hf", "original": "thinker"}
FLOAT_TYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
GGUF_TYPES = WRITABLE
DEFAULT_GGUF_TYPE = "F16"

Progress = Callable[[int, int], None]  # (tensors written, tensors in all)


class _Source:
    """The source folder's tensors by our name, read one at a time, adapters merged in float32."""

    def __init__(self, folder: Path, cfg: AsrConfig, specs: Sequence[str]) -> None:
        self.folder, self.cfg = folder, cfg
        self.files = locate(folder)
        check_sizes(self.files, self.files.headers(), cfg)
        with torch.device("meta"):
            meta = AsrModel(cfg)
        self.tied = meta.lm_head is None
        expected = meta.state_dict()
        wanted, ignored = match_tensors(self.files, cfg, expected, tied=self.tied)
        self.ckpt = {ours: name for name, ours in wanted.items()}  # our name -> checkpoint name
        self.ignored_head = ignored[0] if ignored else None
        self.adapters = load_adapters(specs, meta) if specs else []
        self.changed = set(changed_params(self.adapters))
        self.untie = self.tied and "lm_head.weight" in self.changed  # a head adapter on a tied model
        self.shapes = {ours: tuple(expected[ours].shape) for ours in self.ckpt}
        if self.untie:
            self.shapes["lm_head.weight"] = self.shapes["decoder.embed_tokens.weight"]
        headers = self.files.headers()
        self.dtypes = {ours: headers[name].dtype for ours, name in self.ckpt.items()}
        for ours, dtype in self.dtypes.items():
            if dtype not in ("F32", "F16", "BF16"):
                raise WeightsError(
                    f"{self.files.tensor_files[self.ckpt[ours]]}: tensor {self.ckpt[ours]} is {dtype}; "
                    "only bf16/fp16/fp32 models can be converted"
                )
        if self.untie:
            self.dtypes["lm_head.weight"] = self.dtypes["decoder.embed_tokens.weight"]

    def read_raw(self, name: str) -> torch.Tensor:
        """A checkpoint tensor as stored."""
        with safe_open(str(self.files.tensor_files[name]), framework="pt", device="cpu") as f:
            return f.get_tensor(name)

    def read(self, ours: str) -> torch.Tensor:
        """Our parameter ``ours`` with the adapters merged (in the stored dtype)."""
        stored = self.read_raw(
            self.ckpt["decoder.embed_tokens.weight" if ours == "lm_head.weight" and self.untie else ours]
        )
        if ours not in self.changed:
            return stored
        merged = merged_weights(self.adapters, {ours: stored})[ours]
        if stored.dtype not in FLOAT_DTYPES:
            raise WeightsError(f"{self.folder}: {ours} is {stored.dtype}; adapters merge into float weights only")
        return merged.to(stored.dtype)

    @property
    def label(self) -> str:
        return json.dumps([a.label for a in self.adapters])


def convert(
    model: str | os.PathLike,
    to: str,
    out: str | os.PathLike,
    *,
    adapters: Sequence[str] = (),
    type_name: str | None = None,
    gguf_layout: str = "single",
    quantize_all: bool = False,
    on_progress: Progress | None = None,
) -> list[Path]:
    """Convert the model folder ``model`` (a path or a cached repo id); returns the paths written.

    Raises ModelError / WeightsError / AdapterError naming the problem, before anything is written where
    it can (unknown target or type, existing output, quantized source, an adapter for another model).
    """
    if to not in TARGETS:
        raise ModelError(f"cannot convert to {to!r}; choose one of {', '.join(TARGETS)}")
    allowed = GGUF_TYPES if to == "gguf" else tuple(FLOAT_TYPES)
    if type_name is not None and type_name.upper() not in allowed:
        raise ModelError(f"--type {type_name} is not available for --to {to}; choose one of {', '.join(allowed)}")
    type_name = type_name.upper() if type_name else None
    if gguf_layout not in export.LAYOUTS:
        raise ModelError(f"--gguf-layout {gguf_layout!r}: choose one of {', '.join(export.LAYOUTS)}")
    out = Path(out).expanduser().absolute()
    outputs = list(export.pair_paths(out)) if to == "gguf" and gguf_layout == "pair" else [out]
    for path in outputs:
        refuse_existing(path)
    folder = resolve_model(model)
    cfg = AsrConfig.from_file(folder / "config.json")
    if cfg.quantization is not None:
        raise ModelError(
            f"{folder / 'config.json'}: a quantized model ({cfg.quantization['variant']}); convert the "
            "floating-point model it was made from"
        )
    source = _Source(folder, cfg, adapters)
    if to == "gguf":
        _write_gguf(source, outputs, type_name or DEFAULT_GGUF_TYPE, gguf_layout, quantize_all, on_progress)
    else:
        _write_layout(source, LAYOUT_OF[to], out, type_name, on_progress)
    return outputs


def _write_layout(source: _Source, layout: str, out: Path, type_name: str | None, on_progress: Progress | None) -> None:
    cfg, files = source.cfg, source.files
    cast = FLOAT_TYPES[type_name] if type_name else None
    names: dict[str, str] = {}  # target name -> our name (or the source's ignored stored head)
    for ours in source.shapes:
        names[checkpoint_name(ours, layout)] = ours
    keep_head = source.ignored_head is not None and layout == "thinker"  # transformers 5 would use it: not in -hf
    if keep_head:
        names[checkpoint_name("lm_head.weight", layout)] = source.ignored_head
    shapes = dict(source.shapes)
    dtypes = dict(source.dtypes)
    if keep_head:
        info = files.headers()[source.ignored_head]
        shapes[source.ignored_head], dtypes[source.ignored_head] = info.shape, info.dtype
    specs = [(name, ST_DTYPES[cast] if cast else dtypes[ours], shapes[ours]) for name, ours in names.items()]
    total, done = len(specs), 0

    def produce(name: str) -> torch.Tensor:
        ours = names[name]
        t = source.read_raw(ours) if ours == source.ignored_head else source.read(ours)
        return t.to(cast) if cast is not None else t

    def tick(name: str) -> None:
        nonlocal done
        done += 1
        if on_progress is not None:
            on_progress(done, total)

    metadata = _source_metadata(files) or {"format": "pt"}
    if source.adapters:
        metadata["merged_adapters"] = source.label
    raw = json.loads((source.folder / "config.json").read_text(encoding="utf-8"))
    tied = source.tied and not source.untie
    dtype = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}[specs[0][1]] if specs else "float32"
    own = layout_files(raw, cfg, layout, tied=tied, dtype=dtype)
    with atomic_outputs([out], folders=True) as (tmp,):
        skip = set(OWN_FILES["thinker"]) | set(OWN_FILES["hf"]) | {INDEX_FILE}
        for entry in sorted(source.folder.iterdir()):
            if entry.name.startswith(".") or entry.name in skip or entry.name.endswith(WEIGHT_SUFFIXES):
                continue
            if entry.is_dir():
                shutil.copytree(entry, tmp / entry.name)
            else:
                shutil.copyfile(entry, tmp / entry.name)
        for name, text in own.items():
            (tmp / name).write_text(text, encoding="utf-8")
        write_safetensors(tmp / "model.safetensors", specs, produce, metadata, tick)
        os.chmod(tmp / "model.safetensors", (tmp / "config.json").stat().st_mode & 0o777)
    log.info("wrote %s (%s layout, %d tensors)", out, layout, total)


def _source_metadata(files) -> dict[str, str] | None:
    """The ``__metadata__`` of a single-file source (kept, so a round trip gives back the same file)."""
    if len(files.files) != 1:
        return None
    with open(files.files[0], "rb") as f:  # the header's own key order (safe_open's is arbitrary)
        header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
    meta = header.get("__metadata__")
    return {str(k): str(v) for k, v in meta.items()} if isinstance(meta, dict) and meta else None


def _write_gguf(
    source: _Source, outputs: list[Path], requested: str, layout: str, quantize_all: bool, on_progress: Progress | None
) -> None:
    cfg = source.cfg
    shapes = dict(source.shapes)
    if source.tied and not source.untie:
        shapes.pop("lm_head.weight", None)
    tokenizer, _ = load_tokenizer(source.folder, cfg.text.vocab_size)
    vocab = vocab_metadata(tokenizer, cfg.text.vocab_size, source.folder)
    name = source.folder.name + (f" + {', '.join(a.label for a in source.adapters)}" if source.adapters else "")
    plans = export.plan(cfg, shapes, vocab, requested, layout, name=name, quantize_all=quantize_all)
    total = sum(len(p.tensors) for p in plans)
    done = 0

    def produce(t: PlannedTensor):
        if t.source in export.CONSTANTS:
            return export.constant(t.source, t.shape)
        tensor = source.read(t.source)
        return encode_chunks(tensor.reshape(t.shape), t.type_name)

    def tick(t: PlannedTensor) -> None:
        nonlocal done
        done += 1
        if on_progress is not None:
            on_progress(done, total)

    with atomic_outputs(outputs) as temps:
        for tmp, p in zip(temps, plans, strict=True):
            with open(tmp, "wb") as f:
                write_gguf(f, p.metadata, p.tensors, produce, tick)
    counts: dict[str, int] = {}
    for p in plans:
        for t in p.tensors:
            counts[t.type_name] = counts.get(t.type_name, 0) + 1
    log.info(
        "wrote %s (%s)", " + ".join(str(o) for o in outputs), ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
    )
