"""The Engine area: the installed torch build, the GPU it can use (or why not, with the torch build or
driver that would fix it), the device the settings choose, and whether the chosen model fits in the
GPU's memory. A CPU-only build of torch is recognised without importing it."""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import os
import shutil
import subprocess
import sys
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dictation import spawn
from dictation.doctor.check import Check, Context, gb

CUDA_TORCH_FIX = (
    "pip install --force-reinstall torch --index-url https://download.pytorch.org/whl/cu128 "
    "(or the CUDA version your driver supports: https://pytorch.org/get-started/locally/)"
)
CPU_TORCH_URL = "https://download.pytorch.org/whl/cpu"
NVIDIA_PROC = "/proc/driver/nvidia"
SMI_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class TorchBuild:
    version: str
    cuda: str | None = None
    hip: str | None = None


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    total_bytes: int | None = None
    free_bytes: int | None = None


def torch_build() -> TorchBuild | None:
    """The installed torch's version and GPU build, without importing torch if it isn't yet (slow)."""
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "version"):
        return TorchBuild(str(torch.__version__), torch.version.cuda, getattr(torch.version, "hip", None))
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin:
        return None
    values: dict[str, Any] = {}
    for node in ast.parse((Path(spec.origin).parent / "version.py").read_text(encoding="utf-8")).body:
        target, value = None, None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign):
            target, value = node.target, node.value
        if isinstance(target, ast.Name) and isinstance(value, ast.Constant):
            values[target.id] = value.value
    return TorchBuild(str(values.get("__version__", "?")), values.get("cuda"), values.get("hip"))


def nvidia_driver_present(env: Mapping[str, str]) -> str | None:
    """What shows an NVIDIA driver here (nvidia-smi on PATH, /proc/driver/nvidia), or None."""
    smi = shutil.which("nvidia-smi", path=env.get("PATH", os.defpath))
    if smi:
        return f"{smi} is installed"
    if os.path.exists(NVIDIA_PROC):
        return f"{NVIDIA_PROC} exists"
    return None


def cuda_devices(env: Mapping[str, str]) -> tuple[bool, str, list[GpuInfo]]:
    """(usable, why not, GPUs) as torch sees them. Imports torch; creates no CUDA context."""
    import torch

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        usable = torch.cuda.is_available()
    if not usable:
        return False, "; ".join(str(w.message).strip().splitlines()[0] for w in caught if str(w.message).strip()), []
    initialized = torch.cuda.is_initialized()
    gpus = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        free = torch.cuda.mem_get_info(i)[0] if initialized else None
        gpus.append(GpuInfo(i, props.name, int(props.total_memory), free))
    if not initialized:  # free memory without creating a context: ask nvidia-smi, where it matches
        smi = _smi_memory(env)
        if len(smi) == len(gpus) and all(s.name == g.name for s, g in zip(smi, gpus, strict=True)):
            gpus = [dataclasses.replace(g, free_bytes=s.free_bytes) for s, g in zip(smi, gpus, strict=True)]
    return True, "", gpus


