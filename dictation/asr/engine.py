"""AsrEngine: the engine's public face.

16 kHz mono float32 samples in, text out. Loading is lazy, idempotent and thread-safe; one lock
serialises use of the model (and its KV cache) between threads.
"""

from __future__ import annotations

import gc
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from dictation.asr.checkpoints.hub import is_gguf_path
from dictation.asr.checkpoints.locate import check_sizes, locate
from dictation.asr.checkpoints.safetensors import load_model
from dictation.asr.config import SAMPLE_RATE, AsrConfig
from dictation.asr.decode import longform
from dictation.asr.decode.greedy import sync_device
from dictation.asr.decode.longform import join_texts, merge_languages, split_long_audio
from dictation.asr.decode.pipeline import PassResult, Pipeline, Progress, Transcript
from dictation.asr.device import resolve_device, resolve_dtype
from dictation.asr.errors import AdapterError, AsrError, AudioError, RequestError
from dictation.asr.heap import Arena, release_freed_memory
from dictation.asr.limits import check_context, check_max_new_tokens
from dictation.asr.nn.compact import expand
from dictation.asr.nn.features import MIN_SAMPLES, LogMel
from dictation.asr.nn.int8_table import Int8Table, int8_head_usable, use_int8_head
from dictation.asr.nn.model import AsrModel
from dictation.asr.nn.options import DEFAULT_OPTIONS, ModelOptions
from dictation.asr.nn.quant_format import DEFAULT_GROUP_SIZE, QUANTIZED, VARIANTS
from dictation.asr.nn.quant_swap import quantizable_linears
from dictation.asr.nn.quantized import QUANT_MODULES, cpu_computes_in_bf16
from dictation.asr.text.prompt import PromptBuilder, normalize_language
from dictation.asr.tune.quantize import format_bytes, quantize_model, replace_linear, weight_bytes

if TYPE_CHECKING:
    from dictation.asr.decode.streaming import StreamingTranscription
    from dictation.asr.tune.adapters import AdapterState

FLOAT_VARIANTS = ("bf16", "fp16", "fp32")

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineOptions:
    model: str | Path
    device: str = "auto"
    dtype: str = "auto"
    variant: str | None = None
    adapters: Sequence[str] = ()  # LoRA adapter folders, "DIR" or "DIR:weight", applied in order
    group_size: int = DEFAULT_GROUP_SIZE  # int4 quantization group (along the input features)
    max_new_tokens: int | None = None  # None: scale with the audio length
    # An adapter that cannot be used (missing, for another model, unreadable) is left out of the load
    # and listed in AsrEngine.skipped_adapters, instead of failing the load (the app; the CLI fails).
    skip_bad_adapters: bool = False
    # The code paths the model runs (buckets, graphs, fused projections, kernels: nn/options.py); two
    # engines in one process may differ.
    model_options: ModelOptions = DEFAULT_OPTIONS
    # Which tensors held exactly as stored are the file's own (mapped) pages instead of a copy
    # (docs/engine.md, "CPU memory"): "encoder" (read once per clip; the default: a decode step
    # streamed mapped pages 9 % slower than copied ones on a VM), "all" (a one-shot process, where the
    # load weighs more than the decode: `dictation transcribe`), "none".
    map_weights: str = "encoder"


# EngineOptions.map_weights -> the names of the model's tensors that may be mapped (a prefix each).
MAPPED_PREFIXES = {"encoder": ("audio_tower.",), "all": ("",), "none": ()}

# The pass AsrEngine.warm_up runs after loading: this much quiet noise and this many generated
# tokens, with a KV cache of this many positions (the prompt and token budget of ~40 s of audio).
WARM_UP_SECONDS = 1.0
WARM_UP_TOKENS = 2  # the prefill gives the first, one decode step (captured on CUDA) the second
WARM_UP_CACHE = 1024


