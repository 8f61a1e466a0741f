"""Random Qwen3-ASR checkpoints at the real sizes, and pre-quantized copies of them, for the benchmark.

Written by our own code (no transformers needed), in the original ``Qwen/Qwen3-ASR-*`` layout that the
official implementation loads as well: ``config.json`` in the official format, ``model.safetensors``
(bf16, ``thinker.*`` names, tied head not stored, as ``save_pretrained`` writes it),
``preprocessor_config.json`` and a synthetic byte-level BPE tokenizer with the real special-token ids.

Weights: every matrix and conv kernel N(0, 0.02), biases 0, norm weights 1, each tensor from its own
generator seeded by (seed, tensor name). The values are meaningless (near-uniform logits); the amount
of compute and memory traffic is the real model's.

Tokenizer: the 256 byte symbols, whole-word merges for the chat template's words (``system``, ``user``,
``assistant``) so the prompt has the real model's length (15 + audio tokens), unreachable fillers up to
id 151642, and the added tokens at their real ids. Decoded text is meaningless, prompt ids are right.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dictation.asr import SAMPLE_RATE

SEED = 1234
WEIGHT_STD = 0.02
CHECKPOINT_FORMAT = 2  # bump when the generated checkpoint changes (invalidates --workdir caches)


# Real dimensions (docs/model.md §1); "tiny" is for smoke tests (the real vocabulary, a few MB of layers).
SIZES: dict[str, dict[str, dict[str, int]]] = {
    "tiny": {
        "audio": {
            "d_model": 128,
            "encoder_layers": 2,
            "encoder_attention_heads": 2,
            "encoder_ffn_dim": 256,
            "output_dim": 64,
            "downsample_hidden_size": 32,
        },
        "text": {"hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128},
    },
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
    "initializer_range": WEIGHT_STD,
    "model_type": "qwen3_asr_audio_encoder",
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
    "attention_dropout": 0.0,
    "max_position_embeddings": 65536,
    "tie_word_embeddings": True,
    "use_cache": True,
    "initializer_range": WEIGHT_STD,
    "rope_scaling": {
        "rope_type": "default",
        "mrope_section": [24, 20, 20],
        "interleaved": True,
        "mrope_interleaved": True,
    },
    "model_type": "qwen3_asr_text",
}
AUDIO_PAD_ID, AUDIO_START_ID, AUDIO_END_ID = 151676, 151669, 151670
N_REGULAR_TOKENS = 151643  # byte-level BPE entries; added tokens start here
ADDED_TOKENS = {
    151643: "<|endoftext|>",
    151644: "<|im_start|>",
    151645: "<|im_end|>",
    AUDIO_START_ID: "<|audio_start|>",
    AUDIO_END_ID: "<|audio_end|>",
    AUDIO_PAD_ID: "<|audio_pad|>",
    151704: "<asr_text>",
    151705: "<timestamp>",
}
NOT_SPECIAL = {"<asr_text>"}
TEMPLATE_WORDS = ("system", "user", "assistant")

PREPROCESSOR = {
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


def config_dict(size: str) -> dict[str, Any]:
    """config.json of a random checkpoint of ``size``, in the official (``thinker_config``) format."""
    audio = {**AUDIO_COMMON, **SIZES[size]["audio"]}
    audio["num_hidden_layers"] = audio["encoder_layers"]
    text = {**TEXT_COMMON, **SIZES[size]["text"]}
    return {
        "architectures": ["Qwen3ASRForConditionalGeneration"],
        "model_type": "qwen3_asr",
        "dtype": "bfloat16",
        "tie_word_embeddings": True,
        "support_languages": ["Chinese", "English"],
        "thinker_config": {
            "model_type": "qwen3_asr_thinker",
            "audio_config": audio,
            "text_config": text,
            "audio_token_id": AUDIO_PAD_ID,
            "audio_start_token_id": AUDIO_START_ID,
            "audio_end_token_id": AUDIO_END_ID,
            "user_token_id": 872,
            "initializer_range": WEIGHT_STD,
            "tie_word_embeddings": True,
        },
    }


# --- tokenizer ---------------------------------------------------------------------------------------------


def _byte_symbols() -> list[str]:
    """GPT-2's byte -> printable character table (what byte-level BPE vocabularies are written in)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return [table[b] for b in range(256)]


