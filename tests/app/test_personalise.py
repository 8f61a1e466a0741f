"""Correcting transcripts in the History window and the Personalise action.

Real Qt windows, a real History file and real settings (FakeController); the training function is a
fake behind `dictation.training.train_adapter`'s signature, except in the integration test at the end.
"""

from __future__ import annotations

import json
import shutil
import stat
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import QApplication, QMessageBox

from dictation.app import personalise as P
from dictation.app.history_window import COL_OUTCOME, COL_TEXT, EditDialog, HistoryWindow
from dictation.app.history_worker import HistoryWorker
from dictation.app.settings_window import SettingsWindow
from dictation.app.widgets.fields import ERROR_STYLE
from dictation.asr.tune.data import TrainingError
from dictation.audio.wav import write_wav
from dictation.config.history import History, Outcome
from dictation.config.settings import Adapter, Settings
from tests.app.rig import speech

# --- correcting a transcript --------------------------------------------------------------------------


@pytest.fixture
def typed(controller, tmp_path):
    """A typed dictation with its recording: (entry id, recording)."""
    audio = tmp_path / "rec-1.wav"
    write_wav(audio, speech(0.5), 16_000)
    entry_id = controller.history.add("cube cuddle get pods", duration_s=0.5, audio_path=audio, outcome=Outcome.TYPED)
    return entry_id, audio


@pytest.fixture
def window(qtbot, controller):
    def open_() -> HistoryWindow:
        window = HistoryWindow(controller, player=object())
        qtbot.addWidget(window)
        window.show()
        qtbot.waitExposed(window)
        return window

    return open_


def edit_with(qtbot, window, text: str | None, key=Qt.Key.Key_Return, modifier=Qt.KeyboardModifier.ControlModifier):
    """Press Edit on the selected entry, replace its text with ``text`` in the dialog and press ``key``
    (Ctrl+Enter saves; Esc cancels). Returns the text the dialog opened with."""
    seen = []

    def in_dialog(tries: int = 100):
        dialog = QApplication.activeModalWidget()
        if not isinstance(dialog, EditDialog):
            if tries:
                QTimer.singleShot(20, lambda: in_dialog(tries - 1))
            return
        seen.append(dialog.text())
        if text is not None:
            dialog.editor.setPlainText(text)
        qtbot.keyClick(dialog.editor, key, modifier)
        if dialog.isVisible():  # the key did not close it: fail the test, do not hang it
            seen.append("STILL OPEN")
            dialog.reject()

    QTimer.singleShot(0, in_dialog)
    qtbot.mouseClick(window.edit_button, Qt.MouseButton.LeftButton)
    assert seen and "STILL OPEN" not in seen, seen
    return seen[0]


def test_an_edit_marks_the_entry_corrected_and_it_stays_so_after_reopening(qtbot, window, controller, typed):
    entry_id, audio = typed
    w = window()
    w.select_entry(entry_id)
    assert w.table.item(0, COL_OUTCOME).text() == "Typed"
    assert edit_with(qtbot, w, "kubectl get pods") == "cube cuddle get pods"
    qtbot.waitUntil(lambda: w.message_text().startswith("Correction saved"), timeout=5000)
    assert w.table.item(0, COL_TEXT).text() == "kubectl get pods"
    assert w.table.item(0, COL_OUTCOME).text() == "Typed · corrected"
    assert "kept (not pruned)" in w.table.item(0, COL_OUTCOME).toolTip()
    w.close()

    reopened = History(controller.history.path)  # what the next start reads
    entry = reopened.get(entry_id)
    assert (entry.text, entry.corrected, entry.audio_path) == ("kubectl get pods", True, audio)
    assert [e.id for e in reopened.corrected_entries()] == [entry_id]
    assert audio in reopened.kept_audio()
    reopened.close()
    again = window()
    assert again.table.item(0, COL_OUTCOME).text() == "Typed · corrected"


def test_escape_leaves_the_text_as_it_was(qtbot, window, controller, typed):
    entry_id, _ = typed
    w = window()
    w.select_entry(entry_id)
    edit_with(qtbot, w, "something else", key=Qt.Key.Key_Escape, modifier=Qt.KeyboardModifier.NoModifier)
    qtbot.wait(50)
    assert controller.called("correct_entry") == []
    assert (controller.history.get(entry_id).text, controller.history.get(entry_id).corrected) == (
        "cube cuddle get pods",
        False,
    )


