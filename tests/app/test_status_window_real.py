"""The status window (no system tray) as the desktop sees it: its title on a real X server (Xvfb), and
on a real headless sway a small floating window, not a tiled half of the screen; the "no hotkey
works" message with its binding advice fits in it. The window runs in its own process
(tests/output/own_app.py, with the app's display name set as the app sets it)."""

from __future__ import annotations

import json

from dictation.app.hotkey_input import no_backend_message
from dictation.app.tray import STATUS_WIDTH
from dictation.hotkeys.choose import COMMANDS_HINT
from tests.output.conftest import _run, sway, xvfb  # noqa: F401  (fixtures)
from tests.output.test_focus_real import OwnApp
from tests.waiting import wait_until

NO_HOTKEYS = no_backend_message(
    "Hotkeys: none of the global hotkey backends works in this Wayland session (sway).\n"
    "  portal: unavailable — no GlobalShortcuts portal\n"
    "  evdev: unavailable — no readable keyboard under /dev/input\n" + COMMANDS_HINT
)


def _x_windows(env, title: str) -> list[str]:
    result = _run(env, "xdotool", "search", "--name", title)
    return result.stdout.decode().split() if result.returncode == 0 else []


def _x_size(env, window: str) -> tuple[int, int]:
    info = _run(env, "xwininfo", "-id", window).stdout.decode()
    fields = dict(line.strip().split(": ", 1) for line in info.splitlines() if ": " in line)
    return int(fields["Width"]), int(fields["Height"])


def _sway_windows(env) -> list[dict]:
    """Every window (con or floating_con with a name) in sway's tree."""
    result = _run(env, "swaymsg", "-t", "get_tree")
    stack, found = [json.loads(result.stdout)] if result.returncode == 0 else [], []
    while stack:
        node = stack.pop()
        if node.get("type") in ("con", "floating_con") and node.get("name"):
            found.append(node)
        stack.extend(node.get("nodes", []) + node.get("floating_nodes", []))
    return found


def test_the_title_names_the_app_once_on_x11(xvfb, tmp_path):  # noqa: F811
    app = OwnApp(xvfb, tmp_path / "app")
    try:
        window = wait_until(lambda: _x_windows(xvfb, "— Dictation$"), 15, what="the status window")[0]
        name = _run(xvfb, "xprop", "-id", window, "_NET_WM_NAME").stdout.decode()
        assert name.strip() == '_NET_WM_NAME(UTF8_STRING) = "Ready — Dictation"'  # was "Dictation — Ready — Dictation"
        app.ask("status recording")
        wait_until(lambda: _x_windows(xvfb, "^Recording… — Dictation$"), 10, what="the new title")
    finally:
        app.close()


def test_the_no_hotkey_advice_is_shown_whole_on_x11(xvfb, tmp_path):  # noqa: F811
    app = OwnApp(xvfb, tmp_path / "app")
    try:
        window = wait_until(lambda: _x_windows(xvfb, "^Ready — Dictation$"), 15, what="the status window")[0]
        small = _x_size(xvfb, window)
        app.ask(f"notify {NO_HOTKEYS}")
        width, height = wait_until(
            lambda: (size := _x_size(xvfb, window))[1] > small[1] and size, 10, what="the window to grow"
        )
        assert app.ask("message") == f"fits=True {NO_HOTKEYS}"  # every line of it, none cut off
        assert "`dictation toggle`" in NO_HOTKEYS and "bindsym" in NO_HOTKEYS
        assert width == STATUS_WIDTH and height < 500  # still a small window
    finally:
        app.close()


def _settled_window(env, name: str) -> dict:
    """The named window once sway reports the same size for it three times in a row, 0.1 s apart.

    Read as it is mapped, its size may not yet be the one it settles at (on a busy machine the test
    once waited 10 s in vain for the window to grow past the size it read first)."""
    sizes: list[tuple] = []

    def settled():
        node = next((n for n in _sway_windows(env) if n["name"] == name), None)
        sizes.append(None if node is None else (node["rect"]["width"], node["rect"]["height"]))
        return node if node is not None and sizes[-3:] == [sizes[-1]] * 3 else None

    return wait_until(settled, 15, what=f"the window {name!r} to settle", interval=0.1)


def test_on_sway_the_status_window_floats_and_stays_small(sway, tmp_path):  # noqa: F811
    app = OwnApp(sway, tmp_path / "app")
    try:
        node = _settled_window(sway, "Ready — Dictation")
        assert node["type"] == "floating_con", node["type"]  # tiled, it took half of the 1280x800 screen
        rect = node["rect"]
        assert rect["width"] < 450 and rect["height"] < 300, rect
        app.ask(f"notify {NO_HOTKEYS}")
        grown = wait_until(
            lambda: next(
                (
                    n
                    for n in _sway_windows(sway)
                    if n["name"] == "Ready — Dictation" and n["rect"]["height"] > rect["height"]
                ),
                None,
            ),
            10,
            what="the window to grow with the advice",
        )
        assert grown["type"] == "floating_con"
        assert grown["rect"]["width"] < 450 and grown["rect"]["height"] < 500, grown["rect"]
        assert app.ask("message") == f"fits=True {NO_HOTKEYS}"
    finally:
        app.close()
