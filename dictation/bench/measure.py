"""What the benchmark measures with: timing and memory helpers, the bench clip, weight and cache bytes,
the GPU bandwidth table, one run's stage times (Run), and the agreement figures between variants."""

from __future__ import annotations

import gc
import os
import platform
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dictation.asr import SAMPLE_RATE

AUDIO_SEED = 1234


STAGES = ("mel_ms", "encoder_ms", "prefill_ms", "decode_ms_per_token", "e2e_ms")


RELEASE = ("release_ms", "release_preview_ms", "release_draft_ms", "release_best_ms")


DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


DTYPE_NAMES = {v: k for k, v in DTYPES.items()}


FLOAT_VARIANTS = ("bf16", "fp16", "fp32")


# Peak memory bandwidth by GPU name, bytes/s (vendor figures). First match wins: the more specific
# name comes first (GH200 before H200, A100 before A10, L40S and L40 before L4).
GPU_BANDWIDTH: tuple[tuple[tuple[str, ...], str, float], ...] = (
    (("gh200", "144g"), "GH200 144GB HBM3e", 4.9e12),
    (("gh200",), "GH200 96GB HBM3", 4.0e12),
    (("h200",), "H200", 4.8e12),
    (("h100", "nvl"), "H100 NVL", 3.9e12),
    (("h100", "pcie"), "H100 PCIe", 2.0e12),
    (("h100", "sxm"), "H100 SXM", 3.35e12),
    (("h100", "hbm3"), "H100 SXM", 3.35e12),  # the SXM part reports itself as "NVIDIA H100 80GB HBM3"
    (("a100", "80gb"), "A100 80GB", 2.0e12),
    (("a100",), "A100 40GB", 1.555e12),
    (("5090",), "RTX 5090", 1.792e12),
    (("4090",), "RTX 4090", 1.0e12),
    (("3090", "ti"), "RTX 3090 Ti", 1.008e12),
    (("3090",), "RTX 3090", 0.936e12),
    (("l40s",), "L40S", 0.864e12),
    (("l40",), "L40", 0.864e12),
    (("l4",), "L4", 0.3e12),
    (("a10g",), "A10G", 0.6e12),
    (("a10",), "A10", 0.6e12),
    (("tesla t4",), "T4", 0.32e12),
)


def say(message: str = "") -> None:
    print(message, flush=True)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def _proc_status_bytes(key: str) -> int | None:
    """A memory line of /proc/self/status (``VmHWM``: peak RSS, ``VmRSS``: current RSS) in bytes, else None."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


class PeakMemory:
    """Peak memory between ``reset()`` and ``peak()``.

    CUDA: ``torch.cuda.max_memory_allocated`` (tensors only, not the allocator's cache).
    CPU: the process's resident-set high-water mark (VmHWM, reset through /proc/self/clear_refs);
    ``current()`` before loading gives the baseline (interpreter, libraries, leftovers) to subtract.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.kind = "cuda_max_memory_allocated" if device.type == "cuda" else "process_peak_rss"

    def reset(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            return
        try:
            with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
                f.write("5")  # resets VmHWM to the current RSS
        except OSError:
            pass

    def peak(self) -> int | None:
        if self.device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(self.device))
        return _proc_status_bytes("VmHWM")

    def current(self) -> int | None:
        if self.device.type == "cuda":
            return int(torch.cuda.memory_allocated(self.device))
        return _proc_status_bytes("VmRSS")


def _minus(a: int | None, b: int | None) -> int | None:
    return a - b if a is not None and b is not None else None


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def free_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    try:  # glibc keeps freed heap memory mapped; hand it back so the next RSS baseline is honest
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "mps":
        return "Apple MPS"
    return (
        f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} logical cores, "
        f"{torch.get_num_threads()} torch threads)"
    )


def gpu_bandwidth(name: str) -> tuple[str, float] | None:
    """(label, bytes/s) for a known GPU name, else None."""
    lower = name.lower()
    for keys, label, bandwidth in GPU_BANDWIDTH:
        if all(k in lower for k in keys):
            return label, bandwidth
    return None


def synth_audio(seconds: float, seed: int = AUDIO_SEED) -> np.ndarray:
    """Deterministic 16 kHz float32 test signal: a few amplitude-modulated sines plus white noise."""
    rng = np.random.default_rng(seed)
    n = int(round(seconds * SAMPLE_RATE))
    t = np.arange(n) / SAMPLE_RATE
    x = np.zeros(n)
    for freq, mod in ((180.0, 2.0), (420.0, 3.1), (1100.0, 4.7), (2500.0, 1.3)):
        x += np.sin(2 * np.pi * freq * t) * (0.5 + 0.5 * np.sin(2 * np.pi * mod * t + rng.uniform(0, np.pi)))
    x += 0.05 * rng.standard_normal(n)
    return (0.5 * x / np.abs(x).max()).astype(np.float32)


