"""Run X11GrabBackend in a child process and report its callbacks on stdout (for bindings that pynput
watches: pynput picks its backend at import, which must not happen in the pytest process).

    python tests/hotkeys/x11_probe.py '{"ptt": "right_ctrl", ...}'
    stdout: READY | EVENT <name> <1|0> | ERROR <message>
    stdin:  "stop" (or end of input) -> stop the backend and exit
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dictation.hotkeys import X11GrabBackend  # noqa: E402

_print_lock = threading.Lock()


def say(line: str) -> None:
    with _print_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def main() -> int:
    backend = X11GrabBackend()
    backend.start(
        json.loads(sys.argv[1]),
        on_event=lambda name, pressed: say(f"EVENT {name} {int(pressed)}"),
        on_error=lambda error: say(f"ERROR {error}"),
    )
    if not backend.wait_ready(20):
        say("ERROR not ready after 20 s")
        return 1
    say("READY")
    for line in sys.stdin:
        if line.strip() == "stop":
            break
    backend.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