def test_an_empty_correction_cannot_be_saved(qtbot):
    dialog = EditDialog("text", "Today 10:00")
    qtbot.addWidget(dialog)
    save = dialog.buttons.button(dialog.buttons.StandardButton.Ok)
    assert save.text() == "Save" and save.isEnabled()
    dialog.editor.setPlainText("   ")
    assert not save.isEnabled()
    dialog.accept()
    assert dialog.result() != dialog.DialogCode.Accepted


def test_a_correction_that_is_not_saved_is_said_and_kept_for_the_next_edit(qtbot, window, controller, typed):
    entry_id, _ = typed
    w = window()
    w.select_entry(entry_id)
    controller.correct_fails = "database or disk is full"
    edit_with(qtbot, w, "kubectl get pods")
    qtbot.waitUntil(lambda: "not saved" in w.message_text(), timeout=5000)
    assert w.message_text() == (
        "The correction was not saved: database or disk is full. Press Edit again to retry; your text is kept."
    )
    assert w.message.styleSheet() == ERROR_STYLE
    assert not controller.history.get(entry_id).corrected
    controller.correct_fails = ""
    assert edit_with(qtbot, w, None) == "kubectl get pods"  # the user's text, not the model's
    qtbot.waitUntil(lambda: controller.history.get(entry_id).corrected, timeout=5000)


def test_a_pending_dictation_cannot_be_edited(qtbot, window, controller):
    entry_id = controller.history.add("", outcome=Outcome.PENDING)
    w = window()
    w.select_entry(entry_id)
    assert not w.edit_button.isEnabled()
    assert "still being transcribed" in w.edit_button.toolTip()


def test_the_history_worker_saves_a_correction_and_answers(tmp_path):
    path = tmp_path / "history.sqlite3"
    history = History(path)
    done = history.add("wrong words", outcome=Outcome.TYPED)
    worker = HistoryWorker(path)
    answers, changes = [], []
    worker.corrected.connect(lambda entry_id, error: answers.append((entry_id, error)))
    worker.changed.connect(lambda: changes.append(1))
    worker.open()
    pending = history.add("", outcome=Outcome.PENDING)  # a take being recorded (after the start's recovery)
    worker.correct_entry(done, "right words")
    worker.correct_entry(pending, "too early")
    worker.correct_entry(9999, "gone")
    worker.close()
    assert answers[0] == (done, "")
    assert answers[1][0] == pending and "still being transcribed" in answers[1][1]
    assert answers[2] == (9999, "this dictation is no longer in the history")
    assert len(changes) == 1
    assert (history.get(done).text, history.get(done).corrected) == ("right words", True)
    history.close()


def test_retranscribing_a_corrected_entry_asks_first(qtbot, window, controller, typed, monkeypatch):
    entry_id, _ = typed
    controller.history.correct(entry_id, "kubectl get pods")
    asked = []

    def question(parent, title, text, *args):
        asked.append(text)
        return QMessageBox.StandardButton.No

    monkeypatch.setattr(QMessageBox, "question", question)
    w = window()
    w.select_entry(entry_id)
    qtbot.mouseClick(w.retranscribe_button, Qt.MouseButton.LeftButton)
    assert asked and "replaces your text" in asked[0]
    assert controller.called("retranscribe_entry") == []


# --- Personalise with a fake trainer ------------------------------------------------------------------


@dataclass(frozen=True)
class Score:
    wer: float
    cer: float
    clips: int

    def __str__(self) -> str:
        return f"WER {self.wer * 100:.1f}%, CER {self.cer * 100:.1f}% on {self.clips} held-out clips"


@dataclass(frozen=True)
class Report:
    out: Path
    steps: int
    final_loss: float
    seconds: float
    train_clips: int
    val_clips: int
    before: Score | None
    after: Score | None


@dataclass(frozen=True)
class Step:
    step: int
    steps: int
    loss: float
    seconds_left: float


