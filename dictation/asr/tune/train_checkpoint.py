"""A training run's resumable checkpoint (in the run's work folder, ``train.work_folder``): the LoRA
matrices, AdamW's state, the data order and random state, and the :func:`fingerprint` of the data
and settings it was made from, in one safetensors file; resuming from it gives the very adapter an
uninterrupted run gives."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from dictation.asr.tune.data import Example, TrainingError
from dictation.asr.tune.train_options import TrainOptions


def fingerprint(examples: Sequence[Example], options: TrainOptions) -> str:
    """What a checkpoint was made from: the settings that shape training and every example's audio
    and text. A checkpoint is resumed only with the same."""
    digest = hashlib.sha256()
    fields = {k: v for k, v in vars(options).items() if k not in ("save_every", "checkpointing")}
    digest.update(json.dumps(fields, sort_keys=True, default=str).encode())
    for example in examples:
        digest.update(example.target.encode())
        digest.update(np.ascontiguousarray(example.audio, dtype=np.float32).tobytes())
    return digest.hexdigest()


CHECKPOINT = "checkpoint.safetensors"


def save_checkpoint(work: Path, lora: dict, optimizer: torch.optim.Optimizer, state: dict) -> None:
    """The LoRA matrices, AdamW's moments and the loop's state (step, data order, random state) in
    one safetensors file (no pickle), written under a temporary name and renamed."""
    from safetensors.torch import save_file

    tensors = {}
    for name, module in lora.items():
        tensors[f"lora.{name}.A"] = module.lora_A.detach().float().cpu().contiguous()
        tensors[f"lora.{name}.B"] = module.lora_B.detach().float().cpu().contiguous()
    opt = optimizer.state_dict()
    for index, entry in opt["state"].items():
        for key, value in entry.items():
            tensors[f"opt.{index}.{key}"] = torch.as_tensor(value).detach().float().cpu().contiguous()
    meta = dict(state, param_groups=opt["param_groups"])
    work.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = work / f".{CHECKPOINT}.tmp"
    save_file(tensors, str(tmp), metadata={"state": json.dumps(meta)})
    os.chmod(tmp, 0o600)
    os.replace(tmp, work / CHECKPOINT)


def load_checkpoint(work: Path, lora: dict, optimizer: torch.optim.Optimizer, fingerprint: str) -> dict:
    """Restore what :func:`save_checkpoint` wrote; TrainingError when there is none or it was made
    from other data or settings."""
    from safetensors import safe_open

    path = work / CHECKPOINT
    if not path.is_file():
        raise TrainingError(f"{work}: no checkpoint to resume from; start without --resume")
    with safe_open(str(path), framework="pt") as f:
        meta = json.loads(f.metadata()["state"])
        if meta.get("fingerprint") != fingerprint:
            raise TrainingError(
                f"{path}: made from other data or settings; resume with the same ones, or start without --resume"
            )
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (a safe_open handle, not a dict)
    with torch.no_grad():
        for name, module in lora.items():
            module.lora_A.copy_(tensors[f"lora.{name}.A"])
            module.lora_B.copy_(tensors[f"lora.{name}.B"])
    opt_state: dict[int, dict] = {}
    for key, value in tensors.items():
        if key.startswith("opt."):
            _, index, field_name = key.split(".", 2)
            opt_state.setdefault(int(index), {})[field_name] = value
    optimizer.load_state_dict({"state": opt_state, "param_groups": meta.pop("param_groups")})
    return meta
