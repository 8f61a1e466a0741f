"""Transcribing while the user speaks: encode and prefill each finished 8-s window early.

The encoder never attends across 8-s windows (800 mel frames → 104 audio tokens, docs/model.md §5.4) and its
conv stack works on 1-s chunks inside them (§4.1), so a window's audio embeddings depend only on its
own features. The decoder is causal, so the prompt up to the end of a window can sit in the KV cache
before later audio exists. :class:`StreamingTranscription` does that work in :meth:`feed`; at
:meth:`~StreamingTranscription.finish` only the last (partial) window, the prompt tail and decoding
remain. The result is the whole-clip :meth:`AsrEngine.transcribe` result:

* **Frames.** Mel frame ``t`` is the 400-sample window centred on sample ``160 t``; the clip is
  reflected at its ends. A frame is final once ``160 t + 200`` samples have arrived (it then reads
  no reflected end sample), so window ``w`` (frames ``800 w .. 800 w + 799``) is taken once
  ``128000 (w + 1) + 40`` samples are in. Frames are computed from just the samples they need
  (:meth:`LogMel.log_spec_frames`), bitwise equal to the whole clip's columns; the tail frames,
  which reflect the clip's end, are computed at finish. ``T = N // 160`` throughout.
* **Floor.** Features are ``max(log_spec, clip_max - 8)`` with the max of the WHOLE clip. A window
  is encoded with the running max of the frames so far; its pre-floor values are kept. At finish,
  with the final max, a window's features changed iff the floor rose and the window has a value
  below the new floor (its stored minimum tells). From the first such window on, windows are
  re-encoded with the final floor and the decoder cache is refilled (the decoder is causal, so all
  later positions too).
* **Peak.** Like ``transcribe``, a clip whose peak exceeds 1 is scaled as a whole; then nothing
  done early is valid, and finish transcribes the whole clip.
* **Cache.** The KV cache is the engine's; any other use of it (a normal transcribe) marks it taken
  and the stream refills its prompt from the kept audio embeddings the next time it runs.

Fallbacks (finish runs the normal ``transcribe`` on the whole clip): no window completed during
the recording (clips up to ~8 s), a clip over the single-pass limit (20 minutes: long audio is
split), a peak over 1, or the model changed (unloaded, adapters swapped) while recording.

Previews and drafts: :meth:`~StreamingTranscription.preview` transcribes all the audio fed so far
from the cached prompt (only the partial last window, the prompt tail and the decoding cost
anything): the app's live preview while the user speaks. Its ids are the draft for the next preview
and for ``finish(draft_ids=...)``, which verifies them in batched passes instead of decoding token
by token, with the same result (:func:`dictation.asr.decode.greedy.greedy`).
:meth:`~StreamingTranscription.partial` is the same over the completed windows only.

Trailing silence: ``finish(end=n)`` transcribes the first ``n`` samples only (the app cuts the
silence after the last word once the recording stopped), still equal to ``transcribe(audio[:n])``.

The decoder prompt is thus prefilled in other pieces than by ``transcribe`` (which uses 1024-token
pieces): the same maths, so the same greedy tokens, with logits equal up to float rounding. On CUDA
those pieces (an extended window, the tail at finish or preview) run as bucketed rows, one captured
CUDA graph per bucket (``AsrModel.forward_rows``), so that the finish is a few launches too.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from dictation.asr.config import SAMPLE_RATE
from dictation.asr.decode import longform
from dictation.asr.decode.greedy import greedy, sync_device
from dictation.asr.decode.pipeline import PassResult, Pipeline, Transcript
from dictation.asr.errors import AudioError
from dictation.asr.nn.features import HOP_LENGTH, N_FFT, n_audio_tokens, n_frames
from dictation.asr.text.parse import parse_output
from dictation.asr.text.prompt import normalize_language

log = logging.getLogger(__name__)

# Cache positions allocated beyond the need when the cache has to grow during a recording
# (bounded, so a short dictation does not hold much more than a whole-clip transcribe would).
MAX_HEADROOM = 2048


def _pass_limit_samples() -> int:
    """Longest clip transcribed in one pass; read at call time so it follows the engine's limit."""
    return int(longform.MAX_PASS_SECONDS * SAMPLE_RATE)


class PipelineSource(Protocol):
    """What a stream needs of the engine (``AsrEngine``): its public pass API, nothing private."""

    def prepare(self) -> None: ...

    @property
    def current_pipeline(self) -> Pipeline | None: ...

    def transcribe(
        self,
        samples: np.ndarray,
        *,
        language: str | None = None,
        context: str = "",
        max_new_tokens: int | None = None,
        draft_ids: Sequence[int] | None = None,
    ) -> Transcript: ...


