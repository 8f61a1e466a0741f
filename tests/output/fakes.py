"""Test doubles: a host with chosen tools, a clipboard in memory, a key sender that records."""

from __future__ import annotations

from dictation.output.base import Availability, InjectionError
from dictation.output.clipboard import ClipboardSnapshot, Selection
from dictation.output.process import ProcResult


class FakeHost:
    """Tools that "exist", files that exist, and a responder for commands (default: success)."""

    def __init__(self, tools=(), files=(), environment=None, responder=None):
        self.environment = dict(environment or {})
        self.tools = set(tools)
        self.files = set(files)
        self.responder = responder
        self.calls: list[tuple[tuple[str, ...], bytes | None]] = []

    def which(self, tool):
        return f"/usr/bin/{tool}" if tool in self.tools else None

    def exists(self, path):
        return path in self.files

    def run(self, argv, *, input=None, timeout=5.0, capture_stdout=True, env=None):
        argv = tuple(argv)
        self.calls.append((argv, input))
        result = self.responder(argv, input) if self.responder else None
        return result if result is not None else ProcResult(argv, 0)

    def argvs(self):
        return [argv for argv, _ in self.calls]


class FakeClipboard:
    """Clipboard and PRIMARY in memory. `sticky_text` makes writes silently not take (read returns it)."""

    name = "fake"
    supports_primary = True

    def __init__(self, text=None, *, snapshot_kind=None, sticky_text=None):
        self.contents: dict[Selection, ClipboardSnapshot] = {s: ClipboardSnapshot("empty") for s in Selection}
        if text is not None:
            self.set(text)
        self.snapshot_kind = snapshot_kind
        self.sticky_text = sticky_text
        self.ops: list[str] = []

    def set(self, text, selection=Selection.CLIPBOARD):
        """The user copies something."""
        self.contents[selection] = ClipboardSnapshot("text", text.encode(), "UTF8_STRING")

    def check(self):
        return Availability(True, "clipboard via fake")

    def snapshot(self, selection=Selection.CLIPBOARD):
        self.ops.append(f"snapshot {selection.value}")
        if self.snapshot_kind == "unsaved":
            return ClipboardSnapshot("unsaved", note="image/x-huge, too big")
        return self.contents[selection]

    def read_text(self, selection=Selection.CLIPBOARD):
        if self.sticky_text is not None:
            return self.sticky_text
        snap = self.contents[selection]
        return snap.text if snap.kind == "text" else None

    def write_text(self, text, selection=Selection.CLIPBOARD):
        self.ops.append(f"write {selection.value} {text!r}")
        self.set(text, selection)

    def restore(self, snapshot, selection=Selection.CLIPBOARD):
        self.ops.append(f"restore {selection.value} {snapshot.kind}")
        self.contents[selection] = snapshot

    def text(self, selection=Selection.CLIPBOARD):
        return self.read_text(selection)


class FakeKeys:
    """Records chords, typed text and pressed keys; `error` is raised on use."""

    def __init__(self, name="fakekeys", *, ok=True, unicode_typing=True, error: InjectionError | None = None):
        self.name = name
        self.ok = ok
        self.unicode_typing = unicode_typing
        self.error = error
        self.sent: list[str] = []

    def check(self):
        return Availability(self.ok, "fake keys" if self.ok else "fake keys missing")

    def send_chord(self, chord):
        if self.error:
            raise self.error
        self.sent.append(chord.value)

    def type_text(self, text, delay_ms):
        if self.error:
            raise self.error
        self.sent.append(f"type {text!r} {delay_ms}")

    def press_key(self, key, count):
        if self.error:
            raise self.error
        self.sent.append(f"press {key} {count}")


class FakeSelectionTools:
    """A responder for FakeHost that behaves like xclip / wl-copy + wl-paste on one in-memory store:
    {selection: (mime, bytes)}. Text written without a type is offered under the usual text types."""

    X_TEXT = ("UTF8_STRING", "STRING")
    WL_TEXT = ("text/plain;charset=utf-8", "text/plain", "UTF8_STRING")

    def __init__(self):
        self.store: dict[str, tuple[tuple[str, ...], bytes]] = {}

    def __call__(self, argv, input):
        tool, args = argv[0], list(argv[1:])
        if tool == "xclip":
            sel = args[args.index("-selection") + 1]
            mime = args[args.index("-t") + 1] if "-t" in args else None
            if "-i" in args:
                self.store[sel] = ((mime,) if mime else self.X_TEXT, input)
                return ProcResult(argv, 0)
            return self._read(argv, sel, mime or "UTF8_STRING", "\n")
        if tool == "wl-copy":
            sel = "primary" if "--primary" in args else "clipboard"
            if "--clear" in args:
                self.store.pop(sel, None)
            else:
                mime = args[args.index("--type") + 1] if "--type" in args else None
                self.store[sel] = ((mime,) if mime else self.WL_TEXT, input)
            return ProcResult(argv, 0)
        if tool == "wl-paste":
            sel = "primary" if "--primary" in args else "clipboard"
            mime = "TARGETS" if "--list-types" in args else args[args.index("--type") + 1]
            return self._read(argv, sel, mime, "\n")
        if tool == "xsel" and "--clear" in args:
            self.store.pop(args[0].lstrip("-"), None)
            return ProcResult(argv, 0)
        return None

    def _read(self, argv, sel, mime, sep):
        if sel not in self.store:
            return ProcResult(argv, 1, stderr=b"Error: target not available / Nothing is copied")
        types, data = self.store[sel]
        if mime == "TARGETS":
            return ProcResult(argv, 0, stdout=sep.join(("TARGETS",) + types).encode() + b"\n")
        if mime not in types:
            return ProcResult(argv, 1, stderr=b"Error: target not available")
        return ProcResult(argv, 0, stdout=data)
