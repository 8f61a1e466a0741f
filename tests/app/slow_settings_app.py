"""The real app, except that building its settings window takes `DICTATION_TEST_SETTINGS_DELAY_S`
longer (a slow or busy computer: on one, the second `dictation` waited over 3 s for its answer) and
then writes the file `DICTATION_TEST_SETTINGS_MARKER`. `python -m tests.app.slow_settings_app`."""

from __future__ import annotations

import os
import time
from pathlib import Path

from dictation.app.settings_window import SettingsWindow
from dictation.cli import main

_built = SettingsWindow.__init__


def _slow(self, *args, **kwargs):
    time.sleep(float(os.environ["DICTATION_TEST_SETTINGS_DELAY_S"]))
    _built(self, *args, **kwargs)
    Path(os.environ["DICTATION_TEST_SETTINGS_MARKER"]).write_text("built")


SettingsWindow.__init__ = _slow

if __name__ == "__main__":
    raise SystemExit(main())
