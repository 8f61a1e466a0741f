"""The mouse wheel scrolls the settings window; it changes a combo or spin box only once the user has
clicked or tabbed into it (scrolling the Model page set the weights to int4).

Real wheel events (QTest.wheelEvent goes through the window system queue as a mouse's would, so Qt's
focus-on-wheel and propagation rules apply) over every combo and spin box of the real window.
"""

from __future__ import annotations

import re
from pathlib import Path

from PySide6.QtCore import QPoint, QPointF, Qt
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QAbstractSpinBox, QComboBox, QScrollArea

from dictation.app.settings_window import PAGE_NAMES, SettingsWindow
from dictation.config.settings import Adapter, Settings

NOTCH = 120  # one wheel step


def wheel_over(window, widget, steps: int) -> None:
    """Turn the wheel ``steps`` notches (negative: towards the user, scrolling down) over ``widget``'s middle."""
    pos = widget.mapTo(window, widget.rect().center())
    QTest.wheelEvent(window.windowHandle(), QPointF(pos), QPoint(0, steps * NOTCH))


def value_of(box) -> object:
    return box.currentText() if isinstance(box, QComboBox) else box.value()


def page_scroll_area(window, name: str) -> QScrollArea | None:
    area = window.stack.widget(PAGE_NAMES.index(name))
    return area if isinstance(area, QScrollArea) else None


def boxes_of(page) -> list:
    return [b for b in page.findChildren(QComboBox) + page.findChildren(QAbstractSpinBox) if b.isVisible()]


def open_small_window(qtbot, controller) -> SettingsWindow:
    window = SettingsWindow(controller)
    qtbot.addWidget(window)
    window.resize(760, 380)  # every settings page needs scrolling at this size
    window.bring_forward("model")
    qtbot.waitExposed(window)
    return window


def test_the_wheel_over_a_box_scrolls_the_page_and_changes_nothing(qtbot, make_controller, tmp_path):
    s = Settings()  # an adapter, so that the adapter list shows a weight spin box
    controller = make_controller(s.replace(engine=s.engine.replace(adapters=(Adapter(path=str(tmp_path / "a")),))))
    saved = controller.saved_settings()
    window = open_small_window(qtbot, controller)
    seen: dict[str, int] = {}
    for name in PAGE_NAMES:
        window.show_page(name)
        page = window.page(name)
        area = page_scroll_area(window, name)
        for box in boxes_of(page):
            window.sidebar.setFocus()  # the focus is elsewhere, as while reading the page
            before = value_of(box)
            for direction in (-1, 1):  # a notch down, then one up
                if area is None:
                    wheel_over(window, box, direction)
                    continue
                area.ensureWidgetVisible(box)
                bar = area.verticalScrollBar()
                assert bar.maximum() > 0, f"page {name} does not scroll at this size"
                position = bar.value()
                steps = direction if 0 < position < bar.maximum() else (1 if position == bar.maximum() else -1)
                wheel_over(window, box, steps)
                assert bar.value() != position, f"{name}: the page did not scroll over {type(box).__name__}"
            assert value_of(box) == before, f"{name}: the wheel changed {type(box).__name__} {before!r}"
            assert not box.hasFocus()  # the wheel does not take the focus either
            seen[name] = seen.get(name, 0) + 1
    assert controller.applied == []
    assert controller.saved_settings() == saved
    # Model: device, precision, weights variant, language, adapter weight; Recording: microphone, mode
    # and numbers; Log: the level filter.
    assert seen["model"] >= 5 and seen["recording"] >= 3 and seen["output"] >= 2 and seen["general"] >= 2
    assert seen["log"] == 1


def test_a_box_the_user_tabbed_into_takes_the_wheel(qtbot, controller):
    window = open_small_window(qtbot, controller)
    window.show_page("general")
    row = window.field_rows()["general.history_size"]
    spin = row.editor.spin
    page_scroll_area(window, "general").ensureWidgetVisible(spin)
    spin.setFocus(Qt.FocusReason.TabFocusReason)
    before = spin.value()
    wheel_over(window, spin, 1)
    assert spin.value() == before + spin.singleStep()
    assert controller.saved_settings().general.history_size == before + spin.singleStep()


def test_every_combo_and_spin_box_of_the_app_is_a_wheel_guarded_one():
    """Plain Qt boxes would take the wheel again; the guarded classes live in widgets/wheel.py."""
    app = Path(__file__).resolve().parents[2] / "dictation" / "app"
    plain = re.compile(r"\bQ(ComboBox|SpinBox|DoubleSpinBox|FontComboBox|DateTimeEdit|DateEdit|TimeEdit)\(")
    found = [
        f"{path.relative_to(app)}:{n}"
        for path in app.rglob("*.py")
        if path.name != "wheel.py"
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if plain.search(line)
    ]
    assert found == []
