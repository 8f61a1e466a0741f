"""Our engine as a benchmark contender, one variant at a time: every stage timed through the engine's
pass pipeline (dictation.asr.decode.pipeline), the release-to-text path through streaming, the
teacher-forced agreement figures, the decode step's kernel count."""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dictation.asr import SAMPLE_RATE
from dictation.bench.measure import AUDIO_SEED, DTYPE_NAMES, FLOAT_VARIANTS, Run, sync, synth_audio


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
                from dictation.asr.nn.quantized import cpu_computes_in_bf16, cpu_decodes_in_bf16

                if cpu_computes_in_bf16():
                    note += "; the quantized layers compute in bf16 (this CPU has bf16 instructions)"
                elif cpu_decodes_in_bf16(self.variant):
                    note += "; the decode step's quantized layers run torch's bf16 kernel (faster here)"
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
        prompt = self.engine.pipeline.prompt_embeds(audio)
        return prompt.embeds, prompt.ids

    def prompt_ids(self, audio: np.ndarray) -> list[int]:
        from dictation.asr.nn.features import n_audio_tokens, n_frames

        frames = n_frames(len(audio))
        return self.engine.prompt.prompt_ids(
            n_audio_tokens(frames, self.engine.model.cfg.audio.chunk_frames), context="", language=None
        )

    def run(self, audio: np.ndarray, n_tokens: int) -> Run:
        """One pass with exactly ``n_tokens`` generated (no end of text), each stage timed: the engine's
        pass pipeline (mel, encoder, prompt embeddings) and greedy decoding, as a transcription runs."""
        from dictation.asr.decode.greedy import greedy

        pipe, device = self.engine.pipeline, self.device
        with pipe.lock, torch.inference_mode():
            pipe.cache_owner = None  # this pass overwrites the cache
            sync(device)
            t0 = time.perf_counter()
            prompt = pipe.prompt_embeds(audio)
            sync(device)
            embedded = time.perf_counter() - t0
            gen = greedy(pipe.model, prompt.embeds, max_new_tokens=n_tokens, eos_ids=())
        if len(gen.token_ids) != n_tokens:
            raise RuntimeError(f"ours generated {len(gen.token_ids)} tokens, expected {n_tokens}")
        steps = max(n_tokens - 1, 1)
        embed_s = embedded - prompt.mel_s - prompt.encoder_s  # the prompt's ids and embeddings
        return Run(
            mel_ms=prompt.mel_s * 1e3,
            encoder_ms=prompt.encoder_s * 1e3,
            prefill_ms=(embed_s + gen.prefill_s) * 1e3,
            decode_ms_per_token=gen.decode_s * 1e3 / steps,
            tokens=list(gen.token_ids),
            extra={"prompt_embed_ms": embed_s * 1e3},
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
            "layers": count.layers,
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
        from dictation.asr.nn.quant_rows import kernel_cache_bytes

        return kernel_cache_bytes(self.engine.model)

    def unload(self) -> None:
        if self.engine is not None:
            self.engine.unload()
        self.engine = None


def decode_weight_bytes(model: Any) -> int:
    """Weight bytes one decode step of our model reads (quantized layers as stored): the decoder without
    its embedding table (one row is gathered), plus the output head (an int8 head's int8 copy and
    scales: nn/int8_table.py; the few table rows it re-scores are left out)."""
    from dictation.asr.nn.int8_table import Int8Table
    from dictation.asr.tune.quantize import weight_bytes

    embed = model.decoder.embed_tokens
    table = embed.weight.numel() * embed.weight.element_size()
    decoder = weight_bytes(model.decoder) - table
    if isinstance(embed, Int8Table):
        decoder -= embed.nbytes  # counted by weight_bytes as the module's own
    return decoder + head_bytes(model)


def head_bytes(model: Any) -> int:
    """Bytes of the output head a decode step reads: an int8 head's int8 copy and scales
    (nn/int8_table.py), else the float table."""
    from dictation.asr.nn.int8_table import Int8Table

    head = model.decoder.embed_tokens if model.lm_head is None else model.lm_head
    if isinstance(head, Int8Table):
        return head.nbytes + head.scale.numel() * head.scale.element_size()
    return model.output_weight.numel() * model.output_weight.element_size()
