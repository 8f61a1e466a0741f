"""A key event's X server stamp as this process's clock: a press is dated when it
happened, not when a thread busy behind the app's imports got to it."""

from __future__ import annotations

import pytest

from dictation.hotkeys.event_time import WRAP_MS, server_time_to_clock


def at(now: float):
    return lambda: now


def test_a_stamp_on_our_clock_is_the_time_of_the_event():
    now = 1234.567
    assert server_time_to_clock(int(now * 1000) - 800, at(now)) == pytest.approx(now - 0.8, abs=0.002)


def test_a_stamp_across_the_32_bit_wrap_is_still_ours():
    now = (WRAP_MS + 300) / 1000  # our clock wrapped 0.3 s ago in the server's 32 bits
    stamp = WRAP_MS - 200  # 0.5 s ago, before the wrap
    assert server_time_to_clock(stamp, at(now)) == pytest.approx(now - 0.5, abs=0.002)


@pytest.mark.parametrize("delta_ms", [3, 100_000, -3_600_000, -(2**31)])
def test_a_stamp_ahead_of_us_or_from_another_clock_gives_the_time_of_arrival(delta_ms):
    now = 5000.0
    stamp = (int(now * 1000) + delta_ms) % WRAP_MS  # ahead of us, or an hour or more away
    assert server_time_to_clock(stamp, at(now)) == now
