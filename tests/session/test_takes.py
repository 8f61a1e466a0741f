"""`dictation.takes.Takes`, the owner of every take, without Qt: a fake app and fake workers record
what it asks (a worker's call as "worker.method")."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from dictation import session as S
from dictation.audio.trim import find_speech, transcribed_part
from dictation.audio.wav import write_wav
from dictation.config import Outcome, Settings
from dictation.config.settings import LearnedWord
from dictation.output import DeliveryResult
from dictation.takes import (
    Retranscription,
    Retype,
    SavedTake,
    TakeEngine,
    TakeHistory,
    TakeOutput,
    Takes,
    apply_text_options,
)

SR = 16_000


class Recorder:
    """A worker (or a signal) as `Takes` calls it: each call of a method ``m`` is logged as ``prefix + m``,
    if the Protocol lists it."""

    def __init__(self, calls: list[tuple], prefix: str, protocol: type | None = None) -> None:
        self._calls, self._prefix = calls, prefix
        self._names = {n for n in vars(protocol) if not n.startswith("_")} if protocol else None

    def __getattr__(self, name: str):
        if name.startswith("_") or (self._names is not None and name not in self._names):
            raise AttributeError(name)
        return lambda *args: self._calls.append((self._prefix + name, *args))


@dataclass
class FakePort:
    """The app and its workers, as `Takes` sees them (`TakesApp`, `TakeWorkers`): settings and state
    to read, and a log of everything asked of them."""

    settings: Settings = field(default_factory=Settings)
    model_label: str = "tiny · cpu"
    model_ready: bool = True
    running: bool = True
    entries: dict[int, Any] = field(default_factory=dict)
    calls: list[tuple] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.history = SimpleNamespace(get=self.entries.get)  # what the app's history holds
        self.retranscribed = SimpleNamespace(emit=lambda *args: self.calls.append(("retranscribed", *args)))
        self.workers = SimpleNamespace(
            engine=Recorder(self.calls, "engine.", TakeEngine),
            history=Recorder(self.calls, "history.", TakeHistory),
            output=Recorder(self.calls, "output.", TakeOutput),
        )

    def dispatch(self, event: Any) -> None:
        self.calls.append(("dispatch", event))

    def notify(self, level: str, message: str, *, log_as: str | None = None) -> None:
        self.calls.append(("notify", level, message, *([log_as] if log_as is not None else [])))

    def named(self, *names: str) -> list[tuple]:
        return [c for c in self.calls if c[0] in names]


def saved_take(path: Path | None = Path("/rec/1.wav"), *, speech: bool = True, streamed: bool = False, **kw):
    samples = np.ones(SR, np.float32) * 0.1
    end = SR if speech else 0
    return SavedTake(path, samples, 0, end, 1.0, kw.pop("silence_reason", None), None, streamed, **kw)


def transcript(text: str = "hello world", language: str = "English") -> Any:
    return SimpleNamespace(text=text, language=language, timings={"total": 0.25})


@pytest.fixture
def port() -> FakePort:
    return FakePort()


@pytest.fixture
def takes(port) -> Takes:
    return Takes(port, port.workers)


def started(takes: Takes, take_id: int = 1) -> None:
    takes.begin(take_id)
    assert takes.started(take_id, Path(f"/rec/{take_id}.wav"))


@pytest.mark.parametrize("entry_first", [True, False])
def test_a_take_goes_to_the_engine_once_it_is_wanted_and_its_entry_exists(takes, port, entry_first):
    port.settings = port.settings.replace(transcription=port.settings.transcription.replace(language="German"))
    started(takes)
    assert port.named("history.begin_take") == [("history.begin_take", 1, Path("/rec/1.wav"))]
    first, second = (
        (takes.entry_ready, takes.want_transcription) if entry_first else (takes.want_transcription, takes.entry_ready)
    )
    first(1)
    assert port.named("engine.transcribe_take") == []  # not before both: the entry exists before transcription
    second(1)
    assert port.named("engine.transcribe_take") == [("engine.transcribe_take", 1, "German", "")]
    takes.saved(1, saved_take())  # the samples went to the engine worker directly: nothing more to send
    assert len(port.named("engine.transcribe_take")) == 1


def test_the_model_is_given_the_users_vocabulary_and_the_words_learned_from_corrections(takes, port):
    learned = (LearnedWord(word="kubectl", heard="cube cuddle", dictated="2026-11-30T14:03:00+00:00", entry_id=4),)
    transcription = port.settings.transcription.replace(context="Kubernetes, PySide6", learned_words=learned)
    port.settings = port.settings.replace(transcription=transcription)
    started(takes)
    takes.entry_ready(1)
    takes.want_transcription(1)
    assert port.named("engine.transcribe_take") == [("engine.transcribe_take", 1, None, "Kubernetes, PySide6\nkubectl")]


def test_a_take_discarded_before_it_started_makes_no_entry(takes, port):
    port.settings = port.settings.replace(engine=port.settings.engine.replace(stream_while_recording=False))
    takes.begin(1)
    takes.discard(1)
    assert not takes.started(1, Path("/rec/1.wav"))
    assert port.calls == [] and 1 not in takes


def test_a_streamed_take_discarded_drops_its_stream_and_its_entry(takes, port):
    port.settings = port.settings.replace(engine=port.settings.engine.replace(stream_while_recording=True))
    assert takes.begin(1).streaming
    takes.started(1, Path("/rec/1.wav"))
    takes.discard(1)
    keep = port.settings.general.keep_recordings
    assert port.named("engine.cancel_take", "history.discard_take") == [
        ("engine.cancel_take", 1),
        ("history.discard_take", 1, False, keep),
    ]
    port.model_ready = False
    assert not takes.begin(2).streaming  # no model loaded: nothing to stream into


def test_a_silent_take_says_why_keeps_no_entry_and_is_done_without_text(takes, port):
    port.settings = port.settings.replace(general=port.settings.general.replace(keep_recordings=0))
    started(takes)
    takes.saved(1, saved_take(speech=False, silence_reason="The microphone delivered only silence (muted?)"))
    takes.no_speech(1)
    assert port.named("notify", "history.discard_take", "dispatch") == [
        ("notify", "warning", "The microphone delivered only silence (muted?)"),
        ("history.discard_take", 1, True, 0),  # keep 0: the recording goes too
        ("dispatch", S.TranscriptionDone(1, "")),
    ]
    assert 1 not in takes


def test_a_skipped_take_waits_for_its_audio_then_keeps_it_untranscribed(takes, port):
    started(takes)
    takes.skip(1, "Speech model unavailable: broken")
    assert port.named("engine.cancel_take", "history.finish_take") == []  # its audio is not saved yet
    takes.saved(1, saved_take())
    keep = port.settings.general.keep_recordings
    fields = {
        "outcome": Outcome.failed("not transcribed: Speech model unavailable: broken"),
        "duration_s": 1.0,
        "audio_path": Path("/rec/1.wav"),
    }
    # the engine worker got the saved take too: it is dropped, after it arrived
    assert port.named("engine.cancel_take", "history.finish_take") == [
        ("engine.cancel_take", 1),
        ("history.finish_take", 1, fields, False, keep),
    ]


def test_a_skipped_take_whose_audio_could_not_be_saved_is_lost_and_the_user_told(takes, port):
    started(takes)
    takes.skip(1, "no model")
    takes.saved(1, saved_take(None, save_error="disk full"))
    assert ("history.discard_take", 1, False, port.settings.general.keep_recordings) in port.calls
    assert (
        "notify",
        "error",
        "The recording could not be saved either (disk full), so this dictation is lost.",
    ) in port.calls


def test_a_failed_transcription_says_whether_the_audio_was_saved(takes, port):
    started(takes)
    takes.saved(1, saved_take(None, save_error="read-only"))
    takes.transcribe_failed(1, "boom")
    assert ("dispatch", S.TranscriptionFailed(1, "boom", audio_saved=False)) in port.calls


def test_text_is_stored_before_it_is_typed_and_the_outcome_recorded_after(takes, port):
    port.settings = port.settings.replace(general=port.settings.general.replace(keep_recordings=0))
    started(takes)
    takes.saved(1, saved_take(streamed=True))
    takes.transcribed(1, transcript())
    assert port.named("dispatch") == [("dispatch", S.TranscriptionDone(1, "hello world", "English"))]
    takes.record_text(S.DeliverText(1, "hello world", "English"))
    text = apply_text_options("hello world", port.settings)
    assert port.named("history.store_text") == [
        (
            "history.store_text",
            1,
            {
                "text": text,
                "raw_text": "hello world",
                "language": "English",
                "duration_s": 1.0,
                "model_label": "tiny · cpu",
                "audio_path": Path("/rec/1.wav"),
                "timings": {"total": 0.25},  # timings only: whether it was streamed is a field of its own
                "streamed": True,
            },
        )
    ]
    assert port.named("output.type_text") == []  # not before the history has it
    takes.stored(1)
    assert port.named("output.type_text") == [("output.type_text", 1, text)]
    takes.delivered(1, DeliveryResult("xdotool-paste", True, "ok"))
    assert port.named("history.finish_take") == [("history.finish_take", 1, {"outcome": Outcome.PASTED}, True, 0)]
    assert len(takes) == 0


def test_text_stored_while_quitting_is_kept_in_the_history_not_typed(takes, port):
    started(takes)
    takes.saved(1, saved_take())
    takes.transcribed(1, transcript())
    takes.record_text(S.DeliverText(1, "hello world"))
    port.running = False
    takes.stored(1)
    assert port.named("output.type_text") == []
    outcome = Outcome.failed("the app quit before the text could be typed")
    assert port.named("history.finish_take")[0][2] == {"outcome": outcome}


def test_a_retype_is_not_a_take(takes, port):
    started(takes)
    failed = DeliveryResult("xdotool-paste", False, "no paste tool")
    takes.delivered(Retype(1), failed)  # entry 1 typed again, not take 1
    assert port.named("history.finish_take") == [] and 1 in takes
    assert port.named("notify") == [("notify", "warning", "no paste tool")]


def recording(tmp_path: Path, streamed: bool) -> tuple[Any, np.ndarray]:
    """A history entry with a saved recording: silence, a tone, silence."""
    rng = np.random.default_rng(3)
    audio = (rng.standard_normal(3 * SR) * 0.001).astype(np.float32)
    t = np.arange(SR) / SR
    audio[SR : 2 * SR] += (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)
    path = tmp_path / "rec.wav"
    write_wav(path, audio, SR)
    entry = SimpleNamespace(id=7, audio_path=path, streamed=streamed, text="old")
    return entry, audio


@pytest.mark.parametrize("streamed", [False, True])
def test_a_history_entry_is_transcribed_again_trimmed_as_the_first_time(takes, port, tmp_path, streamed):
    from dictation.audio.wav import load_audio_16k

    entry, _ = recording(tmp_path, streamed)
    port.entries[entry.id] = entry
    takes.retranscribe(entry.id)
    [(_, request, samples, language, context)] = port.named("engine.transcribe")
    assert request == Retranscription(7, streamed=streamed) and language is None
    saved = load_audio_16k(entry.audio_path)
    start, end = transcribed_part(find_speech(saved), streamed=streamed)
    assert (start == 0) == streamed and end < len(saved)  # a streamed take keeps its start
    np.testing.assert_array_equal(samples, saved[start:end])

    takes.transcribed(request, transcript("again"))
    [(_, entry_id, fields)] = port.named("history.update_entry")
    assert (
        entry_id == 7
        and fields["streamed"] is streamed
        and fields["text"] == apply_text_options("again", port.settings)
    )
    assert ("retranscribed", 7, "") in port.calls
    assert port.named("dispatch", "output.type_text") == []  # the session and the output never hear of it


def test_a_retranscription_and_a_take_with_the_same_number_do_not_mix(takes, port):
    started(takes, 7)
    takes.transcribe_failed(Retranscription(7), "boom")
    assert 7 in takes and port.named("dispatch") == []
    assert ("retranscribed", 7, "Re-transcription failed: boom") in port.calls


def test_retranscription_is_refused_without_a_recording_or_a_model(takes, port, tmp_path):
    port.entries[1] = SimpleNamespace(id=1, audio_path=None, streamed=False)
    takes.retranscribe(1)
    port.model_ready = False
    port.entries[2], _ = recording(tmp_path, False)
    takes.retranscribe(2)
    assert port.named("engine.transcribe") == []
    assert [c[1:3] for c in port.named("retranscribed")] == [
        (1, "This dictation has no saved recording to transcribe again."),
        (2, "The speech model is not loaded; try again once it is ready."),
    ]


def test_takes_a_crash_interrupted_wait_for_the_model_and_go_to_the_history_only(takes, port):
    port.model_ready = False
    audio = np.zeros(SR, np.float32)
    takes.recovered([SimpleNamespace(entry_id=3, samples=audio), SimpleNamespace(entry_id=4, samples=audio)])
    assert port.named("engine.transcribe") == []
    port.model_ready = True
    takes.transcribe_recovered()
    requests = [c[1] for c in port.named("engine.transcribe")]
    assert requests == [Retranscription(3, recovered=True), Retranscription(4, recovered=True)]
    takes.transcribed(requests[0], transcript("found"))
    takes.transcribe_failed(requests[1], "boom")
    updates = port.named("history.update_entry")
    assert updates[0][1] == 3 and updates[0][2]["outcome"] == Outcome.RECOVERED
    assert updates[1][1:] == (
        4,
        {"outcome": Outcome.failed("interrupted by a crash; transcribing it at the next start failed: boom")},
    )
    assert port.named("output.type_text", "dispatch", "retranscribed") == []  # never typed
    assert [c[2] for c in port.named("notify")][-1].startswith("Recovered 1 dictation(s)")


def test_a_start_command_waits_with_its_take_until_answered_once(takes, port):
    started(takes)
    answers: list[dict] = []
    takes.await_start(1, answers.append, due=12.5)
    assert takes.start_replies() == {1: 12.5}
    takes.answer_start(1, {"ok": True})
    takes.answer_start(1, {"ok": False})
    assert answers == [{"ok": True}] and takes.start_replies() == {}