def float_decode_weight_bytes(cfg: Any, element_size: int) -> int:
    """Weight bytes one decode step of a floating-point model reads: every decoder weight except the
    embedding table (one row is gathered), plus the output head (tied: the embedding matrix)."""
    t = cfg.text
    h, inter, hd = t.hidden_size, t.intermediate_size, t.head_dim
    q, kv = t.num_attention_heads * hd, t.num_key_value_heads * hd
    per_layer = h * q + 2 * h * kv + q * h + 3 * h * inter + 2 * h + 2 * hd
    return (t.num_hidden_layers * per_layer + h + t.vocab_size * h) * element_size


def kv_cache_bytes(cfg: Any, element_size: int, context: float) -> float:
    t = cfg.text
    return 2.0 * t.num_hidden_layers * t.num_key_value_heads * t.head_dim * context * element_size


@dataclass
class Run:
    mel_ms: float
    encoder_ms: float
    prefill_ms: float
    decode_ms_per_token: float
    tokens: list[int] = field(default_factory=list)
    extra: dict[str, float] = field(default_factory=dict)

    def e2e_ms(self, n_tokens: int) -> float:
        """mel + encoder + prefill + the (n - 1) decode steps (the first token comes from the prefill)."""
        return self.mel_ms + self.encoder_ms + self.prefill_ms + self.decode_ms_per_token * max(n_tokens - 1, 0)


def median_run(runs: list[Run], n_tokens: int) -> dict[str, Any]:
    out: dict[str, Any] = {s: statistics.median(getattr(r, s) for r in runs) for s in STAGES if s != "e2e_ms"}
    out["e2e_ms"] = statistics.median(r.e2e_ms(n_tokens) for r in runs)
    for key in runs[0].extra:
        out[key] = statistics.median(r.extra[key] for r in runs)
    out["runs"] = [
        {**{s: getattr(r, s) for s in STAGES if s != "e2e_ms"}, "e2e_ms": r.e2e_ms(n_tokens), **r.extra} for r in runs
    ]
    return out


def _leading_agreement(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _same_fraction(a: list[int], b: list[int]) -> float:
    n = max(len(a), len(b), 1)
    return sum(x == y for x, y in zip(a, b, strict=False)) / n


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().reshape(-1), b.double().reshape(-1)
    return float(torch.nn.functional.cosine_similarity(a, b, dim=0))


class Agreement:
    """Agreement of every contender with the reference variant, clip by clip.

    The reference's greedy ids and first logits are recorded when the reference is measured (it must
    come first); then for each of ours: the fraction of identical greedy ids, the teacher-forced top-1
    agreement (the reference's ids fed in, the fraction of positions where this variant's argmax is
    the reference's next id) and the cosine of the first-step logits. The official implementation
    gets the greedy figures only.
    """

    def __init__(self, reference: str) -> None:
        self.reference = reference
        self.data: dict[float, tuple[list[int], torch.Tensor]] = {}

    def measure(self, bench: Any, seconds: float, audio: np.ndarray, tokens: list[int]) -> dict[str, Any] | None:
        is_ours = hasattr(bench, "teacher_forced")  # ours (OursBench); the official contender has none
        if is_ours and bench.key == self.reference and seconds not in self.data:
            preds, first = bench.teacher_forced(audio, tokens)
            self.data[seconds] = (list(tokens), first)
        elif seconds not in self.data:
            return None
        else:
            preds, first = bench.teacher_forced(audio, self.data[seconds][0]) if is_ours else (None, None)
        ref_tokens, ref_first = self.data[seconds]
        out: dict[str, Any] = {
            "reference": self.reference,
            "greedy_same_ids": _same_fraction(tokens, ref_tokens),
            "greedy_leading_same": _leading_agreement(tokens, ref_tokens),
            "teacher_forced_top1": None,
            "first_logits_cosine": None,
        }
        if preds is not None:
            out["teacher_forced_top1"] = _same_fraction(preds, ref_tokens)
            out["first_logits_cosine"] = _cosine(first, ref_first)
        return out


def warm_page_cache(folder: Path) -> int:
    """Read every file of ``folder`` once, so that a timed load finds it in the page cache: the engine's load time
    is measured from a warm cache, and otherwise whichever contender loads a checkpoint first pays for the
    disk. Returns the bytes read."""
    total = 0
    for path in sorted(Path(folder).rglob("*")):
        if path.is_file():
            with open(path, "rb", buffering=0) as f:
                while chunk := f.read(1 << 24):
                    total += len(chunk)
    return total
