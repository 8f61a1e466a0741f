"""Regenerate the user guide's screenshots (docs/images/*.png) from the real app windows.

    python tools/take_screenshots.py            # writes docs/images/
    python tools/take_screenshots.py --out DIR  # somewhere else

It needs Xvfb and the test extra (``pip install -e ".[test]"``): the windows are the app's own
settings window, history window and tray menu, driven by the fake controller of the window tests
(``tests/app/fakes.py``) with a plausible state: a model chosen (a tiny random checkpoint stands in
for Qwen/Qwen3-ASR-1.7B in a throw-away Hugging Face cache), a vocabulary, an adapter, replacements
and a few history entries. The rendering itself is ``tests/app/screenshots.py`` (the same code the
screenshot test runs), under a private Xvfb with Qt's xcb platform, so fonts and styles are those
of a plain X desktop. The Diagnostics page shows the real checks of the machine it runs on.

The PNGs are reduced to 256 colours (plenty for widgets and text) so the docs stay small; the
script fails if one is over ``MAX_BYTES``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MAX_BYTES = 200_000
FAKE_REPO = "Qwen/Qwen3-ASR-1.7B"
FAKE_COMMIT = "0123456789abcdef0123456789abcdef01234567"

# (file written by tests/app/screenshots.py, name in docs/images); the first-run shot comes from a
# run with an empty model cache, the others from a run with the stand-in model cached.
FIRST_RUN = {"settings-model-first-run.png": "first-run.png"}
CONFIGURED = {
    "settings-model.png": "settings-model.png",
    "settings-vocabulary.png": "settings-vocabulary.png",
    "settings-recording.png": "settings-recording.png",
    "settings-output.png": "settings-output.png",
    "settings-general.png": "settings-general.png",
    "settings-diagnostics.png": "settings-diagnostics.png",
    "settings-log.png": "settings-log.png",
    "history.png": "history.png",
    "tray-menu.png": "tray-menu.png",
    "tray-menu-model.png": "tray-menu-model.png",
    "tray-icons.png": "tray-icons.png",
}


@contextlib.contextmanager
def xvfb(screen: str = "1280x1024x24") -> Iterator[str]:
    """A private Xvfb on a free display number; yields its DISPLAY (":N")."""
    if shutil.which("Xvfb") is None:
        raise SystemExit("Xvfb is missing (Debian/Ubuntu: sudo apt-get install xvfb)")
    read_fd, write_fd = os.pipe()
    proc = subprocess.Popen(
        ["Xvfb", "-displayfd", str(write_fd), "-screen", "0", screen, "-nolisten", "tcp"],
        pass_fds=(write_fd,),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    os.close(write_fd)
    try:
        ready, _, _ = select.select([read_fd], [], [], 20)
        number = os.read(read_fd, 64).decode().strip() if ready else ""
        if not number.isdigit():
            raise SystemExit("Xvfb did not start")
        yield f":{number}"
    finally:
        os.close(read_fd)
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def fake_hf_cache(cache: Path, work: Path) -> Path:
    """A Hugging Face hub cache holding a tiny random checkpoint under FAKE_REPO's name."""
    sys.path.insert(0, str(REPO))
    from tests.oracle.checkpoints import cached_checkpoint

    checkpoint = cached_checkpoint(work)
    repo = cache / ("models--" + FAKE_REPO.replace("/", "--"))
    snapshot = repo / "snapshots" / FAKE_COMMIT
    shutil.copytree(checkpoint, snapshot)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(FAKE_COMMIT)
    return cache


def render(display: str, out: Path, hf_cache: Path, home: Path) -> None:
    """Run tests/app/screenshots.py on ``display``; its PNGs land in ``out``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WAYLAND_")}
    env.update(
        DISPLAY=display,
        QT_QPA_PLATFORM="xcb",
        DICTATION_HOME=str(home),
        HF_HUB_CACHE=str(hf_cache),
        HF_HUB_OFFLINE="1",
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")])),
    )
    proc = subprocess.run(
        [sys.executable, "-m", "tests.app.screenshots", str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if proc.returncode != 0:
        raise SystemExit(f"rendering failed:\n{proc.stderr[-3000:]}")


def shrink(source: Path, target: Path) -> int:
    """Save ``source`` as a 256-colour PNG at ``target``; its size in bytes."""
    from PySide6.QtCore import Qt
    from PySide6.QtGui import QImage

    image = QImage(str(source))
    if image.isNull():
        raise SystemExit(f"{source} is not a readable PNG")
    flags = Qt.ImageConversionFlag.ThresholdDither | Qt.ImageConversionFlag.AvoidDither
    small = image.convertToFormat(QImage.Format.Format_Indexed8, flags)
    if not small.save(str(target), "PNG", 0):  # quality 0: the strongest compression
        raise SystemExit(f"cannot write {target}")
    return target.stat().st_size


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "images", help="where the PNGs go")
    args = parser.parse_args(argv)

    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # only for shrinking the images here
    from PySide6.QtGui import QGuiApplication

    app = QGuiApplication(sys.argv[:1])  # noqa: F841  (QImage conversion wants an application)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="dictation-shots-") as tmp_name:
        tmp = Path(tmp_name)
        cache = fake_hf_cache(tmp / "hf-cache", tmp / "checkpoints")
        with xvfb() as display:
            render(display, tmp / "first", tmp / "hf-empty", tmp / "home-first")
            render(display, tmp / "configured", cache, tmp / "home")
        too_big = []
        for folder, names in (("first", FIRST_RUN), ("configured", CONFIGURED)):
            for raw, name in names.items():
                size = shrink(tmp / folder / raw, args.out / name)
                print(f"{args.out / name}  {size / 1000:.0f} kB")
                if size > MAX_BYTES:
                    too_big.append(name)
    if too_big:
        print(f"over {MAX_BYTES // 1000} kB: {', '.join(too_big)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
