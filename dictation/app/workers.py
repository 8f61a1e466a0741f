"""Worker objects that run the blocking parts off the GUI thread (DESIGN.md principle 4).

Each worker is a QObject moved to its own QThread; the controller calls its slots through queued
signals and hears back through the worker's signals, so nothing here ever blocks the GUI:

- `EngineWorker` owns the `AsrEngine`: load, transcribe (one at a time, in request order), unload;
  and takes transcribed while they are recorded (streaming, with live previews; see below).
- `AudioWorker` owns the `Recorder`: open, start, stop (blocks ~0.25 s for the tail), and the
  take on disk *while* it is recorded (`TakeFile`: the new audio is appended every
  ``STREAM_PULL_MS``, so a crash loses at most that much) and whole before anything is transcribed
  (principle 7), then trimming for the engine. If the recordings folder cannot be written (full,
  read-only), the take is transcribed from memory all the same and ``SavedTake.save_error`` says
  why the audio was not kept. While a streamed take records, the same pulls hand the new audio to
  the engine.
- `OutputWorker` owns the `OutputChain`: delivering text blocks while keys are sent.
- `DownloadWorker` fetches a model into the Hugging Face cache with byte progress and cancel.

Streaming (a take transcribed while it is recorded, issue 6). The controller asks for it at the
press when the model is loaded and ``engine.stream_while_recording`` is on: ``EngineWorker.begin_take``
then ``AudioWorker.start(..., stream=True)``. If the device delivers 16 kHz (at other rates the
take is resampled as a whole at the end, so it is transcribed after the release as before), the
audio worker emits ``chunk_ready(job, start, samples)`` with `Recorder.take_samples`, straight to
``EngineWorker.feed``: one sender thread, one receiver, so the chunks arrive in order, and each
names its first sample, so a gap or a repeat is noticed. The engine feeds them to
``engine.stream()`` (which encodes and prefills every finished 8-s window) and, when live preview
is on, decodes a preview of everything heard so far now and then. At the release the controller
calls ``interrupt(job)`` (any thread) so a running preview stops within a token; the saved take
then comes to ``finish_take``, which feeds the last audio and finishes the stream with the trailing
silence cut (``end``): the text is exactly ``engine.transcribe`` of the saved take up to ``end``.
Whatever goes wrong on the way (a feed or preview raising, the model reloaded or unloaded, the
settings changed mid-take) drops the stream and the saved take is transcribed as a whole, so the
dictation is never lost; a cancelled take cancels its stream.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from PySide6.QtCore import QObject, Qt, QThread, QTimer, Signal, Slot

from dictation.asr import SAMPLE_RATE

log = logging.getLogger(__name__)

STREAM_PULL_MS = 500  # how often a streamed take's new audio goes to the engine
FIRST_BLOCK_WAIT_S = 1.0  # a microphone opened at the press: how long `start` waits to learn when its audio begins
# A live preview runs at most this often, and waits twice as long as the last one took: on a slow
# CPU previews get rarer instead of piling up and holding back the window work.
PREVIEW_MIN_INTERVAL_S = 1.0
PREVIEW_FIRST_AUDIO_S = 1.0  # the first preview once this much audio is in (less holds no words)


def start_thread(worker: QObject, name: str) -> QThread:
    """Move ``worker`` to a new running QThread named ``name`` and return the thread."""
    thread = QThread()
    thread.setObjectName(name)
    worker.moveToThread(thread)
    thread.start()
    return thread


def stop_thread(thread: QThread, timeout_ms: int = 10_000) -> None:
    thread.quit()
    if not thread.wait(timeout_ms):
        log.warning("the %s thread did not stop within %.0f s", thread.objectName(), timeout_ms / 1000)


# ---- engine -------------------------------------------------------------------------------------


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
    transcribed = Signal(int, object)  # request id, Transcript
    transcribe_failed = Signal(int, str)
    preview_ready = Signal(int, str)  # job id, a live preview of what was heard so far
    _work_requested = Signal()  # queued to itself: feed what arrived, then maybe preview

    def __init__(self, engine_factory: Callable[[Any], Any] | None = None) -> None:
        super().__init__()
        self._factory = engine_factory
        self._engine: Any = None
        self._options: Any = None
        self._takes: dict[int, _StreamedTake] = {}  # job id -> take being streamed
        self._work_posted = False
        self._interrupted_upto = 0  # takes with ids up to this one were released or cancelled
        self._work_requested.connect(self._work, Qt.ConnectionType.QueuedConnection)
        self._warmed = False  # the loaded engine (with its adapters) had its warm-up pass

    @Slot(object)
    def load(self, options: Any) -> None:
        """Load the model ``options`` (EngineOptions) name; a callable returning them is called here
        first, so building them (which imports torch, seconds at a cold start) keeps off the GUI thread."""
        from dictation.asr import AsrEngine

        if callable(options):
            options = options()
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
            log.warning("loading %s failed", options.model, exc_info=True)
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
        if self._takes:
            log.info("warm-up skipped: a take is under way")
            return
        self._warmed = True
        try:
            log.info("warm-up pass took %.2f s", engine.warm_up())
        except Exception:
            log.warning("the warm-up pass failed", exc_info=True)

    def _reload(self, options: Any) -> bool:
        """Load the model that worked before a failed switch; True if it is back."""
        from dictation.asr import AsrEngine

        try:
            engine = (self._factory or AsrEngine)(options)
            engine.prepare()
        except Exception:
            log.warning("reloading the previous model %s failed too", options.model, exc_info=True)
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
            log.warning("applying adapters failed", exc_info=True)
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

    def _drop(self) -> None:
        self._cancel_streams("the model was unloaded or reloaded")
        if self._engine is not None:
            try:
                self._engine.unload()
            finally:
                self._engine = self._options = None

    @Slot(int, object, object, str)
    def transcribe(self, request_id: int, samples: np.ndarray, language: str | None, context: str) -> None:
        if self._engine is None:
            self.transcribe_failed.emit(request_id, "the speech model is not loaded")
            return
        try:
            result = self._engine.transcribe(samples, language=language, context=context)
        except Exception as exc:
            log.warning("transcription %d failed", request_id, exc_info=True)
            result = self._retry_on_cpu(exc, samples, language, context)
            if result is None:
                self.transcribe_failed.emit(request_id, _message(exc))
                return
        self.transcribed.emit(request_id, result)

    # ---- streaming -------------------------------------------------------------------------------

    def interrupt(self, job_id: int) -> None:
        """Thread-safe: take ``job_id`` (and every earlier one) was released or cancelled, so a live
        preview of it that is running stops at its next token, and none starts again. Called from
        the GUI thread, so the finish never waits behind a preview."""
        if job_id > self._interrupted_upto:
            self._interrupted_upto = job_id  # one int store: atomic; read by the engine thread

    def _interrupted(self, job_id: int) -> bool:
        return job_id <= self._interrupted_upto

    @Slot(int, object, str, bool)
    def begin_take(self, job_id: int, language: str | None, context: str, preview: bool) -> None:
        """Take ``job_id`` will be fed as it is recorded (if its device delivers 16 kHz). The stream
        itself is made at the first chunk, with the language and context the take was started with."""
        self._takes[job_id] = _StreamedTake(job_id, language, context, preview)

    @Slot(int, int, object)
    def feed(self, job_id: int, start: int, samples: np.ndarray) -> None:
        """New audio of take ``job_id`` from sample ``start`` on. Only queued here: chunks that
        arrived while the engine was busy are fed together by one ``_work``."""
        take = self._takes.get(job_id)
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
        for take in list(self._takes.values()):
            self._feed_pending(take)
        live = [t for t in self._takes.values() if not self._interrupted(t.job_id)]
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
        except Exception:
            log.warning("transcribing take %d while recording failed", take.job_id, exc_info=True)
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
            preview = take.stream.preview(draft_ids=draft, should_stop=lambda: self._interrupted(take.job_id))
        except Exception:
            log.warning("the live preview of take %d failed", take.job_id, exc_info=True)
            self._fail(take, "an error in the live preview")
            return
        elapsed = preview.elapsed_s if preview is not None else 0.0
        take.next_preview_at = time.monotonic() + max(PREVIEW_MIN_INTERVAL_S, 2.0 * elapsed)
        if preview is None:  # nothing to show (e.g. the stream fell back to a whole-clip transcribe)
            return
        take.previewed = fed
        take.last_preview = preview  # a stopped one is a prefix: still a useful draft
        if preview.complete:
            self.preview_ready.emit(take.job_id, preview.text)

    @Slot(int, object, object, str)
    def finish_take(self, job_id: int, saved: Any, language: str | None, context: str) -> None:
        """The saved take of a streamed recording: finish its stream (the last audio, the trailing
        silence cut at ``saved.end``), or transcribe ``saved.speech`` as a whole if streaming did
        not happen or failed. Either way the text is ``engine.transcribe(saved.speech)``."""
        take = self._takes.pop(job_id, None)
        if take is not None:
            self._feed_pending(take)
            if take.stream is not None and not take.failed and (take.language, take.context) != (language, context):
                self._fail(take, "the language or vocabulary changed during the recording")
            if take.stream is not None and not take.failed:
                result = self._finish_stream(take, saved)
                if result is not None:
                    self.transcribed.emit(job_id, result)
                    return
        self.transcribe(job_id, saved.speech, language, context)

    def _finish_stream(self, take: _StreamedTake, saved: Any) -> Any:
        """The stream's transcript of ``saved.samples[:saved.end]``; None (stream dropped) on failure."""
        try:
            if saved.start != 0:
                raise ValueError(f"a streamed take is trimmed at its end only, not from sample {saved.start}")
            if take.fed < len(saved.samples):  # what arrived after the last chunk
                take.stream.feed(saved.samples[take.fed :])
            draft = take.last_preview.token_ids if take.last_preview is not None else None
            return take.stream.finish(draft, end=saved.end)
        except Exception:
            log.warning("finishing take %d's stream failed; transcribing the saved take", take.job_id, exc_info=True)
            take.stream.cancel()
            return None

    @Slot(int)
    def cancel_take(self, job_id: int) -> None:
        """Take ``job_id`` will not be transcribed by streaming (cancelled, silent, not streamed)."""
        take = self._takes.pop(job_id, None)
        if take is not None and take.stream is not None:
            take.stream.cancel()

    def _fail(self, take: _StreamedTake, why: str) -> None:
        log.info("take %d: no more streaming (%s); it is transcribed after the recording", take.job_id, why)
        take.failed = why
        take.pending.clear()
        if take.stream is not None:
            take.stream.cancel()
            take.stream = None

    def _cancel_streams(self, why: str) -> None:
        """Streams use the loaded model: drop them before it changes (their takes go the plain way)."""
        for take in self._takes.values():
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
        except Exception:
            log.warning("the CPU could not take over either", exc_info=True)
            return None
        self._engine, self._options = engine, cpu_options
        self.moved_to_cpu.emit(_message(exc), engine.model_label)
        return result


