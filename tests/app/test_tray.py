"""The tray follows the session, its menu works, and the overlay never takes focus."""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QSystemTrayIcon

from dictation.app.overlay import Overlay
from dictation.app.tray import STATUS_TEXT, Tray
from dictation.session import Status
from tests.app.rig import speech


def _actions(menu) -> dict[str, object]:
    return {a.text(): a for a in menu.actions() if a.text()}


def test_status_window_follows_the_session_where_no_tray_exists(rig, qtbot):
    assert not QSystemTrayIcon.isSystemTrayAvailable()  # offscreen: no tray host
    r = rig()
    shown = []
    tray = Tray(r.c, lambda page: shown.append(("settings", page)), lambda: shown.append(("history", "")))
    assert tray.tray is None and tray.window is not None and tray.window.isVisible()
    r.start()
    seen = set()

    def record(status):
        seen.add((status, tray.window.status_label.text(), tray.window.icon_label.pixmap().cacheKey()))

    r.c.status_changed.connect(record)
    r.wait_status(Status.IDLE)
    record(r.c.status)
    r.dictate(speech())
    qtbot.waitUntil(lambda: bool(r.chain.delivered), timeout=20_000)
    r.wait_status(Status.IDLE)
    statuses = {s for s, _, _ in seen}
    assert {Status.IDLE, Status.RECORDING, Status.TRANSCRIBING} <= statuses
    for status, text, _ in seen:
        assert text == STATUS_TEXT[status]
    icons = {s: key for s, _, key in seen}
    assert len({icons[Status.IDLE], icons[Status.RECORDING], icons[Status.TRANSCRIBING]}) == 3
    assert "Hotkey: ctrl+alt+space (hold)" in tray.tooltip()
    assert "cpu" in tray.tooltip()


def test_menu_lists_recent_transcripts_and_a_click_copies_one(rig, qtbot):
    r = rig()
    tray = Tray(r.c, lambda page: None, lambda: None, force_window=True)
    r.start()
    r.wait_status(Status.IDLE)
    r.dictate(speech(seed=21))
    qtbot.waitUntil(lambda: bool(r.chain.delivered), timeout=20_000)
    tray.menu.rebuild()
    text = r.history.recent(1)[0].text
    recent = [a for a in tray.menu.actions() if a.toolTip() == text]
    assert len(recent) == 1
    QGuiApplication.clipboard().clear()
    recent[0].trigger()
    assert QGuiApplication.clipboard().text() == text


def test_menu_items_drive_the_app(rig, qtbot):
    r = rig()
    shown = []
    tray = Tray(r.c, lambda page: shown.append(page or "settings"), lambda: shown.append("history"), force_window=True)
    r.start()
    r.wait_status(Status.IDLE)
    r.recorders.next_samples(speech())
    tray.menu.rebuild()
    _actions(tray.menu)["Start dictation"].trigger()
    r.wait_status(Status.RECORDING)
    tray.menu.rebuild()
    assert "Stop dictation" in _actions(tray.menu)
    qtbot.waitUntil(lambda: r.sounds.played[-1:] == ["start"], timeout=5000)
    r.clock.advance(2.0)  # spoke for two seconds
    _actions(tray.menu)["Stop dictation"].trigger()
    qtbot.waitUntil(lambda: bool(r.chain.delivered), timeout=20_000)

    _actions(tray.menu)["Settings…"].trigger()
    _actions(tray.menu)["History…"].trigger()
    assert shown == ["settings", "history"]
    pause = _actions(tray.menu)["Pause hotkeys"]
    pause.trigger()
    assert r.c.hotkeys_paused
    assert "paused" in tray.tooltip()
    with qtbot.waitSignal(r.c.quit_requested, timeout=1000):
        _actions(tray.menu)["Quit"].trigger()


def test_model_menu_switches_the_variant_and_saves_it(rig, qtbot):
    r = rig()
    tray = Tray(r.c, lambda page: None, lambda: None, force_window=True)
    r.start()
    r.wait_status(Status.IDLE)
    model_menu = next(a.menu() for a in tray.menu.actions() if a.menu() is not None)
    assert any(a.isChecked() and a.toolTip() == r.c.settings.engine.model for a in model_menu.actions())
    fp32 = _actions(model_menu)["float32"]
    with qtbot.waitSignal(r.c.settings_changed, timeout=5000):
        fp32.trigger()
    assert r.store.load().engine.variant == "fp32"
    qtbot.waitUntil(lambda: r.c.status is Status.IDLE and "fp32" in r.c.model_label, timeout=20_000)


def test_overlay_never_takes_focus_and_is_off_without_a_screen(rig):
    r = rig()
    overlay = Overlay(r.c)
    flags = overlay.windowFlags()
    for flag in (Qt.WindowType.WindowDoesNotAcceptFocus, Qt.WindowType.Tool, Qt.WindowType.WindowStaysOnTopHint):
        assert flags & flag
    assert overlay.testAttribute(Qt.WidgetAttribute.WA_ShowWithoutActivating)
    # offscreen has no screen to draw on: the indicator stays hidden even while recording
    overlay.on_status(Status.RECORDING)
    assert not overlay.isVisible()


def test_the_portal_app_id_is_the_installed_desktop_file_and_the_qt_desktop_name():
    from dictation import desktop
    from dictation.app import hotkey_input, main

    assert hotkey_input.APP_ID == desktop.APP_ID
    assert desktop.desktop_entry_path().name == f"{hotkey_input.APP_ID}.desktop"
    assert f'setDesktopFileName("{hotkey_input.APP_ID}")' in Path(main.__file__).read_text(encoding="utf-8")


def test_pausing_the_hotkeys_changes_the_icon_and_the_status(rig, qtbot):
    """The tray looked the same with the hotkeys paused."""
    from dictation.app.icons import icon, status_icon
    from dictation.app.tray import PAUSED_TEXT

    r = rig()
    tray = Tray(r.c, lambda page: None, lambda: None, force_window=True)
    r.start()
    r.wait_status(Status.IDLE)
    ready = tray.window.icon_label.pixmap().toImage()
    assert ready == icon("idle").pixmap(24, 24).toImage()
    r.c.set_hotkeys_paused(True)
    paused = tray.window.icon_label.pixmap().toImage()
    assert paused == icon("paused").pixmap(24, 24).toImage() and paused != ready
    assert tray.window.status_label.text() == PAUSED_TEXT == "Ready (hotkeys paused)"
    assert "— paused" in tray.tooltip()
    # a dictation started from the tray while paused still shows as recording
    assert status_icon(Status.RECORDING, paused=True).cacheKey() == icon("recording").cacheKey()
    r.c.set_hotkeys_paused(False)
    assert tray.window.icon_label.pixmap().toImage() == ready
    assert tray.window.status_label.text() == "Ready"
