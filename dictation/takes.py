"""One dictation in the app, from the press to its text: `Takes`, the one owner of every take. Qt-free.

A *take* is one recording the user made (a press and its release, or a tray / IPC start and stop)
with everything that follows from it: its file, its history entry, its transcription, its text.
(The recorder, the take file, the history worker and `dictation.session` all call it that, under
the same id.)

`DictationSession` decides *what* happens (the lifecycle rules); `Takes` keeps what the app knows of
each take meanwhile and decides the app's part: when a take may be transcribed (the session asked
for it and its history entry exists), what goes into the history and when, what is typed, what the
user is told. The controller (`dictation.app.controller`) hands it the session's actions; the
workers' results reach it straight (each signal routed onto the GUI thread), and it calls the
workers through one port (`TakeWorkers`: in the app each call is queued onto the worker's own
thread, `dictation.app.worker_port`). What it reads and tells the app is `TakesApp`. The workers
keep only their thread's resources, by take id: the audio worker its recorder and the take being
recorded, the engine worker a take's stream and its saved samples (they come straight from the
audio worker) until it transcribes or drops them.

One take: `begin` (StartCapture) -> `started` (the audio worker writes its file; the history worker
makes its entry) -> `entry_ready` -> `want_transcription` (Transcribe) -> the engine worker
transcribes the saved take -> `transcribed` (or `no_speech`, `transcribe_failed`) -> `record_text`
(DeliverText: the text is stored first) -> `stored` -> typed (the output worker's `type_text`) ->
`delivered` (the outcome). Or it ends early: `discard` (DiscardCapture) or `skip`
(SkipTranscription: the entry keeps the audio, untranscribed, to be transcribed again from the
history).

Engine requests that are not takes are `Retranscription`s (a history entry transcribed again, or a
take a crash interrupted, recovered at the next start and never typed); deliveries that are not
takes are `Retype`s (the history window's "type again"). The types say which; no id range does.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from dictation import session as S
from dictation.audio.trim import find_speech, transcribed_part
from dictation.config.history import Outcome
from dictation.vocabulary import model_context

log = logging.getLogger(__name__)

# A take that begins this much after its press has lost words; the user (and a `dictation start`) is told.
LATE_START_S = 0.05


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

    @property
    def has_speech(self) -> bool:
        """False: nothing to transcribe (the microphone delivered nothing, or trimming found no speech)."""
        return self.silence_reason is None and self.end > self.start


@dataclass
class Take:
    """What the app knows of one take while it is under way."""

    id: int
    streaming: bool = False  # transcribed while it records (the engine worker was told at the press)
    started: bool = False  # the audio worker started it, so the history worker makes its entry
    entry_ready: bool = False  # its history entry (or journal record) exists: it may be transcribed
    transcribe_wanted: bool = False  # the session asked for its transcription, not sent yet
    skip_reason: str | None = None  # the session said it is not transcribed, and why
    saved: SavedTake | None = None
    transcript: Any = None  # the engine's Transcript
    text: str | None = None  # the text to type (text options applied), once asked to store it
    plan: Any = None  # what typing it means (output.steps.Plan: voice commands applied)
    # the `dictation start` (or toggle) that began it, waiting to hear that the microphone records:
    # its answer callback and when it is answered at the latest (monotonic seconds)
    start_reply: tuple[Callable[[dict], None], float] | None = None


@dataclass(frozen=True)
class Retranscription:
    """An engine request for a history entry, not for a take under way."""

    entry_id: int
    streamed: bool = False  # the entry's take was transcribed while recorded: trimmed at its end only
    recovered: bool = False  # a take a crash interrupted: its text goes into the history, never typed


@dataclass(frozen=True)
class Retype:
    """A delivery of a history entry's text (typed again from the history window), not of a take."""

    entry_id: int


class Emits(Protocol):
    """A Qt signal as `Takes` uses it."""

    def emit(self, *args: Any) -> None: ...


