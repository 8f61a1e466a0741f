"""Render every settings page and the history window on a real X server (our own Xvfb) and check the PNGs.

The rendering runs in a subprocess with ``QT_QPA_PLATFORM=xcb`` (this test process runs Qt offscreen).
The PNGs land in ``$DICTATION_SCREENSHOTS`` or ``build/screenshots/`` for people to look at.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from PySide6.QtGui import QImage

from dictation.app.pages.diagnostics import COLOURS
from tests.app.screenshots import PAGES, REPO, screenshot_dir
from tests.output.conftest import running_xvfb

EXPECTED = (
    ["settings-model-first-run.png", "history.png", "tray-menu.png", "tray-menu-model.png", "tray-icons.png"]
    + ["tray-status-window.png"]
    + [f"settings-{page}.png" for page in PAGES]
    + [f"page-{page}.png" for page in PAGES]
)


@pytest.fixture(scope="module")
def x_display(tmp_path_factory):
    """A private Xvfb; yields its DISPLAY (":N")."""
    if shutil.which("Xvfb") is None:
        pytest.fail("Xvfb is missing: apt-get install xvfb (see tests/system-packages.txt)")
    with running_xvfb(tmp_path_factory.mktemp("xvfb") / "xvfb.log", screen="1280x1024x24") as display:
        yield display


def distinct_colours(image: QImage, samples: int = 64) -> int:
    colours = set()
    for i in range(samples):
        for j in range(samples):
            colours.add(
                image.pixel(i * (image.width() - 1) // (samples - 1), j * (image.height() - 1) // (samples - 1))
            )
    return len(colours)


def test_pages_and_history_render_on_a_real_x_server(x_display, tmp_path):
    out = screenshot_dir()
    for name in EXPECTED:
        (out / name).unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("WAYLAND_")}
    env.update(
        DISPLAY=x_display,
        QT_QPA_PLATFORM="xcb",
        DICTATION_HOME=str(tmp_path / "home"),
        HF_HUB_CACHE=str(tmp_path / "hf-cache"),
        HF_HUB_OFFLINE="1",
    )
    proc = subprocess.run(
        [sys.executable, "-m", "tests.app.screenshots", str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in EXPECTED:
        path = out / name
        assert path.is_file(), f"{name} was not written"
        image = QImage(str(path))
        assert not image.isNull(), f"{name} is not a readable PNG"
        small = name.startswith("tray-")  # menus and the icon strip are small by nature
        minimum = (150, 60) if small else (600, 300)
        assert image.width() >= minimum[0] and image.height() >= minimum[1], (
            f"{name} is {image.width()}x{image.height()}"
        )
        assert distinct_colours(image) >= 4, f"{name} is (nearly) blank"
    window = QImage(str(out / "settings-model.png"))
    assert (window.width(), window.height()) == (960, 900)
    # the Diagnostics page waited for its checks: their status icons are in the picture
    page = QImage(str(out / "page-diagnostics.png"))
    shown = {page.pixel(x, y) & 0xFFFFFF for x in range(0, page.width(), 2) for y in range(0, page.height(), 2)}
    assert {int(COLOURS[s][1:], 16) for s in ("ok", "problem")} <= shown