class AsrEngine:
    def __init__(self, options: EngineOptions) -> None:
        if options.map_weights not in MAPPED_PREFIXES:
            raise AsrError(f"unknown map_weights {options.map_weights!r}; choose one of {', '.join(MAPPED_PREFIXES)}")
        _check_request("", options.max_new_tokens)
        self.options = options
        self._lock = threading.RLock()
        self._model: AsrModel | None = None
        self._prompt: PromptBuilder | None = None
        self._mel: LogMel | None = None
        self._label = ""
        self._variant = ""
        self._adapters: AdapterState | None = None
        # (spec, reason) of adapters the last load left out (EngineOptions.skip_bad_adapters)
        self.skipped_adapters: tuple[tuple[str, str], ...] = ()
        self.folder: Path | None = None
        self.load_seconds = 0.0
        # The pass pipeline of the loaded state of the weights: a new one after every change (adapters,
        # reloads), so a stream holding an older one knows its work is stale (decode/streaming.py).
        self._pipeline: Pipeline | None = None

    # --- lifecycle ---------------------------------------------------------------------------

    @property
    def is_loaded(self) -> bool:
        return self._model is not None

    def prepare(self) -> None:
        """Load the model once; later calls return at once. Safe to call from any thread, and inside
        ``torch.inference_mode()``: the model is built as ordinary tensors whatever mode the caller is
        in (:func:`setting_up`)."""
        with self._lock:
            if self._model is not None:
                return
            with setting_up():
                self._load()

    def _load(self) -> None:
        t0 = time.perf_counter()
        read, skipped = self._read_adapters()  # before the base: a bad adapter fails fast
        # Without adapters a float folder is quantized while it is read (no float copy of the decoder);
        # adapters are merged into float weights first, so they take the float model (_quantize).
        model, prompt, folder, variant = self._load_base(quantize_while_reading=not read)
        if model.options != self.options.model_options:
            model.options = self.options.model_options  # this engine's code paths (nn/options.py)
        state, kept = self._apply_adapters(model, variant, read, skipped)
        if skipped:
            order = list(self.options.adapters)
            skipped.sort(key=lambda item: order.index(item[0]))  # as listed, whichever step refused it
            self.options = replace(self.options, adapters=tuple(kept))
        self.skipped_adapters = tuple(skipped)
        model.sync_weights()  # fused q/k/v and gate/up planned now, not at the first dictation
        self._model, self._prompt, self._mel = model, prompt, LogMel(model.cfg.audio.num_mel_bins, model.device)
        self._renew_pipeline()
        self._adapters = state
        self.folder = folder
        self._variant = variant
        self._label = self._make_label()
        release_freed_memory()
        self.load_seconds = time.perf_counter() - t0
        log.info(
            "loaded %s from %s in %.2f s (weights %s)",
            self._label,
            folder,
            self.load_seconds,
            format_bytes(weight_bytes(model)),
        )

    def _read_adapters(self) -> tuple[list[tuple[str, object, float]], list[tuple[str, str]]]:
        """(spec, AdapterInfo, weight) of each adapter in the options, and (spec, message) of those that
        cannot be read: with ``skip_bad_adapters``; otherwise the first problem raises AdapterError."""
        from dictation.asr.tune.adapters import read_specs

        read, skipped = [], []
        for spec in self.options.adapters:
            try:
                ((info, weight),) = read_specs([spec])
            except AdapterError as exc:
                if not self.options.skip_bad_adapters:
                    raise
                log.warning("LoRA adapter %s left out: %s", spec, exc)
                skipped.append((spec, str(exc)))
                continue
            read.append((spec, info, weight))
        return read, skipped

    def _apply_adapters(self, model: AsrModel, variant: str, read, skipped: list) -> tuple[AdapterState, list[str]]:
        """Check the read adapters against ``model``, load their tensors, quantize the model to ``variant``
        (adapters merged in fp32 first) and apply them. With ``skip_bad_adapters`` one that does not fit
        or cannot be applied is added to ``skipped`` and left out; returns the state and the kept specs."""
        from dictation.asr.tune.adapters import load_adapter

        loaded = []
        for spec, info, weight in read:
            try:
                loaded.append((spec, load_adapter(info, weight, model)))
            except AdapterError as exc:
                if not self.options.skip_bad_adapters:
                    raise
                log.warning("LoRA adapter %s left out: %s", spec, exc)
                skipped.append((spec, str(exc)))
        state = self._quantize(model, variant, [adapter for _, adapter in loaded])
        try:
            state.apply([adapter for _, adapter in loaded])
        except AdapterError:
            if not self.options.skip_bad_adapters:
                raise
            kept = []  # which one cannot be applied: add them one by one
            for spec, adapter in loaded:
                try:
                    state.apply([a for _, a in kept] + [adapter])
                    kept.append((spec, adapter))
                except AdapterError as exc:
                    log.warning("LoRA adapter %s left out: %s", spec, exc)
                    skipped.append((spec, str(exc)))
            state.apply([a for _, a in kept])
            loaded = kept
        return state, [spec for spec, _ in loaded]

    def _load_base(self, quantize_while_reading: bool = False) -> tuple[AsrModel, PromptBuilder, Path, str]:
        """(model with floating or quantized weights, prompt builder, folder, variant name);
        ``quantize_while_reading``: a float folder loaded as int8/int4 is quantized as it is read."""
        from dictation.asr.checkpoints.hub import resolve_model

        requested = self.options.variant or None
        if requested not in (None, *VARIANTS):
            raise AsrError(f"unknown variant {requested!r}; choose one of {', '.join(VARIANTS)}")
        device = resolve_device(self.options.device)
        dtype_opt = self.options.dtype
        if requested in FLOAT_VARIANTS and dtype_opt == "auto":
            dtype_opt = requested
        path = Path(os.fspath(self.options.model)).expanduser()
        if path.exists() and not (path / "config.json").is_file() and is_gguf_path(path):
            from dictation.asr.checkpoints.gguf.build import read_gguf

            dtype = _compute_dtype(dtype_opt, device, self.options.model_options, quantized=requested in QUANTIZED)
            gguf = read_gguf(path, device, dtype)  # dequantized on the device, then run as the variant
            variant = requested if requested in QUANTIZED else _DTYPE_NAMES[dtype]
            return gguf.build_model(), gguf.prompt_builder(), path.absolute(), variant
        folder = resolve_model(self.options.model)
        cfg = AsrConfig.from_file(folder / "config.json")
        files = locate(folder)
        check_sizes(files, files.headers(), cfg)  # config.json against the weights, before anything is built
        # EOS = {<|im_end|>, <|endoftext|>} from the tokenizer; like the official code we
        # ignore generation_config.json (docs/model.md §3).
        prompt = PromptBuilder.from_folder(
            folder, audio_token_id=cfg.special.audio_token_id, vocab_size=cfg.text.vocab_size
        )
        quantized = requested in QUANTIZED or bool(cfg.quantization)
        dtype = _compute_dtype(dtype_opt, device, self.options.model_options, quantized=quantized)
        at_load = requested if quantize_while_reading and requested in QUANTIZED and not cfg.quantization else None
        # Without adapters, float weights that float16 holds exactly are held so on the CPU (nn/compact.py),
        # and a quantized model computing in bf16 there reads its head from an int8 copy (nn/int8_table.py):
        # a decode step then reads only a few rows of the table itself, so it may stay mapped.
        int8_head = (
            quantize_while_reading
            and quantized
            and device.type == "cpu"
            and dtype == torch.bfloat16
            and self.options.model_options.int8_head
            and int8_head_usable()  # else the table stays a copy: the float head streams it every step
        )
        mapped = MAPPED_PREFIXES[self.options.map_weights]
        if int8_head and mapped:
            mapped = (*mapped, "decoder.embed_tokens.", "lm_head.")
        model = load_model(
            folder,
            cfg,
            device,
            dtype,
            quantize=at_load,
            group_size=self.options.group_size,
            compact=quantize_while_reading,
            mapped=mapped,
        )
        if int8_head:
            use_int8_head(model)
        variant = _DTYPE_NAMES[dtype]
        if cfg.quantization:
            variant = cfg.quantization["variant"]  # the folder's metadata decides, never its name
            if requested not in (None, variant, *FLOAT_VARIANTS):
                log.warning("%s holds a pre-quantized %s model; using that, not %s", folder, variant, requested)
        elif requested in QUANTIZED:
            variant = requested
        return model, prompt, folder, variant

    def _quantize(self, model: AsrModel, variant: str, adapters) -> AdapterState:
        """Quantize a floating model to ``variant`` at load time (after merging ``adapters`` in fp32)
        and return the adapter state that knows how to re-merge."""
        from dictation.asr.tune.adapters import AdapterState, changed_params

        quantized_before = any(isinstance(m, QUANT_MODULES) for m in model.modules())
        if variant not in QUANTIZED or quantized_before:
            return AdapterState(model)
        linears = set(quantizable_linears(model))
        group_size = self.options.group_size
        # Keep the float weights of the layers the adapters touch: they are merged in fp32 and
        # quantized again whenever the adapters change, as here at load time.
        originals = {
            name: _param_of(model, name).detach().to("cpu", copy=True)
            for name in changed_params(adapters)
            if name.removesuffix(".weight") in linears
        }
        quantize_model(model, variant, group_size=group_size)

        def requantize(module: str, weight: torch.Tensor) -> None:
            replace_linear(model, module, variant, weight, group_size=group_size)

        return AdapterState(model, originals, requantize)

    def set_adapters(self, adapters: Sequence[str]) -> None:
        """Apply ``adapters`` (``DIR`` or ``DIR:weight``) instead of the current ones, without reading
        the base model again. A bad adapter raises AdapterError and leaves the model as it was."""
        from dictation.asr.tune.adapters import load_adapters

        adapters = tuple(adapters)
        with self._lock, setting_up():
            if self._model is None:
                self.options = replace(self.options, adapters=adapters)
                return
            if adapters and expand(self._model):  # adapters merge into float32 weights
                self._model.sync_weights()
            loaded = load_adapters(adapters, self._model)
            previous = self._adapters.applied
            try:
                self._adapters.apply(loaded)
            except Exception:
                self._adapters.apply(previous)
                raise
            finally:
                self._renew_pipeline()
            self.options = replace(self.options, adapters=adapters)
            self._label = self._make_label()
            log.info("adapters now: %s", ", ".join(self._adapters.labels) or "none")

    @property
    def variant(self) -> str:
        """bf16, fp16, fp32, int8 or int4 once loaded; empty before."""
        return self._variant

    @property
    def weight_bytes(self) -> int:
        """Memory held by the model's weights (parameters and persistent buffers)."""
        return weight_bytes(self.model)

    def _make_label(self) -> str:
        assert self._model is not None and self.folder is not None
        label = f"{_model_name(self._model.cfg, self.folder)} · {self._variant} · {self._model.device.type}"
        if self._adapters.labels:
            label += " · " + " + ".join(self._adapters.labels)
        return label

    def warm_up(self) -> float:
        """One short pass over quiet noise, its output discarded, so that the first dictation does
        not pay for one-time set-up: kernel selection and loading, the int4 kernels' packed layouts,
        the CUDA graph captures (the decode step, and the encoder, the prefill and the rows after a
        cached prompt for every bucket: ``AsrModel.prepare_graphs``), the int8 head's oneDNN layout
        (``Int8Table.prepack``), the CPU's int8 weights moved into huge pages (``heap.Arena.collapse``),
        and a KV cache of
        ``WARM_UP_CACHE`` positions (utterances up to about 40 s fit without growing it, so the
        captured decode step is kept). Returns its seconds."""
        with self._lock:
            self.prepare()
            t0 = time.perf_counter()
            model = self._model
            if model.cache is not None and model.cache.max_len < WARM_UP_CACHE:
                # The pass below overwrites the cache: growing it would first copy what it holds (on
                # the CPU, pages of positions nothing reads again, at once beside the old cache's).
                model.release_cache()
            self._model.ensure_capacity(WARM_UP_CACHE)
            rng = np.random.default_rng(0)
            noise = (1e-3 * rng.standard_normal(int(WARM_UP_SECONDS * SAMPLE_RATE))).astype(np.float32)
            self._pipeline.run(noise, None, "", WARM_UP_TOKENS, quiet=True)  # greedy syncs at its end
            self._model.prepare_graphs()  # CUDA: the encoder, prefill and row graphs of every bucket
            for module in self._model.modules():
                if isinstance(module, Int8Table):
                    module.prepack()  # the int8 head on oneDNN (nn/int8_table.py): 0.3 s for the 0.6B
                arena = getattr(module, "arena", None)
                if isinstance(arena, Arena):
                    arena.collapse()  # the int8 weights into huge pages (heap.Arena): about 1 s for the 0.6B
            sync_device(self._model.device)
            self._release_on_cpu()
            return time.perf_counter() - t0

    def _release_on_cpu(self) -> None:
        """After a pass on the CPU, hand the heap's free pages back (`release_freed_memory`, a few ms):
        what a pass frees stays in glibc's heap otherwise, about 60 MB for the 0.6B between dictations."""
        if self._model is not None and self._model.device.type == "cpu":
            release_freed_memory()

    def unload(self) -> None:
        """Drop the model and its caches; GPU memory is returned to the driver."""
        with self._lock:
            device = self._model.device if self._model is not None else None
            self._model = self._prompt = self._mel = self._adapters = None
            self._pipeline = None
            if gc.isenabled():  # off in the app while its GUI thread collects (dictation/app/gui_gc.py)
                gc.collect()
            if device is not None and device.type == "cuda":
                torch.cuda.empty_cache()

    @property
    def model_label(self) -> str:
        """e.g. ``Qwen3-ASR-1.7B · bf16 · cuda``; empty until loaded."""
        return self._label

    @property
    def model(self) -> AsrModel:
        self.prepare()
        assert self._model is not None
        return self._model

    @property
    def prompt(self) -> PromptBuilder:
        self.prepare()
        assert self._prompt is not None
        return self._prompt

    def _renew_pipeline(self) -> None:
        self._pipeline = Pipeline(
            self._model, self._prompt, self._mel, lock=self._lock, max_new_tokens=self.options.max_new_tokens
        )

    @property
    def pipeline(self) -> Pipeline:
        """The pass pipeline of the model as it is now (loaded first if needed): the stages of one
        pass, what ``transcribe``, streaming and the bench all run (decode/pipeline.py)."""
        with self._lock:
            self.prepare()
            assert self._pipeline is not None
            return self._pipeline

    @property
    def current_pipeline(self) -> Pipeline | None:
        """The same without loading: None while no model is loaded. A stream compares it with the
        pipeline it started on to know whether the weights changed under it."""
        return self._pipeline

    # --- transcription -----------------------------------------------------------------------

    def stream(
        self, *, language: str | None = None, context: str = "", max_new_tokens: int | None = None
    ) -> StreamingTranscription:
        """Start transcribing audio that is still being recorded: ``feed`` it, then ``finish``
        (see :mod:`dictation.asr.decode.streaming`). The result equals :meth:`transcribe` of the whole clip."""
        from dictation.asr.decode.streaming import StreamingTranscription

        _check_request(context, max_new_tokens)
        return StreamingTranscription(self, language=language, context=context, max_new_tokens=max_new_tokens)

    def transcribe(
        self,
        samples: np.ndarray,
        *,
        language: str | None = None,
        context: str = "",
        max_new_tokens: int | None = None,
        draft_ids: Sequence[int] | None = None,
    ) -> Transcript:
        """Transcribe 16 kHz mono audio. ``language``: None/"auto", a name or an ISO code.

        ``draft_ids``: a guess at ``token_ids``, e.g. those of a partial transcript of the clip's
        start (same language and context). Decoding verifies it in batches instead of token by token;
        the result is the same as without it (see :func:`dictation.asr.decode.greedy.greedy`).
        """
        return self.transcribe_with_progress(
            samples, language=language, context=context, max_new_tokens=max_new_tokens, draft_ids=draft_ids
        )

    def transcribe_with_progress(
        self,
        samples: np.ndarray,
        *,
        language: str | None = None,
        context: str = "",
        max_new_tokens: int | None = None,
        on_progress: Callable[[Progress], None] | None = None,
        draft_ids: Sequence[int] | None = None,
    ) -> Transcript:
        """Like :meth:`transcribe`; clips over 20 minutes are split at quiet points and
        ``on_progress`` is called before the first piece and after each one (``draft_ids`` then
        serve the first piece only). A context or token budget beyond ``asr/limits.py`` raises
        RequestError; a budget above what a piece's audio justifies is lowered to that."""
        _check_request(context, max_new_tokens)
        forced = normalize_language(language)
        audio = prepare_samples(samples)
        total = len(audio) / SAMPLE_RATE
        pieces = split_long_audio(audio, SAMPLE_RATE, longform.MAX_PASS_SECONDS)
        self.prepare()
        t0 = time.perf_counter()
        passes: list[PassResult] = []
        done = 0.0
        if on_progress:
            on_progress(Progress(0.0, total, 0, len(pieces), ""))
        for i, (piece, _offset) in enumerate(pieces):
            draft = draft_ids if i == 0 else None
            passes.append(self.pipeline.run(piece, forced, context, max_new_tokens, draft_ids=draft))
            done = min(total, done + len(piece) / SAMPLE_RATE)
            if on_progress:
                on_progress(Progress(done, total, i + 1, len(pieces), join_texts([p.text for p in passes])))
        keys = dict.fromkeys(key for p in passes for key in p.timings)
        timings = {key: sum(p.timings.get(key, 0.0) for p in passes) for key in keys}
        timings["total_s"] = time.perf_counter() - t0
        self._release_on_cpu()
        return Transcript(
            text=join_texts([p.text for p in passes]),
            language=forced or merge_languages([p.language for p in passes]),
            token_ids=[t for p in passes for t in p.ids],
            audio_seconds=total,
            timings=timings,
            raw="".join(p.raw for p in passes),
            chunks=len(passes),
            truncated=any(p.truncated for p in passes),
        )