def write_tokenizer(out: Path) -> None:
    """vocab.json + merges.txt + tokenizer_config.json (see the module docstring)."""
    vocab: dict[str, int] = {s: i for i, s in enumerate(_byte_symbols())}
    merges: list[str] = []
    for word in TEMPLATE_WORDS:
        for i in range(2, len(word) + 1):
            merges.append(f"{word[: i - 1]} {word[i - 1]}")
            vocab.setdefault(word[:i], len(vocab))
    for i in range(len(vocab), N_REGULAR_TOKENS):
        vocab[f"<bench_unused_{i}>"] = i  # unreachable: no merge produces it
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (out / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8")
    decoder = {}
    for tid in range(N_REGULAR_TOKENS, max(ADDED_TOKENS) + 1):
        content = ADDED_TOKENS.get(tid, f"<|bench_reserved_{tid}|>")
        decoder[str(tid)] = {
            "content": content,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": content not in NOT_SPECIAL,
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


# --- checkpoints -------------------------------------------------------------------------------------------


def _fill(name: str, shape: tuple[int, ...], seed: int):
    import torch

    t = torch.empty(shape, dtype=torch.bfloat16)
    if len(shape) >= 2:
        gen = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
        return t.normal_(0.0, WEIGHT_STD, generator=gen)
    return t.zero_() if name.endswith("bias") else t.fill_(1.0)


def draw(shapes: dict[str, tuple[int, ...]], seed: int) -> dict[str, Any]:
    """Every tensor of ``shapes`` drawn by ``_fill``, on all cores: each tensor has its own generator,
    so the values do not depend on the order or the thread (a 1.7B checkpoint is ~2 G normal draws,
    about a minute on one core). Largest first, so the embedding table does not start last."""
    from concurrent.futures import ThreadPoolExecutor

    order = sorted(shapes, key=lambda name: -math.prod(shapes[name]))
    with ThreadPoolExecutor(max_workers=max(1, min(32, os.cpu_count() or 1))) as pool:
        drawn = dict(zip(order, pool.map(lambda name: _fill(name, shapes[name], seed), order), strict=True))
    return {name: drawn[name] for name in shapes}


def _digest(obj: Any) -> str:
    return hashlib.sha1(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:12]


def _atomic_folder(folder: Path, write: Callable[[Path], None]) -> None:
    """Run ``write(tmp)`` into a temporary sibling and rename it to ``folder`` (replacing a stale one)."""
    tmp = folder.with_name(f".{folder.name}.partial-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        write(tmp)
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def build_checkpoint(size: str, root: Path, log: Callable[[str], None] = print) -> Path:
    """A random bf16 checkpoint of ``size`` in ``root/qwen3-asr-<size>-random`` (reused if complete)."""
    import torch
    from safetensors.torch import save_file

    from dictation.asr.checkpoints.locate import checkpoint_name
    from dictation.asr.config import AsrConfig
    from dictation.asr.nn.model import AsrModel

    raw = config_dict(size)
    digest = _digest({"v": CHECKPOINT_FORMAT, "seed": SEED, "std": WEIGHT_STD, "config": raw})
    folder = root / f"qwen3-asr-{size}-random"
    marker = folder / "bench_complete.txt"
    if marker.exists() and marker.read_text(encoding="utf-8").strip() == digest:
        log(f"[{size}] reusing random checkpoint {folder}")
        return folder
    t0 = time.perf_counter()
    cfg = AsrConfig.from_dict(raw)
    with torch.device("meta"):
        shapes = {name: tuple(t.shape) for name, t in AsrModel(cfg).state_dict().items()}
    tensors = {checkpoint_name(name, cfg.layout): t for name, t in draw(shapes, SEED).items()}
    n_params = sum(t.numel() for t in tensors.values())

    def write(tmp: Path) -> None:
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(raw, indent=2) + "\n", encoding="utf-8")
        (tmp / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR, indent=1), encoding="utf-8")
        write_tokenizer(tmp)
        (tmp / "bench_complete.txt").write_text(digest + "\n", encoding="utf-8")

    root.mkdir(parents=True, exist_ok=True)
    _atomic_folder(folder, write)
    tensors.clear()
    log(
        f"[{size}] built random checkpoint ({n_params / 1e6:.0f}M parameters, bf16) in {time.perf_counter() - t0:.1f} s"
    )
    return folder


def _source_key(folder: Path) -> dict[str, Any]:
    """What identifies a model folder's contents cheaply: names, sizes and modification times."""
    return {
        "path": str(folder.resolve()),
        "files": sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in folder.iterdir() if p.is_file()),
    }


def prequantized_folder(
    src: Path, root: Path, variant: str, group_size: int, log: Callable[[str], None] = print
) -> tuple[Path, float | None]:
    """A pre-quantized copy of ``src`` written by ``write_quantized_folder`` into ``root`` (reused while
    ``src`` is unchanged). Returns (folder, seconds it took to write, None if reused)."""
    from dictation.asr.tune.quantize import quantization_config
    from dictation.asr.tune.writers import write_quantized_folder

    # the config written names the method (int4) and format: a folder quantized otherwise is rewritten
    digest = _digest({"src": _source_key(src), "config": quantization_config(variant, group_size)})
    folder = root / f"{src.name}-{variant}" if variant == "int8" else root / f"{src.name}-{variant}-g{group_size}"
    marker = root / f".{folder.name}.complete"
    if folder.is_dir() and marker.exists() and marker.read_text(encoding="utf-8").strip() == digest:
        log(f"  [{variant}] reusing pre-quantized folder {folder}")
        return folder, None
    shutil.rmtree(folder, ignore_errors=True)
    marker.unlink(missing_ok=True)
    t0 = time.perf_counter()
    write_quantized_folder(src, folder, variant, group_size=group_size)
    elapsed = time.perf_counter() - t0
    marker.write_text(digest + "\n", encoding="utf-8")
    log(f"  [{variant}] wrote pre-quantized folder in {elapsed:.1f} s: {folder}")
    return folder, elapsed


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file())
