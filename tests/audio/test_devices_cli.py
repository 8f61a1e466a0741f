"""`dictation devices` against a real (virtual) microphone."""

import os
import subprocess
import sys


def test_devices_lists_the_virtual_microphone(virtual_mic):
    env = {**os.environ, **virtual_mic.env}
    proc = subprocess.run(
        [sys.executable, "-m", "dictation", "devices"], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert "No microphones found" not in proc.stdout
    assert "Hz" in proc.stdout or "16000" in proc.stdout, proc.stdout
