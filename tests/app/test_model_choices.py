"""Choosing a model on the Model page and in the tray: a repo id that is not
downloaded points to a Download button beside it (not to the CLI), the folder chooser opens beside
the models (never in the directory the app was started from), and the folders the user chose are
remembered in the settings and offered again, with every model of the Hugging Face cache."""

from __future__ import annotations

import os

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFileDialog

from dictation.app.settings_window import SettingsWindow
from dictation.app.tray import TrayMenu
from dictation.config.settings import RecentModel, Settings
from tests.app.test_settings_window import enter_text


@pytest.fixture
def open_page(qtbot):
    windows = []  # kept alive for the test

    def open_(controller):
        window = SettingsWindow(controller)
        qtbot.addWidget(window)
        windows.append(window)
        window.bring_forward("model")
        qtbot.waitExposed(window)
        return window.page("model")

    return open_


@pytest.fixture
def browse(monkeypatch):
    """Browse… with the folder dialog answered: records where it opened, returns ``answer[0]``."""
    opened: list[str] = []
    answer: list[str] = [""]

    def dialog(parent, caption, start):
        opened.append(start)
        return answer[0]

    monkeypatch.setattr(QFileDialog, "getExistingDirectory", dialog)
    return opened, answer


@pytest.mark.parametrize(
    ("repo", "size"), [("Qwen/Qwen3-ASR-1.7B", " (4.7 GB)"), ("me/qwen3-asr-medical", "")], ids=["known", "other"]
)
def test_a_repo_id_that_is_not_downloaded_offers_the_download_beside_it(
    qtbot, open_page, controller, put_in_hf_cache, repo, size
):
    page = open_page(controller)
    enter_text(qtbot, page.model_row.editor.edit, repo)
    assert page.model_row.error_text() == (
        f"{repo} is not downloaded yet. Press Download to fetch it{size} into the Hugging Face cache; "
        "it is chosen when done."
    )
    assert "dictation download" not in page.model_row.error_text()
    assert page.download_button.isVisible() and page.download_button.text() == f"Download {repo}"
    assert controller.saved_settings().engine.model == ""

    qtbot.mouseClick(page.download_button, Qt.MouseButton.LeftButton)
    assert controller.called("start_download") == [("start_download", repo)]
    assert page.download_panel.isVisible() and not page.download_button.isVisible()
    assert page.model_row.error_text() == ""
    put_in_hf_cache(repo)  # the files arrived
    controller.download_finished.emit(repo, "")
    assert controller.saved_settings().engine.model == repo


def test_a_partly_downloaded_repo_says_so(qtbot, open_page, controller, put_in_hf_cache):
    snapshot = put_in_hf_cache("Qwen/Qwen3-ASR-0.6B")
    (snapshot / "config.json").unlink()  # interrupted before the config arrived
    page = open_page(controller)
    enter_text(qtbot, page.model_row.editor.edit, "Qwen/Qwen3-ASR-0.6B")
    assert page.model_row.error_text().startswith("Qwen/Qwen3-ASR-0.6B is only partly downloaded. Press Download")
    assert page.download_button.isVisible()


def test_the_folder_chooser_opens_beside_the_models_never_in_the_working_directory(
    qtbot, open_page, controller, browse, model_folder, tmp_path, monkeypatch
):
    opened, answer = browse
    elsewhere = tmp_path / "started-here"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # where a desktop entry or a terminal started the app
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    page = open_page(controller)
    answer[0] = str(model_folder)
    qtbot.mouseClick(page.model_editor.browse, Qt.MouseButton.LeftButton)
    assert opened == [str(tmp_path / "home")]  # nothing chosen yet: the home folder, not the cwd
    assert controller.saved_settings().engine.model == str(model_folder)
    answer[0] = ""  # cancelled
    qtbot.mouseClick(page.model_editor.browse, Qt.MouseButton.LeftButton)
    assert opened[1] == str(model_folder.parent)  # beside the model in use

    controller.change_settings_elsewhere(
        Settings().replace(engine=Settings().engine.replace(model="Qwen/Qwen3-ASR-0.6B"))
    )
    controller.change_settings_elsewhere(
        controller.settings.replace(
            engine=controller.settings.engine.replace(recent_models=(RecentModel(path=str(model_folder)),))
        )
    )
    qtbot.mouseClick(page.model_editor.browse, Qt.MouseButton.LeftButton)
    assert opened[2] == str(model_folder.parent)  # a repo id in use: beside the last folder used
    assert os.getcwd() == str(elsewhere) and str(elsewhere) not in opened


