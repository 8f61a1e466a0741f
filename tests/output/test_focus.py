"""The focus check before any key is sent (output.focus.FocusGuard, OutputChain), against the tools'
real answers replayed by a fake host; tests/output/test_focus_real.py runs the same on real displays."""

from __future__ import annotations

import json
import os

import pytest

from dictation.output import OutputOptions, choose_backend
from dictation.output.environment import Session
from dictation.output.focus import NO_WINDOW, OWN_WINDOW, FocusGuard
from dictation.output.paste import ClipboardKeeper, ClipboardOnlyBackend, ClipboardPasteBackend
from dictation.output.process import ProcResult
from dictation.output.select import OutputChain
from dictation.output.typing_backend import TypingBackend
from tests.output.fakes import FakeClipboard, FakeHost, FakeKeys, FakeSelectionTools

X11 = Session("x11", display=":0")
SWAY = Session("wayland", "sway", wayland_display="wayland-1")
HYPRLAND = Session("wayland", "hyprland", wayland_display="wayland-1")
GNOME = Session("wayland", "gnome", wayland_display="wayland-0")
OURS = os.getpid()

# What xdotool 3.x prints when the X focus is PointerRoot, or None (both exit 1).
POINTER_ROOT = (
    b"XGetInputFocus returned the focused window of 1. This is likely a bug in the X server.\n"
    b"X Error of failed request:  BadWindow (invalid Window parameter)\n"
)
FOCUS_NONE = b"xdo_get_focused_window_sane failed (code=1)\nxdo_focus_window reported an error\n"


def x11_host(*, focus=b"4242\n", focus_rc=0, focus_err=b"", xprop="", root=False):
    def respond(argv, _input):
        if argv[:2] == ("xdotool", "getwindowfocus"):
            return ProcResult(argv, focus_rc, stdout=focus if focus_rc == 0 else b"", stderr=focus_err)
        if argv[0] == "xprop":
            return ProcResult(argv, 0, stdout=xprop.encode())
        if argv[0] == "xwininfo":
            name = "(the root window) (has no name)" if root else '"some window"'
            return ProcResult(argv, 0, stdout=f"\nxwininfo: Window id: 0x50d {name}\n".encode())
        return None

    return FakeHost({"xdotool", "xprop", "xwininfo"}, responder=respond)


def xprop_of(pid: int | None, wm_class: str = '"gedit", "Gedit"') -> str:
    pid_line = f"_NET_WM_PID(CARDINAL) = {pid}" if pid is not None else "_NET_WM_PID:  not found."
    return f"WM_CLASS(STRING) = {wm_class}\n{pid_line}\n"


@pytest.mark.parametrize(
    "host, held_back",
    [
        (x11_host(focus_rc=1, focus_err=POINTER_ROOT), NO_WINDOW),
        (x11_host(focus_rc=1, focus_err=FOCUS_NONE), NO_WINDOW),
        (x11_host(focus=b"1293\n", xprop="WM_CLASS:  not found.\n_NET_WM_PID:  not found.\n", root=True), NO_WINDOW),
        (x11_host(xprop=xprop_of(OURS, '"dictation", "dictation"')), OWN_WINDOW),
        (x11_host(xprop=xprop_of(OURS + 1)), None),
        (x11_host(xprop=xprop_of(None)), None),  # a window without _NET_WM_PID is not ours
        # a child window of an application, without WM_CLASS or pid, that is not the root
        (x11_host(focus=b"77\n", xprop="WM_CLASS:  not found.\n_NET_WM_PID:  not found.\n"), None),
        # the probe failed: it cannot tell, so the text goes out as before
        (x11_host(focus_rc=1, focus_err=b"Error: Can't open display: :9\nFailed creating new xdo instance\n"), None),
        (x11_host(focus_rc=0, focus=b""), None),
    ],
)
def test_x11_focus_verdicts(host, held_back):
    assert FocusGuard(X11, host).check().held_back == held_back


def test_x11_focused_window_reports_its_process_and_class():
    check = FocusGuard(X11, x11_host(xprop=xprop_of(31337))).check()
    assert (check.window.id, check.window.pid, check.window.label) == ("4242", 31337, "Gedit")


def _sway_tree(focused: dict | None) -> bytes:
    workspace = {"type": "workspace", "name": "1", "focused": focused is None, "nodes": [], "floating_nodes": []}
    if focused is not None:
        workspace["nodes"].append({"type": "con", "focused": True, "nodes": [], "floating_nodes": [], **focused})
        workspace["nodes"].append({"type": "con", "focused": False, "app_id": "foot", "pid": 7, "nodes": []})
    return json.dumps({"type": "root", "nodes": [{"type": "output", "nodes": [workspace]}]}).encode()


