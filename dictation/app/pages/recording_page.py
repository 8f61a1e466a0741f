"""The Recording page: microphone (with a live level meter), hotkeys, and the other recording settings."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QComboBox, QSizePolicy, QWidget

from dictation.app.pages import SettingsPage
from dictation.app.widgets.fields import FieldEditor, fields_of, info_for
from dictation.app.widgets.hotkey_edit import HotkeyEdit
from dictation.app.widgets.level_meter import LevelMeter
from dictation.app.widgets.wheel import ComboBox
from dictation.audio.devices import AudioDeviceError, InputDevice
from dictation.config.schema import FieldInfo

LEVEL_INTERVAL_MS = 50
DEFAULT_DEVICE = "default"
# hotkeys.backend sits on the General page, next to the description of the backend in use.
HAND_BUILT = {"recording.input_device", "hotkeys.hotkey", "hotkeys.cancel_key", "hotkeys.backend"}


class MicrophoneEditor(FieldEditor):
    """The system default plus each input device by name (names survive replugging; indexes do not)."""

    def __init__(self, info: FieldInfo, parent: QWidget | None = None):
        super().__init__(info, parent)
        self.combo = self._add(ComboBox())
        self.combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        self.combo.setSizePolicy(QSizePolicy.Policy.Fixed, QSizePolicy.Policy.Fixed)
        self.combo.activated.connect(lambda index: self.committed.emit(self.combo.itemData(index)))
        self._devices: list[InputDevice] = []
        self._value = DEFAULT_DEVICE
        self._fill()

    def set_devices(self, devices: list[InputDevice]) -> None:
        self._devices = list(devices)
        self._fill()

    def _fill(self) -> None:
        self.combo.blockSignals(True)
        self.combo.clear()
        default = next((d.name for d in self._devices if d.is_default), "")
        self.combo.addItem(f"System default ({default})" if default else "System default", DEFAULT_DEVICE)
        for name in dict.fromkeys(d.name for d in self._devices):  # one entry per name (one per host API on Windows)
            self.combo.addItem(name, name)
        if self.combo.findData(self._value) < 0:
            self.combo.addItem(f"{self._value} (not connected)", self._value)
        self.combo.setCurrentIndex(self.combo.findData(self._value))
        self.combo.blockSignals(False)

    def value(self) -> str:
        return self._value

    def set_value(self, value: Any) -> None:
        if value == self._value and self.combo.currentData() == value:
            return
        self._value = str(value)
        self._fill()


class RecordingPage(SettingsPage):
    name = "recording"
    title = "Recording"

    def __init__(self, controller: Any, parent: QWidget | None = None):
        super().__init__(controller, parent)
        mic = self.add_group("Microphone")
        self.microphone_row = mic.add_field(
            info_for("recording.input_device"), MicrophoneEditor(info_for("recording.input_device"))
        )
        self.microphone: MicrophoneEditor = self.microphone_row.editor
        self.meter = LevelMeter()
        self.meter.setToolTip("The selected microphone's level right now. Speak to see it move.")
        mic.add_widget("Level", self.meter)
        self._level_timer = QTimer(self)
        self._level_timer.setInterval(LEVEL_INTERVAL_MS)
        self._level_timer.timeout.connect(self._poll_level)

        keys = self.add_group("Hotkeys")
        keys.add_fields([info_for("hotkeys.mode")])
        self.hotkey_edit = HotkeyEdit(info_for("hotkeys.hotkey"))
        keys.add_field(info_for("hotkeys.hotkey"), self.hotkey_edit)
        self.cancel_edit = HotkeyEdit(info_for("hotkeys.cancel_key"), allow_clear=True)
        keys.add_field(info_for("hotkeys.cancel_key"), self.cancel_edit)
        keys.add_fields(fields_of("hotkeys", HAND_BUILT | {"hotkeys.mode"}))
        self._paused_before: bool | None = None
        for edit in (self.hotkey_edit, self.cancel_edit):
            edit.capture_started.connect(self._pause_hotkeys)
            edit.capture_ended.connect(self._restore_hotkeys)

        self.add_group("Recording", fields_of("recording", HAND_BUILT))
        self.finish()

    # --- microphone -------------------------------------------------------------------------------

    def refresh_devices(self) -> None:
        try:
            devices = self.controller.input_devices()
        except AudioDeviceError as e:
            self.microphone_row.show_error(str(e))
            devices = []
        self.microphone.set_devices(devices)

    def _poll_level(self) -> None:
        self.meter.set_level(self.controller.input_level())

    @property
    def metering(self) -> bool:
        return self._level_timer.isActive()

    def showEvent(self, event) -> None:
        super().showEvent(event)
        self.refresh_devices()
        self._level_timer.start()

    def hideEvent(self, event) -> None:
        super().hideEvent(event)
        self._level_timer.stop()
        self.meter.set_level(0.0)

    # --- hotkey capture ---------------------------------------------------------------------------

    def _pause_hotkeys(self) -> None:
        self._paused_before = self.controller.hotkeys_paused
        self.controller.set_hotkeys_paused(True)

    def _restore_hotkeys(self) -> None:
        if self._paused_before is not None:
            self.controller.set_hotkeys_paused(self._paused_before)
            self._paused_before = None
