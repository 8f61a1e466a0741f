"""Which device and float dtype the engine runs on, from the user's "auto" / "cuda" / "bf16" / ... ."""

from __future__ import annotations

import torch

from dictation.asr.errors import ModelError

DEVICE_CHOICES = "auto, cpu, cuda, cuda:N or mps"
_DEVICE_TYPES = ("cpu", "cuda", "mps")


def resolve_device(device: str | torch.device) -> torch.device:
    """The torch device for ``auto`` / ``cpu`` / ``cuda`` / ``cuda:N`` / ``mps``; ModelError (one line)
    for any other string, and for a GPU this machine does not have."""
    name = str(device)
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        dev = torch.device(name)
    except (RuntimeError, ValueError, TypeError):  # "tpu:7", "gpu", "", "cuda:x"
        dev = None
    if dev is None or dev.type not in _DEVICE_TYPES:
        raise ModelError(f"unknown device {name!r}; choose {DEVICE_CHOICES}")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ModelError(f"device {name!r} requested but torch sees no CUDA GPU (torch {torch.__version__})")
        count = torch.cuda.device_count()
        if dev.index is not None and dev.index >= count:
            have = "one CUDA GPU, cuda:0" if count == 1 else f"{count} CUDA GPUs, cuda:0 to cuda:{count - 1}"
            raise ModelError(f"device {name!r} requested but torch sees {have}")
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