def _check_request(context: str, max_new_tokens: int | None) -> None:
    """RequestError unless the context and token budget are within the engine's limits (limits.py)."""
    problem = check_context(context or "") or check_max_new_tokens(max_new_tokens)
    if problem:
        raise RequestError(problem)


@contextmanager
def setting_up() -> Iterator[None]:
    """Where the engine builds or changes the model (loading, quantizing, adapters, fusing): ordinary
    tensors without autograd, even inside a caller's ``torch.inference_mode()``. Tensors made in
    inference mode are *inference tensors*, which outside it take no in-place change, no ``.data``
    re-pointing and no view that needs a version counter; the model's weights get all of these when
    adapters change or projections are fused again (``decoder.Fusion``, ``quant_rows.fuse_rows``), so
    weights loaded inside a caller's inference mode broke every later change ("Inference tensors
    do not track version counter"). Passes still run in inference mode; they only read the weights."""
    with torch.inference_mode(False), torch.no_grad():
        yield


def prepare_samples(samples: np.ndarray) -> np.ndarray:
    """Validate and normalise 16 kHz mono samples as the official toolkit does (docs/model.md §4)."""
    audio = np.asarray(samples)
    if audio.ndim != 1:
        raise AudioError(f"expected 1-D mono samples, got an array of shape {audio.shape}")
    if audio.size == 0:
        raise AudioError("no audio samples")
    if not np.issubdtype(audio.dtype, np.floating):
        raise AudioError(f"expected float samples in [-1, 1], got {audio.dtype}")
    audio = audio.astype(np.float32, copy=False)
    if not np.isfinite(audio).all():
        raise AudioError("audio contains NaN or infinite samples")
    if audio.size < MIN_SAMPLES:
        raise AudioError(f"audio too short: {audio.size} samples (< {MIN_SAMPLES / SAMPLE_RATE * 1000:.0f} ms)")
    peak = float(np.abs(audio).max())
    if peak > 1.0:
        audio = audio / peak
    return np.clip(audio, -1.0, 1.0)


