"""A new user presses the hotkey before choosing a speech model: nothing is recorded,
the press is answered at once (error sound, a message naming what to do) and the Model page opens."""

from __future__ import annotations

from dictation.app.tray import Tray
from dictation.config import Settings
from dictation.session import NO_MODEL_MESSAGE, ModelState, Status
from tests.app.rig import Rig, speech


def test_a_press_without_a_model_records_nothing_and_opens_the_model_page(qtbot, tmp_path):
    r = Rig(qtbot, tmp_path, Settings())  # engine.model is "": nothing chosen yet
    shown: list[str] = []
    r.c.show_settings_requested.connect(shown.append)
    try:
        r.start()
        assert r.c.session.model_state is ModelState.NOT_CHOSEN and r.c.status is Status.ERROR
        r.recorders.next_samples(speech())
        r.hotkeys.press()
        qtbot.waitUntil(lambda: shown == ["model"], timeout=5000)
        r.hotkeys.release()
        assert r.notes == [("error", NO_MODEL_MESSAGE)]
        assert "None" not in NO_MODEL_MESSAGE and "Model page" in NO_MODEL_MESSAGE
        assert r.sounds.played == ["error"]
        assert not any(rec.recording for rec in r.recorders.recorders)
        assert Status.RECORDING not in r.statuses

        r.c.toggle()  # the tray's click: the same answer
        assert shown == ["model", "model"] and r.sounds.played == ["error", "error"]
        reply = r.c.handle_ipc("start")  # `dictation start` from a compositor binding fails visibly
        assert reply == {"ok": False, "message": NO_MODEL_MESSAGE}
        assert shown == ["model"] * 3
        assert r.history.recent(5) == []
        assert not list((tmp_path / "recordings").glob("*"))
    finally:
        r.close()


def test_the_tray_says_that_a_model_must_be_chosen(qtbot, tmp_path):
    r = Rig(qtbot, tmp_path, Settings())
    try:
        tray = Tray(r.c, lambda page: None, lambda: None, force_window=True)
        r.start()
        tray.refresh()
        assert tray.window.status_label.text() == "Choose a speech model"
        assert "Dictation: Choose a speech model (Settings → Model)" in tray.tooltip()
    finally:
        r.close()