class TakesApp(Protocol):
    """What `Takes` reads and tells on the GUI thread (the controller): settings, state, session events,
    notices, the history to read an entry from."""

    @property
    def settings(self) -> Any: ...  # dictation.config.Settings
    @property
    def model_label(self) -> str: ...
    @property
    def model_ready(self) -> bool: ...
    @property
    def running(self) -> bool: ...  # False once quitting began: the output worker has stopped
    @property
    def history(self) -> Any: ...  # dictation.config.History: get(entry_id) -> HistoryEntry | None
    @property
    def retranscribed(self) -> Emits: ...  # (entry id, "" when the text was replaced, else why not)

    def dispatch(self, event: Any) -> None: ...  # a session event
    def notify(self, level: str, message: str, *, log_as: str | None = None) -> None: ...


# What `Takes` asks of each worker; in the app each call is queued onto the worker's thread
# (dictation.app.worker_port), run there in the order it was made.


class TakeEngine(Protocol):
    """`dictation.app.engine_worker.EngineWorker`."""

    def transcribe_take(self, take_id: int, language: str | None, context: str) -> None: ...
    def cancel_take(self, take_id: int) -> None: ...  # the take's stream and saved samples go
    def transcribe(self, key: Retranscription, samples: np.ndarray, language: str | None, context: str) -> None: ...


class TakeHistory(Protocol):
    """`dictation.app.history_worker.HistoryWorker`."""

    def begin_take(self, take_id: int, audio_path: Any) -> None: ...
    def store_text(self, take_id: int, fields: dict) -> None: ...  # text first: before it is typed
    def finish_take(self, take_id: int, fields: dict, delete_audio: bool, keep: int) -> None: ...
    def discard_take(self, take_id: int, delete_audio: bool, keep: int) -> None: ...
    def update_entry(self, entry_id: int, fields: dict) -> None: ...


class TakeOutput(Protocol):
    """`dictation.app.workers.OutputWorker`."""

    def type_text(self, key: int | Retype, text: Any) -> None: ...  # a str, or an output.steps.Plan


class TakeWorkers(Protocol):
    """The workers as `Takes` reaches them (dictation.app.worker_port.WorkerPort)."""

    @property
    def engine(self) -> TakeEngine: ...
    @property
    def history(self) -> TakeHistory: ...
    @property
    def output(self) -> TakeOutput: ...