class FakeTrainer:
    """train_adapter's signature. ``mode``: "succeed" (writes ``adapter`` to out), "wait" (reports steps
    and writes a partial folder until should_stop), "fail"."""

    def __init__(self, adapter: Path | None = None, mode: str = "succeed") -> None:
        self.adapter = adapter
        self.mode = mode
        self.calls: list[dict] = []
        self.saw_stop = threading.Event()

    def __call__(
        self, model, samples, out, options, *, device, val, resume, on_progress, on_status, should_stop
    ) -> Report:
        self.calls.append({"model": model, "samples": samples, "out": Path(out), "device": device, "val": val})
        on_status("Loading the model …")
        if self.mode == "fail":
            raise TrainingError("rec-7.wav: no audio in the file\n(details)")
        if self.mode == "wait":
            work = Path(out).parent / f".{Path(out).name}.training"  # the trainer's checkpoints, for --resume
            work.mkdir()
            (work / "checkpoint.safetensors").write_bytes(b"step")
            Path(out).mkdir()
            (Path(out) / "adapter_model.safetensors").write_bytes(b"half")
            step = 0
            while not should_stop():
                step = min(step + 1, 40)
                on_progress(Step(step, 40, 2.5 / step, 30.0))
                time.sleep(0.02)
            self.saw_stop.set()
            raise P._Cancelled()
        for step in (1, 2, 3):
            on_progress(Step(step, 3, 1.0 / step, 3 - step))
        shutil.copytree(self.adapter, out)
        held = round(len(samples) * val)
        before = Score(0.5, 0.25, held) if held else None
        after = Score(0.125, 0.0625, held) if held else None
        return Report(Path(out), 3, 0.33, 75.0, len(samples) - held, held, before, after)


def corrected_entries(controller, tmp_path, n: int, *, with_audio: bool = True) -> list[int]:
    ids = []
    first = controller.history.count()
    for i in range(first, first + n):
        audio = tmp_path / f"rec-{i}.wav"
        if with_audio:
            write_wav(audio, speech(0.3, seed=i), 16_000)
        entry_id = controller.history.add(f"model words {i}", audio_path=audio, outcome=Outcome.PASTED)
        controller.history.correct(entry_id, f"my words {i}")
        ids.append(entry_id)
    controller.history_changed.emit()
    return ids


@pytest.fixture
def setup(make_controller, model_folder, tmp_path, monkeypatch):
    """A controller whose model is the tiny checkpoint, a Personaliser with a fake trainer, and Yes
    to the question before training."""

    def make(trainer: FakeTrainer, *, device="cpu", adapters=()):
        settings = Settings()
        engine = settings.engine.replace(model=str(model_folder), device=device, adapters=adapters)
        controller = make_controller(settings.replace(engine=engine))
        controller.personaliser.train = trainer
        controller.personaliser.samples = lambda path: [f"sample of {e.id}" for e in History(path).corrected_entries()]
        return controller

    monkeypatch.setattr(QMessageBox, "question", lambda *args: QMessageBox.StandardButton.Yes)
    return make


def test_personalise_is_disabled_with_the_reason_until_a_dictation_is_corrected(qtbot, setup, tmp_path):
    controller = setup(FakeTrainer())
    controller.history.add("not corrected", audio_path=tmp_path / "x.wav", outcome=Outcome.TYPED)
    corrected_entries(controller, tmp_path, 1, with_audio=False)  # corrected, but its recording is gone
    w = HistoryWindow(controller, player=object())
    qtbot.addWidget(w)
    panel = w.personalise
    assert not panel.button.isEnabled()
    assert panel.button.toolTip() == P.NO_ENTRIES and panel.text() == P.NO_ENTRIES
    panel.button.click()
    assert controller.personaliser.train.calls == []

    corrected_entries(controller, tmp_path, 1)
    assert panel.button.isEnabled()
    assert panel.button.toolTip().startswith("Train a personal adapter on your 1 corrected dictation")

    controller.change_settings_elsewhere(
        controller.settings.replace(engine=controller.settings.engine.replace(model=""))
    )
    assert not panel.button.isEnabled() and panel.text() == P.NO_MODEL


