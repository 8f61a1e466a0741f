"""The real app, except that a dictation's transcription stalls: it writes a marker file and sleeps,
so a test can kill the app while it transcribes (`python -m tests.e2e.stalled_app -v`). Only
``AsrEngine.transcribe`` is slowed (the warm-up pass does not use it); run it with streaming off so
every dictation goes that way."""

from __future__ import annotations

import os
import time
from pathlib import Path

from dictation.asr.engine import AsrEngine
from dictation.cli import main

MARKER = Path(os.environ["DICTATION_TEST_STALL_MARKER"])


def _stalled(self, *args, **kwargs):
    MARKER.write_text("transcribing")
    time.sleep(30)  # longer than the test waits; the app is killed meanwhile


AsrEngine.transcribe = _stalled

if __name__ == "__main__":
    raise SystemExit(main())
