"""Fixtures for the hotkey tests: a private Xvfb display and a private D-Bus session bus.

Both FAIL (not skip) when the program is missing: CI installs them (apt: xvfb xdotool dbus).
"""

from __future__ import annotations

import os
import select
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

STARTUP_TIMEOUT = 20.0  # generous: a loaded 2-core CI machine


def require(program: str, package: str) -> str:
    path = shutil.which(program)
    if path is None:
        pytest.fail(f"{program} not found — install the apt package {package!r}", pytrace=False)
    return path


def _read_line(fd: int, timeout: float, proc: subprocess.Popen, what: str, log: Path) -> str:
    """Read one line from ``fd`` (a pipe the child writes once it is ready)."""
    data = b""
    deadline = time.monotonic() + timeout
    while not data.endswith(b"\n"):
        remaining = deadline - time.monotonic()
        if remaining <= 0 or proc.poll() is not None:
            detail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            pytest.fail(f"{what} did not become ready (exit code {proc.poll()}): {detail}", pytrace=False)
        ready, _, _ = select.select([fd], [], [], min(remaining, 0.5))
        if ready:
            chunk = os.read(fd, 256)
            if not chunk:
                continue
            data += chunk
    return data.decode().strip()


def _terminate(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


@pytest.fixture(scope="session")
def xvfb_display(tmp_path_factory) -> Iterator[str]:
    """A fresh Xvfb server; yields its DISPLAY (":N"). -displayfd picks a free number."""
    xvfb = require("Xvfb", "xvfb")
    xdotool = require("xdotool", "xdotool")
    log = tmp_path_factory.mktemp("xvfb") / "xvfb.log"
    read_fd, write_fd = os.pipe()
    with open(log, "wb") as log_file:
        proc = subprocess.Popen(
            [xvfb, "-displayfd", str(write_fd), "-screen", "0", "640x480x24", "-nolisten", "tcp"],
            pass_fds=(write_fd,),
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=log_file,
        )
    os.close(write_fd)
    try:
        display = ":" + _read_line(read_fd, STARTUP_TIMEOUT, proc, "Xvfb", log)
        env = {**os.environ, "DISPLAY": display}
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while subprocess.run([xdotool, "getmouselocation"], env=env, capture_output=True).returncode != 0:
            if time.monotonic() > deadline or proc.poll() is not None:
                pytest.fail(f"Xvfb on {display} does not answer xdotool", pytrace=False)
            time.sleep(0.05)
        yield display
    finally:
        os.close(read_fd)
        _terminate(proc)


BUS_CONFIG = """<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>session</type>
  <listen>unix:dir={dir}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow send_destination="*" eavesdrop="true"/>
    <allow eavesdrop="true"/>
    <allow own="*"/>
  </policy>
</busconfig>
"""


@pytest.fixture(scope="session")
def dbus_address(tmp_path_factory) -> Iterator[str]:
    """A private session bus (no service activation, so no real portal can appear on it)."""
    daemon = require("dbus-daemon", "dbus")
    folder = tmp_path_factory.mktemp("dbus")
    config = folder / "session.conf"
    config.write_text(BUS_CONFIG.format(dir=folder))
    log = folder / "dbus.log"
    with open(log, "wb") as log_file:
        proc = subprocess.Popen(
            [daemon, f"--config-file={config}", "--nofork", "--nopidfile", "--print-address=1"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log_file,
        )
    try:
        yield _read_line(proc.stdout.fileno(), STARTUP_TIMEOUT, proc, "dbus-daemon", log)
    finally:
        _terminate(proc)
        proc.stdout.close()
