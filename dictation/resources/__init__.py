"""Files the app ships: tray icons, sound cues and the .desktop template, found via importlib.resources.

- ``icons/<state>.svg``: the tray icon per `ICON_STATES`: idle grey, loading amber with an
  hourglass, recording red with a dot, transcribing blue with three dots, error grey with a red
  "!", paused (hotkeys paused while idle) grey with a dark pause badge. 64x64 view box, drawn to
  read at 22 px.
- ``icons/app.svg``: the application icon (windows, menus, the autostart entry).
- ``icons/png/<size>/<name>.png``: each of those icons as PNG at `PNG_SIZES` (made from the SVGs
  by ``tools/make_icons.py``; `dictation install-desktop` puts the app icon's into the hicolor theme).
- ``sounds/<cue>.wav``: per `SOUNDS` (the values of `dictation.session.Sound`): 16-bit mono
  44.1 kHz, 110-190 ms, peak -6 dBFS; made by ``tools/make_sounds.py``.
- ``spoken/<code>.json``: the word tables of voice commands and spoken punctuation, one per language in
  `SPOKEN_LANGUAGES` (read by `dictation.spoken.tables`, which documents the format).
- ``dictation.desktop``: the app-menu entry, with ``{exec}`` and ``{icon}`` placeholders.
- ``dictation.service``: the systemd user unit, with an ``{exec}`` placeholder (written by
  ``dictation install-desktop --systemd``, see the module ``dictation/desktop.py``).

The tray states are the values of `dictation.session.Status` (not imported here: this package
imports nothing of the app) plus "paused". Installed as a regular folder (wheel, PyInstaller) the files are on
disk and the ``*_path`` functions return them; from a zip they are extracted once to a temp folder.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from functools import cache
from importlib import resources
from pathlib import Path

ICON_STATES = ("idle", "loading", "recording", "transcribing", "error", "paused")
APP_ICON = "app"
SOUNDS = ("start", "stop", "cancel", "error")
DESKTOP_TEMPLATE = "dictation.desktop"
SERVICE_TEMPLATE = "dictation.service"
PNG_SIZES = (16, 22, 24, 32, 48, 64, 128, 256)
SPOKEN_LANGUAGES = ("de", "en", "es", "fr")


def read_bytes(name: str) -> bytes:
    """The content of a packaged file, by its path inside this package ("icons/idle.svg")."""
    return _traversable(name).read_bytes()


def resource_path(name: str) -> Path:
    """A file-system path of a packaged file (extracted to a temp folder if the package is zipped)."""
    item = _traversable(name)
    if isinstance(item, Path):
        return item
    return _extracted(name)


def file_on_disk(name: str) -> Path | None:
    """The packaged file's own path if it is a regular file on disk (a normal install), else None.

    For paths written into files that outlive this process (an autostart entry's icon), where a
    temp copy would vanish.
    """
    item = _traversable(name)
    return item if isinstance(item, Path) else None


def icon_name(state: str) -> str:
    """ "icons/<state>.svg" for a tray state or "app"; ValueError for anything else."""
    state = getattr(state, "value", state)
    if state not in ICON_STATES and state != APP_ICON:
        raise ValueError(f"no icon for {state!r}; known: {', '.join(ICON_STATES + (APP_ICON,))}")
    return f"icons/{state}.svg"


def icon_path(state: str) -> Path:
    """The SVG file of a tray state (see `ICON_STATES`) or of the app ("app")."""
    return resource_path(icon_name(state))


def icon_svg(state: str) -> bytes:
    return read_bytes(icon_name(state))


def png_icon_name(state: str, size: int) -> str:
    """ "icons/png/<size>/<state>.png" for a tray state or "app" and a size in `PNG_SIZES`."""
    if size not in PNG_SIZES:
        raise ValueError(f"no {size} px icons; sizes: {', '.join(map(str, PNG_SIZES))}")
    return icon_name(state).replace("icons/", f"icons/png/{size}/", 1).removesuffix(".svg") + ".png"


def sound_name(cue: str) -> str:
    """ "sounds/<cue>.wav" for a cue in `SOUNDS`; ValueError for anything else."""
    cue = getattr(cue, "value", cue)
    if cue not in SOUNDS:
        raise ValueError(f"no sound {cue!r}; known: {', '.join(SOUNDS)}")
    return f"sounds/{cue}.wav"


def sound_path(cue: str) -> Path:
    """The WAV file of a sound cue ("start", "stop", "cancel", "error")."""
    return resource_path(sound_name(cue))


def desktop_template() -> str:
    """The .desktop entry text with ``{exec}`` and ``{icon}`` placeholders (fill with str.replace:
    an Exec line may itself contain braces)."""
    return read_bytes(DESKTOP_TEMPLATE).decode("utf-8")


def service_template() -> str:
    """The systemd user unit text with an ``{exec}`` placeholder (fill with str.replace)."""
    return read_bytes(SERVICE_TEMPLATE).decode("utf-8")


def _traversable(name: str):
    item = resources.files(__name__)
    for part in name.split("/"):
        item = item.joinpath(part)
    if not item.is_file():
        raise FileNotFoundError(f"packaged resource {name!r} is missing from {__name__}")
    return item


@cache
def _extract_dir() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="dictation-resources-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


@cache
def _extracted(name: str) -> Path:
    target = _extract_dir() / name
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(read_bytes(name))
    return target