class Takes:
    """The owner of every take under way and of the history's re-transcriptions; see the module docstring."""

    def __init__(self, app: TakesApp, workers: TakeWorkers) -> None:
        self._app = app
        self._engine, self._history, self._output = workers.engine, workers.history, workers.output
        self._takes: dict[int, Take] = {}
        self._recovery: list[Any] = []  # history_worker.RecoveredTakes waiting for the model
        self._recover_counts = [0, 0, 0]  # recovered takes: found, transcribed so far, with text

    def get(self, take_id: int) -> Take | None:
        return self._takes.get(take_id)

    def __contains__(self, take_id: int) -> bool:
        return take_id in self._takes

    def __len__(self) -> int:
        return len(self._takes)

    def _take(self, take_id: int) -> Take:
        take = self._takes.get(take_id)
        if take is None:
            take = self._takes[take_id] = Take(take_id)
        return take

    def _keep(self) -> int:
        return self._app.settings.general.keep_recordings

    def language_context(self) -> tuple[str | None, str]:
        """The forced language (None: detect) and the model's context: the user's vocabulary text and the
        words learned from corrections (`dictation.vocabulary.model_context`)."""
        t = self._app.settings.transcription
        return (None if t.language == "auto" else t.language), model_context(t)

    # ---- the session's actions ----------------------------------------------------------------------

    def begin(self, take_id: int) -> Take:
        """StartCapture: a new take; ``streaming`` when it is transcribed while it records (the model
        is loaded and the settings ask for it)."""
        streaming = self._app.settings.engine.stream_while_recording and self._app.model_ready
        take = self._takes[take_id] = Take(take_id, streaming=streaming)
        return take

    def discard(self, take_id: int) -> None:
        """DiscardCapture (cancelled, too short, nothing recorded): no entry is kept, no audio."""
        take = self._takes.pop(take_id, None)
        if take is not None and take.streaming:
            self._engine.cancel_take(take_id)
        if take is not None and take.started:
            self._history.discard_take(take_id, False, self._keep())

    def want_transcription(self, take_id: int) -> None:
        """Transcribe: asked of the engine worker as soon as the take's history entry exists."""
        take = self._take(take_id)
        take.transcribe_wanted = True
        self._maybe_transcribe(take)

    def skip(self, take_id: int, reason: str) -> None:
        """SkipTranscription: the model is unavailable; the entry keeps the audio, untranscribed."""
        self._take(take_id).skip_reason = reason
        self._maybe_record_skip(take_id)

    # ---- the workers' answers ---------------------------------------------------------------------

    def started(self, take_id: int, audio_path: Any) -> bool:
        """The microphone records the take, into ``audio_path``: its history entry is made. False for
        a take that is no longer wanted (discarded before it even started)."""
        take = self._takes.get(take_id)
        if take is None:
            return False
        if not take.started:
            take.started = True
            self._history.begin_take(take_id, audio_path)
        return True

    def entry_ready(self, take_id: int, durable: bool = True) -> None:
        """The take's history entry exists (``durable``: in the database, else in the journal)."""
        take = self._takes.get(take_id)
        if take is not None:
            take.entry_ready = True
            self._maybe_transcribe(take)

    def saved(self, take_id: int, saved: SavedTake) -> None:
        """The audio worker saved the take (the engine worker got it too, straight from that thread)."""
        take = self._take(take_id)
        take.saved = saved
        if saved.path is not None:
            gap = saved.start_gap_s
            late = f"; it began {gap:.2f} s after the press" if gap is not None and gap > LATE_START_S else ""
            log.info("recording %d saved: %s (%.1f s%s)", take_id, saved.path, saved.duration_s, late)
        if saved.error:
            self._app.notify("warning", saved.error)
        if saved.save_error is not None and take.skip_reason is None:
            self._app.notify(
                "warning",
                f"The recording could not be saved ({saved.save_error}). It is transcribed from memory and "
                "typed as usual, and its text is kept in the history, but the audio is not kept.",
            )
        self._maybe_record_skip(take_id)

    def no_speech(self, take_id: int) -> None:
        """The engine worker found nothing to transcribe in the saved take (muted, or only silence)."""
        take = self._takes.get(take_id)
        if take is not None and take.saved is not None and take.saved.silence_reason is not None:
            self._app.notify("warning", take.saved.silence_reason)
        self._no_text(take_id)
        self._app.dispatch(S.TranscriptionDone(take_id, ""))

    def transcribed(self, key: int | Retranscription, transcript: Any) -> None:
        if isinstance(key, Retranscription):
            self._retranscribed(key, transcript)
            return
        take = self._takes.get(key)
        if take is not None:
            take.transcript = transcript
        language = transcript.language or "not named by the model"
        log.info("transcribed take %d: %d characters, language %s", key, len(transcript.text), language)
        if not transcript.text.strip():
            self._no_text(key)
        self._app.dispatch(S.TranscriptionDone(key, transcript.text, transcript.language or None))

    def transcribe_failed(self, key: int | Retranscription, message: str) -> None:
        if isinstance(key, Retranscription):
            if key.recovered:
                outcome = Outcome.failed(f"interrupted by a crash; transcribing it at the next start failed: {message}")
                self._history.update_entry(key.entry_id, {"outcome": outcome})
                self._count_recovered()
            else:
                self._app.notify("error", f"Re-transcription failed: {message}")
                self._app.retranscribed.emit(key.entry_id, f"Re-transcription failed: {message}")
            return
        take = self._takes.get(key)
        audio_saved = take is None or take.saved is None or take.saved.path is not None
        self._app.dispatch(S.TranscriptionFailed(key, message, audio_saved=audio_saved))
        if take is not None and take.saved is not None:
            self._record_untranscribed(key, f"transcription failed: {message}")

    def record_text(self, action: S.DeliverText) -> None:
        """DeliverText: history first: the text is planned and stored (database or journal), then typed
        once it is (`stored`)."""
        take = self._take(action.take_id)
        plan = plan_text(action.text, action.language, self._app.settings)
        transcript, saved = take.transcript, take.saved
        take.text, take.plan = plan.text, plan
        fields = {
            "text": plan.text,
            "raw_text": action.text,
            "language": action.language,
            "duration_s": saved.duration_s if saved else None,
            "model_label": self._app.model_label or None,
            "audio_path": saved.path if saved else None,
            "timings": dict(transcript.timings) if transcript is not None else None,
            "streamed": saved is not None and saved.streamed,
        }
        self._history.store_text(action.take_id, fields)

    def stored(self, take_id: int, durable: bool = True) -> None:
        """The take's text is in the history (``durable``), or its journal: now it is typed."""
        take = self._takes.get(take_id)
        if take is None or take.text is None:
            return
        if not self._app.running:  # quitting: the output worker has stopped; the text stays in history
            self._takes.pop(take_id, None)
            fields = {"outcome": Outcome.failed("the app quit before the text could be typed")}
            self._history.finish_take(take_id, fields, False, self._keep())
            return
        plan = take.plan
        if plan is not None and plan.taken_back:  # "... scratch that": the dictation took itself back
            self._takes.pop(take_id, None)
            keep = self._keep()
            fields = {"outcome": Outcome.command("scratch that: this dictation was taken back, nothing typed")}
            self._history.finish_take(take_id, fields, keep == 0, keep)
            return
        self._output.type_text(take_id, take.text if plan is None or plan.plain else plan)

    def delivered(self, key: int | Retype, result: Any) -> None:
        if isinstance(key, Retype):
            if not result.ok:
                held_back = getattr(result, "held_back", None)
                self._app.notify("warning", delivery_message(result) if held_back else result.message)
            return
        take = self._takes.pop(key, None)
        plan = take.plan if take is not None else None
        only_undo = plan is not None and plan.undoes and not plan.text
        if result.undo_refused:
            self._app.notify("warning", f'"Scratch that" was not done: {result.undo_refused}.')
        if not result.ok and not (only_undo and result.undo_refused):
            self._app.notify("warning", delivery_message(result))
        outcome = outcome_of(result)
        if only_undo:
            why = result.undo_refused or result.message
            removed = f"scratch that: removed {result.undone} characters"
            outcome = Outcome.command(removed) if result.ok else Outcome.failed(f"scratch that not performed: {why}")
        # keep == 0: the text is safely in history, the recording is no longer needed
        keep = self._keep()
        self._history.finish_take(key, {"outcome": outcome}, keep == 0 and take is not None, keep)

    # ---- a command waiting for its take's microphone -------------------------------------------------

    def await_start(self, take_id: int, answer: Callable[[dict], None], due: float) -> None:
        """The command that began take ``take_id`` is answered once its microphone records, or at ``due``."""
        self._take(take_id).start_reply = (answer, due)

    def answer_start(self, take_id: int, reply: dict) -> None:
        """Answer the command that began take ``take_id``, if one still waits."""
        take = self._takes.get(take_id)
        if take is not None and take.start_reply is not None:
            answer, take.start_reply = take.start_reply[0], None
            answer(reply)

    def start_replies(self) -> dict[int, float]:
        """Take id -> when its waiting command is answered at the latest."""
        return {take.id: take.start_reply[1] for take in self._takes.values() if take.start_reply is not None}

    # ---- a take's way to the engine, or to the history untranscribed ----------------------------------

    def _maybe_transcribe(self, take: Take) -> None:
        if not take.transcribe_wanted or not take.entry_ready:
            return
        take.transcribe_wanted = False
        language, context = self.language_context()
        self._engine.transcribe_take(take.id, language, context)  # the engine worker has, or gets, the samples

    def _maybe_record_skip(self, take_id: int) -> None:
        """A skipped take's audio stays findable: its entry, untranscribed, points at it."""
        take = self._takes.get(take_id)
        if take is None or take.skip_reason is None or take.saved is None:
            return
        self._engine.cancel_take(take_id)  # after the saved take reached the engine worker: it is dropped too
        self._record_untranscribed(take_id, f"not transcribed: {take.skip_reason}")

    def _record_untranscribed(self, take_id: int, reason: str) -> None:
        """The take's entry keeps no text, an outcome saying why, and the saved audio, so it can be
        re-transcribed later; without audio there is nothing to keep, and the user is told."""
        take = self._takes.pop(take_id, None)
        if take is None or not take.started:
            return
        saved = take.saved
        keep = self._keep()
        if saved is None or saved.path is None:
            self._history.discard_take(take_id, False, keep)
            why = saved.save_error if saved is not None else "it was not saved"
            self._app.notify("error", f"The recording could not be saved either ({why}), so this dictation is lost.")
            return
        fields = {"outcome": Outcome.failed(reason), "duration_s": saved.duration_s, "audio_path": saved.path}
        self._history.finish_take(take_id, fields, False, keep)

    def _no_text(self, take_id: int) -> None:
        """A take without speech: no history entry (as before), its recording pruned as usual."""
        take = self._takes.pop(take_id, None)
        if take is not None and take.started:
            keep = self._keep()
            self._history.discard_take(take_id, keep == 0, keep)

    # ---- history entries transcribed again ------------------------------------------------------------

    def retranscribe(self, entry_id: int) -> None:
        """Transcribe an entry's saved recording again (the history window), trimmed as the first time."""
        from dictation.audio.wav import load_audio_16k

        entry = self._app.history.get(entry_id)
        if entry is None or entry.audio_path is None:
            self._refuse(entry_id, "warning", "This dictation has no saved recording to transcribe again.")
            return
        if not self._app.model_ready:
            self._refuse(entry_id, "warning", "The speech model is not loaded; try again once it is ready.")
            return
        try:
            samples = load_audio_16k(entry.audio_path)
        except Exception as exc:  # a missing or damaged file: say which
            self._refuse(entry_id, "error", f"Cannot read {entry.audio_path}: {exc}")
            return
        request = Retranscription(entry_id, streamed=entry.streamed)
        self._transcribe_entry(request, samples)

    def _refuse(self, entry_id: int, level: str, message: str) -> None:
        self._app.notify(level, message)
        self._app.retranscribed.emit(entry_id, message)

    def _transcribe_entry(self, request: Retranscription, samples: np.ndarray) -> None:
        if self._app.settings.recording.trim_silence:  # as the first time, so the results compare
            start, end = transcribed_part(find_speech(samples), streamed=request.streamed)
            samples = samples[start:end]  # without speech: the whole recording
        language, context = self.language_context()
        self._engine.transcribe(request, samples, language, context)

    def _retranscribed(self, request: Retranscription, transcript: Any) -> None:
        settings = self._app.settings
        text = plan_text(transcript.text, transcript.language, settings).text if transcript.text.strip() else ""
        fields = {
            "text": text,
            "raw_text": transcript.text,
            "language": transcript.language or None,
            "model_label": self._app.model_label,
            "timings": dict(transcript.timings),
            "streamed": request.streamed,
        }
        entry_id = request.entry_id
        if request.recovered:  # into the history only: old text is never typed into whatever has the focus now
            fields["outcome"] = Outcome.RECOVERED
            if settings.general.keep_recordings == 0:  # its text is safe: the recording goes
                fields["audio_path"] = None
            self._history.update_entry(entry_id, fields)
            self._count_recovered(bool(text))
            return
        self._history.update_entry(entry_id, fields)
        self._app.retranscribed.emit(entry_id, "")
        self._app.notify(
            "info",
            f"Transcribed again: {text.strip()[:80] or '(no speech)'}",
            log_as=f"history entry {entry_id} transcribed again: {len(text)} characters",
        )

    # ---- takes a crash interrupted ------------------------------------------------------------------

    def recovered(self, takes: list[Any]) -> None:
        """Takes the last run left untranscribed (killed while recording or transcribing): they are
        transcribed into the history once the model is ready, each as "recovered", never typed."""
        self._recovery.extend(takes)
        self._recover_counts[0] += len(takes)
        self.transcribe_recovered()

    def transcribe_recovered(self) -> None:
        if not self._app.model_ready:
            return  # they wait (and stay pending in the history) until a model works
        while self._recovery:
            take = self._recovery.pop(0)
            self._transcribe_entry(Retranscription(take.entry_id, recovered=True), take.samples)

    def _count_recovered(self, with_text: bool = False) -> None:
        counts = self._recover_counts
        counts[1] += 1
        counts[2] += int(with_text)
        if counts[1] < counts[0]:
            return
        kept = counts[2]
        self._recover_counts = [0, 0, 0]
        if kept:
            self._app.notify(
                "info",
                f"Recovered {kept} dictation(s) interrupted when the app last stopped. Their text is in the "
                "History, marked Recovered; nothing was typed.",
            )


