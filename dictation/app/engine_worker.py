"""`EngineWorker`: the speech engine on its own thread (docs/architecture.md, principle 4).

It owns the `AsrEngine`: load (with a CPU fallback and adapter swaps), transcribe (one at a time,
in request order), unload; and the takes transcribed while they are recorded (streaming, with live
previews; below). Requests come as calls queued onto its thread (`dictation.app.worker_port`:
from `Takes` and the controller); a take's saved samples come straight from the audio worker
(`take_saved`, audio thread -> engine thread), and `Takes`' `transcribe_take` says when to
transcribe them (the session asked, and the take's history entry exists; `dictation.takes`):
whichever of the two comes second starts the transcription. A take without speech (a muted
microphone, or only silence) is answered with `no_speech`; a trimmed take whose speech gives no
words is transcribed once more, whole (`_finish_take`).
`transcribe(request, samples, ...)` serves the history's `Retranscription`s; answers carry the
take id or that request back.

Streaming (a take transcribed while it is recorded). The controller asks for it at the
press when the model is loaded and ``engine.stream_while_recording`` is on: ``begin_take``, then
``AudioWorker.start(..., stream=True)``. If the device delivers 16 kHz (at other rates the take is
resampled as a whole at the end, so it is transcribed after the release as before), the audio
worker emits ``chunk_ready(take, start, samples)`` with `Recorder.take_samples`, straight to
``feed``: one sender thread, one receiver, so the chunks arrive in order, and each names its first
sample, so a gap or a repeat is noticed. The engine feeds them to ``engine.stream()`` (which
encodes and prefills every finished 8-s window) and, when live preview is on, decodes a preview of
everything heard so far now and then. At the release the controller calls ``interrupt(take)`` (any
thread) so a running preview stops within a token; the saved take then finishes the stream: the
last audio is fed and the stream finished with the trailing silence cut (``end``, the trim rule of
`dictation.audio.trim.transcribed_part`): the text is exactly ``engine.transcribe`` of the saved
take up to ``end``. Whatever goes wrong on the way (a feed or preview raising, the model reloaded
or unloaded, the settings changed mid-take) drops the stream and the saved take is transcribed as a
whole, so the dictation is never lost; a cancelled take cancels its stream.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from PySide6.QtCore import QObject, Qt, Signal, Slot

from dictation.asr import SAMPLE_RATE
from dictation.takes import SavedTake

log = logging.getLogger(__name__)

# A live preview runs at most this often, and waits twice as long as the last one took: on a slow
# CPU previews get rarer instead of piling up and holding back the window work.
PREVIEW_MIN_INTERVAL_S = 1.0
PREVIEW_FIRST_AUDIO_S = 1.0  # the first preview once this much audio is in (less holds no words)


def is_cuda_failure(exc: BaseException, device: str) -> bool:
    """True when loading failed because of the GPU (out of memory, no usable device), so the CPU may work."""
    if not (device == "auto" or device.startswith("cuda")):
        return False
    try:
        import torch

        if isinstance(exc, torch.OutOfMemoryError):
            return True
    except ImportError:  # pragma: no cover - torch is a dependency
        pass
    text = str(exc).lower()
    return any(word in text for word in ("cuda", "out of memory", "nvidia", "cudnn", "cublas", "no gpu"))


class EngineWorker(QObject):
    """Owns the engine on its own thread. ``engine_factory(EngineOptions) -> engine`` (AsrEngine by default)."""

    loading = Signal(str)  # what is being loaded
    loaded = Signal(str, float)  # model label, seconds
    load_failed = Signal(str, bool)  # message, whether a CPU retry may help (a GPU failure)
    unloaded = Signal()
    adapters_failed = Signal(str)  # the loaded model kept its previous adapters
    adapters_skipped = Signal(object)  # [(spec, message)]: left out of a load, which went on without them
    kept_previous = Signal(str, str)  # a new model failed (message); the previous one is loaded again (label)
    moved_to_cpu = Signal(str, str)  # the GPU failed while transcribing (message); now on the CPU (label)
    transcribed = Signal(object, object)  # take id or Retranscription, Transcript
    transcribe_failed = Signal(object, str)  # take id or Retranscription, message
    no_speech = Signal(int)  # take id: its saved take holds nothing to transcribe
    preview_ready = Signal(int, str)  # take id, a live preview of what was heard so far
    _work_requested = Signal()  # queued to itself: feed what arrived, then maybe preview

    def __init__(self, engine_factory: Callable[[Any], Any] | None = None) -> None:
        super().__init__()
        self._factory = engine_factory
        self._engine: Any = None
        self._options: Any = None
        self._takes: dict[int, _EngineTake] = {}  # take id -> what this thread holds of it, until it is done
        self._work_posted = False
        self._interrupted_upto = 0  # takes with ids up to this one were released or cancelled
        self._work_requested.connect(self._work, Qt.ConnectionType.QueuedConnection)
        self._warmed = False  # the loaded engine (with its adapters) had its warm-up pass

    @Slot(object)
    def build_and_load(self, build_options: Callable[[], Any]) -> None:
        """``load(build_options())``, the options built here on the engine thread: building them imports
        torch (seconds at a cold start), which must keep off the GUI thread. What the controller sends."""
        self.load(build_options())

    @Slot(object)
    def load(self, options: Any) -> None:
        """Load the model ``options`` (EngineOptions) name; the same options again keep what is loaded,
        and options that differ only in their adapters swap those (`_swap_adapters`)."""
        from dictation.asr import AsrEngine

        if self._engine is not None and self._options == options and self._engine.is_loaded:
            self.loaded.emit(self._engine.model_label, 0.0)
            return
        if self._swap_adapters(options):
            return
        previous = self._options if self._engine is not None and self._engine.is_loaded else None
        self._drop()  # first, so two models never share the memory
        self.loading.emit(str(options.model))
        t0 = time.perf_counter()
        try:
            engine = (self._factory or AsrEngine)(options)
            engine.prepare()
        except Exception as exc:  # every failure becomes one message for the user
            log_failure(f"loading {options.model} failed", exc)
            gpu_failure = is_cuda_failure(exc, str(options.device))
            if previous is not None and not gpu_failure and self._reload(previous):
                self.kept_previous.emit(_message(exc), self._engine.model_label)
                return
            self.load_failed.emit(_message(exc), gpu_failure)
            return
        self._engine, self._options, self._warmed = engine, self._without_skipped(engine, options), False
        self.loaded.emit(engine.model_label, time.perf_counter() - t0)

    def _without_skipped(self, engine: Any, options: Any) -> Any:
        """``options`` less the adapters the load left out (announced through ``adapters_skipped``), so
        the same options without them (the controller switches them off) need no reload."""
        skipped = list(getattr(engine, "skipped_adapters", ()) or ())
        if not skipped:
            return options
        self.adapters_skipped.emit(skipped)
        left_out = {spec for spec, _ in skipped}
        return replace(options, adapters=tuple(spec for spec in options.adapters if spec not in left_out))

    @Slot()
    def warm_up(self) -> None:
        """A short pass after a load or an adapter swap, so the first dictation does not pay for
        one-time set-up (``AsrEngine.warm_up``). The controller asks for it when the model becomes
        ready while nothing is being dictated; it runs once per loaded state, not while a take is
        streamed (that take must not wait for it), and a failure only logs: dictation reports its own."""
        engine = self._engine
        if engine is None or not engine.is_loaded or self._warmed:
            return
        if self._streams():
            log.info("warm-up skipped: a take is under way")
            return
        self._warmed = True
        try:
            log.info("warm-up pass took %.2f s", engine.warm_up())
        except Exception as exc:
            log_failure("the warm-up pass failed", exc)

    def _reload(self, options: Any) -> bool:
        """Load the model that worked before a failed switch; True if it is back."""
        from dictation.asr import AsrEngine

        try:
            engine = (self._factory or AsrEngine)(options)
            engine.prepare()
        except Exception as exc:
            log_failure(f"reloading the previous model {options.model} failed too", exc)
            return False
        self._engine, self._options, self._warmed = engine, self._without_skipped(engine, options), False
        return True

    def _swap_adapters(self, options: Any) -> bool:
        """Only the adapters changed: apply them to the loaded model (no re-read of the base).
        True if that settled the request (applied, or refused with the old adapters still on)."""
        engine = self._engine
        if engine is None or not engine.is_loaded or not hasattr(engine, "set_adapters"):
            return False
        if replace(self._options, adapters=tuple(options.adapters)) != replace(
            options, adapters=tuple(options.adapters)
        ):
            return False
        t0 = time.perf_counter()
        self._cancel_streams("the LoRA adapters changed")
        self.loading.emit(str(options.model))
        try:
            engine.set_adapters(options.adapters)
        except Exception as exc:  # a bad adapter: the model keeps the adapters it had
            log_failure("applying adapters failed", exc)
            self.adapters_failed.emit(_message(exc))
            self.loaded.emit(engine.model_label, 0.0)
            return True
        self._options = options
        self._warmed = False  # re-quantized layers build kernel layouts, CUDA captures its step again
        self.loaded.emit(engine.model_label, time.perf_counter() - t0)
        return True

    @Slot()
    def unload(self) -> None:
        self._drop()
        self.unloaded.emit()

    def close(self) -> None:
        """The app quits and this worker's thread has stopped: the model is freed, without a word
        (nobody listens any more)."""
        self.blockSignals(True)
        self._drop()

    def _drop(self) -> None:
        self._cancel_streams("the model was unloaded or reloaded")
        if self._engine is not None:
            try:
                self._engine.unload()
            finally:
                self._engine = self._options = None

    @Slot(object, object, object, str)
    def transcribe(self, key: Any, samples: np.ndarray, language: str | None, context: str) -> None:
        """Transcribe ``samples``; the answer carries ``key`` (a take id, or a `Retranscription`)."""
        result, failure = self._run(key, samples, language, context)
        if result is None:
            self.transcribe_failed.emit(key, failure)
        else:
            self.transcribed.emit(key, result)

    def _run(self, key: Any, samples: np.ndarray, language: str | None, context: str) -> tuple[Any, str]:
        """``(transcript, "")``, or ``(None, why)`` when the engine failed (the CPU tried where it could)."""
        if self._engine is None:
            return None, "the speech model is not loaded"
        try:
            return self._engine.transcribe(samples, language=language, context=context), ""
        except Exception as exc:
            log_failure(f"transcription {key} failed", exc)
            result = self._retry_on_cpu(exc, samples, language, context)
            return result, ("" if result is not None else _message(exc))

    # ---- takes -----------------------------------------------------------------------------------

    def _take(self, take_id: int) -> _EngineTake:
        take = self._takes.get(take_id)
        if take is None:
            take = self._takes[take_id] = _EngineTake()
        return take

    def _streams(self) -> list[_StreamedTake]:
        return [take.streamed for take in self._takes.values() if take.streamed is not None]

    @Slot(int, object)
    def take_saved(self, take_id: int, saved: SavedTake) -> None:
        """From the audio worker: take ``take_id`` was saved; it is transcribed once it is wanted."""
        self._take(take_id).saved = saved
        self._maybe_transcribe_take(take_id)

    @Slot(int, object, str)
    def transcribe_take(self, take_id: int, language: str | None, context: str) -> None:
        """From the controller: transcribe take ``take_id`` once its saved take is here (maybe it is)."""
        self._take(take_id).wanted = (language, context)
        self._maybe_transcribe_take(take_id)

    def _maybe_transcribe_take(self, take_id: int) -> None:
        take = self._takes[take_id]
        if take.saved is None or take.wanted is None:
            return
        del self._takes[take_id]
        (language, context), saved = take.wanted, take.saved
        if not saved.has_speech:
            if take.streamed is not None and take.streamed.stream is not None:
                take.streamed.stream.cancel()
            self.no_speech.emit(take_id)
            return
        self._finish_take(take.streamed, take_id, saved, language, context)

    # ---- streaming -------------------------------------------------------------------------------

    def interrupt(self, take_id: int) -> None:
        """Thread-safe: take ``take_id`` (and every earlier one) was released or cancelled, so a live
        preview of it that is running stops at its next token, and none starts again. Called from
        the GUI thread, so the finish never waits behind a preview."""
        if take_id > self._interrupted_upto:
            self._interrupted_upto = take_id  # one int store: atomic; read by the engine thread

    def interrupt_all(self) -> None:
        """Thread-safe: quitting: every live preview stops at its next token, and none starts again."""
        self._interrupted_upto = sys.maxsize

    def _interrupted(self, take_id: int) -> bool:
        return take_id <= self._interrupted_upto

    @Slot(int, object, str, bool)
    def begin_take(self, take_id: int, language: str | None, context: str, preview: bool) -> None:
        """Take ``take_id`` will be fed as it is recorded (if its device delivers 16 kHz). The stream
        itself is made at the first chunk, with the language and context the take was started with."""
        self._take(take_id).streamed = _StreamedTake(take_id, language, context, preview)

    @Slot(int, int, object)
    def feed(self, take_id: int, start: int, samples: np.ndarray) -> None:
        """New audio of take ``take_id`` from sample ``start`` on. Only queued here: chunks that
        arrived while the engine was busy are fed together by one ``_work``."""
        take = self._takes[take_id].streamed if take_id in self._takes else None
        if take is None or take.failed:
            return
        if start != take.received:
            self._fail(take, f"audio chunk from sample {start} where {take.received} was expected")
            return
        take.pending.append(samples)
        take.received += len(samples)
        if not self._work_posted:
            self._work_posted = True
            self._work_requested.emit()  # queued behind the chunks already waiting

    @Slot()
    def _work(self) -> None:
        self._work_posted = False
        for take in self._streams():
            self._feed_pending(take)
        live = [t for t in self._streams() if not self._interrupted(t.take_id)]
        if live and self._preview_due(live[-1]):
            self._preview(live[-1])

    def _feed_pending(self, take: _StreamedTake) -> None:
        if take.failed or not take.pending:
            return
        chunk = take.pending[0] if len(take.pending) == 1 else np.concatenate(take.pending)
        take.pending.clear()
        if self._engine is None:
            self._fail(take, "the speech model is not loaded")
            return
        try:
            if take.stream is None:
                take.stream = self._engine.stream(language=take.language, context=take.context)
            take.stream.feed(chunk)
        except Exception as exc:
            log_failure(f"transcribing take {take.take_id} while recording failed", exc)
            self._fail(take, "an error while feeding the audio")
            return
        take.fed += len(chunk)

    def _preview_due(self, take: _StreamedTake) -> bool:
        return (
            take.preview
            and not take.failed
            and take.stream is not None
            and take.fed > max(take.previewed, PREVIEW_FIRST_AUDIO_S * SAMPLE_RATE)
            and time.monotonic() >= take.next_preview_at
        )

    def _preview(self, take: _StreamedTake) -> None:
        draft = take.last_preview.token_ids if take.last_preview is not None else None
        fed = take.fed
        try:
            preview = take.stream.preview(draft_ids=draft, should_stop=lambda: self._interrupted(take.take_id))
        except Exception as exc:
            log_failure(f"the live preview of take {take.take_id} failed", exc)
            self._fail(take, "an error in the live preview")
            return
        elapsed = preview.elapsed_s if preview is not None else 0.0
        take.next_preview_at = time.monotonic() + max(PREVIEW_MIN_INTERVAL_S, 2.0 * elapsed)
        if preview is None:  # nothing to show (e.g. the stream fell back to a whole-clip transcribe)
            return
        take.previewed = fed
        take.last_preview = preview  # a stopped one is a prefix: still a useful draft
        if preview.complete:
            self.preview_ready.emit(take.take_id, preview.text)

    def _finish_take(
        self, take: _StreamedTake | None, take_id: int, saved: SavedTake, language: str | None, context: str
    ) -> None:
        """Transcribe a saved take: finish its stream if it was streamed (the last audio, the
        trailing silence cut at ``saved.end``), or transcribe ``saved.speech`` as a whole if streaming
        did not happen or failed. Either way the text is ``engine.transcribe(saved.speech)``.

        The trim found speech, so a transcript without a word gets one more pass, over the whole
        recording: speech cut at a margin (a word that fades out, a gate closing early) or audio the
        model reads differently with its edges is not thrown away. Only when that finds nothing
        either (or the take was not trimmed: the same samples give the same text) is it no speech."""
        result = None
        if take is not None and not saved.streamed:  # nothing was fed (the device did not deliver 16 kHz)
            if take.stream is not None:
                take.stream.cancel()
            take = None
        if take is not None:
            self._feed_pending(take)
            if take.stream is not None and not take.failed and (take.language, take.context) != (language, context):
                self._fail(take, "the language or vocabulary changed during the recording")
            if take.stream is not None and not take.failed:
                result = self._finish_stream(take, saved)
        if result is None:
            result, failure = self._run(take_id, saved.speech, language, context)
            if result is None:
                self.transcribe_failed.emit(take_id, failure)
                return
        if not result.text.strip() and len(saved.speech) < len(saved.samples):
            log.info("take %d: no words in its speech; transcribing the whole recording once more", take_id)
            whole, _ = self._run(take_id, saved.samples, language, context)
            if whole is not None:
                result = whole
        self.transcribed.emit(take_id, result)

    def _finish_stream(self, take: _StreamedTake, saved: Any) -> Any:
        """The stream's transcript of ``saved.samples[:saved.end]``; None (stream dropped) on failure."""
        try:
            if saved.start != 0:
                raise ValueError(f"a streamed take is trimmed at its end only, not from sample {saved.start}")
            if take.fed < len(saved.samples):  # what arrived after the last chunk
                take.stream.feed(saved.samples[take.fed :])
            draft = take.last_preview.token_ids if take.last_preview is not None else None
            return take.stream.finish(draft, end=saved.end)
        except Exception as exc:
            log_failure(f"finishing take {take.take_id}'s stream failed; transcribing the saved take", exc)
            take.stream.cancel()
            return None

    @Slot(int)
    def cancel_take(self, take_id: int) -> None:
        """Take ``take_id`` will not be transcribed here (cancelled, skipped, without speech): its
        stream and its saved samples go."""
        take = self._takes.pop(take_id, _EngineTake()).streamed
        if take is not None and take.stream is not None:
            take.stream.cancel()

    def _fail(self, take: _StreamedTake, why: str) -> None:
        log.info("take %d: no more streaming (%s); it is transcribed after the recording", take.take_id, why)
        take.failed = why
        take.pending.clear()
        if take.stream is not None:
            take.stream.cancel()
            take.stream = None

    def _cancel_streams(self, why: str) -> None:
        """Streams use the loaded model: drop them before it changes (their takes go the plain way)."""
        for take in self._streams():
            if take.stream is not None and not take.failed:
                self._fail(take, why)

    def _retry_on_cpu(self, exc: Exception, samples: np.ndarray, language: str | None, context: str) -> Any:
        """The GPU failed mid-dictation (out of memory, a lost device): move the model to the CPU and
        transcribe this take there, so the dictation is not lost. None if that is not the case or fails."""
        options = self._options
        if options is None or str(options.device) == "cpu" or not is_cuda_failure(exc, str(options.device)):
            return None
        from dictation.asr import AsrEngine

        cpu_options = replace(options, device="cpu")
        self._drop()  # frees the GPU memory first
        _empty_cuda_cache()
        try:
            engine = (self._factory or AsrEngine)(cpu_options)
            engine.prepare()
            result = engine.transcribe(samples, language=language, context=context)
        except Exception as exc:
            log_failure("the CPU could not take over either", exc)
            return None
        self._engine, self._options = engine, cpu_options
        self.moved_to_cpu.emit(_message(exc), engine.model_label)
        return result


