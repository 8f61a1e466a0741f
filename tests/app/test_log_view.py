"""The Log page shows long lines whole (they were cut at the edge of the view)."""

from __future__ import annotations

import logging

from dictation.app.settings_window import SettingsWindow

LONG_PATH = "/home/user/.cache/huggingface/hub/models--Qwen--Qwen3-ASR-1.7B/snapshots/" + "0123456789abcdef" * 6


def test_a_long_log_line_wraps_inside_the_view(qtbot, controller):
    window = SettingsWindow(controller)
    qtbot.addWidget(window)
    window.resize(760, 500)
    window.bring_forward("log")
    qtbot.waitExposed(window)
    page = window.page("log")
    message = "cannot read the model folder " + LONG_PATH + " because " + "the disk is slow " * 12
    controller.log_record.emit(logging.LogRecord("dictation.app", logging.WARNING, __file__, 1, message, None, None))
    view = page.view
    assert message in page.text()
    block = view.document().lastBlock()
    assert message in block.text()
    assert block.layout().lineCount() >= 3  # wrapped, the path included
    widest = max(block.layout().lineAt(i).naturalTextWidth() for i in range(block.layout().lineCount()))
    assert widest <= view.viewport().width()
    assert view.horizontalScrollBar().maximum() == 0  # nothing sticks out to the right
