"""Locating, reading, validating and mapping a checkpoint's safetensors tensors.

Our modules carry the checkpoint's names (DESIGN.md §1.5), so loading is a prefix map:

- ``audio_tower.proj1/proj2.*``: ``thinker.audio_tower.proj1/proj2.*`` (original) or
  ``model.multi_modal_projector.linear_1/linear_2.*`` (``-hf``)
- ``audio_tower.*``: ``thinker.audio_tower.*`` or ``model.audio_tower.*``
- ``decoder.*``: ``thinker.model.*`` or ``model.language_model.*``
- ``lm_head.weight``: ``thinker.lm_head.weight`` or ``lm_head.weight``

Loading is strict: a missing, unexpected or mis-shaped tensor is an error naming the file, the
tensor, and the expected and actual shapes. Pickle checkpoints are refused.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from dictation.asr.config import AsrConfig
from dictation.asr.errors import ModelError, WeightsError
from dictation.asr.model import AsrModel

log = logging.getLogger(__name__)

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt")
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

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


def checkpoint_name(ours: str, layout: str) -> str:
    for mine, theirs in PREFIXES[layout]:
        if ours.startswith(mine):
            return theirs + ours[len(mine) :]
    raise KeyError(ours)


@dataclass(frozen=True)
class CheckpointFiles:
    folder: Path
    tensor_files: dict[str, Path]  # checkpoint tensor name -> file holding it

    @property
    def files(self) -> list[Path]:
        return sorted(set(self.tensor_files.values()))


def locate(folder: Path) -> CheckpointFiles:
    """Find the safetensors file(s) of a model folder and list which file holds each tensor."""
    folder = Path(folder)
    index, single = folder / INDEX_FILE, folder / SINGLE_FILE
    if index.exists():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (OSError, KeyError, TypeError, json.JSONDecodeError) as exc:
            raise WeightsError(f"{index}: unreadable shard index ({exc})") from None
        tensor_files = {name: folder / shard for name, shard in weight_map.items()}
        for shard in sorted(set(tensor_files.values())):
            if not shard.exists():
                raise WeightsError(f"{shard}: shard listed in {INDEX_FILE} is missing")
        return CheckpointFiles(folder, tensor_files)
    if single.exists():
        try:
            with safe_open(str(single), framework="pt") as f:
                names = list(f.keys())
        except (SafetensorError, OSError) as exc:
            raise WeightsError(f"{single}: not a readable safetensors file ({exc})") from None
        return CheckpointFiles(folder, {name: single for name in names})
    pickles = sorted(p.name for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES) if folder.is_dir() else []
    if pickles:
        raise WeightsError(
            f"{folder / pickles[0]}: pickle checkpoints are refused because loading one can run arbitrary "
            "code; use the model's safetensors files (model.safetensors)"
        )
    raise WeightsError(f"{folder}: no {SINGLE_FILE} or {INDEX_FILE} in the model folder")


def resolve_device(device: str | torch.device) -> torch.device:
    name = str(device)
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ModelError(f"device {name!r} requested but torch sees no CUDA GPU (torch {torch.__version__})")
    if dev.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise ModelError(f"device {name!r} requested but Apple MPS is not available")
    return dev


_DTYPES = {
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
    "fp32": torch.float32,
    "float32": torch.float32,
}


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        if device.type == "mps":
            return torch.float16
        return torch.float32
    if dtype not in _DTYPES:
        raise ModelError(f"unknown dtype {dtype!r}; choose auto, bf16, fp16 or fp32")
    return _DTYPES[dtype]


def load_model(folder: Path, cfg: AsrConfig, device: torch.device, dtype: torch.dtype) -> AsrModel:
    """Build the model without initialising it, then fill every parameter from the checkpoint."""
    files = locate(folder)
    with torch.device("meta"):
        model = AsrModel(cfg)
    model = model.to(dtype).to_empty(device=device)
    model.eval().requires_grad_(False)
    expected = {name: tensor for name, tensor in model.state_dict().items()}
    wanted = {checkpoint_name(name, cfg.layout): name for name in expected}

    unexpected = [n for n in files.tensor_files if n not in wanted]
    tied_head = checkpoint_name("lm_head.weight", cfg.layout)
    ignored = [tied_head] if model.lm_head is None and tied_head in unexpected else []
    unexpected = [n for n in unexpected if n not in ignored]
    if unexpected:
        name = unexpected[0]
        more = f" (and {len(unexpected) - 1} more)" if len(unexpected) > 1 else ""
        raise WeightsError(
            f"{files.tensor_files[name]}: unexpected tensor {name}{more}; "
            f"not a Qwen3-ASR checkpoint in the {cfg.layout!r} layout?"
        )
    missing = [n for n in wanted if n not in files.tensor_files]
    if missing:
        name = missing[0]
        shape = tuple(expected[wanted[name]].shape)
        where = files.files[0] if len(files.files) == 1 else files.folder / INDEX_FILE
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise WeightsError(f"{where}: missing tensor {name} (expected shape {shape}){more}")

    by_file: dict[Path, list[str]] = {}
    for ckpt_name in wanted:
        by_file.setdefault(files.tensor_files[ckpt_name], []).append(ckpt_name)
    for path, names in by_file.items():
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for ckpt_name in names:
                target = expected[wanted[ckpt_name]]
                shape = tuple(f.get_slice(ckpt_name).get_shape())
                if shape != tuple(target.shape):
                    raise WeightsError(f"{path}: tensor {ckpt_name} has shape {shape}, expected {tuple(target.shape)}")
                tensor = f.get_tensor(ckpt_name)
                if tensor.dtype not in FLOAT_DTYPES:
                    raise WeightsError(
                        f"{path}: tensor {ckpt_name} is {tensor.dtype}; only bf16/fp16/fp32 checkpoints load here"
                    )
                target.copy_(tensor)
    if ignored:
        _log_tied_head(files.tensor_files[tied_head], tied_head, model)
    # Non-persistent buffers were left uninitialised by to_empty(); compute them now.
    model.audio_tower.reset_buffers()
    return model


def _log_tied_head(path: Path, name: str, model: AsrModel) -> None:
    with safe_open(str(path), framework="pt", device="cpu") as f:
        stored = f.get_tensor(name)
    embed = model.decoder.embed_tokens.weight
    same = stored.shape == embed.shape and torch.equal(stored.to(embed.dtype).to(embed.device), embed)
    log.info(
        "tie_word_embeddings is true: using embed_tokens as the output head; the stored %s %s it",
        name,
        "equals" if same else "differs from",
    )
