"""The settings window against a FakeController with real settings storage: what a user edits ends up in
settings.json, what is refused is explained next to the field and leaves the file alone."""

from __future__ import annotations

import logging
import os
import re
import sys
from pathlib import Path

import pytest
from PySide6.QtCore import QEvent, QPoint, Qt
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import QApplication, QComboBox

from dictation.app.pages import model_page
from dictation.app.settings_window import PAGE_NAMES, SettingsWindow
from dictation.config.schema import FieldError, field_info
from dictation.config.settings import Adapter, Phrase, Replacement, Settings


@pytest.fixture
def open_window(qtbot):
    def open_(controller, page: str = "model") -> SettingsWindow:
        window = SettingsWindow(controller)
        qtbot.addWidget(window)
        window.bring_forward(page)
        qtbot.waitExposed(window)
        return window

    return open_


@pytest.fixture
def window(open_window, controller):
    return open_window(controller)


def rows(window):
    return window.field_rows()


def enter_text(qtbot, widget, text: str) -> None:
    """Replace the text of a line edit, editable combo or spin box as a user would, then press Enter."""
    if isinstance(widget, QComboBox):
        widget = widget.lineEdit()
    widget.selectAll()
    qtbot.keyClicks(widget, text)  # typing replaces the selection
    qtbot.keyClick(widget, Qt.Key.Key_Return)


