"""Widgets of the settings window: generated setting editors and the hand-built ones (one per file)."""

from dictation.app.widgets.adapter_list import AdapterList
from dictation.app.widgets.download_panel import DownloadPanel
from dictation.app.widgets.fields import FieldEditor, FieldGroup, FieldRow, make_editor
from dictation.app.widgets.hotkey_edit import HotkeyEdit
from dictation.app.widgets.level_meter import LevelMeter
from dictation.app.widgets.replacements import ReplacementsEditor

__all__ = [
    "AdapterList",
    "DownloadPanel",
    "FieldEditor",
    "FieldGroup",
    "FieldRow",
    "HotkeyEdit",
    "LevelMeter",
    "ReplacementsEditor",
    "make_editor",
]
