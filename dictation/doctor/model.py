"""The Model area: the chosen model folder (or GGUF file) and its weights variant, every adapter in
the settings, and the free disk space where models are downloaded."""

from __future__ import annotations

import shutil
from pathlib import Path

from dictation.doctor.check import Check, Context, existing_ancestor, gb

NO_MODEL_FIX = "download one on the Model page, or run `dictation download Qwen/Qwen3-ASR-0.6B` and choose it there"
LOW_DISK_BYTES = 5 * 10**9  # the 1.7B model is 4.7 GB


def checks(ctx: Context) -> list[Check]:
    from dictation.asr.checkpoints.hub import (
        check_model_folder,
        hf_cache_dir,
        is_gguf_path,
        looks_like_repo_id,
        resolve_model,
    )
    from dictation.asr.tune.adapter_files import check_adapter

    area = "Model"
    engine = ctx.settings.engine
    spec = engine.model.strip()
    checks: list[Check] = []
    model_ok = False
    folder: Path | None = None
    if not spec:
        checks.append(Check(area, "Model", "problem", "no model chosen yet", NO_MODEL_FIX))
    else:
        error = check_model_folder(spec)
        if error is None:
            model_ok = True
            try:
                folder = resolve_model(spec)
            except Exception:  # noqa: BLE001 - a GGUF file path: resolve_model wants folders
                folder = Path(spec).expanduser()
            where = "" if str(folder) == spec else f" ({folder})"
            checks.append(Check(area, "Model", "ok", f"{spec}{where}"))
        else:
            local = Path(spec).expanduser()
            if looks_like_repo_id(spec) and not local.exists():
                fix = f"`dictation download {spec}` (or download it on the Model page)"
            else:
                fix = "choose a complete model folder on the Model page (the folder that holds config.json)"
            checks.append(Check(area, "Model", "problem", error, fix))

    variant = f"weights {engine.variant}, precision {engine.dtype}, device {engine.device}"
    if folder is not None and folder.is_dir():
        config = folder / "config.json"
        if config.is_file() and "quantization_config" in config.read_text(encoding="utf-8", errors="replace"):
            variant += "; the folder is pre-quantized (its own variant applies)"
        elif not config.is_file() and is_gguf_path(folder):
            variant += "; GGUF weights"
    elif folder is not None and is_gguf_path(folder):
        variant += "; a GGUF file"
    checks.append(Check(area, "Variant", "info", variant))

    if not engine.adapters:
        checks.append(Check(area, "Adapters", "info", "none"))
    for i, adapter in enumerate(engine.adapters, 1):
        name = f"Adapter {i}"
        if not adapter.enabled:
            checks.append(Check(area, name, "info", f"{adapter.path} (turned off)"))
            continue
        error = check_adapter(adapter.path, spec if model_ok else None)
        if error is None:
            checks.append(Check(area, name, "ok", f"{adapter.path}, weight {adapter.weight:g}"))
        else:
            checks.append(
                Check(
                    area,
                    name,
                    "problem",
                    error,
                    "fix the folder, or turn the adapter off or remove it on the Model page",
                )
            )

    target = folder if folder is not None else hf_cache_dir()
    if spec and folder is None and not looks_like_repo_id(spec):
        target = Path(spec).expanduser()
    existing = existing_ancestor(target)
    usage = shutil.disk_usage(existing)
    detail = f"{gb(usage.free)} free of {gb(usage.total)} on the disk holding {target}"
    if usage.free < LOW_DISK_BYTES:
        fix = (
            "free some space there (Qwen3-ASR-1.7B takes about 4.7 GB, the 0.6B 1.9 GB), or set HF_HOME to a "
            "folder on a larger disk before downloading"
        )
        checks.append(Check(area, "Disk space", "warning", detail, fix))
    else:
        checks.append(Check(area, "Disk space", "ok", detail))
    return checks
