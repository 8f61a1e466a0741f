"""The Diagnostics page (offscreen): the checks as a tree with their fixes, Copy report, Run again, runs
off the GUI thread, and the rows only the running app can add."""

from __future__ import annotations

import threading

import pytest
from PySide6.QtWidgets import QApplication

from dictation.app.pages import diagnostics
from dictation.app.pages.diagnostics import DiagnosticsPage, status_icon, worst
from dictation.app.settings_window import SettingsWindow
from dictation.doctor import AREAS, NO_MODEL_FIX, Check, format_report

FIRST = [
    Check("Session", "Display server", "ok", "X11 (DISPLAY=:0)"),
    Check("Session", "System tray", "ok", "a StatusNotifier host runs"),
    Check("Hotkeys", "Active backend", "ok", "pynput (picked automatically)"),
    Check("Hotkeys", "evdev", "info", "unavailable: can't read /dev/input/event0", "`sudo usermod -aG input $USER`"),
    Check("Output", "Text delivery", "ok", "xdotool-paste"),
    Check("Model", "Model", "problem", "no model chosen yet", NO_MODEL_FIX),
]
SECOND = [
    Check("Session", "Display server", "ok", "X11 (DISPLAY=:0)"),
    Check("Model", "Model", "ok", "Qwen/Qwen3-ASR-0.6B"),
]


class Runner:
    """A fake run_checks: returns the next prepared result, remembering the thread and the settings."""

    def __init__(self, *results, gate: threading.Event | None = None):
        self.results = list(results)
        self.calls: list = []
        self.threads: list = []
        self.gate = gate

    def __call__(self, settings):
        self.calls.append(settings)
        self.threads.append(threading.current_thread())
        if self.gate is not None:
            assert self.gate.wait(10)
        result = self.results[min(len(self.calls), len(self.results)) - 1]
        if isinstance(result, Exception):
            raise result
        return list(result)


@pytest.fixture
def make_page(qtbot, controller):
    def make(runner) -> DiagnosticsPage:
        page = DiagnosticsPage(controller, runner=runner)
        qtbot.addWidget(page)
        page.resize(900, 700)
        return page

    return make


def show_and_wait(qtbot, page: DiagnosticsPage) -> None:
    with qtbot.waitSignal(page.finished, timeout=10_000):
        page.show()


def test_showing_the_page_runs_the_checks_and_lists_them_with_their_fixes(qtbot, make_page, controller):
    runner = Runner(FIRST)
    page = make_page(runner)
    assert runner.calls == []  # nothing runs before the page is shown
    show_and_wait(qtbot, page)
    assert runner.calls == [controller.settings]
    shown = page.shown_checks()
    assert shown == [
        ("Session", "Display server", "ok"),
        ("Session", "System tray", shown[1][2]),  # replaced by Qt's own answer (offscreen: none)
        ("Hotkeys", "Active backend", "ok"),
        ("Hotkeys", "In use by the app", "info"),
        ("Hotkeys", "evdev", "info"),
        ("Output", "Text delivery", "ok"),
        ("Output", "In use by the app", "info"),
        ("Model", "Model", "problem"),
    ]
    tray = next(c for c in page.checks if c.name == "System tray")
    assert tray.detail != "a StatusNotifier host runs"
    in_use = next(c for c in page.checks if c.area == "Hotkeys" and c.name == "In use by the app")
    assert in_use.detail == controller.hotkey_description()
    model_area = page.tree.topLevelItem(3)
    assert (model_area.text(0), model_area.text(1)) == ("Model", "Problem")
    model = model_area.child(0)
    assert model.text(1) == "no model chosen yet"
    assert (model.child(0).text(0), model.child(0).text(1)) == ("Fix", NO_MODEL_FIX)
    assert page.summary.text().startswith("1 problem.")


def test_copy_report_puts_the_text_report_on_the_clipboard(qtbot, make_page):
    page = make_page(Runner(FIRST))
    assert not page.copy_button.isEnabled()  # nothing to copy before a run
    show_and_wait(qtbot, page)
    QApplication.clipboard().setText("something else")
    page.copy_button.click()
    text = QApplication.clipboard().text()
    assert text == format_report(page.checks)
    assert f"  ✘ Model: no model chosen yet\n      fix: {NO_MODEL_FIX}" in text
    assert "The report is on the clipboard" in page.summary.text()


def test_run_again_refreshes(qtbot, make_page):
    runner = Runner(FIRST, SECOND)
    page = make_page(runner)
    show_and_wait(qtbot, page)
    with qtbot.waitSignal(page.finished, timeout=10_000):
        page.run_button.click()
    assert len(runner.calls) == 2
    assert ("Model", "Model", "ok") in page.shown_checks()
    assert ("Model", "Model", "problem") not in page.shown_checks()
    assert page.summary.text().startswith("No problems found.")


def test_the_checks_run_off_the_gui_thread_and_the_window_stays_responsive(qtbot, make_page):
    gate = threading.Event()
    runner = Runner(FIRST, gate=gate)
    page = make_page(runner)
    page.show()
    qtbot.waitUntil(lambda: len(runner.calls) == 1)
    assert runner.threads[0] is not threading.main_thread()
    assert page.running and not page.run_button.isEnabled()
    assert page.summary.text() == "Checking…"
    qtbot.wait(50)  # the event loop runs while the checks wait
    with qtbot.waitSignal(page.finished, timeout=10_000):
        gate.set()
    assert not page.running and page.run_button.isEnabled()


