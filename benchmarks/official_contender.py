"""The official Qwen3-ASR implementation (qwen-asr 0.0.6 on transformers 4.57.6) as a benchmark contender.

Optional: it needs the test extra, which the app never installs. It lives outside the package (the
wheel does not carry it): ``benchmarks/bench_asr.py`` hands it to the runner, and the imports happen
inside functions that run only when the official comparison runs.
"""

from __future__ import annotations

import importlib
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dictation.bench.measure import Run, sync

INSTALL_HINT = "pip install 'dictation[reference]' && pip install --no-deps qwen-asr==0.0.6"

# The official chat template rendered for an empty context, no forced language (docs/model.md §7.1,
# Qwen3ASRModel._build_text_prompt); the processor expands the one audio pad to N.
PROMPT_TEXT = (
    "<|im_start|>system\n<|im_end|>\n<|im_start|>user\n<|audio_start|><|audio_pad|><|audio_end|>"
    "<|im_end|>\n<|im_start|>assistant\n"
)


def unavailable_reason() -> str | None:
    """None if the official implementation can be imported, else why not (one line)."""
    try:
        import qwen_asr.core.transformers_backend.modeling_qwen3_asr  # noqa: F401
        import qwen_asr.core.transformers_backend.processing_qwen3_asr  # noqa: F401
        import transformers
    except Exception as exc:  # ImportError, or a broken install raising anything at import time
        return f"{type(exc).__name__}: {exc}".splitlines()[0]
    transformers.logging.set_verbosity_error()
    return None


def versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {}
    for dist in ("transformers", "qwen-asr"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def _has_accelerate() -> bool:
    import importlib.util

    return importlib.util.find_spec("accelerate") is not None


class OfficialBench:
    """qwen-asr 0.0.6 (transformers backend) loaded as ``Qwen3ASRModel.from_pretrained`` does, default
    attention (sdpa). Stages are cut out of the official code path; decode comes from ``generate``."""

    key = "official"

    def __init__(self, folder: Path, device: torch.device, dtype: torch.dtype, dtype_name: str) -> None:
        self.folder, self.device, self.dtype = folder, device, dtype
        self.label = f"official {dtype_name}"
        self.model: Any = None
        self.processor: Any = None
        self.prompt_text = PROMPT_TEXT
        self.notes: list[str] = []
        self.weight_bytes: int | None = None

    def load(self) -> float:
        from qwen_asr.core.transformers_backend import modeling_qwen3_asr as modeling
        from qwen_asr.core.transformers_backend import processing_qwen3_asr as processing

        kwargs: dict[str, Any] = {"dtype": self.dtype, "attn_implementation": "sdpa"}
        if self.device.type == "cuda" and _has_accelerate():
            kwargs["device_map"] = str(self.device)  # as the official README loads it (needs accelerate)
        t0 = time.perf_counter()
        model = modeling.Qwen3ASRForConditionalGeneration.from_pretrained(str(self.folder), **kwargs)
        if "device_map" not in kwargs:
            model = model.to(self.device)
        model.eval()
        self.processor = processing.Qwen3ASRProcessor.from_pretrained(str(self.folder), fix_mistral_regex=True)
        if getattr(self.processor, "chat_template", None):  # Qwen3ASRModel._build_text_prompt, empty context
            messages = [
                {"role": "system", "content": ""},
                {"role": "user", "content": [{"type": "audio", "audio": ""}]},
            ]
            self.prompt_text = self.processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        sync(self.device)
        elapsed = time.perf_counter() - t0
        self.model = model
        seen: set[int] = set()
        total = 0
        for t in [*model.parameters(), *model.buffers()]:
            if id(t) not in seen:
                seen.add(id(t))
                total += t.numel() * t.element_size()
        self.weight_bytes = total
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
        generation = importlib.import_module("transformers.generation")
        device = self.device
        stamps: list[float] = []

        class Stamp(generation.StoppingCriteria):  # called once per generated token, never stops anything
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
            stopping_criteria=generation.StoppingCriteriaList([Stamp()]),
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