def _as_chunk(samples: np.ndarray) -> np.ndarray:
    """Validate one fed chunk as ``prepare_samples`` validates a clip; float32, 1-D."""
    audio = np.asarray(samples)
    if audio.ndim == 2 and audio.shape[1] == 1:
        audio = audio[:, 0]
    if audio.ndim != 1:
        raise AudioError(f"expected 1-D mono samples, got an array of shape {audio.shape}")
    if audio.size and not np.issubdtype(audio.dtype, np.floating):
        raise AudioError(f"expected float samples in [-1, 1], got {audio.dtype}")
    audio = audio.astype(np.float32, copy=False)
    if not np.isfinite(audio).all():
        raise AudioError("audio contains NaN or infinite samples")
    return audio


@dataclass
class Preview:
    """A transcript of the audio fed so far (:meth:`StreamingTranscription.preview`)."""

    token_ids: list[int]
    text: str
    seconds: float  # audio covered
    elapsed_s: float  # what computing it took
    complete: bool  # False: ``should_stop`` ended it early (the text is a prefix)


class StreamingTranscription:
    """One recording: :meth:`feed` audio as it arrives, then :meth:`finish` (or :meth:`cancel`).

    ``feed`` does the model work for every 8-s window that became complete, on the caller's thread,
    holding the engine lock meanwhile. Not reusable: one stream per recording.
    """

    def __init__(
        self,
        engine: PipelineSource,
        *,
        language: str | None = None,
        context: str = "",
        max_new_tokens: int | None = None,
    ) -> None:
        self._forced = normalize_language(language)  # an unknown language fails before any work
        self._engine = engine
        self._context = context or ""
        self._max_new_tokens = max_new_tokens
        self._lock = threading.Lock()  # the stream's state; taken before the engine lock
        self._cancelled = False
        self._state = "open"  # open | finished | cancelled
        self._buf = np.empty(0, np.float32)
        self._n = 0
        self._peak = 0.0
        self._streaming = True  # False: finish transcribes the whole clip
        self._feed_s = 0.0
        # Per window encoded during the recording: pre-floor log-mel, the floor used, its minimum.
        self._raw: list[torch.Tensor] = []
        self._floors: list[torch.Tensor] = []
        self._mins: list[torch.Tensor] = []
        self._running_max: torch.Tensor | None = None
        # Decoder input in prompt order, ``[1, n, hidden]`` each: the prompt head, then one per window;
        # the first ``_filled`` of them are in the engine's KV cache while it is ours.
        self._segments: list[torch.Tensor] = []
        self._filled = 0

        engine.prepare()
        pipe = engine.current_pipeline
        assert pipe is not None
        # The pipeline of the weights as they are now; the engine makes a new one when they change.
        self._pipe = pipe
        self._model, self._mel, self._prompt = pipe.model, pipe.mel, pipe.prompt
        ids = self._prompt.prompt_ids(0, context=self._context, language=self._forced)
        at = ids.index(self._prompt.special.audio_start) + 1
        self._head_ids, self._tail_ids = ids[:at], ids[at:]  # around the audio pads
        self._window_frames = self._model.audio_tower.window_frames
        self._window_tokens = n_audio_tokens(self._window_frames, self._model.cfg.audio.chunk_frames)

    # --- public ----------------------------------------------------------------------------------

    @property
    def seconds(self) -> float:
        """Audio fed so far."""
        return self._n / SAMPLE_RATE

    @property
    def windows_done(self) -> int:
        """8-s windows encoded and prefilled so far."""
        return len(self._raw)

    def feed(self, samples: np.ndarray) -> None:
        """Append 16 kHz mono float samples (any chunk size) and process every window now complete.

        Raises AudioError for a bad chunk (not appended). Ignored after :meth:`cancel`.
        """
        chunk = _as_chunk(samples)
        if self._cancelled:
            return
        with self._lock:
            if self._state == "cancelled":
                return
            if self._state != "open":
                raise RuntimeError("feed() after finish()")
            self._append(chunk)
            if chunk.size:
                self._peak = max(self._peak, float(np.abs(chunk).max()))
            if self._streaming and self._peak > 1.0:
                self._stop_streaming("the clip will be peak-normalised")
            if self._streaming and self._n > _pass_limit_samples():
                self._stop_streaming("the clip is longer than one pass")
            while self._streaming and not self._cancelled and self._n >= self._window_ready_at(len(self._raw)):
                self._encode_window()
            if self._cancelled:
                self._close("cancelled")

    def finish(self, draft_ids: Sequence[int] | None = None, *, end: int | None = None) -> Transcript:
        """The transcript of everything fed: exactly what ``engine.transcribe`` gives for the whole clip.

        ``draft_ids``: a guess at the output (e.g. a :meth:`preview`'s ``token_ids``), verified in
        batches to decode faster; it never changes the result (``AsrEngine.transcribe``).

        ``end``: transcribe only the first ``end`` samples fed (trailing silence cut after the
        recording stopped); the result is ``engine.transcribe(audio[:end])``. Windows that reach past
        ``end`` are dropped; those before it stay valid, as they were encoded before any later audio
        existed (their floor came from earlier frames only)."""
        t0 = time.perf_counter()
        with self._lock:
            if self._cancelled or self._state == "cancelled":
                raise RuntimeError("finish() after cancel()")
            if self._state != "open":
                raise RuntimeError("finish() called twice")
            if end is not None and not 0 <= end <= self._n:
                raise ValueError(f"finish(end={end}): only {self._n} samples were fed")
            self._state = "finished"
            audio = self._buf[: self._n if end is None else end]
            if end is not None:
                self._truncate(end)
            try:
                result = self._finish_streamed(audio, draft_ids=draft_ids) if self._streaming and self._raw else None
            finally:
                streamed = len(self._raw)
                self._close("finished")
        if result is None:
            transcript = self._engine.transcribe(
                audio,
                language=self._forced,
                context=self._context,
                max_new_tokens=self._max_new_tokens,
                draft_ids=draft_ids,
            )
            windows = -(-n_frames(len(audio)) // self._window_frames)
            transcript.timings.update(stream_windows=0.0, finish_windows=float(windows))
            transcript.timings["feed_s"] = self._feed_s
            return transcript
        result.timings["total_s"] = time.perf_counter() - t0
        result.timings["stream_windows"] = float(streamed)
        return Transcript(
            text=result.text,
            language=self._forced or result.language,
            token_ids=result.ids,
            audio_seconds=len(audio) / SAMPLE_RATE,
            timings=result.timings,
            raw=result.raw,
            chunks=1,
            truncated=result.truncated,
        )

    def partial(self) -> list[int] | None:
        """Greedy ids for the windows encoded so far (the audio up to ``8 * windows_done`` s), from
        the prompt already in the cache: only the prompt tail and the decoding cost anything. A draft
        for :meth:`finish`; close to, not always equal to, ``transcribe`` of that audio (its windows
        use the running floor). None when nothing is streamed (no window yet, or a fallback)."""
        preview = self._preview(None, None, windows_only=True)
        return preview.token_ids if preview is not None else None

    def preview(
        self, *, draft_ids: Sequence[int] | None = None, should_stop: Callable[[], bool] | None = None
    ) -> Preview | None:
        """A transcript of ALL the audio fed so far, for a live preview and as the next draft.

        Cheap while the user speaks: the completed windows are already in the KV cache, so only the
        partial last window, the prompt tail and the decoding are computed; with the previous
        preview's ``token_ids`` as ``draft_ids`` the decoding is mostly one verification pass. Close
        to, not always equal to, ``transcribe`` of that audio: the windows keep the floor they were
        encoded with. Nothing is kept: the stream's state and its final result are unaffected.

        ``should_stop``: polled between tokens; when it returns True the preview ends early
        (``complete`` False). None when there is nothing to preview: no audio yet, the stream fell
        back to a whole-clip transcribe, or it is closed."""
        return self._preview(draft_ids, should_stop, windows_only=False)

    def _preview(
        self, draft_ids: Sequence[int] | None, should_stop: Callable[[], bool] | None, *, windows_only: bool
    ) -> Preview | None:
        """:meth:`preview`; ``windows_only``: of the completed windows alone (:meth:`partial`)."""
        pipe = self._pipe
        t0 = time.perf_counter()

        def stop() -> bool:
            return self._cancelled or (should_stop is not None and should_stop())

        with self._lock:
            if self._state != "open" or not self._streaming:
                return None
            tail_start = len(self._raw) * self._window_frames
            n = tail_start * HOP_LENGTH if windows_only else self._n
            total = tail_start if windows_only else n_frames(n)
            if total <= tail_start and not self._raw:
                return None
            with pipe.lock, torch.inference_mode():
                if not self._model_current():
                    return None
                model, mel, prompt = self._model, self._mel, self._prompt
                audio = self._buf[:n]
                self._ensure_head()
                start = self._fill_cache()
                clip_max = self._running_max
                pieces = []
                if total > tail_start:
                    tail = mel.log_spec_frames(audio, tail_start, total)
                    clip_max = tail.max() if clip_max is None else torch.maximum(clip_max, tail.max())
                    fresh = model.audio_tower(mel.floor(tail, clip_max), clip_frames=total)
                    pieces.append(fresh.to(model.dtype).unsqueeze(0))
                tail_ids = torch.tensor(self._tail_ids, device=model.device)
                budget = pipe.budget(n, self._max_new_tokens)
                pieces.append(model.decoder.embed_tokens(tail_ids).unsqueeze(0))
                # Everything written here lies after the streamed prompt; the next window overwrites
                # those positions before anything attends to them, so the cache stays this stream's.
                gen = greedy(
                    model,
                    torch.cat(pieces, dim=1),
                    max_new_tokens=budget,
                    eos_ids=prompt.special.eos,
                    should_stop=stop,
                    start=start,
                    draft=draft_ids,
                )
                _, text = parse_output(prompt.decode(gen.token_ids), self._forced)
                complete = gen.stopped_on_eos or len(gen.token_ids) >= budget or not stop()
                return Preview(gen.token_ids, text, n / SAMPLE_RATE, time.perf_counter() - t0, complete)

    def cancel(self) -> None:
        """Drop the recording. Never waits for model work: a running ``feed`` stops after its window,
        a running ``finish`` stops decoding at the next token. The engine stays usable."""
        self._cancelled = True
        if self._lock.acquire(blocking=False):
            try:
                if self._state == "open":
                    self._close("cancelled")
            finally:
                self._lock.release()

    # --- work ------------------------------------------------------------------------------------

    def _truncate(self, end: int) -> None:
        """Forget the windows that need samples at or after ``end`` (see :meth:`finish`)."""
        keep = 0
        while keep < len(self._raw) and self._window_ready_at(keep) <= end:
            keep += 1
        if keep == len(self._raw):
            return
        del self._raw[keep:], self._floors[keep:], self._mins[keep:]
        del self._segments[1 + keep :]
        self._filled = min(self._filled, len(self._segments))
        # Each kept window was encoded before any dropped one, so its floor never saw their frames;
        # the clip max so far is the max over the kept windows alone.
        self._running_max = torch.stack([raw.max() for raw in self._raw]).max() if self._raw else None

    def _ensure_head(self) -> None:
        """The prompt up to the first audio pad, as the first decoder segment."""
        if not self._segments:
            head = torch.tensor(self._head_ids, device=self._model.device)
            self._segments.append(self._model.decoder.embed_tokens(head).unsqueeze(0))

    def _window_ready_at(self, window: int) -> int:
        """Samples needed before window ``window``'s last frame reads no reflected end sample."""
        last_frame = (window + 1) * self._window_frames - 1
        return last_frame * HOP_LENGTH + N_FFT // 2

    def _append(self, chunk: np.ndarray) -> None:
        need = self._n + chunk.size
        if need > self._buf.size:
            grown = np.empty(max(need, 2 * self._buf.size, 10 * SAMPLE_RATE), np.float32)
            grown[: self._n] = self._buf[: self._n]
            self._buf = grown
        self._buf[self._n : need] = chunk
        self._n = need

    def _model_current(self) -> bool:
        return self._engine.current_pipeline is self._pipe

    def _stop_streaming(self, why: str) -> None:
        log.debug("streaming off (%s): finish will transcribe the whole clip", why)
        self._streaming = False
        self._drop_work()

    def _drop_work(self) -> None:
        self._raw, self._floors, self._mins, self._segments = [], [], [], []
        self._running_max = None
        self._filled = 0
        if self._pipe.cache_owner is self:  # only ever cleared: at worst someone refills
            self._pipe.cache_owner = None

    def _close(self, state: str) -> None:
        self._state = state
        self._drop_work()
        self._buf, self._n = np.empty(0, np.float32), 0

    def _encode_window(self) -> None:
        """Encode the next complete window with the running floor and prefill it (and the prompt head)."""
        t0 = time.perf_counter()
        try:
            with self._pipe.lock, torch.inference_mode():
                if not self._model_current():
                    self._stop_streaming("the model changed")
                    return
                model, mel = self._model, self._mel
                w = len(self._raw)
                start, stop = w * self._window_frames, (w + 1) * self._window_frames
                raw = mel.log_spec_frames(self._buf[: self._n], start, stop)
                top = raw.max()
                self._running_max = top if self._running_max is None else torch.maximum(self._running_max, top)
                embeds = model.audio_tower(mel.floor(raw, self._running_max), clip_frames=stop)
                self._ensure_head()
                self._segments.append(embeds.to(model.dtype).unsqueeze(0))
                self._raw.append(raw)
                self._floors.append(self._running_max - 8.0)
                self._mins.append(raw.min())
                self._fill_cache()
                sync_device(model.device)
        except Exception:
            log.warning("streaming work failed; finish will transcribe the whole clip", exc_info=True)
            self._stop_streaming("an error")
        finally:
            self._feed_s += time.perf_counter() - t0

    def _cached_positions(self, upto: int) -> int:
        """Prompt positions of segments ``[:upto]`` that the cache holds now."""
        filled = min(self._filled, upto) if self._pipe.cache_owner is self else 0
        return sum(s.shape[1] for s in self._segments[:filled])

    def _fill_cache(self, upto: int | None = None) -> int:
        """Make the cache hold segments ``[:upto]`` (default all); returns the positions they take."""
        upto = len(self._segments) if upto is None else upto
        if self._pipe.cache_owner is not self:
            self._filled = 0
        self._filled = min(self._filled, upto)
        start = sum(s.shape[1] for s in self._segments[: self._filled])
        if self._filled < upto:
            embeds = torch.cat(self._segments[self._filled : upto], dim=1)
            self._model.extend(embeds, start, headroom=min(start, MAX_HEADROOM))
            start += embeds.shape[1]
            self._filled = upto
            self._pipe.cache_owner = self
        return start

    def _finish_streamed(
        self, audio: np.ndarray, keep_first_logits: bool = False, draft_ids: Sequence[int] | None = None
    ) -> PassResult | None:
        """The last window, re-encoding of windows whose floor changed, the prompt tail, decoding."""
        pipe = self._pipe
        with pipe.lock, torch.inference_mode():
            if not self._model_current():
                return None
            model, mel, prompt = self._model, self._mel, self._prompt
            t0 = time.perf_counter()
            total = n_frames(len(audio))
            done = len(self._raw)
            tail_start = done * self._window_frames
            tail = mel.log_spec_frames(audio, tail_start, total) if total > tail_start else None
            clip_max = self._running_max if tail is None else torch.maximum(self._running_max, tail.max())
            # A window's features change iff the floor rose and some value lies below the new floor.
            new_floor = clip_max - 8.0
            stale = ((new_floor > torch.stack(self._floors)) & (torch.stack(self._mins) < new_floor)).tolist()
            first = stale.index(True) if any(stale) else done
            parts = [mel.floor(raw, clip_max) for raw in self._raw[first:]]
            if tail is not None:
                parts.append(mel.floor(tail, clip_max))
            sync_device(model.device)
            t1 = time.perf_counter()
            fresh = model.audio_tower(torch.cat(parts, dim=1), clip_frames=total) if parts else None
            sync_device(model.device)
            t2 = time.perf_counter()

            n_tokens = done * self._window_tokens + n_audio_tokens(total - tail_start, model.cfg.audio.chunk_frames)
            ids = self._head_ids + [prompt.special.audio_pad] * n_tokens + self._tail_ids
            cached = self._cached_positions(upto=1 + first)
            start = self._fill_cache(upto=1 + first)  # the head and the windows still valid
            pieces = [] if fresh is None else [fresh.to(model.dtype).unsqueeze(0)]
            pieces.append(model.decoder.embed_tokens(torch.tensor(self._tail_ids, device=model.device)).unsqueeze(0))
            embeds = torch.cat(pieces, dim=1)
            assert start + embeds.shape[1] == len(ids), "streamed prompt length differs from the whole clip's"
            pipe.cache_owner = None  # decoding writes past the prompt; the stream is done with it
            budget = pipe.budget(len(audio), self._max_new_tokens)
            gen = greedy(
                model,
                embeds,
                max_new_tokens=budget,
                eos_ids=prompt.special.eos,
                keep_first_logits=keep_first_logits,
                should_stop=lambda: self._cancelled,
                start=start,
                draft=draft_ids,
            )
            stages = {
                "mel_s": t1 - t0,
                "encoder_s": t2 - t1,
                "finish_prefill_tokens": float(len(ids) - cached),  # prompt positions computed at finish
                "finish_windows": float(-(-(total - first * self._window_frames) // self._window_frames)),
                "reencoded_windows": float(done - first),
                "feed_s": self._feed_s,
            }
            return pipe.finish(gen, self._forced, budget, draft_ids, t0, stages, n_prompt=len(ids))