def apply_text_options(text: str, settings: Any) -> str:
    from dictation.output.textops import TextOptions, apply

    return apply(text, TextOptions.from_settings(settings.output))


def plan_text(transcript: str, language: str | None, settings: Any) -> Any:
    """What typing ``transcript`` means (an output.steps.Plan): voice commands and spoken punctuation as
    the settings ask (`dictation.spoken`, in ``language``: the model's, else the one set), then the text
    options. Its ``text`` is what the history keeps as typed."""
    from dictation.output.steps import Plan, plan_for
    from dictation.output.textops import TextOptions, apply
    from dictation.spoken import parse, table_for, user_table

    options = TextOptions.from_settings(settings.output)
    commands = settings.commands
    if not commands.enabled and not commands.spoken_punctuation:
        text = apply(transcript, options)
        return Plan((text,) if text else ())
    if not language and settings.transcription.language != "auto":
        language = settings.transcription.language
    table = table_for(language, user_table(commands.phrases))
    actions = parse(transcript, table, commands=commands.enabled, punctuation=commands.spoken_punctuation)
    return plan_for(actions, options)


def outcome_of(result: Any) -> str:
    """History outcome for a DeliveryResult: what really happened to the text.

    Held back (our own window or no window had the focus): "clipboard_only: <why>", or failed when
    even the clipboard could not take it. The clipboard-only backend sent nothing to any window, so
    its success is "clipboard_only", never "pasted"."""
    held_back = getattr(result, "held_back", None)
    if held_back:
        if result.on_clipboard:
            return Outcome.kept(f"not delivered: {held_back}")
        return Outcome.failed(result.message)
    if result.ok:
        if result.method == "clipboard":
            return Outcome.CLIPBOARD_ONLY
        return Outcome.TYPED if str(result.method).endswith("-type") else Outcome.PASTED
    if result.on_clipboard:
        return Outcome.CLIPBOARD_ONLY
    return Outcome.failed(result.message)


def delivery_message(result: Any) -> str:
    """What the user is told about text that was not typed."""
    held_back = getattr(result, "held_back", None)
    if held_back:  # "a Dictation window had the keyboard focus", "no window had the keyboard focus"
        if result.on_clipboard:
            return f"Not typed: {held_back}. The text is on the clipboard: click where it belongs and paste it."
        return f"Not typed: {held_back}. The text is in the history. ({result.message})"
    if result.on_clipboard:
        return f"The text could not be typed; it is on the clipboard, paste it yourself. ({result.message})"
    return f"The text could not be typed; it is in the history. ({result.message})"
