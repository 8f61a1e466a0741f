"""Clipboard access through the platform's command-line tools.

| platform | tool               | text | non-text save/restore              | PRIMARY | clear            |
|----------|--------------------|------|------------------------------------|---------|------------------|
| X11      | xclip (preferred)  | yes  | yes, one format (image/png first)  | yes     | via xsel, else "" |
| X11      | xsel               | yes  | no (cannot even see it)            | yes     | yes              |
| Wayland  | wl-copy / wl-paste | yes  | yes, one format (image/png first)  | yes     | yes              |
| macOS    | pbcopy / pbpaste   | yes  | no (untested here)                 | no      | sets ""          |
| Windows  | -                  | not implemented yet: the paste backend reports it as unavailable     |

A snapshot keeps one format of the previous content: the text (as UTF-8) if there is any text,
else the first of image/png, image/jpeg, any image/*, any other MIME type, up to 64 MiB. Richer
clipboards (text + HTML from a browser) come back as their plain text only.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol

from dictation.output.base import Availability, ClipboardError
from dictation.output.environment import Session
from dictation.output.process import Host, ProcResult

MAX_SAVED_BYTES = 64 * 1024 * 1024
# X11 targets and Wayland MIME types that carry text, best first.
TEXT_TYPES = ("text/plain;charset=utf-8", "UTF8_STRING", "text/plain", "STRING", "TEXT", "COMPOUND_TEXT")
# X11 meta targets: never content.
_META_TARGETS = frozenset({"TARGETS", "TIMESTAMP", "MULTIPLE", "SAVE_TARGETS", "DELETE", "INCR"})


class Selection(str, enum.Enum):
    CLIPBOARD = "clipboard"
    PRIMARY = "primary"


@dataclass(frozen=True)
class ClipboardSnapshot:
    """One saved clipboard content. kind: "empty", "text", "data" (non-text bytes) or "unsaved"."""

    kind: str
    data: bytes = b""
    mime: str | None = None
    note: str = ""

    @property
    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace")

    def describe(self) -> str:
        if self.kind == "text":
            return f"text ({len(self.text)} characters)"
        if self.kind == "data":
            return f"{self.mime} ({len(self.data)} bytes)"
        return self.kind + (f" ({self.note})" if self.note else "")


class Clipboard(Protocol):
    name: str
    supports_primary: bool

    def check(self) -> Availability: ...

    def snapshot(self, selection: Selection = Selection.CLIPBOARD) -> ClipboardSnapshot: ...

    def read_text(self, selection: Selection = Selection.CLIPBOARD) -> str | None: ...

    def write_text(self, text: str, selection: Selection = Selection.CLIPBOARD) -> None: ...

    def restore(self, snapshot: ClipboardSnapshot, selection: Selection = Selection.CLIPBOARD) -> None: ...


def _pick_data_type(types: list[str]) -> str | None:
    content = [t for t in types if t not in _META_TARGETS and "/" in t]
    for preferred in ("image/png", "image/jpeg"):
        if preferred in content:
            return preferred
    images = [t for t in content if t.startswith("image/")]
    return (images or content or [None])[0]


class _ToolClipboard:
    """A clipboard driven by external command-line tools: holds the host and checks the tools."""

    name = ""
    tools: tuple[str, ...] = ()
    capability = ""  # appended to the availability reason, e.g. " (text only)"

    def __init__(self, host: Host, timeout: float = 5.0):
        self.host = host
        self.timeout = timeout

    def check(self) -> Availability:
        missing = [t for t in self.tools if not self.host.which(t)]
        if missing:
            return Availability(False, f"{' and '.join(missing)} not installed")
        return Availability(True, f"clipboard via {self.name}{self.capability}")


class _TypedClipboard(_ToolClipboard):
    """Shared logic for tools that can list and read formats (xclip, wl-clipboard)."""

    supports_primary = True

    # Tool-specific commands.
    def _list_cmd(self, selection: Selection) -> list[str]:
        raise NotImplementedError

    def _read_cmd(self, selection: Selection, mime: str) -> list[str]:
        raise NotImplementedError

    def _write_cmd(self, selection: Selection, mime: str | None) -> list[str]:
        raise NotImplementedError

    def _clear(self, selection: Selection) -> None:
        raise NotImplementedError

    def _run(self, argv: list[str], **kwargs) -> ProcResult:
        return self.host.run(argv, timeout=self.timeout, **kwargs)

    def list_types(self, selection: Selection = Selection.CLIPBOARD) -> list[str]:
        """The formats on offer; [] when nobody owns the selection."""
        result = self._run(self._list_cmd(selection))
        if not result.ok:
            return []
        return [line.strip() for line in result.text().splitlines() if line.strip()]

    def _read(self, selection: Selection, mime: str) -> bytes:
        result = self._run(self._read_cmd(selection, mime))
        if not result.ok:
            raise ClipboardError(f"reading {mime} from the {selection.value}: {result.failure()}")
        return result.stdout

    def snapshot(self, selection: Selection = Selection.CLIPBOARD) -> ClipboardSnapshot:
        types = self.list_types(selection)
        if not types:
            return ClipboardSnapshot("empty")
        text_type = next((t for t in TEXT_TYPES if t in types), None)
        mime = text_type or _pick_data_type(types)
        if mime is None:
            return ClipboardSnapshot("unsaved", note=f"no readable format among {', '.join(types[:6])}")
        try:
            data = self._read(selection, mime)
        except ClipboardError as exc:
            return ClipboardSnapshot("unsaved", note=str(exc))
        if len(data) > MAX_SAVED_BYTES:
            return ClipboardSnapshot("unsaved", note=f"{mime} is {len(data)} bytes, more than we keep")
        return ClipboardSnapshot("text" if text_type else "data", data, mime)

    def read_text(self, selection: Selection = Selection.CLIPBOARD) -> str | None:
        types = self.list_types(selection)
        text_type = next((t for t in TEXT_TYPES if t in types), None)
        if text_type is None:
            return None
        try:
            return self._read(selection, text_type).decode("utf-8", errors="replace")
        except ClipboardError:
            return None

    def _write(self, data: bytes, selection: Selection, mime: str | None) -> None:
        # The tool forks a process that serves the selection: no pipes on its output (pitfall 4).
        result = self._run(self._write_cmd(selection, mime), input=data, capture_stdout=False)
        if not result.ok:
            raise ClipboardError(f"setting the {selection.value}: {result.failure()}")

    def write_text(self, text: str, selection: Selection = Selection.CLIPBOARD) -> None:
        self._write(text.encode("utf-8"), selection, None)

    def restore(self, snapshot: ClipboardSnapshot, selection: Selection = Selection.CLIPBOARD) -> None:
        if snapshot.kind == "text":
            self.write_text(snapshot.text, selection)
        elif snapshot.kind == "data":
            self._write(snapshot.data, selection, snapshot.mime)
        elif snapshot.kind == "empty":
            self._clear(selection)
        else:
            raise ClipboardError(f"cannot restore an unsaved clipboard ({snapshot.note})")


class XclipClipboard(_TypedClipboard):
    """X11 via xclip (xsel, when also installed, is used to clear a selection)."""

    name = "xclip"
    tools = ("xclip",)

    def _list_cmd(self, selection):
        return ["xclip", "-selection", selection.value, "-o", "-t", "TARGETS"]

    def _read_cmd(self, selection, mime):
        return ["xclip", "-selection", selection.value, "-o", "-t", mime]

    def _write_cmd(self, selection, mime):
        return ["xclip", "-selection", selection.value, "-i"] + (["-t", mime] if mime else [])

    def _clear(self, selection):
        if self.host.which("xsel"):
            result = self._run(["xsel", f"--{selection.value}", "--clear"])
            if result.ok:
                return
        # xclip cannot give up a selection: an empty string is the closest it gets.
        self.write_text("", selection)


class WlClipboard(_TypedClipboard):
    """Wayland via wl-clipboard (wl-copy / wl-paste)."""

    name = "wl-clipboard"
    tools = ("wl-copy", "wl-paste")

    @staticmethod
    def _primary(selection):
        return ["--primary"] if selection is Selection.PRIMARY else []

    def _list_cmd(self, selection):
        return ["wl-paste", *self._primary(selection), "--list-types"]

    def _read_cmd(self, selection, mime):
        return ["wl-paste", *self._primary(selection), "--no-newline", "--type", mime]

    def _write_cmd(self, selection, mime):
        return ["wl-copy", *self._primary(selection)] + (["--type", mime] if mime else [])

    def _clear(self, selection):
        result = self._run(["wl-copy", *self._primary(selection), "--clear"])
        if not result.ok:
            raise ClipboardError(f"clearing the {selection.value}: {result.failure()}")


class _TextOnlyClipboard(_ToolClipboard):
    """Tools that only see text (xsel, pbcopy): an empty read means "empty or not text"."""

    supports_primary = False
    env: dict[str, str] = {}
    capability = " (text only)"

    def _read_cmd(self, selection: Selection) -> list[str]:
        raise NotImplementedError

    def _write_cmd(self, selection: Selection) -> list[str]:
        raise NotImplementedError

    def read_text(self, selection: Selection = Selection.CLIPBOARD) -> str | None:
        result = self.host.run(self._read_cmd(selection), timeout=self.timeout, env=self.env)
        return result.text() if result.ok and result.stdout else None

    def snapshot(self, selection: Selection = Selection.CLIPBOARD) -> ClipboardSnapshot:
        text = self.read_text(selection)
        if text is None:
            return ClipboardSnapshot("empty", note=f"{self.name} cannot see non-text content")
        return ClipboardSnapshot("text", text.encode("utf-8"), "UTF8_STRING")

    def write_text(self, text: str, selection: Selection = Selection.CLIPBOARD) -> None:
        result = self.host.run(
            self._write_cmd(selection),
            input=text.encode("utf-8"),
            timeout=self.timeout,
            capture_stdout=False,
            env=self.env,
        )
        if not result.ok:
            raise ClipboardError(f"setting the {selection.value}: {result.failure()}")

    def restore(self, snapshot: ClipboardSnapshot, selection: Selection = Selection.CLIPBOARD) -> None:
        if snapshot.kind not in ("text", "empty"):
            raise ClipboardError(f"{self.name} cannot restore {snapshot.describe()}")
        self.write_text(snapshot.text, selection)


class XselClipboard(_TextOnlyClipboard):
    """X11 via xsel: text only; an image on the clipboard looks empty to it."""

    name = "xsel"
    supports_primary = True
    tools = ("xsel",)

    def _read_cmd(self, selection):
        return ["xsel", f"--{selection.value}", "--output"]

    def _write_cmd(self, selection):
        return ["xsel", f"--{selection.value}", "--input"]

    def restore(self, snapshot: ClipboardSnapshot, selection: Selection = Selection.CLIPBOARD) -> None:
        if snapshot.kind == "empty":
            result = self.host.run(["xsel", f"--{selection.value}", "--clear"], timeout=self.timeout)
            if not result.ok:
                raise ClipboardError(f"clearing the {selection.value}: {result.failure()}")
            return
        super().restore(snapshot, selection)


class PbClipboard(_TextOnlyClipboard):
    """macOS via pbcopy/pbpaste (text only; not tested on a Mac by this project's CI)."""

    name = "pbcopy"
    tools = ("pbcopy", "pbpaste")
    env = {"LANG": "en_US.UTF-8"}  # pbcopy mangles non-ASCII text under the C locale of a GUI app

    def _read_cmd(self, selection):
        return ["pbpaste"]

    def _write_cmd(self, selection):
        return ["pbcopy"]


class UnavailableClipboard:
    """Stands in where no clipboard tool works; every operation raises ClipboardError."""

    supports_primary = False

    def __init__(self, name: str, reason: str):
        self.name = name
        self.reason = reason

    def check(self) -> Availability:
        return Availability(False, self.reason)

    def _fail(self, *args, **kwargs):
        raise ClipboardError(self.reason)

    snapshot = read_text = write_text = restore = _fail


def platform_clipboard(session: Session, host: Host, timeout: float = 5.0) -> Clipboard:
    """The clipboard for this session: xclip > xsel on X11, wl-clipboard on Wayland, pbcopy on macOS."""
    if session.kind == "x11":
        if host.which("xclip"):
            return XclipClipboard(host, timeout)
        if host.which("xsel"):
            return XselClipboard(host, timeout)
        return UnavailableClipboard("xclip", "neither xclip nor xsel is installed")
    if session.kind == "wayland":
        return WlClipboard(host, timeout)
    if session.kind == "macos":
        return PbClipboard(host, timeout)
    if session.kind == "windows":
        return UnavailableClipboard("win32", "clipboard access is not supported on Windows yet")
    return UnavailableClipboard("none", "no graphical session (neither DISPLAY nor WAYLAND_DISPLAY is set)")
