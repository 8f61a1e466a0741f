"""The benchmark itself: contenders (our variants, the official implementation), timed stages, memory,
agreement with a reference variant, and the run over sizes and clips. See benchmarks/README.md.

A contender has ``key``, ``label``, ``notes``, ``weight_bytes`` and ``load() -> seconds``,
``run(audio, n_tokens) -> Run``, ``prompt_ids(audio)``, ``unload()``; ours also has
``teacher_forced(audio, tokens)`` for the agreement figures.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import logging
import os
import platform
import shutil
import statistics
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dictation.bench import checkpoints
from dictation.bench.options import IMPLS

SAMPLE_RATE = 16000
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

RANDOM_AGREEMENT_NOTE = (
    "agreement: random weights give near-uniform logits, so on these checkpoints the agreement figures are only "
    "a sanity check (the reference must agree with itself: 1.00); use --model with a real model for meaningful ones"
)


def say(message: str = "") -> None:
    print(message, flush=True)


# --- device helpers ----------------------------------------------------------------------------------


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


# --- inputs ------------------------------------------------------------------------------------------


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


# --- measurements -------------------------------------------------------------------------------------


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


class OursBench:
    """Our engine as one variant: bf16/fp16/fp32, or int8/int4 quantized at load (or from a
    pre-quantized folder with ``load_prequantized``)."""

    def __init__(
        self, folder: Path, device: torch.device, variant: str, float_dtype: str, group_size: int, step: str = ""
    ) -> None:
        """``float_dtype``: bf16/fp16/fp32 for int8/int4's floating parts, or "auto" for the engine's own
        choice (bf16 on a CPU with bf16 instructions); float variants run in their own dtype. ``step``:
        "" for the engine's default decode step, "unfused" (torch ops only), "gemv" (the fused kernels with the
        GEMV option) or "compiled" (torch.compile)."""
        self.folder, self.device, self.variant, self.group_size = folder, device, variant, group_size
        self.step = step
        self.key = f"{variant}/{step}" if step else variant
        self.label = f"ours {self.key}"
        self.dtype_name = variant if variant in FLOAT_VARIANTS else float_dtype
        self.engine: Any = None
        self.notes: list[str] = []
        self.weight_bytes: int | None = None
        self.decode_weight_bytes: int | None = None

    def _engine(self, folder: Path, variant: str | None):
        from dictation.asr import AsrEngine, EngineOptions

        return AsrEngine(
            EngineOptions(
                model=str(folder),
                device=str(self.device),
                dtype=self.dtype_name,
                variant=variant,
                group_size=self.group_size,
            )
        )

    def _timed_prepare(self, engine) -> float:
        t0 = time.perf_counter()
        engine.prepare()
        sync(self.device)
        elapsed = time.perf_counter() - t0
        if engine.variant != self.variant:
            raise RuntimeError(f"asked for the {self.variant} variant, the engine loaded {engine.variant}")
        return elapsed

    def load(self) -> float:
        self.engine = self._engine(self.folder, self.variant)
        elapsed = self._timed_prepare(self.engine)
        model = self.engine.model
        if self.step == "unfused":
            model.decoder.kernels = False
        elif self.step == "gemv":
            model.decoder.gemv = True
        elif self.step == "compiled":
            model.compile_step = True
        self.weight_bytes = self.engine.weight_bytes
        self.decode_weight_bytes = decode_weight_bytes(self.engine.model)
        self.dtype_name = DTYPE_NAMES[self.engine.model.dtype]  # what "auto" became
        if self.variant in ("int8", "int4"):
            note = f"{self.variant}: encoder, embeddings and head in {self.dtype_name}"
            if self.device.type == "cpu":
                from dictation.asr.nn.quantized import cpu_computes_in_bf16

                if cpu_computes_in_bf16():
                    note += "; the quantized layers compute in bf16 (this CPU has bf16 instructions)"
            self.notes.append(note)
        return elapsed

    def load_prequantized(self, folder: Path) -> tuple[float, int]:
        """Load time and weight bytes of a pre-quantized folder (its metadata names the variant)."""
        engine = self._engine(folder, None)
        try:
            return self._timed_prepare(engine), engine.weight_bytes
        finally:
            engine.unload()

    def _prompt_embeds(self, audio: np.ndarray) -> tuple[torch.Tensor, list[int]]:
        from dictation.asr.nn.features import n_audio_tokens

        engine = self.engine
        model = engine.model
        features = engine.pipeline.mel(audio)
        audio_embeds = model.audio_tower(features)
        ids = engine.prompt.prompt_ids(
            n_audio_tokens(features.shape[-1], model.cfg.audio.chunk_frames), context="", language=None
        )
        return model.embed_prompt(torch.tensor(ids, device=self.device), audio_embeds), ids

    def prompt_ids(self, audio: np.ndarray) -> list[int]:
        from dictation.asr.nn.features import n_audio_tokens, n_frames

        frames = n_frames(len(audio))
        return self.engine.prompt.prompt_ids(
            n_audio_tokens(frames, self.engine.model.cfg.audio.chunk_frames), context="", language=None
        )

    def run(self, audio: np.ndarray, n_tokens: int) -> Run:
        from dictation.asr.decode.greedy import greedy
        from dictation.asr.nn.features import n_audio_tokens

        engine, device = self.engine, self.device
        model = engine.model
        with torch.inference_mode():
            sync(device)
            t0 = time.perf_counter()
            features = engine.pipeline.mel(audio)
            sync(device)
            t1 = time.perf_counter()
            audio_embeds = model.audio_tower(features)
            sync(device)
            t2 = time.perf_counter()
            ids = engine.prompt.prompt_ids(
                n_audio_tokens(features.shape[-1], model.cfg.audio.chunk_frames), context="", language=None
            )
            embeds = model.embed_prompt(torch.tensor(ids, device=device), audio_embeds)
            sync(device)
            t3 = time.perf_counter()
            gen = greedy(model, embeds, max_new_tokens=n_tokens, eos_ids=())
        if len(gen.token_ids) != n_tokens:
            raise RuntimeError(f"ours generated {len(gen.token_ids)} tokens, expected {n_tokens}")
        steps = max(n_tokens - 1, 1)
        return Run(
            mel_ms=(t1 - t0) * 1e3,
            encoder_ms=(t2 - t1) * 1e3,
            prefill_ms=(t3 - t2 + gen.prefill_s) * 1e3,
            decode_ms_per_token=gen.decode_s * 1e3 / steps,
            tokens=list(gen.token_ids),
            extra={"prompt_embed_ms": (t3 - t2) * 1e3},
        )

    def release(self, audio: np.ndarray, n_tokens: int, repeats: int) -> dict[str, float]:
        """Key release to text when the work is done while the user speaks (``engine.stream``).

        The clip is fed in 100-ms chunks as a recorder delivers it (completed 8-s windows are encoded
        and prefilled then; that work is ``speech_work_ms``), and only ``finish`` is timed:

        * ``release_ms``: streamed, no draft;
        * ``release_preview_ms``: with the ids of a ``preview()`` taken 1 s before the end as the
          draft, as the app does (on random weights the preview shares few ids with the final text;
          ``preview_accepted`` says how many were verified);
        * ``release_draft_ms``: with a draft whose first 85% are the final ids and the rest wrong:
          what a preview 1 s before the end gives on real speech, where the words already spoken
          keep their text;
        * ``release_best_ms``: the same 85% draft on this clip with its first second made the loudest
          (no window has to be redone at release; on the bench clip the windows encoded before its
          loudest frame are redone when the final floor changes them: ``windows_redone``).

        Every path's ids are compared with a whole-clip ``transcribe`` with the same budget. In fp32
        they must be equal (the run stops with an error otherwise). In bf16 and the quantized variants
        the prefill's rounding depends on how the prompt was split into chunks (and on the CPU which
        int8/int4 kernel a chunk's row count picks), so a near tie can go the other way:
        ``streamed_same_ids`` is the share of runs whose ids were equal."""
        engine = self.engine
        exact = self.variant == "fp32"
        chunk = SAMPLE_RATE // 10
        loud_start = audio * 0.5
        loud_start[:SAMPLE_RATE] = synth_audio(1.0, seed=AUDIO_SEED + 1) * 1.8
        wanted = {False: engine.transcribe(audio, max_new_tokens=n_tokens).token_ids}
        wanted[True] = engine.transcribe(loud_start, max_new_tokens=n_tokens).token_ids
        for ids in wanted.values():
            if len(ids) != n_tokens:
                raise RuntimeError(f"the model ended after {len(ids)} of {n_tokens} tokens; use fewer --tokens")
        vocab = engine.model.cfg.text.vocab_size

        def draft85(ids: list[int]) -> list[int]:
            keep = int(0.85 * len(ids))
            return ids[:keep] + [(t + 1) % vocab for t in ids[keep:]]

        def one(clip: np.ndarray, mode: str) -> tuple[float, float, float, float, bool]:
            stream = engine.stream(max_new_tokens=n_tokens)
            preview_at = max(0, len(clip) - SAMPLE_RATE)
            draft: list[int] | None = None
            work = 0.0
            for i in range(0, len(clip), chunk):
                if mode == "preview" and i <= preview_at < i + chunk:
                    stream.feed(clip[i:preview_at])
                    t0 = time.perf_counter()
                    preview = stream.preview()
                    work += time.perf_counter() - t0
                    draft = preview.token_ids if preview is not None else None
                    stream.feed(clip[preview_at : i + chunk])
                else:
                    stream.feed(clip[i : i + chunk])
            best = clip is loud_start
            if mode == "draft":
                draft = draft85(wanted[best])
            sync(self.device)
            t0 = time.perf_counter()
            got = stream.finish(draft_ids=draft)
            sync(self.device)
            elapsed = time.perf_counter() - t0
            same = got.token_ids == wanted[best]
            if exact and not same:
                raise RuntimeError("the streamed transcript differs from the whole clip's")
            t = got.timings
            return (
                elapsed * 1e3,
                (t["feed_s"] + work) * 1e3,
                t.get("draft_accepted", 0.0),
                t.get("reencoded_windows", 0.0),
                same,
            )

        runs: dict[str, list[tuple[float, float, float, float, bool]]] = {}
        for key, clip, mode in (
            ("release_ms", audio, "none"),
            ("release_preview_ms", audio, "preview"),
            ("release_draft_ms", audio, "draft"),
            ("release_best_ms", loud_start, "draft"),
        ):
            runs[key] = [one(clip, mode) for _ in range(repeats)]
        out = {key: statistics.median(r[0] for r in values) for key, values in runs.items()}
        out["speech_work_ms"] = statistics.median(r[1] for r in runs["release_ms"])
        out["preview_accepted"] = statistics.median(r[2] for r in runs["release_preview_ms"])
        out["windows_redone"] = runs["release_ms"][0][3]
        every = [r[4] for values in runs.values() for r in values]
        out["streamed_same_ids"] = sum(every) / len(every)
        return out

    def teacher_forced(self, audio: np.ndarray, tokens: list[int]) -> tuple[list[int], torch.Tensor]:
        """Feed ``tokens`` (another variant's greedy output) after the prompt; return this variant's
        argmax at every position (the prediction of tokens[i] from tokens[:i]) and the first logits
        (float32, on the CPU)."""
        model = self.engine.model
        with torch.inference_mode():
            embeds, _ = self._prompt_embeds(audio)
            logits = model.prefill(embeds, len(tokens))
            first = logits.float().cpu()
            preds = [int(logits.argmax())]
            position = embeds.shape[1]
            for token in tokens[:-1]:
                logits = model.step(torch.tensor([token], device=self.device), position)
                preds.append(int(logits.argmax()))
                position += 1
        return preds, first

    def warm_up(self) -> float:
        """``engine.warm_up()`` (what the app runs after loading: kernel set-up and compiles, the CUDA
        graph capture); returns its seconds."""
        seconds = self.engine.warm_up()
        self.engine.pipeline.cache_owner = None
        return seconds

    def decode_kernels(self) -> dict[str, Any]:
        """How many kernels one decode step launches per decoder layer (dictation.bench.kernel_count), counted
        on the step decoding uses here."""
        from dictation.bench.kernel_count import decode_step

        self.engine.pipeline.cache_owner = None  # the count writes a cache position
        count = decode_step(self.engine.model, 1)
        return {
            "path": count.path,
            "per_layer": count.per_layer,
            "outside": count.outside,
            "total": count.total,
            "generated": count.generated,
            "first_layer": count.first_layer,
            "describe": count.describe(),
        }

    def kernel_cache_bytes(self) -> int:
        """Bytes the quantized layers hold besides their weights: kernel layouts and cast scales, built
        on first use (e.g. the int4 kernels' packed copy of the weights), the fused q/k/v and gate/up
        layers' included."""
        from dictation.asr.nn.quantized import kernel_cache_bytes

        return kernel_cache_bytes(self.engine.model)

    def unload(self) -> None:
        if self.engine is not None:
            self.engine.unload()
        self.engine = None


def decode_weight_bytes(model: Any) -> int:
    """Weight bytes one decode step of our model reads (quantized layers as stored): the decoder without
    its embedding table (one row is gathered), plus the output head."""
    from dictation.asr.tune.quantize import weight_bytes

    embed = model.decoder.embed_tokens.weight
    head = model.output_weight
    return weight_bytes(model.decoder) - embed.numel() * embed.element_size() + head.numel() * head.element_size()


def median_run(runs: list[Run], n_tokens: int) -> dict[str, Any]:
    out: dict[str, Any] = {s: statistics.median(getattr(r, s) for r in runs) for s in STAGES if s != "e2e_ms"}
    out["e2e_ms"] = statistics.median(r.e2e_ms(n_tokens) for r in runs)
    for key in runs[0].extra:
        out[key] = statistics.median(r.extra[key] for r in runs)
    out["runs"] = [
        {**{s: getattr(r, s) for s in STAGES if s != "e2e_ms"}, "e2e_ms": r.e2e_ms(n_tokens), **r.extra} for r in runs
    ]
    return out


# --- agreement ----------------------------------------------------------------------------------------


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
        is_ours = isinstance(bench, OursBench)
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


# --- running contenders -------------------------------------------------------------------------------


def warm_page_cache(folder: Path) -> int:
    """Read every file of ``folder`` once, so that a timed load finds it in the page cache: issue 6 times
    loading from a warm cache, and otherwise whichever contender loads a checkpoint first pays for the
    disk. Returns the bytes read."""
    total = 0
    for path in sorted(Path(folder).rglob("*")):
        if path.is_file():
            with open(path, "rb", buffering=0) as f:
                while chunk := f.read(1 << 24):
                    total += len(chunk)
    return total


def _load(bench: Any, device: torch.device) -> dict[str, Any]:
    warm_page_cache(bench.folder)
    memory = PeakMemory(device)
    free_memory(device)
    baseline = memory.current()
    memory.reset()
    load_s = bench.load()
    peak = memory.peak()
    warm_up_s = None
    if isinstance(bench, OursBench):
        warm_up_s = bench.warm_up()
        say(f"  [{bench.label}] loaded in {load_s:.2f} s, warmed up in {warm_up_s:.2f} s")
    else:
        say(f"  [{bench.label}] loaded in {load_s:.2f} s")
    return {
        "warm_up_s": warm_up_s,
        "label": bench.label,
        "load_s": load_s,
        "load_peak_bytes": peak,
        "load_peak_over_baseline_bytes": _minus(peak, baseline),
        "baseline_bytes": baseline,
        "memory_kind": memory.kind,
        "weight_bytes": bench.weight_bytes,
        "clips": {},
    }


def _finish(bench: Any, stats: dict[str, Any], runs: list[Run], audio: np.ndarray, args: argparse.Namespace) -> None:
    stats["tokens"] = runs[-1].tokens
    stats["prompt_ids"] = bench.prompt_ids(audio)
    if isinstance(bench, OursBench) and not getattr(args, "no_release", False):
        stats["release"] = bench.release(audio, args.tokens, args.repeats)


def _close(bench: Any, result: dict[str, Any], device: torch.device) -> None:
    if isinstance(bench, OursBench):
        result["decode_kernels"] = bench.decode_kernels()
        result["step"] = bench.step or "default"
        result["variant"] = bench.variant
        result["dtype"] = bench.dtype_name
        result["decode_weight_bytes"] = bench.decode_weight_bytes
        result["kernel_cache_bytes"] = bench.kernel_cache_bytes() if bench.variant not in FLOAT_VARIANTS else None
        if bench.variant == "int8" and device.type == "cuda":
            from dictation.asr.nn.quantized import cuda_int8_path

            path = cuda_int8_path(device, bench.engine.model.dtype)
            result["int8_path"] = path
            bench.notes.append(f"int8: one-row products through the {path} path (the fastest that ran on this GPU)")
    result["notes"] = bench.notes
    bench.unload()
    free_memory(device)


def bench_sequential(
    benches: list[Any], clips: dict[float, np.ndarray], args: argparse.Namespace, device: torch.device, agree: Agreement
) -> dict[str, dict[str, Any]]:
    """One contender at a time: load, time every clip (``warmup`` untimed runs, then ``repeats``),
    measure agreement, unload."""
    results: dict[str, dict[str, Any]] = {}
    for bench in benches:
        result = _load(bench, device)
        memory = PeakMemory(device)
        baseline = result["baseline_bytes"]
        for seconds, audio in clips.items():
            memory.reset()
            t0 = time.perf_counter()
            for _ in range(args.warmup):
                bench.run(audio, args.tokens)
            runs = [bench.run(audio, args.tokens) for _ in range(args.repeats)]
            stats = median_run(runs, args.tokens)
            peak = memory.peak()
            stats["peak_bytes"] = peak
            stats["peak_over_baseline_bytes"] = _minus(peak, baseline)
            _finish(bench, stats, runs, audio, args)
            stats["agreement"] = agree.measure(bench, seconds, audio, stats["tokens"])
            result["clips"][seconds] = stats
            say(
                f"  [{bench.label}] {seconds:g} s clip: e2e {stats['e2e_ms']:.1f} ms "
                f"(wall {time.perf_counter() - t0:.1f} s for {args.warmup + args.repeats} runs)"
            )
        _close(bench, result, device)
        results[bench.key] = result
    return results


def bench_interleaved(
    benches: list[Any], clips: dict[float, np.ndarray], args: argparse.Namespace, device: torch.device, agree: Agreement
) -> dict[str, dict[str, Any]]:
    """Load every contender at once and alternate their runs, so that all see the same machine load
    (for shared CPUs). Needs memory for all models; peak memory is not measured."""
    results: dict[str, dict[str, Any]] = {}
    for bench in benches:
        result = _load(bench, device)
        result["load_peak_bytes"] = result["load_peak_over_baseline_bytes"] = None
        result["memory_kind"] = "not measured (--interleave)"
        results[bench.key] = result
    for seconds, audio in clips.items():
        t0 = time.perf_counter()
        runs: dict[str, list[Run]] = {b.key: [] for b in benches}
        for _ in range(args.warmup):
            for bench in benches:
                bench.run(audio, args.tokens)
        for r in range(args.repeats):
            for bench in benches if r % 2 == 0 else benches[::-1]:
                runs[bench.key].append(bench.run(audio, args.tokens))
        for bench in benches:  # the reference comes first
            stats = median_run(runs[bench.key], args.tokens)
            stats["peak_bytes"] = stats["peak_over_baseline_bytes"] = None
            _finish(bench, stats, runs[bench.key], audio, args)
            stats["agreement"] = agree.measure(bench, seconds, audio, stats["tokens"])
            results[bench.key]["clips"][seconds] = stats
        summary = ", ".join(f"{b.label} {results[b.key]['clips'][seconds]['e2e_ms']:.1f} ms" for b in benches)
        say(f"  {seconds:g} s clip: e2e {summary} (wall {time.perf_counter() - t0:.1f} s)")
    for bench in benches:
        _close(bench, results[bench.key], device)
    return results


def reference_pass(
    bench: OursBench, clips: dict[float, np.ndarray], n_tokens: int, device: torch.device, agree: Agreement
) -> dict[str, Any]:
    """Load the reference variant only for the agreement figures (it is not among the compared ones)."""
    result = _load(bench, device)
    for seconds, audio in clips.items():
        run = bench.run(audio, n_tokens)
        agree.measure(bench, seconds, audio, run.tokens)
    del result["clips"]
    _close(bench, result, device)
    return result


def prequantized_loads(
    benches: list[OursBench], source: Path, root: Path, group_size: int, device: torch.device
) -> dict[str, dict[str, Any]]:
    """For int8/int4: write (or reuse) a pre-quantized folder and time loading it."""
    from dictation.asr import AsrError

    out: dict[str, dict[str, Any]] = {}
    for bench in benches:
        if bench.variant not in ("int8", "int4"):
            continue
        try:
            folder, write_s = checkpoints.prequantized_folder(source, root, bench.variant, group_size, log=say)
        except AsrError as exc:
            say(f"  [{bench.label}] no pre-quantized folder: {exc}")
            out[bench.key] = {"error": str(exc)}
            continue
        warm_page_cache(folder)
        memory = PeakMemory(device)
        free_memory(device)
        baseline = memory.current()
        memory.reset()
        load_s, weight_bytes = bench.load_prequantized(folder)
        peak = memory.peak()
        free_memory(device)
        say(f"  [{bench.label}] pre-quantized folder loaded in {load_s:.2f} s")
        out[bench.key] = {
            "folder": str(folder),
            "write_s": write_s,
            "disk_bytes": checkpoints.folder_bytes(folder),
            "load_s": load_s,
            "weight_bytes": weight_bytes,
            "load_peak_over_baseline_bytes": _minus(peak, baseline),
        }
    return out


# --- one model -----------------------------------------------------------------------------------------


def bench_model(
    label: str,
    folder: Path,
    random_weights: bool,
    args: argparse.Namespace,
    device: torch.device,
    dtype: torch.dtype,
    clips: dict[float, np.ndarray],
    workdir: Path,
    contender: Any,
) -> dict[str, Any]:
    from dictation.asr.config import AsrConfig

    base = DTYPE_NAMES[dtype]
    variants = list(args.variants or [base])
    reference = args.reference_variant or ("bf16" if device.type == "cuda" else "fp32")
    ours_on = "ours" in args.impl
    cfg = AsrConfig.from_file(folder / "config.json")

    def make(variant: str, step: str = "") -> OursBench:  # int8/int4 under --dtype auto: the engine's own choice
        return OursBench(folder, device, variant, args.dtype, args.group_size, step)

    ours: list[OursBench] = []
    if ours_on:  # the reference first: the others are compared with it as they are measured
        order = [reference, *[v for v in variants if v != reference]] if reference in variants else variants
        ours = [make(v) for v in order]
        # Other decode steps of the base float variant, each its own column (after the default ones).
        extra = [make(base, step) for step in getattr(args, "decode_steps", [])]
        ours += extra
        variants = variants + [b.key for b in extra]
    benches: list[Any] = list(ours)
    if contender is not None:  # the official implementation (benchmarks/official_contender.py)
        benches.append(contender.OfficialBench(folder, device, dtype, base))

    agree = Agreement(reference)
    res: dict[str, Any] = {
        "size": label,
        "checkpoint": str(folder),
        "random_weights": random_weights,
        "base_variant": base,
        "variants": variants if ours_on else [],
        "reference_variant": reference if ours_on else None,
        "reference_only": None,
    }
    if ours_on and reference not in variants:
        say(f"  [ours {reference}] reference for the agreement figures (not timed)")
        res["reference_only"] = reference_pass(make(reference), clips, args.tokens, device, agree)
    prequantized = {}
    if ours_on and not args.no_prequantized:
        prequantized = prequantized_loads(ours, folder, workdir, args.group_size, device)
    if args.interleave and len(benches) > 1:
        results = bench_interleaved(benches, clips, args, device, agree)
    else:
        results = bench_sequential(benches, clips, args, device, agree)
    for key, pre in prequantized.items():
        results[key]["prequantized"] = pre

    ours_results = {v: results[v] for v in variants if ours_on}
    official = results.get("official")
    res["ours"] = ours_results
    res["official"] = official
    bandwidth = gpu_bandwidth(device_name(device)) if device.type == "cuda" else None
    res["clips"] = []
    for seconds in args.seconds:
        clip: dict[str, Any] = {"seconds": seconds}
        clip["ours"] = {v: r["clips"][seconds] for v, r in ours_results.items()}
        clip["official"] = official["clips"][seconds] if official else None
        any_stats = next(iter(clip["ours"].values()), None) or clip["official"]
        prompt_len = len(any_stats["prompt_ids"])
        clip["prompt_tokens"] = prompt_len
        clip["audio_tokens"] = prompt_len - 15  # spec §6.1: N + 15 without context
        context = prompt_len + args.tokens / 2
        for v, stats in clip["ours"].items():
            r = ours_results[v]
            elem = DTYPES[r["dtype"]].itemsize
            stats["decoder_bytes_per_token"] = r["decode_weight_bytes"] + kv_cache_bytes(cfg, elem, context)
        if clip["official"]:
            elem = dtype.itemsize
            clip["official"]["decoder_bytes_per_token"] = float_decode_weight_bytes(cfg, elem) + kv_cache_bytes(
                cfg, elem, context
            )
        for stats in [*clip["ours"].values(), *([clip["official"]] if clip["official"] else [])]:
            per_token = stats["decoder_bytes_per_token"]
            stats["floor_ms_per_token"] = per_token / bandwidth[1] * 1e3 if bandwidth else None
        if clip["official"] and base in clip["ours"]:
            mine, theirs = clip["ours"][base], clip["official"]
            if mine["prompt_ids"] != theirs["prompt_ids"]:
                say(f"WARNING: {label} {seconds:g} s: prompt ids differ between ours and official")
            clip["same_prompt"] = mine["prompt_ids"] == theirs["prompt_ids"]
            agree_n = _leading_agreement(mine["tokens"], theirs["tokens"])
            clip["tokens_agree"] = f"{agree_n}/{args.tokens}"
            clip["ratio"] = {s: _ratio(theirs[s], mine[s]) for s in STAGES}
            if mine.get("release"):  # the official implementation starts at release: its end-to-end
                clip["ratio"].update(
                    {key: _ratio(theirs["e2e_ms"], value) for key, value in mine["release"].items() if key in RELEASE}
                )
            clip["ratio"]["peak_over_baseline_bytes"] = _ratio(
                theirs["peak_over_baseline_bytes"], mine["peak_over_baseline_bytes"]
            )
        for stats in [*clip["ours"].values(), *([clip["official"]] if clip["official"] else [])]:
            stats.pop("prompt_ids", None)
        res["clips"].append(clip)
    for r in results.values():
        del r["clips"]
    if official and base in ours_results:
        res["load_ratio"] = _ratio(official["load_s"], ours_results[base]["load_s"])
    return res


def _ratio(official: float | None, ours: float | None) -> float | None:
    if official is None or ours is None or ours <= 0:
        return None
    return official / ours


# --- main ---------------------------------------------------------------------------------------------


def run(args: argparse.Namespace, official: Any = None) -> int:
    """Run the benchmark for parsed and checked options (dictation.bench.options); returns an exit code.

    ``official``: the official implementation as a contender (``benchmarks/official_contender.py``, which
    ``benchmarks/bench_asr.py`` passes in); the package itself never loads the reference implementation.
    """
    from dictation.asr import AsrError
    from dictation.asr.device import resolve_device
    from dictation.bench.report import print_size_table, print_summary

    warnings.filterwarnings("ignore")
    logging.getLogger("dictation").setLevel(logging.ERROR)  # e.g. every run hits its token budget
    if args.threads:
        torch.set_num_threads(args.threads)
    from dictation.asr.nn import quant_format

    quant_format.INT4_METHOD = getattr(args, "int4_method", quant_format.INT4_METHOD)  # loads and pre-quantized folders
    try:
        device = resolve_device(args.device)
    except AsrError as exc:
        say(f"dictation bench: error: {exc}")
        return 1
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    auto_dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    dtype = auto_dtype if args.dtype == "auto" else DTYPES[args.dtype]

    impls = [i for i in IMPLS if i in args.impl]
    official_missing = None
    official_versions: dict[str, str] = {}
    if "official" in impls and official is None:
        impls.remove("official")
        official_missing = "not part of `dictation bench`"
        say(
            "official numbers: run benchmarks/bench_asr.py from a checkout with the test extra installed "
            "(the app never loads the reference implementation)"
        )
    elif "official" in impls:
        official_missing = official.unavailable_reason()
        if official_missing:
            impls.remove("official")
            say(
                f"official numbers missing: transformers 4.57.6 + qwen-asr are not importable ({official_missing}); "
                f"get them with: {official.INSTALL_HINT}"
            )
        else:
            official_versions = official.versions()
    if not impls:
        say("dictation bench: error: nothing to run (only the official implementation was asked for)")
        return 1
    args.impl = impls

    name = device_name(device)
    bandwidth = gpu_bandwidth(name) if device.type == "cuda" else None
    meta: dict[str, Any] = {
        "device": name,
        "device_type": device.type,
        "dtype": DTYPE_NAMES[dtype],
        "variants": list(args.variants or [DTYPE_NAMES[dtype]]),
        "reference_variant": args.reference_variant or ("bf16" if device.type == "cuda" else "fp32"),
        "group_size": args.group_size,
        "int4_method": quant_format.INT4_METHOD,
        "impls": impls,
        "official_missing": official_missing,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": official_versions.get("transformers"),
        "qwen_asr": official_versions.get("qwen-asr"),
        "python": platform.python_version(),
        "tokens": args.tokens,
        "repeats": args.repeats,
        "warmup": args.warmup,
        "seconds": args.seconds,
        "torch_threads": torch.get_num_threads(),
        "bandwidth_gpu": bandwidth[0] if bandwidth else None,
        "bandwidth_bytes_per_s": bandwidth[1] if bandwidth else None,
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "interleave": args.interleave,
        "cpu_count": os.cpu_count(),
        "loadavg_start": _loadavg(),
    }
    versions = f" · transformers {meta['transformers']} · qwen-asr {meta['qwen_asr']}" if official_versions else ""
    say(f"device: {name} · dtype {meta['dtype']} · torch {torch.__version__}{versions}")

    clips = {s: synth_audio(s) for s in args.seconds}
    temp = None
    workdir = args.workdir
    if workdir is None:
        temp = workdir = Path(tempfile.mkdtemp(prefix="dictation_bench_"))
    workdir.mkdir(parents=True, exist_ok=True)
    results: list[dict[str, Any]] = []
    t_start = time.perf_counter()
    try:
        if args.model is not None:
            from dictation.asr.checkpoints.hub import resolve_model

            try:
                folder = resolve_model(args.model)
            except AsrError as exc:
                say(f"dictation bench: error: {exc}")
                return 1
            targets = [(folder.name, folder, False)]
            meta["sizes"] = []
            meta["model"] = str(folder)
        else:
            sizes = args.sizes or (["0.6B", "1.7B"] if device.type == "cuda" else ["0.6B"])
            meta["sizes"] = sizes
            targets = [(size, None, True) for size in sizes]
        for label, folder, random_weights in targets:
            if folder is None:
                folder = checkpoints.build_checkpoint(label, workdir, log=say)
            res = bench_model(
                label,
                folder,
                random_weights,
                args,
                device,
                dtype,
                clips,
                workdir,
                official if "official" in impls else None,
            )
            results.append(res)
            print_size_table(res, meta)
    finally:
        if temp is not None:
            shutil.rmtree(temp, ignore_errors=True)
    meta["wall_s"] = time.perf_counter() - t_start
    meta["loadavg_end"] = _loadavg()
    print_summary(results, meta)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps({"meta": meta, "results": results}, indent=2, default=str) + "\n", encoding="utf-8"
        )
        say(f"wrote {args.json}")
    return 0
