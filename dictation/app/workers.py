"""Worker objects that run the blocking parts off the GUI thread (DESIGN.md principle 4).

Each worker is a QObject moved to its own QThread; the controller calls its slots through queued
signals and hears back through the worker's signals, so nothing here ever blocks the GUI:

- `EngineWorker` owns the `AsrEngine`: load, transcribe (one at a time, in request order), unload.
- `AudioWorker` owns the `Recorder`: open, start, stop (blocks ~0.25 s for the tail), and saving
  the take to disk *before* anything is transcribed (principle 7), then trimming for the engine.
- `OutputWorker` owns the `OutputChain`: delivering text blocks while keys are sent.
- `DownloadWorker` fetches a model into the Hugging Face cache with byte progress and cancel.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from PySide6.QtCore import QObject, QThread, Signal, Slot

log = logging.getLogger(__name__)


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
    kept_previous = Signal(str, str)  # a new model failed (message); the previous one is loaded again (label)
    moved_to_cpu = Signal(str, str)  # the GPU failed while transcribing (message); now on the CPU (label)
    transcribed = Signal(int, object)  # request id, Transcript
    transcribe_failed = Signal(int, str)

    def __init__(self, engine_factory: Callable[[Any], Any] | None = None) -> None:
        super().__init__()
        self._factory = engine_factory
        self._engine: Any = None
        self._options: Any = None

    @Slot(object)
    def load(self, options: Any) -> None:
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
            log.warning("loading %s failed", options.model, exc_info=True)
            gpu_failure = is_cuda_failure(exc, str(options.device))
            if previous is not None and not gpu_failure and self._reload(previous):
                self.kept_previous.emit(_message(exc), self._engine.model_label)
                return
            self.load_failed.emit(_message(exc), gpu_failure)
            return
        self._engine, self._options = engine, options
        self.loaded.emit(engine.model_label, time.perf_counter() - t0)

    def _reload(self, options: Any) -> bool:
        """Load the model that worked before a failed switch; True if it is back."""
        from dictation.asr import AsrEngine

        try:
            engine = (self._factory or AsrEngine)(options)
            engine.prepare()
        except Exception:
            log.warning("reloading the previous model %s failed too", options.model, exc_info=True)
            return False
        self._engine, self._options = engine, options
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
        self.loading.emit(str(options.model))
        try:
            engine.set_adapters(options.adapters)
        except Exception as exc:  # a bad adapter: the model keeps the adapters it had
            log.warning("applying adapters failed", exc_info=True)
            self.adapters_failed.emit(_message(exc))
            self.loaded.emit(engine.model_label, 0.0)
            return True
        self._options = options
        self.loaded.emit(engine.model_label, time.perf_counter() - t0)
        return True

    @Slot()
    def unload(self) -> None:
        self._drop()
        self.unloaded.emit()

    def _drop(self) -> None:
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
    """A finished recording, on disk, and the audio to transcribe (trimmed when asked)."""

    path: Path
    samples: np.ndarray  # 16 kHz float32 for the engine; empty when trimming found no speech
    duration_s: float  # of the saved recording
    silence_reason: str | None  # the microphone delivered nothing (muted?)
    error: str | None  # the device failed during the take


class AudioWorker(QObject):
    """Owns the Recorder. ``recorder_factory(RecorderConfig) -> Recorder-like``."""

    started = Signal(int)  # job id: the mic is live
    start_failed = Signal(int, str)
    saved = Signal(int, object)  # job id, SavedTake
    save_failed = Signal(int, str)  # job id, why the audio could not be saved
    opened = Signal(str)  # device name, when the stream was opened ahead of a press
    open_failed = Signal(str)

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

    @Slot(int, float)
    def start(self, job_id: int, t_press: float) -> None:
        from dictation.audio.devices import AudioDeviceError

        if self.recorder is None:
            self._create()
        try:
            self.recorder.start(t_press)
        except (AudioDeviceError, OSError, RuntimeError) as exc:
            self.start_failed.emit(job_id, f"The microphone could not be opened: {exc}")
            return
        self._job = job_id
        self.started.emit(job_id)

    @Slot(int, float, bool, int)
    def stop(self, job_id: int, t_release: float, trim: bool, keep: int) -> None:
        """Stop, save to disk, then trim. ``keep``: recordings to keep on disk (0: the app deletes
        each file itself once its text is in history)."""
        from dictation.audio.recordings import save_recording
        from dictation.audio.trim import find_speech

        if self._job != job_id or self.recorder is None:
            return
        self._job = None
        take = self.recorder.stop(t_release)
        try:
            # keep == 0: no pruning here; the app deletes each file once its text is in history
            path = save_recording(take.samples, take.sample_rate, directory=self._dir, keep=keep if keep > 0 else None)
        except OSError as exc:
            self.save_failed.emit(job_id, f"the recording could not be saved ({exc}); nothing was transcribed")
            return
        samples = take.samples
        silence = take.silence_reason
        if silence is not None:
            samples = samples[:0]
        elif trim:  # one speech search both trims and says whether there is speech at all
            span = find_speech(samples, take.sample_rate)
            samples = samples[span.start : span.end] if span.has_speech else samples[:0]
        self.saved.emit(job_id, SavedTake(path, samples, take.duration_s, silence, take.error))
        self._apply_pending_config()

    @Slot(int)
    def cancel(self, job_id: int) -> None:
        if self._job != job_id or self.recorder is None:
            return
        self._job = None
        self.recorder.cancel()
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
        if self.recorder is not None:
            self.recorder.close()
            self.recorder = None
        self._job = None

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
    """Owns the output chain. ``chain_factory(OutputOptions) -> OutputChain`` (choose_backend by default)."""

    delivered = Signal(int, object)  # history entry id, DeliveryResult
    described = Signal(str)  # the chain's diagnostics after (re)building it

    def __init__(self, chain_factory: Callable[[Any], Any] | None = None) -> None:
        super().__init__()
        self._factory = chain_factory
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
            self.chain = (self._factory or choose_backend)(options)
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
