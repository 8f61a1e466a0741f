"""The real app, except that one engine call stalls: it writes a marker file and sleeps, so a test
can stop the app while the engine is busy (`python -m tests.e2e.stalled_app -v`).

``DICTATION_TEST_STALL`` says which call: ``transcribe`` (the default; only ``AsrEngine.transcribe``,
which the warm-up pass does not use: run it with streaming off so every dictation goes that way),
``load`` (reading the model) or ``warm_up`` (the pass after the load)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from dictation.asr.engine import AsrEngine
from dictation.cli import main

MARKER = Path(os.environ["DICTATION_TEST_STALL_MARKER"])
STALL = os.environ.get("DICTATION_TEST_STALL", "transcribe")


def _stalled(self, *args, **kwargs):
    MARKER.write_text(STALL)
    time.sleep(30)  # longer than the test waits; the app is stopped meanwhile


setattr(AsrEngine, {"transcribe": "transcribe", "load": "_load", "warm_up": "warm_up"}[STALL], _stalled)

if __name__ == "__main__":
    raise SystemExit(main())