def test_chosen_folders_are_remembered_and_offered_again(qtbot, open_page, controller, model_folder, tmp_path, browse):
    import shutil

    other = tmp_path / "models" / "another-asr-model"
    shutil.copytree(model_folder, other)
    page = open_page(controller)
    enter_text(qtbot, page.model_row.editor.edit, str(model_folder))
    enter_text(qtbot, page.model_row.editor.edit, str(other))
    saved = controller.saved_settings().engine
    assert saved.model == str(other)
    assert [r.path for r in saved.recent_models] == [str(other), str(model_folder)]  # newest first, in settings
    recent = page.recent_list
    assert recent.table.rowCount() == 2
    assert recent.button(0, 1).text() == "In use" and not recent.button(0, 1).isEnabled()
    qtbot.mouseClick(recent.button(1, 1), Qt.MouseButton.LeftButton)  # Use the first folder again
    assert controller.saved_settings().engine.model == str(model_folder)
    assert [r.path for r in controller.saved_settings().engine.recent_models] == [str(model_folder), str(other)]
    qtbot.mouseClick(recent.button(1, 2), Qt.MouseButton.LeftButton)  # Forget the other one
    assert [r.path for r in controller.saved_settings().engine.recent_models] == [str(model_folder)]
    assert controller.saved_settings().engine.model == str(model_folder)

    shutil.rmtree(model_folder)  # e.g. on a drive that is not plugged in now
    window = page.window()
    window.show_page("general")
    window.show_page("model")  # looked at again
    assert page.recent_list.table.item(0, 0).text() == f"{model_folder} (not found)"
    assert page.recent_list.button(0, 1).text() == "In use"


def test_the_tray_lists_every_local_model(qtbot, controller, put_in_hf_cache, model_folder, tmp_path):
    import shutil

    put_in_hf_cache("Qwen/Qwen3-ASR-0.6B")
    put_in_hf_cache("me/qwen3-asr-medical")
    put_in_hf_cache("Qwen/Qwen3-ASR-1.7B")
    gone = tmp_path / "gone-model"
    other = tmp_path / "models" / "int8-model"
    shutil.copytree(model_folder, other)
    s = Settings()
    recent = tuple(RecentModel(path=str(p)) for p in (model_folder, gone, other))
    controller.change_settings_elsewhere(
        s.replace(engine=s.engine.replace(model=str(model_folder), recent_models=recent))
    )
    menu = TrayMenu(controller, lambda page: None, lambda: None)
    model_menu = next(a.menu() for a in menu.actions() if a.menu() is not None)
    items = [(a.text(), a.isChecked()) for a in model_menu.actions() if a.text() and a.isCheckable()]
    sections = [a.text() for a in model_menu.actions() if a.isSeparator() and a.text()]
    assert sections == ["Downloaded models", "Model folders"]
    assert items[:5] == [
        ("Qwen3-ASR-0.6B", False),
        ("Qwen3-ASR-1.7B", False),
        ("me/qwen3-asr-medical", False),
        ("my-asr-model", True),
        ("int8-model", False),
    ]
    by_text = {a.text(): a for a in model_menu.actions()}
    assert by_text["int8-model"].toolTip() == str(other)
    by_text["me/qwen3-asr-medical"].trigger()
    saved = controller.saved_settings().engine
    assert saved.model == "me/qwen3-asr-medical"
    assert [r.path for r in saved.recent_models] == [str(model_folder), str(gone), str(other)]  # kept
    menu.rebuild()
    model_menu = next(a.menu() for a in menu.actions() if a.menu() is not None)
    next(a for a in model_menu.actions() if a.text() == "int8-model").trigger()
    assert controller.saved_settings().engine.model == str(other)
    assert controller.saved_settings().engine.recent_models[0].path == str(other)
