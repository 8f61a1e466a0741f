"""Run PynputBackend in a child process for the Xvfb test and report its callbacks on stdout.

A child process keeps pynput's import-time backend choice (it needs DISPLAY and PYNPUT_BACKEND=xorg)
out of the pytest process, where another test may already have imported pynput differently.

    python tests/hotkeys/pynput_probe.py '{"ptt": "F9", ...}'
    stdout: READY | EVENT <name> <1|0> <thread name> | ERROR <message> | REPEATS <n>
    stdin:  "stop" -> stop the backend, print REPEATS, exit
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dictation.hotkeys import PynputBackend  # noqa: E402

_print_lock = threading.Lock()


def say(line: str) -> None:
    with _print_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def main() -> int:
    bindings = json.loads(sys.argv[1])
    backend = PynputBackend()
    ok, reason = backend.is_available()
    if not ok:
        say(f"ERROR unavailable: {reason}")
        return 1
    backend.start(
        bindings,
        on_event=lambda name, pressed: say(f"EVENT {name} {int(pressed)} {threading.current_thread().name}"),
        on_error=lambda error: say(f"ERROR {error}"),
    )
    if not backend.wait_ready(20):
        say("ERROR listener not ready after 20 s")
        return 1
    say(f"READY {threading.current_thread().name}")
    for line in sys.stdin:
        if line.strip() == "stop":
            break
    backend.stop()
    say(f"REPEATS {backend.repeats_suppressed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
