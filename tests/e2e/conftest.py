"""Whole-app runs: a real X display (Xvfb) with a tray host, a virtual microphone (PulseAudio) and a
real target window, shared with the output and audio suites (see ../shared/e2e-recipe.md)."""

from __future__ import annotations

from tests.audio.conftest import pulse_server  # noqa: F401  (fixtures)
from tests.e2e.test_app_e2e import speech_wav, tray_host  # noqa: F401  (fixtures)
from tests.output.conftest import target, target_session, xclipboard, xvfb  # noqa: F401  (fixtures)