def click_check(qtbot, check) -> None:
    """Click a check box on its box (a click right of its text does nothing, as for a user)."""
    qtbot.mouseClick(check, Qt.MouseButton.LeftButton, pos=QPoint(8, check.height() // 2))


def wait_for_error(qtbot, window, fragment: str) -> str:
    """The Model page checks adapters on a worker thread: wait for its message under the list."""
    row = window.page("model").adapter_row
    qtbot.waitUntil(lambda: fragment in row.error_text(), timeout=20_000)
    return row.error_text()


def with_engine(**changes) -> Settings:
    s = Settings()
    return s.replace(engine=s.engine.replace(**changes))


# --- the window -------------------------------------------------------------------------------------


def test_every_setting_has_a_control_on_some_page(window):
    assert set(rows(window)) == {info.key for info in field_info()}


def test_show_page_and_bring_forward(qtbot, controller):
    window = SettingsWindow(controller)
    qtbot.addWidget(window)
    assert not window.isVisible()
    window.bring_forward("output")
    assert window.isVisible()
    assert window.current_page() == "output"
    for name in PAGE_NAMES:
        window.show_page(name)
        assert window.current_page() == name
    with pytest.raises(ValueError, match="no settings page 'sounds'"):
        window.show_page("sounds")


# --- generated fields -------------------------------------------------------------------------------


def test_a_number_typed_in_a_field_is_saved(qtbot, window, controller):
    window.show_page("recording")
    spin = rows(window)["recording.max_seconds"].editor.spin
    enter_text(qtbot, spin, "600")
    assert controller.saved_settings().recording.max_seconds == 600


def test_a_check_box_click_is_saved(qtbot, window, controller):
    window.show_page("output")
    check = rows(window)["output.trailing_space"].editor.check
    click_check(qtbot, check)
    assert controller.saved_settings().output.trailing_space is False


def test_a_refused_value_is_explained_next_to_its_field_and_not_saved(qtbot, window, controller):
    row = rows(window)["engine.device"]
    enter_text(qtbot, row.editor.combo, "gpu")
    assert "'gpu' is not auto, cpu, cuda, cuda:N or mps" in row.error_text()
    assert row.editor.value() == "auto"  # back to what is in effect
    assert not controller.store.path.exists()
    assert controller.settings.engine.device == "auto"
    # the next accepted edit clears the message
    enter_text(qtbot, row.editor.combo, "cpu")
    assert row.error_text() == ""
    assert controller.saved_settings().engine.device == "cpu"


def test_values_are_stored_in_their_normal_form(qtbot, window, controller):
    enter_text(qtbot, rows(window)["engine.device"].editor.combo, "CUDA:1")
    assert controller.saved_settings().engine.device == "cuda:1"
    assert rows(window)["engine.device"].editor.value() == "cuda:1"


def test_a_choice_picked_with_the_keyboard_is_saved(qtbot, window, controller):
    combo = rows(window)["transcription.language"].editor.combo
    first_language = combo.itemData(1)
    qtbot.keyClick(combo, Qt.Key.Key_Down)
    assert controller.saved_settings().transcription.language == first_language != "auto"


def test_vocabulary_applies_after_a_pause_not_per_keystroke(qtbot, window, controller):
    edit = rows(window)["transcription.context"].editor.edit
    qtbot.keyClicks(edit, "Kubernetes, PySide6")
    assert controller.applied == []  # nothing applied while typing
    qtbot.waitUntil(lambda: controller.saved_settings().transcription.context == "Kubernetes, PySide6", timeout=5000)
    assert len(controller.applied) == 1
    assert edit.toPlainText() == "Kubernetes, PySide6"


def test_vocabulary_applies_when_the_field_loses_focus(qtbot, window, controller):
    edit = rows(window)["transcription.context"].editor.edit
    edit.setFocus()
    qtbot.waitUntil(edit.hasFocus)
    qtbot.keyClicks(edit, "Dr. Nguyen")
    rows(window)["engine.model"].editor.edit.setFocus()
    qtbot.waitUntil(lambda: controller.saved_settings().transcription.context == "Dr. Nguyen", timeout=500)


def test_settings_changed_elsewhere_update_the_widgets_without_applying_again(window, controller):
    s = controller.settings
    controller.change_settings_elsewhere(
        s.replace(
            recording=s.recording.replace(max_seconds=42),
            output=s.output.replace(paste_chord="ctrl+shift+v", restore_clipboard=False),
        )
    )
    assert rows(window)["recording.max_seconds"].editor.value() == 42
    assert rows(window)["output.paste_chord"].editor.value() == "ctrl+shift+v"
    assert rows(window)["output.paste_chord"].editor.combo.currentText() == "Ctrl+Shift+V"
    assert not rows(window)["output.restore_delay_ms"].isEnabled()  # only matters while restoring
    assert controller.applied == []


def test_list_item_errors_appear_under_the_list_and_it_reverts(qtbot, open_window, make_controller, monkeypatch):
    controller = make_controller(with_engine(adapters=(Adapter(path="/adapters/a", weight=1.0),)))
    window = open_window(controller)
    monkeypatch.setattr(
        controller, "apply_settings", lambda s: [FieldError("engine.adapters[0].weight", "1.5 is too strong")]
    )
    adapters = window.page("model").adapter_list
    spin = adapters.table.cellWidget(0, 1)
    enter_text(qtbot, spin, "1.5")
    assert window.page("model").adapter_row.error_text() == "Item 1, weight: 1.5 is too strong"
    assert adapters.table.cellWidget(0, 1).value() == 1.0


# --- Model page -------------------------------------------------------------------------------------


def test_first_run_explanation_is_shown_until_a_model_is_chosen(window, controller):
    page = window.page("model")
    assert not page.intro.isHidden()
    assert "0.6B" in page.intro_text.text() and "1.7B" in page.intro_text.text()
    assert "GB of GPU memory" in page.intro_text.text()
    controller.change_settings_elsewhere(with_engine(model="Qwen/Qwen3-ASR-1.7B"))
    assert page.intro.isHidden()


def test_a_bad_model_folder_is_refused_with_the_reason(qtbot, window, controller, tmp_path):
    empty = tmp_path / "not-a-model"
    empty.mkdir()
    row = window.page("model").model_row
    enter_text(qtbot, row.editor.edit, str(empty))
    assert str(empty) in row.error_text()
    assert "config.json" in row.error_text()
    assert row.editor.value() == ""
    assert controller.saved_settings().engine.model == ""
    assert controller.applied == []


def test_a_missing_model_folder_is_refused(qtbot, window, controller, tmp_path):
    row = window.page("model").model_row
    row.editor.committed.emit(str(tmp_path / "nowhere"))  # what Browse… reports
    assert "nowhere" in row.error_text()
    assert controller.saved_settings().engine.model == ""


def test_a_good_model_folder_is_saved(qtbot, window, controller, model_folder):
    page = window.page("model")
    enter_text(qtbot, page.model_row.editor.edit, str(model_folder))
    assert page.model_row.error_text() == ""
    assert controller.saved_settings().engine.model == str(model_folder)
    assert page.intro.isHidden()


def test_known_models_offer_use_when_cached_and_download_otherwise(qtbot, open_window, controller, put_in_hf_cache):
    put_in_hf_cache("Qwen/Qwen3-ASR-0.6B")
    window = open_window(controller)
    page = window.page("model")
    small, large = page.model_rows["Qwen/Qwen3-ASR-0.6B"], page.model_rows["Qwen/Qwen3-ASR-1.7B"]
    assert (small.button.text(), small.status.text()) == ("Use", "Downloaded")
    assert (large.button.text(), large.status.text()) == ("Download", "Not downloaded")
    assert "4.7 GB download" in large.details.text() and "5.5 GB GPU memory" in large.details.text()
    qtbot.mouseClick(small.button, Qt.MouseButton.LeftButton)
    assert controller.saved_settings().engine.model == "Qwen/Qwen3-ASR-0.6B"
    assert small.status.text() == "In use"
    assert not small.button.isEnabled()


def test_download_shows_progress_cancels_and_selects_the_model_when_done(qtbot, window, controller, put_in_hf_cache):
    page = window.page("model")
    repo = "Qwen/Qwen3-ASR-1.7B"
    qtbot.mouseClick(page.model_rows[repo].button, Qt.MouseButton.LeftButton)
    assert controller.called("start_download") == [("start_download", repo)]
    panel = page.download_panel
    assert not panel.isHidden()
    assert "resume" in panel.note.text()
    assert not page.model_rows["Qwen/Qwen3-ASR-0.6B"].button.isEnabled()  # one download at a time

    controller.download_progress.emit(repo, 2_350_000_000, 4_700_000_000)
    assert panel.percent() == 50
    assert panel.amount.text() == "2.35 GB of 4.70 GB"
    qtbot.mouseClick(panel.cancel_button, Qt.MouseButton.LeftButton)
    assert controller.called("cancel_download") == [("cancel_download",)]

    put_in_hf_cache(repo)  # the files arrived
    controller.download_finished.emit(repo, "")
    assert controller.saved_settings().engine.model == repo
    assert page.model_rows[repo].status.text() == "In use"
    assert panel.cancel_button.isHidden()


def test_a_failed_download_says_why_and_changes_nothing(window, controller):
    page = window.page("model")
    repo = "Qwen/Qwen3-ASR-0.6B"
    page.start_download(repo)
    controller.download_finished.emit(repo, f"{repo}: cannot reach the Hugging Face Hub (offline)")
    assert "cannot reach the Hugging Face Hub" in page.download_panel.result.text()
    assert "failed" in page.download_panel.title.text()
    assert controller.saved_settings().engine.model == ""
    assert page.model_rows[repo].button.isEnabled()  # can be tried again


def test_a_cancelled_download_changes_nothing(window, controller):
    page = window.page("model")
    page.start_download("Qwen/Qwen3-ASR-0.6B")
    controller.download_finished.emit("Qwen/Qwen3-ASR-0.6B", "cancelled")
    assert "cancelled" in page.download_panel.title.text()
    assert controller.saved_settings().engine.model == ""


def test_variants_show_approximate_gpu_memory_for_the_chosen_model(window, controller):
    combo = rows(window)["engine.variant"].editor.combo

    def label(value):
        return combo.itemText(combo.findData(value))

    assert "0.72× the bf16 memory" in label("int8")  # no model chosen: relative figures
    controller.change_settings_elsewhere(with_engine(model="Qwen/Qwen3-ASR-1.7B"))
    assert "about 4.0 GB" in label("int8") and "approx" in label("int8")
    assert "about 11.0 GB" in label("fp32")
    assert "about 3.3 GB" in label("int4")
    assert "about 5.5 GB" in label("bf16")


def test_model_label_and_loading_progress_are_shown(window, controller):
    page = window.page("model")
    assert page.loaded_label.text() == "No model loaded"
    controller.model_progress.emit("Loading Qwen3-ASR-1.7B …")
    assert page.progress_label.text() == "Loading Qwen3-ASR-1.7B …"
    controller.set_model_label("Qwen3-ASR-1.7B · bf16 · cuda")
    controller.model_progress.emit("Loaded Qwen3-ASR-1.7B in 2.1 s")
    assert page.loaded_label.text() == "Qwen3-ASR-1.7B · bf16 · cuda"
    assert page.progress_label.text() == "Loaded Qwen3-ASR-1.7B in 2.1 s"


# --- adapters ---------------------------------------------------------------------------------------


def test_a_rejected_adapter_is_not_added(qtbot, open_window, make_controller, model_folder, tmp_path, monkeypatch):
    seen = []

    def check(adapter_dir, folder):
        seen.append((adapter_dir, folder))
        return f"{adapter_dir}: trained on Qwen3-ASR-0.6B, not on this model"

    monkeypatch.setattr(model_page, "check_adapter", check)
    controller = make_controller(with_engine(model=str(model_folder)))
    window = open_window(controller)
    adapter = tmp_path / "accent-adapter"
    adapter.mkdir()
    window.page("model").adapter_list.add_folder(adapter)
    wait_for_error(qtbot, window, "trained on Qwen3-ASR-0.6B")
    assert seen == [(str(adapter), model_folder)]  # checked against the chosen model, before applying
    assert controller.saved_settings().engine.adapters == ()
    assert controller.applied == []
    assert window.page("model").adapter_list.table.isHidden()


def test_a_real_check_refuses_a_folder_that_is_no_adapter(qtbot, window, controller, tmp_path):
    not_adapter = tmp_path / "holiday-photos"
    not_adapter.mkdir()
    window.page("model").adapter_list.add_folder(not_adapter)
    wait_for_error(qtbot, window, "holiday-photos")
    assert controller.saved_settings().engine.adapters == ()


def test_an_adapter_that_fits_the_model_is_added(qtbot, open_window, make_controller, model_folder, make_adapter):
    controller = make_controller(with_engine(model=str(model_folder)))
    window = open_window(controller)
    adapter = make_adapter("accent")
    window.page("model").adapter_list.add_folder(adapter)
    qtbot.waitUntil(lambda: controller.saved_settings().engine.adapters == (Adapter(path=str(adapter)),))
    assert window.page("model").adapter_row.error_text() == ""


def test_an_adapter_for_another_model_is_refused(qtbot, open_window, make_controller, model_folder, make_adapter):
    controller = make_controller(with_engine(model=str(model_folder)))
    window = open_window(controller)
    adapter = make_adapter("for-a-bigger-model", fits=False)
    window.page("model").adapter_list.add_folder(adapter)
    message = wait_for_error(qtbot, window, "for-a-bigger-model")
    assert "for-a-bigger-model" in message and "different model" in message
    assert controller.saved_settings().engine.adapters == ()


def test_choosing_another_model_warns_about_adapters_that_do_not_fit_it(
    qtbot, open_window, make_controller, model_folder, monkeypatch
):
    controller = make_controller(with_engine(adapters=(Adapter(path="/adapters/accent"),)))
    window = open_window(controller)
    monkeypatch.setattr(model_page, "check_adapter", lambda adapter_dir, folder: f"{adapter_dir}: made for 0.6B.")
    enter_text(qtbot, window.page("model").model_row.editor.edit, str(model_folder))
    assert controller.saved_settings().engine.model == str(model_folder)  # the model change itself applies
    wait_for_error(qtbot, window, "/adapters/accent: made for 0.6B.")


def test_adapters_can_be_added_switched_weighted_and_removed(qtbot, window, controller, tmp_path, monkeypatch):
    monkeypatch.setattr(model_page, "check_adapter", lambda adapter_dir, folder: None)
    adapters = window.page("model").adapter_list
    folder = tmp_path / "jargon"
    adapters.add_folder(folder)
    qtbot.waitUntil(lambda: controller.saved_settings().engine.adapters == (Adapter(path=str(folder)),))
    assert adapters.table.rowCount() == 1

    adapters.add_folder(folder)
    assert "already in the list" in window.page("model").adapter_row.error_text()
    assert len(controller.saved_settings().engine.adapters) == 1

    adapters.set_enabled(0, False)
    assert controller.saved_settings().engine.adapters[0].enabled is False
    enter_text(qtbot, adapters.table.cellWidget(0, 1), "0.5")
    assert controller.saved_settings().engine.adapters[0].weight == 0.5
    qtbot.mouseClick(adapters.table.cellWidget(0, 2), Qt.MouseButton.LeftButton)
    assert controller.saved_settings().engine.adapters == ()
    assert adapters.table.isHidden() and not adapters.empty.isHidden()


def test_switching_an_adapter_on_checks_it_first(qtbot, open_window, make_controller, monkeypatch):
    monkeypatch.setattr(
        model_page, "check_adapter", lambda adapter_dir, folder: f"{adapter_dir}: no adapter_config.json"
    )
    controller = make_controller(with_engine(adapters=(Adapter(path="/adapters/old", enabled=False),)))
    window = open_window(controller)
    adapters = window.page("model").adapter_list
    adapters.set_enabled(0, True)
    wait_for_error(qtbot, window, "/adapters/old: no adapter_config.json")
    assert adapters.table.item(0, 0).checkState() == Qt.CheckState.Unchecked
    assert controller.saved_settings().engine.adapters[0].enabled is False


def test_an_adapter_whose_pattern_never_finishes_is_refused_while_the_window_stays_live(
    qtbot, open_window, make_controller, model_folder, make_adapter, short_pattern_deadline
):
    """target_modules "(.*)*X" used to freeze the GUI thread for ever (re held it); now the check runs on a
    worker thread, is refused after the matcher's deadline, and the window keeps painting meanwhile."""
    import faulthandler
    import json
    import time

    from PySide6.QtCore import QTimer

    controller = make_controller(with_engine(model=str(model_folder)))
    window = open_window(controller)
    adapter = make_adapter("hangs")
    config = json.loads((adapter / "adapter_config.json").read_text())
    (adapter / "adapter_config.json").write_text(json.dumps({**config, "target_modules": "(.*)*X"}))
    ticks = []
    timer = QTimer()
    timer.timeout.connect(lambda: ticks.append(time.monotonic()))
    timer.start(20)
    faulthandler.dump_traceback_later(120, exit=True)  # a frozen GUI thread ends the run instead of hanging it
    try:
        t0 = time.monotonic()
        window.page("model").adapter_list.add_folder(adapter)
        assert time.monotonic() - t0 < 1.0  # returned at once
        assert not window.page("model").adapter_list.isEnabled()  # no second edit while it is checked
        message = wait_for_error(qtbot, window, "did not finish matching")
    finally:
        faulthandler.cancel_dump_traceback_later()
        timer.stop()
    assert "adapter_config.json" in message and "(.*)*X" in message
    assert len(ticks) > 20  # the GUI thread ran its timer all along
    assert controller.saved_settings().engine.adapters == ()
    assert window.page("model").adapter_list.isEnabled()


# --- Recording page ---------------------------------------------------------------------------------


def test_microphones_are_listed_and_the_chosen_name_is_saved(qtbot, window, controller):
    window.show_page("recording")
    combo = window.page("recording").microphone.combo
    items = [combo.itemText(i) for i in range(combo.count())]
    assert items == ["System default (Built-in Microphone)", "Built-in Microphone", "USB Headset"]
    qtbot.keyClick(combo, Qt.Key.Key_End)
    assert controller.saved_settings().recording.input_device == "USB Headset"


def test_a_saved_microphone_that_is_unplugged_stays_visible(open_window, make_controller):
    s = Settings()
    controller = make_controller(s.replace(recording=s.recording.replace(input_device="Podcast Mic")))
    window = open_window(controller, "recording")
    combo = window.page("recording").microphone.combo
    assert combo.currentText() == "Podcast Mic (not connected)"


def test_level_meter_follows_the_microphone_only_while_the_page_is_visible(qtbot, window, controller):
    page = window.page("recording")
    controller.level = 0.6
    assert controller.level_polls == 0  # the model page is showing
    window.show_page("recording")
    qtbot.waitUntil(lambda: page.meter.level() == pytest.approx(0.6))
    controller.level = 0.1
    qtbot.waitUntil(lambda: page.meter.level() == pytest.approx(0.1))
    window.show_page("output")
    assert not page.metering
    polls = controller.level_polls
    qtbot.wait(200)
    assert controller.level_polls == polls


def _capture(qtbot, edit, *keys):
    qtbot.mouseClick(edit.button, Qt.MouseButton.LeftButton)
    assert edit.capturing
    for key, modifiers in keys:
        qtbot.keyPress(edit.button, key, modifiers)
        qtbot.keyRelease(edit.button, key, modifiers)


def test_hotkey_capture_saves_the_pressed_keys_and_pauses_global_hotkeys_meanwhile(qtbot, window, controller):
    window.show_page("recording")
    edit = window.page("recording").hotkey_edit
    qtbot.mouseClick(edit.button, Qt.MouseButton.LeftButton)
    assert controller.hotkeys_paused is True
    mods = Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.ShiftModifier
    qtbot.keyPress(edit.button, Qt.Key.Key_K, mods)
    assert controller.saved_settings().hotkeys.hotkey == "ctrl+shift+k"
    assert edit.button.text() == "Ctrl + Shift + K"
    assert controller.called("set_hotkeys_paused") == [("set_hotkeys_paused", True), ("set_hotkeys_paused", False)]


def test_space_finishes_a_capture_without_starting_another(qtbot, window, controller):
    window.show_page("recording")
    edit = window.page("recording").hotkey_edit
    _capture(qtbot, edit, (Qt.Key.Key_Space, Qt.KeyboardModifier.ShiftModifier))
    assert controller.saved_settings().hotkeys.hotkey == "shift+space"
    assert not edit.capturing  # the release of Space did not click the button again
    assert controller.hotkeys_paused is False


def test_hotkey_capture_escape_keeps_the_old_hotkey(qtbot, window, controller):
    window.show_page("recording")
    edit = window.page("recording").hotkey_edit
    _capture(qtbot, edit, (Qt.Key.Key_Escape, Qt.KeyboardModifier.NoModifier))
    assert not edit.capturing
    assert edit.button.text() == "Ctrl + Alt + Space"
    assert controller.applied == []
    assert controller.hotkeys_paused is False


def test_hotkey_capture_restores_a_pause_that_was_already_on(qtbot, window, controller):
    controller.set_hotkeys_paused(True)
    window.show_page("recording")
    edit = window.page("recording").hotkey_edit
    _capture(qtbot, edit, (Qt.Key.Key_F9, Qt.KeyboardModifier.NoModifier))
    assert controller.saved_settings().hotkeys.hotkey == "f9"
    assert controller.hotkeys_paused is True


def test_a_lone_modifier_becomes_a_push_to_talk_key_with_its_side(qtbot, window, controller):
    window.show_page("recording")
    edit = window.page("recording").hotkey_edit
    qtbot.mouseClick(edit.button, Qt.MouseButton.LeftButton)
    ctrl = Qt.KeyboardModifier.ControlModifier
    right_ctrl_keysym = 0xFFE4
    press = QKeyEvent(QEvent.Type.KeyPress, Qt.Key.Key_Control, ctrl, 105, right_ctrl_keysym, 0)
    release = QKeyEvent(QEvent.Type.KeyRelease, Qt.Key.Key_Control, Qt.KeyboardModifier.NoModifier, 105, 0xFFE4, 0)
    QApplication.sendEvent(edit.button, press)
    assert controller.applied == []  # still waiting: a key may follow
    QApplication.sendEvent(edit.button, release)
    assert controller.saved_settings().hotkeys.hotkey == "right_ctrl"


def test_cancel_key_backspace_means_no_cancel_key_and_default_restores_it(qtbot, window, controller):
    window.show_page("recording")
    edit = window.page("recording").cancel_edit
    _capture(qtbot, edit, (Qt.Key.Key_Backspace, Qt.KeyboardModifier.NoModifier))
    assert controller.saved_settings().hotkeys.cancel_key == ""
    assert edit.button.text() == "None"
    qtbot.mouseClick(edit.reset_button, Qt.MouseButton.LeftButton)
    assert controller.saved_settings().hotkeys.cancel_key == "esc"


# --- Output page ------------------------------------------------------------------------------------


def test_detected_output_chain_is_shown_and_follows_the_method(qtbot, window, controller):
    window.show_page("output")
    page = window.page("output")
    assert page.detected.text() == controller.output_description()
    combo = rows(window)["output.method"].editor.combo
    qtbot.keyClick(combo, Qt.Key.Key_End)  # "Typing"
    assert controller.saved_settings().output.method == "type"
    assert page.detected.text().startswith("method type")


def test_replacements_can_be_added_and_removed(qtbot, window, controller):
    window.show_page("output")
    editor = window.page("output").replacements
    qtbot.mouseClick(editor.add_button, Qt.MouseButton.LeftButton)
    assert editor.table.rowCount() == 1
    editor.set_cell(0, 1, "the")
    assert controller.saved_settings().output.replacements == ()  # no 'replace' text yet: not used
    assert window.page("output").replacements_row.error_text() == ""
    editor.set_cell(0, 0, "teh")
    assert controller.saved_settings().output.replacements == (Replacement(from_="teh", to="the"),)
    editor.table.selectRow(0)
    qtbot.mouseClick(editor.remove_button, Qt.MouseButton.LeftButton)
    assert controller.saved_settings().output.replacements == ()
    assert editor.table.rowCount() == 0


def test_voice_command_phrases_and_spoken_punctuation_are_set_on_the_output_page(qtbot, window, controller):
    window.show_page("output")
    editor = window.page("output").phrases
    qtbot.mouseClick(editor.add_button, Qt.MouseButton.LeftButton)
    editor.set_cell(0, 1, "new line")
    assert controller.saved_settings().commands.phrases == ()  # nothing said yet: not used
    editor.set_cell(0, 0, "next one")
    assert controller.saved_settings().commands.phrases == (Phrase(said="next one", means="new line"),)
    assert controller.saved_settings().commands.spoken_punctuation is False
    click_check(qtbot, rows(window)["commands.spoken_punctuation"].editor.check)
    assert controller.saved_settings().commands.spoken_punctuation is True


# --- General and Log pages --------------------------------------------------------------------------


def test_general_page_saves_and_shows_the_hotkey_backend(qtbot, window, controller):
    window.show_page("general")
    page = window.page("general")
    assert page.hotkey_backend.text() == controller.hotkey_description()
    click_check(qtbot, rows(window)["general.start_at_login"].editor.check)
    enter_text(qtbot, rows(window)["engine.idle_unload_minutes"].editor.spin, "15")
    saved = controller.saved_settings()
    assert saved.general.start_at_login is True
    assert saved.engine.idle_unload_minutes == 15
    assert "engine.idle_unload_minutes" in page.rows
    enter_text(qtbot, rows(window)["engine.idle_unload_minutes"].editor.spin, "0")
    assert rows(window)["engine.idle_unload_minutes"].editor.spin.text() == "Never (keep it loaded)"
    assert controller.saved_settings().engine.idle_unload_minutes == 0


def _record(level, name, message, *args):
    return logging.LogRecord(name, level, __file__, 1, message, args or None, None)


def test_log_shows_earlier_and_new_lines_and_filters_by_level(open_window, controller):
    controller.log.append(_record(logging.INFO, "dictation.app", "starting"))
    controller.log.append(_record(logging.WARNING, "dictation.audio", "microphone %s is silent", "USB Headset"))
    window = open_window(controller, "log")
    page = window.page("log")
    lines = page.text().splitlines()
    assert len(lines) == 2
    assert "INFO" in lines[0] and "dictation.app" in lines[0] and lines[0].endswith("starting")
    assert "WARNING" in lines[1] and lines[1].endswith("microphone USB Headset is silent")
    controller.log_record.emit(_record(logging.ERROR, "dictation.asr", "model failed to load"))
    assert page.text().splitlines()[-1].endswith("model failed to load")
    page.level_filter.setCurrentIndex(page.level_filter.findData(logging.WARNING))
    assert [line.split()[1] for line in page.text().splitlines()] == ["WARNING", "ERROR"]
    controller.log_record.emit(_record(logging.DEBUG, "dictation.asr", "hidden"))
    assert "hidden" not in page.text()


def _click_open_log_folder(qtbot, window, out: Path) -> tuple[str, dict[str, str]]:
    """Click "Open log folder" with a stand-in xdg-open on PATH; what it was given."""
    from tests.frozen import read_fake_tool

    qtbot.mouseClick(window.page("log").open_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(out.exists, timeout=10_000)
    args, env, _ = read_fake_tool(out)
    assert window.page("log").folder_error.isHidden()
    return args, env


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="xdg-open opens folders on Linux")
def test_open_log_folder_opens_the_log_directory(qtbot, open_window, controller, monkeypatch, tmp_path):
    from dictation.paths import log_dir
    from tests.frozen import fake_tool

    out = tmp_path / "xdg-open.out"
    fake_tool(tmp_path / "bin", "xdg-open", out)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    window = open_window(controller, "log")
    args, _ = _click_open_log_folder(qtbot, window, out)
    assert args == str(log_dir())
    assert log_dir().is_dir()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="xdg-open opens folders on Linux")
def test_the_file_manager_of_a_frozen_app_gets_the_users_environment(
    qtbot, open_window, controller, monkeypatch, tmp_path
):
    """Qt would start xdg-open (and so the file manager) with the bundle's LD_LIBRARY_PATH and Qt plugin
    path."""
    from dictation.paths import log_dir
    from tests.frozen import USER_LIBRARY_PATH, bundle_variables, fake_tool, simulate_frozen

    out = tmp_path / "xdg-open.out"
    fake_tool(tmp_path / "bin", "xdg-open", out)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    window = open_window(controller, "log")
    bundle = simulate_frozen(monkeypatch, tmp_path)
    args, env = _click_open_log_folder(qtbot, window, out)
    assert args == str(log_dir())
    assert env["LD_LIBRARY_PATH"] == USER_LIBRARY_PATH
    assert bundle_variables(env, bundle) == {} and "QT_PLUGIN_PATH" not in env


def test_streaming_settings_sit_on_their_pages_and_live_preview_greys_out_without_streaming(qtbot, window, controller):
    assert "engine.stream_while_recording" in window.page("model").rows
    assert "general.live_preview" in window.page("general").rows
    preview = rows(window)["general.live_preview"]
    assert preview.isEnabled()
    click_check(qtbot, rows(window)["engine.stream_while_recording"].editor.check)
    assert controller.saved_settings().engine.stream_while_recording is False
    assert not preview.isEnabled()  # previews come from the streamed audio
    click_check(qtbot, preview.editor.check)  # greyed out: the click does nothing
    assert controller.saved_settings().general.live_preview is True


def _model_status_row(qtbot, controller):
    """The Status row of a settings window opened now (as the app makes it: on first use)."""
    window = SettingsWindow(controller)
    qtbot.addWidget(window)
    window.bring_forward("model")
    status = window.page("model").progress_label
    assert status.isVisible()
    text = status.text()
    window.close()  # before the rig's controller shuts down
    return text


def test_a_model_page_opened_after_the_load_says_where_the_model_stands(rig, qtbot, tmp_path):
    """The settings window is made when first opened, after the load's messages went by: its Status
    row was empty. A real controller: loaded, then a new model that fails while the old one stays."""
    r = rig()
    r.start()
    qtbot.waitUntil(lambda: r.c.model_label != "", timeout=60_000)
    shown = _model_status_row(qtbot, r.c)
    assert re.fullmatch(rf"Loaded {re.escape(r.c.model_label)} in \d+\.\d s", shown), shown

    s = r.c.settings
    assert r.c.apply_settings(s.replace(engine=s.engine.replace(model=str(tmp_path / "gone")))) == []
    qtbot.waitUntil(lambda: r.c.model_state_text.startswith("Still using"), timeout=60_000)
    shown = _model_status_row(qtbot, r.c)
    assert shown.startswith(f"Still using {r.c.model_label}: the new model could not be loaded") and "gone" in shown


def test_a_model_page_opened_after_a_failed_load_says_why(rig, qtbot, tmp_path):
    from dictation.app.model_lifecycle import NO_MODEL_MESSAGE

    settings = Settings()
    r = rig(settings.replace(engine=settings.engine.replace(model=str(tmp_path / "gone"), device="cpu")))
    r.start()
    qtbot.waitUntil(lambda: r.c.model_state_text.startswith("Failed: "), timeout=60_000)
    assert _model_status_row(qtbot, r.c) == f"Failed: {tmp_path / 'gone'}: no such model folder"

    assert r.c.apply_settings(r.c.settings.replace(engine=r.c.settings.engine.replace(model=""))) == []
    qtbot.waitUntil(lambda: r.c.model_state_text == NO_MODEL_MESSAGE, timeout=20_000)
    assert _model_status_row(qtbot, r.c) == NO_MODEL_MESSAGE
