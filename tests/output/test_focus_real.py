"""The keyboard focus on real displays: our windows never take it unasked, and no text is sent
into our own windows or into no window at all (Xvfb and headless sway, real Qt windows, the real
tools)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dictation.output import OutputOptions, choose_backend
from dictation.output.focus import NO_WINDOW
from tests.output.conftest import XClipboard, _run, _stop, read_lines, running_xvfb
from tests.waiting import wait_until

OWN_APP = Path(__file__).with_name("own_app.py")
ROOT = Path(__file__).resolve().parents[2]
STATUS_TITLE = "^Ready — Dictation$"  # Qt adds nothing to a title that ends with the display name


class OwnApp:
    """own_app.py in its own process: our status window, history window and guarded output chain."""

    def __init__(self, env: dict[str, str], folder: Path):
        env = {**env, "PYTHONPATH": str(ROOT)}
        folder.mkdir(parents=True)
        self.log = folder / "stderr.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, str(OWN_APP), str(folder)],
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                encoding="utf-8",
            )
        self._pending = bytearray()
        self.pid = int(self._line("READY", 30).split()[1])

    def _line(self, prefix: str, timeout: float) -> str:
        for line in read_lines(self.proc.stdout, timeout, self._pending):
            if line.startswith(prefix):
                return line.rstrip("\n")
        errors = self.log.read_text(errors="replace")[-1500:]
        pytest.fail(f"own_app.py did not answer {prefix!r} (exit status {self.proc.poll()}): {errors}")

    def ask(self, command: str, timeout: float = 20) -> str:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        name = command.split(" ", 1)[0]
        return self._line(f"ok {name}", timeout)[len(f"ok {name}") :].strip()

    def state(self) -> dict[str, str]:
        return dict(part.split("=", 1) for part in self.ask("state").split(" ", 1))

    def deliver(self, guard: str, text: str) -> dict[str, str]:
        return dict(part.split("=", 1) for part in self.ask(f"deliver {guard} {text}").split(" "))

    def close(self) -> None:
        self.proc.stdin.close()
        _stop(self.proc)
        self.proc.stdout.close()


@pytest.fixture
def own_app(tmp_path):
    started = []

    def start(env):
        started.append(OwnApp(env, tmp_path / f"app{len(started)}"))
        return started[-1]

    yield start
    for app in started:
        app.close()


def _x_window(env, title: str) -> str:
    result = _run(env, "xdotool", "search", "--name", title)
    return result.stdout.decode().split()[0] if result.returncode == 0 and result.stdout.strip() else ""


# ---- the status window ------------------------------------------------------------------------


def test_x11_status_window_asks_the_window_manager_for_no_focus(xvfb, target, own_app):
    """What an X11 window manager decides on: WM_HINTS input False (the window takes no focus, not
    even when clicked) and _NET_WM_USER_TIME 0 (do not focus it when it appears)."""
    app = own_app(xvfb)
    window = wait_until(lambda: _x_window(xvfb, STATUS_TITLE), 15, what="the status window")
    props = _run(xvfb, "xprop", "-id", window, "WM_HINTS", "_NET_WM_USER_TIME").stdout.decode()

    assert "Client accepts input or input focus: False" in props, props
    assert "_NET_WM_USER_TIME(CARDINAL) = 0" in props, props
    for step in ("status recording", "notify Microphone: unplugged", "status transcribing", "status idle"):
        app.ask(step)
        assert app.state() == {"active": "False", "focus": "None"}
        assert target.focused()


def test_x11_status_window_menu_opens_with_a_click_and_leaves_the_focus_alone(xvfb, target, own_app):
    app = own_app(xvfb)
    wait_until(lambda: _x_window(xvfb, STATUS_TITLE), 15, what="the status window")
    x, y = app.ask("button").split()
    _run(xvfb, "xdotool", "mousemove", "--sync", x, y, "click", "1")

    wait_until(lambda: app.ask("menu") == "visible=True", 10, what="the menu to open")
    _run(xvfb, "xdotool", "key", "Escape")
    wait_until(lambda: app.ask("menu") == "visible=False", 10, what="the menu to close")
    assert app.state() == {"active": "False", "focus": "None"}
    assert target.focused()
    # Qt keeps the closed menu as its focus window without saying so: the text must still go out
    assert app.deliver("qt", "after the menu") == {"ok": "True", "held_back": "None", "on_clipboard": "True"}
    assert target.wait_for_text("after the menu") == "after the menu"


def test_sway_status_window_appears_without_taking_the_focus(sway, wl_target, own_app):
    """Sway focuses every new window; the status window must leave the focus on the user's window,
    when it appears and when the status changes (seen: the next dictation pasted into it)."""
    app = own_app(sway)
    wait_until(lambda: _sway_node(sway, "Ready — Dictation"), 15, what="the status window")
    time.sleep(0.3)  # a focus change follows the map at once, if it comes

    assert app.state() == {"active": "False", "focus": "None"}
    assert wl_target.focused()
    for step in ("status recording", "notify Microphone: unplugged", "status transcribing", "status idle"):
        app.ask(step)
        assert app.state() == {"active": "False", "focus": "None"}
    assert wl_target.focused()


def _sway_node(env, title_start: str) -> dict | None:
    import json

    result = _run(env, "swaymsg", "-t", "get_tree")
    stack = [json.loads(result.stdout)] if result.returncode == 0 else []
    while stack:
        node = stack.pop()
        if (node.get("name") or "").startswith(title_start) and node.get("type") in ("con", "floating_con"):
            return node
        stack.extend(node.get("nodes", []) + node.get("floating_nodes", []))
    return None


# ---- no text into our own windows ---------------------------------------------------------------


@pytest.mark.parametrize("guard", ["qt", "desktop"])
def test_x11_nothing_is_pasted_into_our_own_focused_window(xvfb, target, xclipboard, own_app, guard):
    """The history window, opened on purpose, has the focus: a dictation must not land in its search
    field. "qt": Qt says one of our windows is focused; "desktop": the focused window's _NET_WM_PID
    is our process."""
    app = own_app(xvfb)
    app.ask("history")
    wait_until(lambda: app.state()["focus"] == "Dictation history", 15, what="focus on our history window")

    result = app.deliver(guard, "words")

    assert result == {"ok": "False", "held_back": "own", "on_clipboard": "True"}
    time.sleep(0.3)
    assert app.ask("search") == ""
    assert xclipboard.text() == "words"  # kept for the user to paste where it belongs
    assert target.text() == ""


@pytest.mark.parametrize("guard", ["qt", "desktop"])
def test_sway_nothing_is_pasted_into_our_own_focused_window(sway, wl_target, wl_clipboard, own_app, guard):
    app = own_app(sway)
    app.ask("history")
    wait_until(lambda: app.state()["focus"] == "Dictation history", 15, what="focus on our history window")

    result = app.deliver(guard, "words")

    assert result == {"ok": "False", "held_back": "own", "on_clipboard": "True"}
    time.sleep(0.3)
    assert app.ask("search") == ""
    assert wl_clipboard.text() == "words"
    assert wl_target.text() == ""


# ---- no text into no window -------------------------------------------------------------------


KEEPER = "import time; from Xlib.display import Display; d = Display(); print('connected', flush=True); time.sleep(600)"


@pytest.fixture
def bare_x(tmp_path):
    """A display of its own where no window has the focus (X starts with the focus on PointerRoot)."""
    with running_xvfb(tmp_path / "xvfb.log") as display:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("WAYLAND_", "XDG_SESSION", "XDG_CURRENT"))}
        env.update(DISPLAY=display, XDG_SESSION_TYPE="x11")
        env.pop("SWAYSOCK", None)
        wait_until(lambda: _run(env, "xdotool", "getmouselocation").returncode == 0, 10, what="X server")
        # A client that stays connected: when the last one leaves, the X server resets, focus included,
        # and refuses connections while it does. It says when it is connected: `xdotool sleep` did not,
        # and a test's first xdotool call, made before it had connected, left an X server resetting
        # under the next one ("Can't open display", once in a full run on a busy machine).
        keeper = subprocess.Popen([sys.executable, "-c", KEEPER], env=env, stdout=subprocess.PIPE)
        try:
            assert keeper.stdout.readline().strip() == b"connected", "the client keeping the X server up failed"
            yield env
        finally:
            _stop(keeper)


@pytest.mark.parametrize("backend", ["xdotool-paste", "xdotool-type"])
@pytest.mark.parametrize("focus", ["pointer-root", "root-window"])
def test_x11_text_is_kept_on_the_clipboard_when_no_window_has_the_focus(bare_x, backend, focus):
    if focus == "root-window":
        root_id = _root_id(bare_x)
        assert _run(bare_x, "xdotool", "windowfocus", root_id).returncode == 0
        assert _run(bare_x, "xdotool", "getwindowfocus").stdout.decode().strip() == root_id
    chain = choose_backend(OutputOptions(backend=backend, restore_delay_ms=3_600_000), bare_x)

    result = chain.deliver("kept words")

    assert (result.ok, result.held_back, result.on_clipboard) == (False, NO_WINDOW, True), result.message
    assert result.message.startswith(f"not delivered: {NO_WINDOW}; the text is on the clipboard")
    assert XClipboard(bare_x).text() == "kept words"
    chain.flush()


def _root_id(env) -> str:
    out = _run(env, "xwininfo", "-root").stdout.decode()
    return str(int(out.split("Window id: ", 1)[1].split()[0], 16))


def test_clipboard_only_output_copies_whatever_has_the_focus(bare_x):
    """The clipboard-only backend sends nothing to any window: no focus check, the text is copied."""
    chain = choose_backend(OutputOptions(backend="clipboard"), bare_x)
    result = chain.deliver("copied words")
    assert (result.ok, result.method, result.held_back, result.on_clipboard) == (True, "clipboard", None, True)
    assert XClipboard(bare_x).text() == "copied words"