@dataclass
class _EngineTake:
    """What the engine thread holds of one take until it is transcribed or dropped."""

    streamed: _StreamedTake | None = None  # fed while it records (begin_take)
    saved: SavedTake | None = None  # from the audio worker (take_saved)
    wanted: tuple[str | None, str] | None = None  # language, context: from the controller (transcribe_take)


@dataclass
class _StreamedTake:
    """The engine's side of a take transcribed while it is recorded."""

    take_id: int
    language: str | None
    context: str
    preview: bool  # live previews wanted
    next_preview_at: float = 0.0  # time.monotonic() after which the next preview may run
    stream: Any = None  # the engine's StreamingTranscription, made at the first chunk
    received: int = 0  # samples received in chunks, in order
    fed: int = 0  # of those, samples fed to the stream
    pending: list[np.ndarray] = field(default_factory=list)  # received, not fed yet
    failed: str | None = None  # why streaming stopped; the saved take is then transcribed whole
    last_preview: Any = None  # its token ids are the draft of the next preview and of the finish
    previewed: int = 0  # samples fed when the last preview ran


def _empty_cuda_cache() -> None:
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except Exception:  # noqa: BLE001 - best effort after a GPU failure
        log.debug("emptying the CUDA cache failed", exc_info=True)


def is_ordinary(exc: BaseException) -> bool:
    """A failure users meet without a bug: the engine's own errors (a missing model folder, truncated
    weights, a bad adapter), a file that cannot be read, memory that ran out."""
    from dictation.asr import AsrError

    if isinstance(exc, (AsrError, OSError, MemoryError)):
        return True
    try:
        import torch

        return isinstance(exc, torch.OutOfMemoryError)
    except ImportError:  # pragma: no cover - torch is a dependency
        return False


def log_failure(what: str, exc: BaseException) -> None:
    """``what`` failed: an ordinary failure is one line (its traceback at debug level only); anything
    else is a bug and keeps its traceback."""
    if is_ordinary(exc):
        log.warning("%s: %s", what, _message(exc))
        log.debug("%s: the traceback", what, exc_info=exc)
    else:
        log.warning("%s", what, exc_info=exc)


def _message(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    try:
        import torch

        if isinstance(exc, torch.OutOfMemoryError):
            return "not enough GPU memory: " + text.splitlines()[0]
    except ImportError:  # pragma: no cover
        pass
    return text.splitlines()[0] if len(text) > 300 else text
