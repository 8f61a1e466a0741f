"""When a key event happened, on this process's clock (`time.monotonic`), from the X server's stamp.

A press is stamped when the listener's thread gets to it; while the app starts, that thread waits
for Python's GIL behind imports of Qt and torch (a shared library's load holds it for hundreds of
milliseconds), so that stamp can be late and the take would begin after the press. The X server
stamps every key event with its own time in milliseconds (32 bits, wrapping). A local X server
(Xorg, Xvfb and Xwayland on Linux) takes that time from the same monotonic clock, so the stamp is
the press's time; a server elsewhere (ssh -X, another clock) has another origin, and then the time
of arrival is used.
"""

from __future__ import annotations

import time
from collections.abc import Callable

WRAP_MS = 1 << 32
PLAUSIBLE_DELAY_MS = 5_000  # an event older than this is not on our clock (or not worth trusting)


def server_time_to_clock(server_ms: int, clock: Callable[[], float] = time.monotonic) -> float:
    """``server_ms`` (an X event's time) as a ``clock`` value; ``clock()`` when they disagree."""
    now = clock()
    behind = (int(now * 1000) - server_ms) % WRAP_MS  # how long ago, modulo the 32-bit wrap
    if behind <= PLAUSIBLE_DELAY_MS:
        return now - behind / 1000
    return now  # a stamp ahead of us (a coarse or rounded server clock), or another clock altogether