def is_silent(samples: np.ndarray, threshold_db: float = -70.0) -> bool:
    """True for digital silence or near-silence (RMS below ``threshold_db`` dBFS)."""
    audio = np.asarray(samples, dtype=np.float64)
    if audio.size == 0:
        return True
    rms = float(np.sqrt(np.mean(audio * audio)))
    return rms == 0.0 or 20.0 * np.log10(rms) < threshold_db


_DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def _compute_dtype(dtype_opt: str, device: torch.device, options: ModelOptions, *, quantized: bool) -> torch.dtype:
    """The dtype of activations and floating weights. With ``auto`` a quantized model on a CPU that has
    bf16 instructions computes in bf16: its integer layers do anyway (nn.quantized.cpu_computes_in_bf16), and
    the floating output head would otherwise cost more per token than all the quantized layers."""
    if dtype_opt == "auto" and quantized and device.type == "cpu" and cpu_computes_in_bf16(options):
        return torch.bfloat16
    return resolve_dtype(dtype_opt, device)


def _param_of(model: AsrModel, name: str) -> torch.Tensor:
    module, _, attr = name.rpartition(".")
    return getattr(model.get_submodule(module), attr)


def _model_name(cfg: AsrConfig, folder: Path) -> str:
    sizes = {1024: "Qwen3-ASR-0.6B", 2048: "Qwen3-ASR-1.7B"}
    if cfg.text.num_hidden_layers == 28 and cfg.text.hidden_size in sizes:
        return sizes[cfg.text.hidden_size]
    return folder.stem if folder.is_file() else folder.name
