"""The suite's one way to wait for something a thread or another process does."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import pytest

T = TypeVar("T")


def wait_until(
    predicate: Callable[[], T], timeout: float = 10.0, what: str = "condition", *, interval: float = 0.02
) -> T:
    """Poll ``predicate`` every ``interval`` seconds until it returns something truthy and return
    that; fail the test naming ``what`` after ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > end:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)