def test_a_settings_change_runs_the_checks_again(qtbot, make_page, controller):
    runner = Runner(FIRST, SECOND)
    page = make_page(runner)
    show_and_wait(qtbot, page)
    settings = controller.settings
    changed = settings.replace(engine=settings.engine.replace(model="Qwen/Qwen3-ASR-0.6B"))
    with qtbot.waitSignal(page.finished, timeout=10_000):
        assert controller.apply_settings(changed) == []
    assert runner.calls[-1].engine.model == "Qwen/Qwen3-ASR-0.6B"


def test_a_failing_runner_is_shown_as_a_problem(qtbot, make_page):
    page = make_page(Runner(RuntimeError("no luck")))
    show_and_wait(qtbot, page)
    assert ("Diagnostics", "Run", "problem") in page.shown_checks()


def test_the_real_checks_in_the_settings_window(qtbot, controller):
    window = SettingsWindow(controller)
    qtbot.addWidget(window)
    page = window.page("diagnostics")
    with qtbot.waitSignal(page.finished, timeout=30_000):
        window.bring_forward("diagnostics")
    assert window.current_page() == "diagnostics"
    areas = [page.tree.topLevelItem(i).text(0) for i in range(page.tree.topLevelItemCount())]
    assert areas == list(AREAS)
    model = next(c for c in page.checks if (c.area, c.name) == ("Model", "Model"))
    assert (model.status, model.fix) == ("problem", NO_MODEL_FIX)  # the fake controller has no model


LONG_NAMES = [
    *FIRST,
    Check("Hotkeys", "Grab ctrl+alt+space", "ok", "free: the app takes the hotkey from other programs"),
    Check("Hotkeys", "Grab ctrl+alt+shift+super+F12", "ok", "free: the app takes the hotkey from other programs"),
    Check("Output", "Text delivery", "ok", "xdotool-paste: " + "a long result that wraps onto more lines " * 6),
]


def _shown_whole(tree, item, column: int) -> bool:
    """Whether the text of ``item`` in ``column`` fits the area the style draws it in (wrapped at its
    width, as many lines as its height holds); text that does not is elided ("Grab …")."""
    from PySide6.QtCore import QRect, Qt
    from PySide6.QtGui import QFontMetrics
    from PySide6.QtWidgets import QStyle, QStyleOptionViewItem

    index = tree.indexFromItem(item, column)
    option = QStyleOptionViewItem()
    tree.initViewItemOption(option)  # as the tree paints: the icon size, word wrap
    tree.itemDelegate().initStyleOption(option, index)
    option.rect = tree.visualRect(index)
    style = tree.style()
    area = style.subElementRect(QStyle.SubElement.SE_ItemViewItemText, option, tree)
    width = area.width() - 2 * (style.pixelMetric(QStyle.PixelMetric.PM_FocusFrameHMargin, None, tree) + 1)
    needed = QFontMetrics(option.font).boundingRect(
        QRect(0, 0, width, 100_000), Qt.TextFlag.TextWordWrap, item.text(column)
    )
    return width > 0 and needed.height() <= area.height()


def test_every_check_name_and_result_is_shown_whole_at_the_default_size(qtbot, controller, monkeypatch):
    monkeypatch.setattr(diagnostics, "doctor_in_a_process", Runner(LONG_NAMES))
    window = SettingsWindow(controller)  # its default size
    qtbot.addWidget(window)
    page = window.page("diagnostics")
    with qtbot.waitSignal(page.finished, timeout=10_000):
        window.bring_forward("diagnostics")
    qtbot.waitExposed(window)
    tree = page.tree
    rows = [
        tree.topLevelItem(i).child(j)
        for i in range(tree.topLevelItemCount())
        for j in range(tree.topLevelItem(i).childCount())
    ]
    assert {"Grab ctrl+alt+space", "Grab ctrl+alt+shift+super+F12"} <= {row.text(0) for row in rows}
    cut = [(row.text(0), column) for row in rows for column in (0, 1) if not _shown_whole(tree, row, column)]
    assert cut == []  # before: "Grab …"


def test_the_doctor_child_of_a_frozen_app_gets_the_users_environment(monkeypatch, tmp_path):
    """`dictation doctor --json` runs as a child process; in the frozen app it must not inherit the
    bundle's library path. The child here records its environment and answers."""
    import json
    import sys

    from tests.frozen import USER_LIBRARY_PATH, bundle_variables, simulate_frozen

    bundle = simulate_frozen(monkeypatch, tmp_path)
    out = tmp_path / "doctor-env.json"
    script = (
        "import json, os; "
        f"open({str(out)!r}, 'w').write(json.dumps(dict(os.environ))); "
        "print(json.dumps({'checks': [{'area': 'Session', 'name': 'Desktop', 'status': 'ok', 'detail': 'x'}]}))"
    )
    monkeypatch.setattr(diagnostics, "doctor_command", lambda: [sys.executable, "-c", script])
    checks = diagnostics.doctor_in_a_process(None)
    assert [(c.area, c.name, c.status) for c in checks] == [("Session", "Desktop", "ok")]
    env = json.loads(out.read_text(encoding="utf-8"))
    assert env["LD_LIBRARY_PATH"] == USER_LIBRARY_PATH and bundle_variables(env, bundle) == {}


def test_icons_and_area_status():
    for status in ("ok", "info", "warning", "problem"):
        assert not status_icon(status).isNull()
    assert worst(FIRST) == "problem"
    assert worst(FIRST[:3]) == "ok"  # notes need nothing done
    assert worst([*FIRST[:3], Check("Output", "ydotoold", "warning", "not running")]) == "warning"
    assert diagnostics.STATUS_TEXT["problem"] == "Problem"