def test_progress_and_cancel_leave_no_adapter(qtbot, setup, tmp_path):
    trainer = FakeTrainer(mode="wait")
    controller = setup(trainer, device="cuda:1")
    corrected_entries(controller, tmp_path, 2)
    window = HistoryWindow(controller, player=object())
    qtbot.addWidget(window)
    window.show()
    panel = window.personalise
    panel.button.click()
    assert controller.personaliser.running and not panel.button.isEnabled()
    assert panel.cancel_button.isVisible() and panel.bar.isVisible()
    qtbot.waitUntil(lambda: panel.bar.maximum() == 40 and panel.bar.value() >= 3, timeout=5000)
    assert panel.bar.format() == f"Step {panel.bar.value()} of 40"
    qtbot.waitUntil(lambda: panel.text().startswith("Training: loss "), timeout=5000)
    assert panel.text().endswith(", about 30 s left.")
    call = trainer.calls[0]
    assert call["device"] == "cuda:1" and call["val"] == 0.0  # two entries: none held out
    assert call["samples"] == ["sample of 2", "sample of 1"]
    out = call["out"]
    assert out.parent == controller.personaliser.adapters_dir and out.name.startswith("personal-")
    assert out.is_dir()  # the trainer's half-written folder

    before = controller.settings
    qtbot.mouseClick(panel.cancel_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not controller.personaliser.running, timeout=5000)
    assert trainer.saw_stop.is_set()
    assert not out.exists() and list(controller.personaliser.adapters_dir.iterdir()) == []
    assert panel.text() == "Personalise was cancelled; no adapter was made."
    assert controller.settings == before and panel.button.isEnabled() and not panel.bar.isVisible()


def test_success_switches_the_adapter_on_and_shows_the_figures(qtbot, setup, tmp_path, make_adapter, open_settings):
    trainer = FakeTrainer(make_adapter("trained"))
    controller = setup(trainer)
    adapters_dir = controller.personaliser.adapters_dir
    older = Adapter(path=str(adapters_dir / "personal-20240101-000000"), enabled=True)
    other = Adapter(path=str(tmp_path / "accent"), enabled=True, weight=0.5)
    controller.change_settings_elsewhere(
        controller.settings.replace(engine=controller.settings.engine.replace(adapters=(older, other)))
    )
    corrected_entries(controller, tmp_path, 15)
    settings_window = open_settings(controller)
    page = settings_window.page("model")
    panel = page.personalise
    assert "holding about one in 5 out" in panel.button.toolTip()
    finished = []
    controller.personaliser.finished.connect(lambda message, error: finished.append((message, error)))
    panel.button.click()
    qtbot.waitUntil(lambda: bool(finished), timeout=10_000)
    message, error = finished[0]
    out = trainer.calls[0]["out"]
    assert trainer.calls[0]["val"] == 0.2  # fifteen entries: three held out
    assert not error
    assert message == (
        "Personal adapter trained on 12 dictations in 1 min 15 s and switched on. Held-out dictations before: "
        "WER 50.0%, CER 25.0% on 3 held-out clips; after: WER 12.5%, CER 6.2% on 3 held-out clips."
    )
    assert panel.text() == message
    saved = controller.saved_settings().engine.adapters
    assert saved == (older.replace(enabled=False), other, Adapter(path=str(out), enabled=True))
    assert stat.S_IMODE(out.stat().st_mode) == 0o700
    report = json.loads((out / P.REPORT_FILE).read_text())
    assert report["before"]["wer"] == 0.5 and report["after"]["cer"] == 0.0625 and report["val_clips"] == 3
    assert "my words" not in (out / P.REPORT_FILE).read_text()  # numbers, never the dictations' text
    assert stat.S_IMODE((out / P.REPORT_FILE).stat().st_mode) == 0o600
    item = page.adapter_list.table.item(2, 0)
    assert item.checkState() == Qt.CheckState.Checked
    assert "after: WER 12.5%" in item.toolTip() and str(out) in item.toolTip()