@dataclass
class _StreamedTake:
    """The engine's side of a take transcribed while it is recorded."""

    job_id: int
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


def _message(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    try:
        import torch

        if isinstance(exc, torch.OutOfMemoryError):
            return "not enough GPU memory: " + text.splitlines()[0]
    except ImportError:  # pragma: no cover
        pass
    return text.splitlines()[0] if len(text) > 300 else text


# ---- audio --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RecorderConfig:
    device: str | None  # None: the system default
    max_seconds: float
    keep_open: bool


@dataclass(frozen=True)
class SavedTake:
    """A finished recording, on disk (unless ``save_error``), and which part of it to transcribe."""

    path: Path | None  # None: the audio could not be written (``save_error`` says why)
    samples: np.ndarray  # the whole take, 16 kHz float32 (as saved, before rounding to 16 bits)
    start: int  # samples[start:end] is transcribed: silence trimmed when asked; empty = no speech
    end: int
    duration_s: float  # of the saved recording
    silence_reason: str | None  # the microphone delivered nothing (muted?)
    error: str | None  # the device failed during the take
    streamed: bool = False  # fed to the engine while recording: only its trailing silence is trimmed
    save_error: str | None = None  # why the audio could not be kept (the samples are still transcribed)
    start_gap_s: float | None = None  # Take.start_gap_s: > 0 when audio after the press is missing

    @property
    def speech(self) -> np.ndarray:
        """What the engine transcribes."""
        return self.samples[self.start : self.end]


class AudioWorker(QObject):
    """Owns the Recorder. ``recorder_factory(RecorderConfig) -> Recorder-like``."""

    # job id, the take's file being written (None: it could not be created), and the take's first
    # sample minus its press in seconds (Recorder.start_gap; None: not known): > 0 means audio after the
    # press is missing
    started = Signal(int, object, object)
    start_failed = Signal(int, str)
    saved = Signal(int, object)  # job id, SavedTake (also when the file could not be written)
    opened = Signal(str)  # device name, when the stream was opened ahead of a press
    open_failed = Signal(str)
    chunk_ready = Signal(int, int, object)  # job id, index of the first sample in the take, 16 kHz samples

    def __init__(
        self,
        recorder_factory: Callable[[RecorderConfig], Any] | None = None,
        recordings_dir: Path | None = None,
    ) -> None:
        super().__init__()
        self._factory = recorder_factory or _real_recorder
        self._dir = recordings_dir
        self._config: RecorderConfig | None = None
        self.recorder: Any = None
        self._recorder_config: RecorderConfig | None = None  # what self.recorder was built with
        self._job: int | None = None
        self._streaming = False  # the current take's audio goes to the engine as it arrives
        self._pulled = 0  # samples of the current take read from the recorder so far
        self._file: Any = None  # the current take's TakeFile, appended at every pull
        self._file_error: str | None = None
        self._pull_timer = QTimer(self)  # a child: it moves to the audio thread with the worker
        self._pull_timer.timeout.connect(self._pull)
        self._configured = threading.Event()  # the first configure() ran: the microphone is open, or failed to

    @Slot(object)
    def configure(self, config: RecorderConfig) -> None:
        """Use these settings from the next take on; reopens the device ahead of time when kept open."""
        if config == self._config and self.recorder is not None:
            return
        self._config = config
        if self.recorder is not None and self._job is None:
            self.recorder.close()
            self.recorder = None
        if self._job is None:
            self._create()
            if config.keep_open:
                self._open_ahead()
        self._configured.set()

    def heard_s(self) -> float | None:
        """Any thread: seconds of audio the open microphone has delivered so far (how far back a
        press can reach); None when it is not open."""
        recorder = self.recorder
        rate = getattr(recorder, "device_sample_rate", None)
        if recorder is None or not getattr(recorder, "is_open", False) or not rate:
            return None
        return getattr(recorder, "frames_delivered", 0) / rate

    def pre_roll_s(self) -> float:
        """How far a take reaches back before its press (the recorder's pre-roll)."""
        return float(getattr(self.recorder, "pre_roll_s", 0.0) or 0.0)

    def wait_configured(self, timeout: float) -> bool:
        """Any thread: wait until the first `configure` has run (with the microphone kept open: until
        it is open or failed to open); False after ``timeout`` seconds."""
        return self._configured.wait(timeout)

    def _create(self) -> None:
        assert self._config is not None
        self.recorder = self._factory(self._config)
        self._recorder_config = self._config

    def _open_ahead(self) -> None:
        from dictation.audio.devices import AudioDeviceError

        try:
            self.recorder.open()
        except (AudioDeviceError, OSError) as exc:
            log.warning("could not open the microphone ahead of time: %s", exc)
            self.open_failed.emit(str(exc))
            return
        device = self.recorder.device
        self.opened.emit(device.name if device is not None else "")

    @Slot(int, float, bool)
    def start(self, job_id: int, t_press: float, stream: bool = False) -> None:
        """Start take ``job_id``. ``stream``: hand its audio on (``chunk_ready``) while it records,
        if the device delivers 16 kHz; the saved take then says ``streamed``."""
        from dictation.audio.devices import AudioDeviceError

        if self.recorder is None:
            self._create()
        try:
            self.recorder.start(t_press)
        except (AudioDeviceError, OSError, RuntimeError) as exc:
            self.start_failed.emit(job_id, f"The microphone could not be opened: {exc}")
            return
        self._job = job_id
        self._pulled = 0
        self._open_file(job_id)
        self._streaming = stream and self._can_stream()
        if self._file is not None or self._streaming:
            self._pull_timer.start(STREAM_PULL_MS)
        if stream and not self._streaming:
            log.info("take %d is transcribed after the recording: the microphone runs at %s Hz", job_id, self._rate())
        # how far the take reaches back: it begins after the press when the microphone opened later
        gap = self.recorder.start_gap(FIRST_BLOCK_WAIT_S) if hasattr(self.recorder, "start_gap") else None
        self.started.emit(job_id, self._file.path if self._file is not None else None, gap)

    def _open_file(self, job_id: int) -> None:
        """The take's file, written while it records (if the recorder can be read while it records)."""
        from dictation.audio.recordings import TakeFile

        self._file, self._file_error = None, None
        if not hasattr(self.recorder, "take_samples"):
            return
        try:
            self._file = TakeFile.create(self._rate() or SAMPLE_RATE, directory=self._dir)
        except OSError as exc:  # the take goes on in memory; the save at the end tries again
            self._file_error = str(exc)
            log.warning("take %d: cannot write the recording while it records: %s", job_id, exc)

    def _close_file(self, discard: bool) -> None:
        take_file, self._file = self._file, None
        if take_file is not None and discard:
            take_file.discard()
        elif take_file is not None:
            take_file.close()

    def _rate(self) -> Any:
        return getattr(self.recorder, "device_sample_rate", None)

    def _can_stream(self) -> bool:
        # At another rate the take is resampled as a whole at stop, so its samples are not known before.
        return hasattr(self.recorder, "take_samples") and self._rate() == SAMPLE_RATE

    def _pull(self) -> None:
        """Append the audio that arrived since the last pull to the take's file, and hand it on."""
        if self._job is None or (self._file is None and not self._streaming):
            self._pull_timer.stop()
            return
        try:
            chunk = self.recorder.take_samples(self._pulled)
        except Exception:  # the engine gets the rest from the saved take, the file at the stop
            log.warning("reading the take while recording failed", exc_info=True)
            self._pull_timer.stop()
            return
        if not len(chunk):
            return
        if self._file is not None and self._file_error is None:
            try:
                self._file.append(chunk)
            except OSError as exc:  # the disk filled up: the take goes on in memory
                self._file_error = str(exc)
                log.warning("take %d: %s", self._job, exc)
        if self._streaming:
            self.chunk_ready.emit(self._job, self._pulled, chunk)
        self._pulled += len(chunk)

    def _end_streaming(self) -> bool:
        self._pull_timer.stop()
        streamed, self._streaming = self._streaming, False
        return streamed

    @Slot(int, float, bool)
    def stop(self, job_id: int, t_release: float, trim: bool) -> None:
        """Stop, save to disk, then trim. A streamed take keeps its start: that audio was transcribed
        during the recording already, so only the trailing silence is cut. Old recordings are
        pruned by the history worker, which knows which ones are still needed."""
        from dictation.audio.trim import find_speech

        if self._job != job_id or self.recorder is None:
            return
        self._job = None
        streamed = self._end_streaming()
        take = self.recorder.stop(t_release)
        path, save_error = self._save(job_id, take)
        samples = take.samples
        silence = take.silence_reason
        start, end = 0, len(samples)
        if silence is not None:
            start = end = 0
        elif trim:  # one speech search both trims and says whether there is speech at all
            span = find_speech(samples, take.sample_rate)
            start, end = (0 if streamed else span.start, span.end) if span.has_speech else (0, 0)
        saved = SavedTake(
            path, samples, start, end, take.duration_s, silence, take.error, streamed, save_error, take.start_gap_s
        )
        self.saved.emit(job_id, saved)
        self._apply_pending_config()

    def _save(self, job_id: int, take: Any) -> tuple[Path | None, str | None]:
        """The whole take on disk, replacing the file written while it recorded: (path, None), or
        (None, why) when it cannot be written; then the partial file is deleted too."""
        from dictation.audio.recordings import save_recording

        take_file, self._file = self._file, None
        try:
            if take_file is not None:
                return take_file.finish(take.samples, take.sample_rate), None
            return save_recording(take.samples, take.sample_rate, directory=self._dir), None
        except (OSError, ValueError) as exc:
            log.warning("take %d: the recording could not be saved: %s", job_id, exc)
            if take_file is not None:
                take_file.discard()
            return None, str(exc)

    @Slot(int)
    def cancel(self, job_id: int) -> None:
        if self._job != job_id or self.recorder is None:
            return
        self._job = None
        self._end_streaming()
        self.recorder.cancel()
        self._close_file(discard=True)
        self._apply_pending_config()

    def _apply_pending_config(self) -> None:
        """A configure() that arrived during a take is applied once the take is over."""
        if self.recorder is not None and self._recorder_config != self._config:
            self.recorder.close()
            self.recorder = None
            self._create()
            if self._config.keep_open:
                self._open_ahead()

    @Slot()
    def close(self) -> None:
        """Quitting: a take still recording is kept on disk as far as it got (its history entry
        is pending, so the next start transcribes it)."""
        self._end_streaming()
        if self._job is not None:
            self._pull()  # the audio since the last pull
            self._close_file(discard=False)
        if self.recorder is not None:
            self.recorder.close()
            self.recorder = None
        self._job = None

    def mark_cue(self, kind: str, t_start: float, samples: Any, sample_rate: int) -> None:
        """From the sound player's thread: cue ``kind`` started sounding at ``t_start``. The recorder
        mutes it in the take being recorded where the microphone picked it up (a stop cue can land
        in the post-roll, while `stop` waits for it); thread-safe, ignored between takes."""
        recorder = self.recorder
        if recorder is not None and hasattr(recorder, "mark_cue"):
            recorder.mark_cue(t_start, samples, sample_rate)

    # Thread-safe reads for the GUI (Recorder's properties are safe to read from any thread).
    def level(self) -> float:
        recorder = self.recorder
        return recorder.level() if recorder is not None else -100.0

    def recorder_error(self) -> str | None:
        recorder = self.recorder
        return recorder.error if recorder is not None and self._job is not None else None

    def limit_reached(self) -> bool:
        recorder = self.recorder
        return bool(recorder is not None and self._job is not None and recorder.limit_reached)


def _real_recorder(config: RecorderConfig) -> Any:
    from dictation.audio.capture import Recorder

    return Recorder(config.device, max_seconds=config.max_seconds, keep_open=config.keep_open)


# ---- output -------------------------------------------------------------------------------------


class OutputWorker(QObject):
    """Owns the output chain. ``chain_factory(OutputOptions) -> OutputChain`` (by default
    ``choose_backend``, given ``own_window``: which of our windows has the focus, so no text is
    pasted into them; the controller sets it to `dictation.app.focus.OwnFocus` before it starts)."""

    delivered = Signal(int, object)  # history entry id, DeliveryResult
    described = Signal(str)  # the chain's diagnostics after (re)building it

    def __init__(
        self, chain_factory: Callable[[Any], Any] | None = None, own_window: Callable[[], str | None] | None = None
    ) -> None:
        super().__init__()
        self._factory = chain_factory
        self.own_window = own_window
        self.chain: Any = None
        self._options: Any = None

    @Slot(object)
    def configure(self, options: Any) -> None:
        if options == self._options and self.chain is not None:
            return
        from dictation.output import choose_backend

        if self.chain is not None:
            self.chain.flush()
        self._options = options
        try:
            if self._factory is not None:
                self.chain = self._factory(options)
            else:
                self.chain = choose_backend(options, own_window=self.own_window)
        except ValueError as exc:
            log.error("text output: %s", exc)
            self.chain = None
            self.described.emit(f"text output unavailable: {exc}")
            return
        self.described.emit(self.chain.describe())

    @Slot(int, str)
    def deliver(self, entry_id: int, text: str) -> None:
        from dictation.output import DeliveryResult

        if self.chain is None:
            result = DeliveryResult("none", False, "no text output method is configured; the text is only in history")
        else:
            try:
                result = self.chain.deliver(text)
            except Exception as exc:  # a backend bug must not lose the result: history already has the text
                log.exception("delivering text failed")
                result = DeliveryResult("error", False, f"text output failed: {exc}; the text is in history")
        self.delivered.emit(entry_id, result)

    @Slot()
    def flush(self) -> None:
        if self.chain is not None:
            self.chain.flush()


# ---- download -----------------------------------------------------------------------------------


class _Cancelled(Exception):
    pass


class DownloadWorker(QObject):
    progress = Signal(str, "qlonglong", "qlonglong")  # repo id, done bytes, total bytes (64-bit)
    finished = Signal(str, str, str)  # repo id, folder ("" on failure), error ("" on success, "cancelled")

    def __init__(self, download: Callable[..., Path] | None = None) -> None:
        super().__init__()
        self._download = download
        self._cancel = False

    def cancel(self) -> None:
        """Thread-safe: the running download stops at its next progress report."""
        self._cancel = True

    @Slot(str)
    def run(self, repo_id: str) -> None:
        from dictation.asr.errors import AsrError
        from dictation.asr.models import download_model

        self._cancel = False

        def on_progress(done: int, total: int) -> None:
            if self._cancel:
                raise _Cancelled
            self.progress.emit(repo_id, done, total)

        try:
            path = (self._download or download_model)(repo_id, on_progress=on_progress)
        except _Cancelled:
            log.info("download of %s cancelled; the part already fetched is kept and resumes next time", repo_id)
            self.finished.emit(repo_id, "", "cancelled")
            return
        except (AsrError, OSError) as exc:
            log.error("download of %s failed: %s", repo_id, exc)
            self.finished.emit(repo_id, "", str(exc))
            return
        self.finished.emit(repo_id, str(path), "")
