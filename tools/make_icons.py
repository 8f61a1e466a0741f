"""Render the packaged SVG icons to PNGs: dictation/resources/icons/png/<size>/<name>.png.

    python tools/make_icons.py [OUTPUT_DIR]

One PNG per icon (the tray states and "app") at each of `SIZES`, drawn by Qt's SVG renderer
(QSvgRenderer, offscreen: no screen needed) with antialiasing on a transparent background. The
PNGs are committed: `dictation install-desktop` copies the app icon's into the hicolor icon theme,
and desktops or packagers that cannot use SVG take them. Rerun this after changing an SVG and
commit the result; tests/test_packaging.py re-renders them and fails when the committed files are
stale (it tolerates small antialiasing differences between Qt versions).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import QByteArray, QRectF, Qt  # noqa: E402
from PySide6.QtGui import QGuiApplication, QImage, QPainter  # noqa: E402
from PySide6.QtSvg import QSvgRenderer  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
ICON_DIR = ROOT / "dictation" / "resources" / "icons"
OUT_DIR = ICON_DIR / "png"
# dictation.resources.ICON_STATES + app
NAMES = ("idle", "loading", "recording", "transcribing", "error", "paused", "app")
SIZES = (16, 22, 24, 32, 48, 64, 128, 256)  # dictation.resources.PNG_SIZES


def render(svg: bytes, size: int) -> QImage:
    """The SVG drawn into a transparent ``size`` x ``size`` ARGB32 image (not premultiplied)."""
    renderer = QSvgRenderer(QByteArray(svg))
    if not renderer.isValid():
        raise ValueError("not a valid SVG")
    image = QImage(size, size, QImage.Format.Format_ARGB32_Premultiplied)
    image.fill(Qt.GlobalColor.transparent)
    painter = QPainter(image)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    painter.setRenderHint(QPainter.RenderHint.SmoothPixmapTransform)
    renderer.render(painter, QRectF(0, 0, size, size))
    painter.end()
    return image.convertToFormat(QImage.Format.Format_ARGB32)


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else OUT_DIR
    app = QGuiApplication.instance() or QGuiApplication([])  # noqa: F841 (QPainter wants one)
    if out == OUT_DIR and out.exists():
        shutil.rmtree(out)  # no stale sizes or names left behind
    for size in SIZES:
        folder = out / str(size)
        folder.mkdir(parents=True, exist_ok=True)
        for name in NAMES:
            image = render((ICON_DIR / f"{name}.svg").read_bytes(), size)
            target = folder / f"{name}.png"
            if not image.save(str(target), "PNG"):
                print(f"cannot write {target}", file=sys.stderr)
                return 1
    print(f"wrote {len(SIZES) * len(NAMES)} PNGs to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
