"""No dictated word in any log (docs/guide/privacy.md).

Known, unusual words go through the whole app path: the controller and its worker threads, the real
engine (a tiny checkpoint, streaming with live previews), text options (a replacement), the history,
the output worker, re-typing, re-transcribing and copying from the history, a failed delivery and
settings changes, with the vocabulary set. The engine's own text is random (a tiny random model),
so at its boundary the transcripts are swapped for the known words; everything after that is the
app's. Every log line of every level, the log file and stderr must be free of them."""

from __future__ import annotations

import dataclasses
import logging

import pytest

from dictation.app import engine_worker, workers
from dictation.app.logs import setup_logging
from dictation.asr import AsrEngine
from dictation.asr.decode.streaming import StreamingTranscription
from dictation.config import Outcome, Settings
from dictation.config.settings import Replacement
from dictation.session import Status
from tests.app.controller_fakes import RecorderFactory
from tests.app.test_streaming import take_audio

SPOKEN = "Zyxquorblat met Plimbacket in Grüßeltorf"  # what "the model heard"
PREVIEW = "Zyxquorblat met Plimb"  # what the live preview shows first
AGAIN = "Quendramoor heard Zyxquorblat again"  # the re-transcription
VOCABULARY = "Vrenthimor, Quixaldrin"  # the user's vocabulary (the prompt's context)
REPLACED = "Snorvelquist"  # a replacement's "with" text
SECRETS = ("Zyxquorblat", "Plimbacket", "Plimb", "Grüßeltorf", "Quendramoor", "Vrenthimor", "Quixaldrin", REPLACED)


class KnownWordsStream(StreamingTranscription):
    def preview(self, **kwargs):
        preview = super().preview(**kwargs)
        return None if preview is None else dataclasses.replace(preview, text=PREVIEW)

    def finish(self, *args, **kwargs):
        return dataclasses.replace(super().finish(*args, **kwargs), text=SPOKEN)


class KnownWordsEngine(AsrEngine):
    """The real engine; its transcripts carry the known words."""

    contexts: list[str] = []

    def stream(self, *, language=None, context="", max_new_tokens=None):
        self.contexts.append(context)
        return KnownWordsStream(self, language=language, context=context, max_new_tokens=max_new_tokens)

    def transcribe(self, samples, *args, **kwargs):
        self.contexts.append(kwargs.get("context", ""))
        return dataclasses.replace(super().transcribe(samples, *args, **kwargs), text=AGAIN)


@pytest.fixture
def logs(tmp_path, caplog):
    """The app's real logging (file, stderr, log view) at every level, plus pytest's capture."""
    bridge, path = setup_logging(verbose=True, folder=tmp_path / "log")
    logging.getLogger().setLevel(logging.DEBUG)
    caplog.set_level(logging.DEBUG)
    yield bridge, path
    root = logging.getLogger()
    for handler in [h for h in root.handlers if getattr(h, "_dictation", False)]:
        root.removeHandler(handler)
        handler.close()
    root.setLevel(logging.WARNING)


@pytest.fixture(autouse=True)
def fast_streaming(monkeypatch):
    monkeypatch.setattr(workers, "STREAM_PULL_MS", 10)
    monkeypatch.setattr(engine_worker, "PREVIEW_MIN_INTERVAL_S", 0.05)


def test_no_dictated_word_reaches_any_log(rig, qtbot, logs, caplog, capfd, ckpt_untied, tmp_path):
    bridge, log_file = logs
    settings = Settings()
    settings = settings.replace(
        engine=settings.engine.replace(model=str(ckpt_untied), device="cpu"),
        transcription=settings.transcription.replace(context=VOCABULARY),
        output=settings.output.replace(replacements=(Replacement("Grüßeltorf", REPLACED),)),
    )
    KnownWordsEngine.contexts = []
    r = rig(settings, engine_factory=KnownWordsEngine, recorders=RecorderFactory(arrive_per_read=2000))
    r.c.attach_log(bridge)
    previews: list[str] = []
    r.c.preview_changed.connect(previews.append)
    r.start()
    r.wait_status(Status.IDLE)

    # 1. A dictation, streamed with a live preview, typed and kept in the history.
    audio = take_audio(4.0)
    r.hold(audio)
    qtbot.waitUntil(lambda: PREVIEW in previews, timeout=20_000)
    r.release(audio)
    qtbot.waitUntil(lambda: bool(r.chain.delivered), timeout=20_000)
    expected = SPOKEN.replace("Grüßeltorf", REPLACED) + " "
    assert r.chain.delivered == [expected]
    assert any(VOCABULARY in c for c in KnownWordsEngine.contexts)  # the vocabulary went to the model
    entry = r.history.recent(1)[0]
    qtbot.waitUntil(lambda: r.history.get(entry.id).outcome == Outcome.PASTED, timeout=10_000)
    assert entry.text == expected

    # 2. From the history window: copy, re-type, re-transcribe.
    r.c.copy_entry(entry.id)
    r.c.retype_entry(entry.id)
    qtbot.waitUntil(lambda: len(r.chain.delivered) == 2, timeout=10_000)
    r.c.retranscribe_entry(entry.id)
    qtbot.waitUntil(lambda: any("Transcribed again" in m for _, m in r.notes), timeout=20_000)
    qtbot.waitUntil(lambda: r.history.get(entry.id).text.startswith(AGAIN), timeout=10_000)  # written by its worker
    assert ("info", f"Transcribed again: {AGAIN}") in r.notes  # the user sees the words; the log does not

    # 3. A dictation whose delivery fails (the text is left on the clipboard).
    r.chain.ok = False
    r.wait_status(Status.IDLE)
    r.dictate(audio)
    qtbot.waitUntil(lambda: len(r.chain.delivered) == 3, timeout=20_000)
    qtbot.waitUntil(lambda: any(level == "warning" for level, _ in r.notes), timeout=10_000)

    # 4. The vocabulary changed, then an invalid one refused.
    changed = r.c.settings.replace(transcription=r.c.settings.transcription.replace(context=VOCABULARY + ", more"))
    assert r.c.apply_settings(changed) == []
    too_long = changed.replace(transcription=changed.transcription.replace(context=VOCABULARY * 2000))
    errors = r.c.apply_settings(too_long)
    assert errors and not [w for w in SECRETS if w in str(errors)]
    r.wait_status(Status.IDLE)
    r.close()

    logged = [log_file.read_text(encoding="utf-8")]
    logged += [p.read_text(encoding="utf-8") for p in sorted(log_file.parent.glob("dictation.log.*"))]
    logged += [record.getMessage() + "\n" + (record.exc_text or "") for record in caplog.records]
    logged += [record.getMessage() for record in bridge.records]
    logged += list(capfd.readouterr())
    leaks = [(w, line) for text in logged for line in text.splitlines() for w in SECRETS if w.lower() in line.lower()]
    assert leaks == []
    assert "transcribed again" in logged[0] and "characters" in logged[0]  # the log still says what happened