@pytest.mark.parametrize(
    "reply, held_back",
    [
        (ProcResult(("swaymsg",), 0, _sway_tree({"app_id": "dictation", "pid": OURS})), OWN_WINDOW),
        (ProcResult(("swaymsg",), 0, _sway_tree({"app_id": "foot", "pid": OURS + 1})), None),
        (ProcResult(("swaymsg",), 0, _sway_tree(None)), NO_WINDOW),  # the focus is on an empty workspace
        (ProcResult(("swaymsg",), 1, stderr=b"Unable to connect to /run/sway.sock"), None),
    ],
)
def test_sway_focus_verdicts(reply, held_back):
    host = FakeHost({"swaymsg"}, responder=lambda argv, _: reply)
    assert FocusGuard(SWAY, host).check().held_back == held_back


@pytest.mark.parametrize(
    "reply, held_back",
    [
        (ProcResult(("hyprctl",), 0, json.dumps({"class": "dictation", "pid": OURS}).encode()), OWN_WINDOW),
        (ProcResult(("hyprctl",), 0, json.dumps({"class": "foot", "pid": OURS + 1}).encode()), None),
        (ProcResult(("hyprctl",), 0, b"{}"), NO_WINDOW),
        (ProcResult(("hyprctl",), 1, b"", b"HYPRLAND_INSTANCE_SIGNATURE not set"), None),
    ],
)
def test_hyprland_focus_verdicts(reply, held_back):
    host = FakeHost({"hyprctl"}, responder=lambda argv, _: reply)
    assert FocusGuard(HYPRLAND, host).check().held_back == held_back


def test_our_own_view_counts_where_the_desktop_cannot_tell():
    """GNOME on Wayland names no focused window to other programs; Qt still knows ours."""
    host = FakeHost()
    assert FocusGuard(GNOME, host).check().held_back is None
    check = FocusGuard(GNOME, host, own_window=lambda: "Dictation settings").check()
    assert check.held_back == OWN_WINDOW and "Dictation settings" in check.detail
    assert host.argvs() == []  # nothing to ask the desktop once our own window is known to have the focus


def _chain(host, *, clipboard=None, own_window=None, typing=False):
    options = OutputOptions(restore_delay_ms=60_000)
    clipboard = clipboard or FakeClipboard("user text")
    keeper = ClipboardKeeper(clipboard, options)
    keys = FakeKeys()
    backend = (
        TypingBackend("fake-type", keys, options)
        if typing
        else ClipboardPasteBackend("fake-paste", keeper, keys, X11, host, options)
    )
    guard = FocusGuard(X11, host, own_window=own_window)
    return OutputChain("auto", [backend], ClipboardOnlyBackend(keeper), X11, keeper, guard=guard), clipboard, keys


@pytest.mark.parametrize("typing", [False, True])
def test_nothing_is_sent_into_no_window_and_the_text_waits_on_the_clipboard(typing):
    chain, clipboard, keys = _chain(x11_host(focus_rc=1, focus_err=POINTER_ROOT), typing=typing)

    result = chain.deliver("dictated")

    assert (result.ok, result.held_back, result.on_clipboard, result.input_sent) == (False, NO_WINDOW, True, False)
    assert result.message == f"not delivered: {NO_WINDOW}; the text is on the clipboard, paste it yourself"
    assert keys.sent == []
    assert clipboard.text() == "dictated" and result.restore is None  # it stays there for the user


def test_nothing_is_sent_into_our_own_window():
    chain, clipboard, keys = _chain(x11_host(xprop=xprop_of(4242)), own_window=lambda: "Dictation — Ready")
    result = chain.deliver("dictated")
    assert (result.ok, result.held_back, result.on_clipboard) == (False, OWN_WINDOW, True)
    assert keys.sent == [] and clipboard.text() == "dictated"


def test_held_back_text_that_the_clipboard_refuses_is_in_the_history_only():
    stuck = FakeClipboard("user text", sticky_text="user text")  # writes do not take
    chain, _, keys = _chain(x11_host(focus_rc=1, focus_err=FOCUS_NONE), clipboard=stuck)
    result = chain.deliver("dictated")
    assert (result.ok, result.held_back, result.on_clipboard) == (False, NO_WINDOW, False)
    assert "the text is only in history" in result.message and keys.sent == []


def test_text_goes_out_when_another_window_has_the_focus():
    chain, clipboard, keys = _chain(x11_host(xprop=xprop_of(OURS + 1)), own_window=lambda: None)
    result = chain.deliver("dictated")
    assert (result.ok, result.held_back) == (True, None) and keys.sent == ["ctrl+v"]


def test_clipboard_only_output_is_not_held_back():
    """backend "clipboard" sends nothing to any window, so the focus does not matter."""
    tools = FakeSelectionTools()
    host = FakeHost({"xdotool", "xclip", "xsel", "xprop"}, responder=tools)
    env = {"DISPLAY": ":0", "XDG_SESSION_TYPE": "x11"}
    chain = choose_backend(OutputOptions(backend="clipboard"), env, host=host, own_window=lambda: "Dictation")
    result = chain.deliver("copied")
    assert (result.ok, result.method, result.held_back, result.on_clipboard) == (True, "clipboard", None, True)
    assert tools.store["clipboard"][1] == b"copied"