def _smi_memory(env: Mapping[str, str]) -> list[GpuInfo]:
    smi = shutil.which("nvidia-smi", path=env.get("PATH", os.defpath))
    if not smi or env.get("CUDA_VISIBLE_DEVICES"):
        return []
    try:
        proc = spawn.run(
            [smi, "--query-gpu=index,name,memory.total,memory.free", "--format=csv,noheader,nounits"],
            env=env,
            capture_output=True,
            text=True,
            timeout=SMI_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    gpus = []
    for line in proc.stdout.splitlines() if proc.returncode == 0 else []:
        parts = [p.strip() for p in line.split(",")]
        try:
            gpus.append(GpuInfo(int(parts[0]), parts[1], int(parts[2]) * 2**20, int(parts[3]) * 2**20))
        except (ValueError, IndexError):
            return []
    return gpus


def mps_available() -> bool:
    import torch

    return bool(torch.backends.mps.is_available())


def checks(ctx: Context) -> list[Check]:
    area = "Engine"
    build = torch_build()
    if build is None:
        return [
            Check(
                area,
                "PyTorch",
                "problem",
                "PyTorch is not installed",
                "`pip install torch` (CPU only: add `--index-url https://download.pytorch.org/whl/cpu`)",
            )
        ]
    kind = f"CUDA {build.cuda} build" if build.cuda else f"ROCm {build.hip} build" if build.hip else "CPU-only build"
    checks = [Check(area, "PyTorch", "ok", f"torch {build.version}, {kind}")]
    driver = nvidia_driver_present(ctx.env)
    gpus: list[GpuInfo] = []
    accelerator = "cpu"
    cores = os.cpu_count() or "?"
    if ctx.platform == "darwin":
        if mps_available():
            accelerator = "mps"
            checks.append(Check(area, "GPU", "ok", "Apple GPU (MPS) available"))
        else:
            checks.append(
                Check(area, "GPU", "info", f"MPS is not available: the model runs on the CPU ({cores} cores)")
            )
    elif build.cuda or build.hip:
        usable, why, gpus = cuda_devices(ctx.env)
        if usable:
            accelerator = "cuda"
            rows = [f"cuda:{g.index} {g.name}, {gb(g.total_bytes)} total, {gb(g.free_bytes)} free" for g in gpus]
            checks.append(Check(area, "GPU", "ok", "\n".join(rows)))
        elif driver:
            detail = f"torch is built for {'CUDA ' + build.cuda if build.cuda else 'ROCm ' + str(build.hip)}, "
            detail += f"but can't use the GPU ({driver}){': ' + why if why else ''}; the model runs on the CPU"
            fix = (
                f"update the NVIDIA driver to one that supports CUDA {build.cuda} (`nvidia-smi` shows the newest "
                "CUDA version the driver supports), or install a torch build for your driver: "
                "https://pytorch.org/get-started/locally/"
            )
            checks.append(Check(area, "GPU", "warning", detail, fix))
        elif build.cuda:
            checks.append(
                Check(
                    area,
                    "GPU",
                    "warning",
                    f"torch {build.version} is a CUDA {build.cuda} build, but this machine shows no NVIDIA GPU "
                    f"(no nvidia-smi{', no ' + NVIDIA_PROC if ctx.linux else ''}): the model runs on the CPU "
                    f"({cores} cores) and the CUDA libraries only take up disk space; the CPU build is as fast "
                    "here and several GB smaller",
                    cpu_torch_fix(ctx.linux),
                )
            )
        else:
            checks.append(Check(area, "GPU", "info", f"no NVIDIA GPU found: the model runs on the CPU ({cores} cores)"))
    elif driver:
        checks.append(
            Check(
                area,
                "GPU",
                "warning",
                f"this machine has an NVIDIA GPU ({driver}), but torch {build.version} is a CPU-only build: "
                "the model runs on the CPU, several times slower",
                CUDA_TORCH_FIX,
            )
        )
    else:
        checks.append(
            Check(
                area,
                "GPU",
                "info",
                f"CPU-only torch and no NVIDIA GPU found: the model runs on the CPU ({cores} cores)",
            )
        )
    checks.append(_device_check(ctx, accelerator, gpus))
    if accelerator == "cpu" and ctx.linux:
        checks.append(native_step_check(ctx))
    memory = _memory_check(ctx, gpus) if accelerator == "cuda" else None
    if memory is not None:
        checks.append(memory)
    return checks


def native_step_check(ctx: Context) -> Check:
    """Whether int8 models can decode through the native CPU step, which the engine compiles with the
    machine's C compiler at its first use (``$CC``, else gcc or cc, as the engine looks; docs/engine.md,
    "The native CPU step"). Nothing is compiled here: a diagnosis stays quick."""
    cc = ctx.env.get("CC") or ctx.which("gcc") or ctx.which("cc")
    if cc:
        detail = f"int8 models decode on the CPU through the native step, compiled with {cc} at its first use"
        return Check("Engine", "Native CPU step", "ok", detail)
    detail = (
        "no C compiler (gcc or cc): int8 models decode on the CPU through PyTorch alone, "
        "about 2.4x slower than through the native step"
    )
    return Check("Engine", "Native CPU step", "info", detail, f"{ctx.install('gcc')}, then restart dictation")


def cpu_torch_fix(linux: bool, prefix: str | None = None) -> str:
    """How to swap a CUDA build of torch for the CPU build in the environment at ``prefix``
    (this one by default): through pipx where pipx made it, else pip.

    On Linux PyPI's CUDA build pulls in the nvidia-* and triton packages, which a
    ``--force-reinstall`` of the CPU build would leave behind, so they are removed too (the
    issue that asked for this measured 5.7 GB installed against 1.3 GB for the CPU build).
    """
    parts = Path(prefix if prefix is not None else sys.prefix).parts
    pip = "pipx runpip dictation" if "pipx" in parts or ".pipx" in parts else "pip"
    if linux:
        remove = f"{pip} uninstall -y torch triton $({pip} freeze | grep -o '^nvidia-[A-Za-z0-9_.-]*')"
        return f"`{remove}` then `{pip} install torch --index-url {CPU_TORCH_URL}` (about 1.3 GB instead of 5.7 GB)"
    return f"`{pip} uninstall -y torch` then `{pip} install torch --index-url {CPU_TORCH_URL}`"


def _device_check(ctx: Context, accelerator: str, gpus: list[GpuInfo]) -> Check:
    device = ctx.settings.engine.device
    fix = "set Device to Automatic or CPU on the Model page (or fix the GPU, see above)"
    if device == "auto":
        target = {"cuda": "cuda:0", "mps": "the Apple GPU (MPS)"}.get(accelerator, "the CPU")
        return Check("Engine", "Device", "info", f"Automatic: the model runs on {target}")
    if device.startswith("cuda"):
        if accelerator != "cuda":
            return Check(
                "Engine",
                "Device",
                "warning",
                f"set to {device}, but no CUDA GPU is usable: the app falls back to the CPU",
                fix,
            )
        index = int(device.split(":")[1]) if ":" in device else 0
        if index >= len(gpus):
            return Check(
                "Engine",
                "Device",
                "warning",
                f"set to {device}, but there are only {len(gpus)} GPU(s): the app falls back to the CPU",
                fix,
            )
    if device == "mps" and accelerator != "mps":
        return Check(
            "Engine", "Device", "warning", "set to mps, but MPS is not available: the app falls back to the CPU", fix
        )
    return Check("Engine", "Device", "ok", f"set to {device}")


def _memory_check(ctx: Context, gpus: list[GpuInfo]) -> Check | None:
    from dictation.asr.checkpoints.hub import find_known_model

    engine = ctx.settings.engine
    known = find_known_model(engine.model.strip())
    if known is None or not gpus or engine.variant in ("int8", "int4"):
        return None
    device = engine.device
    index = int(device.split(":")[1]) if device.startswith("cuda:") else 0
    gpu = next((g for g in gpus if g.index == index), gpus[0])
    if gpu.total_bytes is None or gpu.total_bytes >= known.vram_gb * 1e9:
        return None
    return Check(
        "Engine",
        "GPU memory",
        "warning",
        f"{known.label} needs about {known.vram_gb:g} GB of GPU memory in bf16; {gpu.name} has {gb(gpu.total_bytes)}",
        "choose the int8 or int4 weights variant on the Model page, or the 0.6B model",
    )
