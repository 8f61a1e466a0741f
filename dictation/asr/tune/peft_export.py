"""A trained LoRA written as a PEFT adapter folder (what ``adapter_files.py`` reads back).

The adapter is written as PEFT writes one (``adapter_config.json`` + ``adapter_model.safetensors``,
tensors ``base_model.model.<module>.lora_A.weight``), in the checkpoint's own module names (the
official ``thinker.model.layers...`` or the ``-hf`` layout's ``model.language_model.layers...``),
with ``target_modules`` a regular expression that selects the decoder's layers only. The folder is
written under a temporary name and renamed, so it appears whole or not at all; an existing
destination is refused.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from pathlib import Path

from dictation.asr.checkpoints.locate import checkpoint_name
from dictation.asr.checkpoints.output import atomic_outputs
from dictation.asr.tune.adapter_files import CONFIG_FILE, WEIGHTS_FILE
from dictation.asr.tune.data import TrainingError
from dictation.asr.tune.lora_forward import LoraTrainLinear
from dictation.asr.tune.train_options import DEFAULT_TARGETS, GROUPS, HEAD, TrainOptions


def _layer_index(name: str) -> int:
    return int(name.split(".")[2])  # decoder.layers.<i>.…


def peft_module(ours: str, layout: str) -> str:
    """The checkpoint's name of our module ``ours`` in ``layout`` (what PEFT calls it)."""
    return checkpoint_name(f"{ours}.weight", layout).removesuffix(".weight")


def target_pattern(targets: Sequence[str], layout: str, layers: Sequence[int] | None = None) -> str:
    """A ``target_modules`` regular expression selecting ``targets`` in the decoder's layers only (the
    encoder has layers named like them too): every one, or those numbered ``layers``."""
    prefix = re.escape(checkpoint_name("decoder.layers.0.weight", layout).removesuffix(".0.weight"))
    if layers is not None:
        prefix += f"\\.(?:{'|'.join(str(i) for i in sorted(layers))})"
    else:
        prefix += "\\.\\d+"
    attn = [t for t in DEFAULT_TARGETS if t in targets and GROUPS[t] == "self_attn"]
    mlp = [t for t in DEFAULT_TARGETS if t in targets and GROUPS[t] == "mlp"]
    parts = [f"self_attn\\.(?:{'|'.join(attn)})"] if attn else []
    parts += [f"mlp\\.(?:{'|'.join(mlp)})"] if mlp else []
    pattern = f"{prefix}\\.(?:{'|'.join(parts)})" if parts else ""
    if HEAD in targets:
        head = re.escape(peft_module(HEAD, layout))
        pattern = f"(?:{pattern}|{head})" if pattern else head
    return pattern


def adapted_layers(lora: dict[str, LoraTrainLinear]) -> list[int] | None:
    """The decoder layers ``lora`` adapts, or None when it adapts all from the first (one pattern for all)."""
    found = sorted({_layer_index(name) for name in lora if name.startswith("decoder.layers.")})
    return None if not found or found[0] == 0 else found


def write_adapter(
    out: str | os.PathLike,
    lora: dict[str, LoraTrainLinear],
    options: TrainOptions,
    *,
    layout: str,
    base_model: str | None = None,
) -> Path:
    """Write ``lora`` as a PEFT adapter folder at ``out`` (refused if it exists; see the module docstring)."""
    from safetensors.torch import save_file

    out = Path(out).expanduser().absolute()
    tensors = {}
    for ours, module in lora.items():
        name = f"base_model.model.{peft_module(ours, layout)}"
        tensors[f"{name}.lora_A.weight"] = module.lora_A.detach().float().cpu().contiguous()
        tensors[f"{name}.lora_B.weight"] = module.lora_B.detach().float().cpu().contiguous()
    config = {
        "peft_type": "LORA",
        "task_type": None,
        "base_model_name_or_path": base_model,
        "r": options.rank,
        "lora_alpha": options.alpha,
        "lora_dropout": 0.0,
        "target_modules": target_pattern(options.targets, layout, adapted_layers(lora)),
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "init_lora_weights": True,
        "modules_to_save": None,
        "rank_pattern": {},
        "alpha_pattern": {},
        "inference_mode": True,
    }
    with atomic_outputs([out], folders=True, error=TrainingError) as (tmp,):
        os.chmod(tmp, 0o700)  # trained on the user's dictations
        save_file(tensors, str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
        (tmp / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        for name in (WEIGHTS_FILE, CONFIG_FILE):
            os.chmod(tmp / name, 0o600)
    return out
