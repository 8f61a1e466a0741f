"""Worker objects that run the blocking parts off the GUI thread (docs/architecture.md, principle 4).

Each worker is a QObject moved to its own QThread; the GUI thread calls its methods as calls queued
onto that thread (`worker_port.py`) and hears back through the worker's signals, routed onto the
GUI thread, so nothing here ever blocks the GUI:

- `EngineWorker` (`engine_worker.py`) owns the `AsrEngine`: load, transcribe, unload, and the
  takes transcribed while they are recorded. The audio worker hands it each saved take directly
  (``saved`` -> ``EngineWorker.take_saved``, audio thread -> engine thread), as it hands it the
  audio of a streamed take while it records (``chunk_ready`` -> ``EngineWorker.feed``).
- `AudioWorker` owns the `Recorder`: open, start, stop (blocks ~0.25 s for the tail), and the
  take on disk *while* it is recorded (`TakeFile`: the new audio is appended every
  ``STREAM_PULL_MS``, so a crash loses at most that much) and whole before anything is transcribed
  (principle 7), then trimming for the engine. If the recordings folder cannot be written (full,
  read-only), the take is transcribed from memory all the same and ``SavedTake.save_error`` says
  why the audio was not kept. While a streamed take records, the same pulls hand the new audio to
  the engine.
- `OutputWorker` owns the `OutputChain`: delivering text blocks while keys are sent.
- `DownloadWorker` fetches a model into the Hugging Face cache with byte progress and cancel.

What a take is and who keeps what of it: `dictation.takes`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, QThread, QTimer, Signal, Slot

from dictation.app import gui_gc
from dictation.app.engine_worker import EngineWorker
from dictation.asr import SAMPLE_RATE
from dictation.audio.trim import transcribed_part
from dictation.output.hold import KeyHold
from dictation.takes import SavedTake

log = logging.getLogger(__name__)

__all__ = ["AudioWorker", "DownloadWorker", "EngineWorker", "OutputWorker", "RecorderConfig", "SavedTake"]

STREAM_PULL_MS = 500  # how often a streamed take's new audio goes to the engine
FIRST_BLOCK_WAIT_S = 1.0  # a microphone opened at the press: how long `start` waits to learn when its audio begins


def start_thread(worker: QObject, name: str) -> QThread:
    """Move ``worker`` to a new running QThread named ``name`` and return the thread."""
    thread = QThread()
    thread.setObjectName(name)
    worker.moveToThread(thread)
    gui_gc.hold()  # from now on cycles are collected on the GUI thread only (gui_gc.py)
    thread.start()
    return thread


def stop_thread(thread: QThread, timeout_ms: int = 10_000) -> bool:
    """Ask ``thread`` to stop once its current slot returns, and wait for it; False if it did not stop in time."""
    thread.quit()
    stopped = thread.wait(timeout_ms)
    gui_gc.release()
    if not stopped:
        log.warning("the %s thread did not stop within %.0f s", thread.objectName(), timeout_ms / 1000)
    return stopped


# Quitting waits this long for the engine's thread. A torch call (loading the weights, a transcription,
# the warm-up pass) cannot be interrupted, and a take being transcribed is already safe on disk with
# its pending history entry (docs/architecture.md, principle 7), which the next start transcribes: so quitting
# does not wait for the call to end; the app ends its process without it (main.py, `leave`).
ENGINE_STOP_WAIT_MS = 500


def stop_threads(threads: list[QThread], engine: Any) -> list[QThread]:
    """Stop the workers' threads in order; returns those left running: the engine's, when it is in
    a call longer than `ENGINE_STOP_WAIT_MS`. Whatever it says after that (``engine``'s signals) is
    dropped: the app is quitting, and its take is transcribed at the next start. An engine whose
    thread stopped is closed (``engine.close()``): its model is freed now, not when the process ends."""
    left = []
    for thread in threads:
        if thread.objectName() != "engine":
            stop_thread(thread)
            continue
        thread.quit()
        stopped = thread.wait(ENGINE_STOP_WAIT_MS)
        gui_gc.release()  # the process ends soon without it
        if stopped:
            engine.close()
        else:
            engine.blockSignals(True)
            log.info(
                "quitting while the engine is busy (loading, transcribing or warming up cannot be "
                "interrupted): a take it was transcribing stays pending and is transcribed at the next start"
            )
            left.append(thread)
    return left


# ---- audio --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RecorderConfig:
    device: str | None  # None: the system default
    max_seconds: float
    keep_open: bool


class AudioWorker(QObject):
    """Owns the Recorder. ``recorder_factory(RecorderConfig) -> Recorder-like``."""

    # take id, the take's file being written (None: it could not be created), and the take's first
    # sample minus its press in seconds (Recorder.start_gap; None: not known): > 0 means audio after the
    # press is missing
    started = Signal(int, object, object)
    start_failed = Signal(int, str)
    saved = Signal(int, object)  # take id, SavedTake (also when the file could not be written)
    opened = Signal(str)  # device name, when the stream was opened ahead of a press
    open_failed = Signal(str)
    chunk_ready = Signal(int, int, object)  # take id, index of the first sample in the take, 16 kHz samples

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
        self._take_id: int | None = None
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
        if self.recorder is not None and self._take_id is None:
            self.recorder.close()
            self.recorder = None
        if self._take_id is None:
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
    def start(self, take_id: int, t_press: float, stream: bool = False) -> None:
        """Start take ``take_id``. ``stream``: hand its audio on (``chunk_ready``) while it records,
        if the device delivers 16 kHz; the saved take then says ``streamed``."""
        from dictation.audio.devices import AudioDeviceError

        if self.recorder is None:
            self._create()
        try:
            self.recorder.start(t_press)
        except (AudioDeviceError, OSError, RuntimeError) as exc:
            self.start_failed.emit(take_id, f"The microphone could not be opened: {exc}")
            return
        self._take_id = take_id
        self._pulled = 0
        self._open_file(take_id)
        self._streaming = stream and self._can_stream()
        if self._file is not None or self._streaming:
            self._pull_timer.start(STREAM_PULL_MS)
        if stream and not self._streaming:
            log.info("take %d is transcribed after the recording: the microphone runs at %s Hz", take_id, self._rate())
        # how far the take reaches back: it begins after the press when the microphone opened later
        gap = self.recorder.start_gap(FIRST_BLOCK_WAIT_S) if hasattr(self.recorder, "start_gap") else None
        self.started.emit(take_id, self._file.path if self._file is not None else None, gap)

    def _open_file(self, take_id: int) -> None:
        """The take's file, written while it records (if the recorder can be read while it records)."""
        from dictation.audio.recordings import TakeFile

        self._file, self._file_error = None, None
        if not hasattr(self.recorder, "take_samples"):
            return
        try:
            self._file = TakeFile.create(self._rate() or SAMPLE_RATE, directory=self._dir)
        except OSError as exc:  # the take goes on in memory; the save at the end tries again
            self._file_error = str(exc)
            log.warning("take %d: cannot write the recording while it records: %s", take_id, exc)

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
        if self._take_id is None or (self._file is None and not self._streaming):
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
                log.warning("take %d: %s", self._take_id, exc)
        if self._streaming:
            self.chunk_ready.emit(self._take_id, self._pulled, chunk)
        self._pulled += len(chunk)

    def _end_streaming(self) -> bool:
        self._pull_timer.stop()
        streamed, self._streaming = self._streaming, False
        return streamed

    @Slot(int, float, bool)
    def stop(self, take_id: int, t_release: float, trim: bool) -> None:
        """Stop, save to disk, then trim (`transcribed_part`: a streamed take keeps its start). The
        saved take goes to the engine worker and to the controller at once. Old recordings are
        pruned by the history worker, which knows which ones are still needed."""
        from dictation.audio.trim import find_speech

        if self._take_id != take_id or self.recorder is None:
            return
        self._take_id = None
        streamed = self._end_streaming()
        take = self.recorder.stop(t_release)
        path, save_error = self._save(take_id, take)
        samples = take.samples
        silence = take.silence_reason
        start, end = 0, len(samples)
        if silence is not None:
            start = end = 0
        elif trim:  # one speech search both trims and says whether there is speech at all
            span = find_speech(samples, take.sample_rate)
            start, end = transcribed_part(span, streamed=streamed) if span.has_speech else (0, 0)
        saved = SavedTake(
            path, samples, start, end, take.duration_s, silence, take.error, streamed, save_error, take.start_gap_s
        )
        self.saved.emit(take_id, saved)
        self._apply_pending_config()

    def _save(self, take_id: int, take: Any) -> tuple[Path | None, str | None]:
        """The whole take on disk, replacing the file written while it recorded: (path, None), or
        (None, why) when it cannot be written; then the partial file is deleted too."""
        from dictation.audio.recordings import save_recording

        take_file, self._file = self._file, None
        try:
            if take_file is not None:
                return take_file.finish(take.samples, take.sample_rate), None
            return save_recording(take.samples, take.sample_rate, directory=self._dir), None
        except (OSError, ValueError) as exc:
            log.warning("take %d: the recording could not be saved: %s", take_id, exc)
            if take_file is not None:
                take_file.discard()
            return None, str(exc)

    @Slot(int)
    def cancel(self, take_id: int) -> None:
        if self._take_id != take_id or self.recorder is None:
            return
        self._take_id = None
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
        if self._take_id is not None:
            self._pull()  # the audio since the last pull
            self._close_file(discard=False)
        if self.recorder is not None:
            self.recorder.close()
            self.recorder = None
        self._take_id = None

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
        return recorder.error if recorder is not None and self._take_id is not None else None

    def limit_reached(self) -> bool:
        recorder = self.recorder
        return bool(recorder is not None and self._take_id is not None and recorder.limit_reached)


def _real_recorder(config: RecorderConfig) -> Any:
    from dictation.audio.capture import Recorder

    return Recorder(config.device, max_seconds=config.max_seconds, keep_open=config.keep_open)


# ---- output -------------------------------------------------------------------------------------


class OutputWorker(QObject):
    """Owns the output chain. ``chain_factory(OutputOptions) -> OutputChain`` (by default
    ``choose_backend``, given ``own_window``: which of our windows has the focus, so no text is
    pasted into them; the controller sets it to `dictation.app.focus.OwnFocus` before it starts)."""

    delivered = Signal(object, object)  # the key type_text() was given (a take id, or a takes.Retype), DeliveryResult
    described = Signal(str)  # the chain's diagnostics after (re)building it

    def __init__(
        self, chain_factory: Callable[[Any], Any] | None = None, own_window: Callable[[], str | None] | None = None
    ) -> None:
        super().__init__()
        self._factory = chain_factory
        self.own_window = own_window
        self.hold = KeyHold()  # the hotkeys held now, fed by HotkeyInput: keys wait for their release
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
                self.chain = choose_backend(options, own_window=self.own_window, hold=self.hold)
        except ValueError as exc:
            log.error("text output: %s", exc)
            self.chain = None
            self.described.emit(f"text output unavailable: {exc}")
            return
        self.described.emit(self.chain.describe())

    @Slot(object, object)
    def type_text(self, key: Any, text: Any) -> None:
        """Type ``text`` into the focused window through the chain (`OutputChain.deliver` a str,
        `OutputChain.perform` an output.steps.Plan: voice commands' keys, "scratch that"), then say
        how it went: ``delivered(key, DeliveryResult)``."""
        from dictation.output import DeliveryResult

        if self.chain is None:
            result = DeliveryResult("none", False, "no text output method is configured; the text is only in history")
        else:
            try:
                result = self.chain.deliver(text) if isinstance(text, str) else self.chain.perform(text.steps)
            except Exception as exc:  # a backend bug must not lose the result: history already has the text
                log.exception("delivering text failed")
                result = DeliveryResult("error", False, f"text output failed: {exc}; the text is in history")
        self.delivered.emit(key, result)

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
        from dictation.asr.checkpoints.hub import download_model
        from dictation.asr.errors import AsrError

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