@pytest.mark.parametrize("entries", [5, 12])
def test_too_few_dictations_to_hold_three_out_give_no_figures_and_say_why(
    qtbot, setup, tmp_path, make_adapter, entries
):
    """With 5 corrected dictations one was held out and its WER shown ("WER 960.0% on 1 held-out
    clip"): a figure takes three held out, so 13 dictations; with fewer every one is trained on."""
    assert round(P.HOLD_OUT_FROM * P.HOLD_OUT_SHARE) >= P.MIN_HELD_OUT > round((P.HOLD_OUT_FROM - 1) * P.HOLD_OUT_SHARE)
    from dictation import training

    assert P.MIN_HELD_OUT == training.MIN_HELD_OUT
    trainer = FakeTrainer(make_adapter("trained"))
    controller = setup(trainer)
    corrected_entries(controller, tmp_path, entries)
    p = controller.personaliser
    assert "(with 13 or more, some are held out to measure it)" in p.describe()
    assert p.start() is None
    qtbot.waitUntil(lambda: not p.running, timeout=10_000)
    assert trainer.calls[0]["val"] == 0.0 and not p.last_error
    assert p.last_message == (
        f"Personal adapter trained on {entries} dictations in 1 min 15 s and switched on. No figures: measuring it "
        "takes 3 held-out dictations, so 13 or more corrected ones (one in five is held out); all of them were "
        "trained on."
    )
    assert "WER" not in p.last_message


def test_a_trainer_that_gives_no_figures_says_why_in_the_app():
    from dictation.training import TrainReport

    why = "no WER/CER: 2 held-out clips would give no meaningful figure (it takes 3), so all 9 clips were trained on"
    report = TrainReport(Path("/a"), 3, 0.3, 75.0, 1.0, 16, None, 9, 0, unscored=why)
    assert P.summary_text(report, 9) == (
        "Personal adapter trained on 9 dictations in 1 min 15 s and switched on. No figures: " + why + "."
    )


def test_an_adapter_for_a_model_no_longer_in_use_is_listed_but_not_switched_on(qtbot, setup, tmp_path, make_adapter):
    trainer = FakeTrainer(make_adapter("trained"))
    controller = setup(trainer)
    corrected_entries(controller, tmp_path, 1)
    p = controller.personaliser
    other = controller.settings.engine.replace(model=str(tmp_path / "another-model"))
    assert p.start() is None
    controller.change_settings_elsewhere(controller.settings.replace(engine=other))  # while it trains
    qtbot.waitUntil(lambda: not p.running, timeout=10_000)
    assert p.last_error and "the model is now" in p.last_message and "switched off" in p.last_message
    assert controller.saved_settings().engine.adapters == (Adapter(path=str(trainer.calls[0]["out"]), enabled=False),)


def test_a_training_error_is_one_line_and_leaves_nothing(qtbot, setup, tmp_path):
    trainer = FakeTrainer(mode="fail")
    controller = setup(trainer)
    corrected_entries(controller, tmp_path, 1)
    window = HistoryWindow(controller, player=object())
    qtbot.addWidget(window)
    panel = window.personalise
    panel.button.click()
    qtbot.waitUntil(lambda: not controller.personaliser.running, timeout=5000)
    assert panel.text() == "Personalise failed: rec-7.wav: no audio in the file"
    assert panel.line.styleSheet() == ERROR_STYLE
    assert controller.settings.engine.adapters == ()
    assert list(controller.personaliser.adapters_dir.iterdir()) == []


def test_one_training_at_a_time_and_quitting_cancels_it(qtbot, setup, tmp_path):
    trainer = FakeTrainer(mode="wait")
    controller = setup(trainer)
    corrected_entries(controller, tmp_path, 1)
    p = controller.personaliser
    assert p.start() is None
    assert p.start() == P.RUNNING
    qtbot.waitUntil(lambda: len(trainer.calls) == 1 and trainer.calls[0]["out"].exists(), timeout=5000)
    p.shutdown()  # what the app's quit does (AppController.shutdown)
    assert trainer.saw_stop.is_set() and not p.running
    assert list(p.adapters_dir.iterdir()) == []  # neither the adapter nor the work folder
    assert len(trainer.calls) == 1


@pytest.fixture
def open_settings(qtbot):
    def open_(controller):
        window = SettingsWindow(controller)
        qtbot.addWidget(window)
        window.bring_forward("model")
        qtbot.waitExposed(window)
        return window

    return open_
