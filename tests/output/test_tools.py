"""Command lines sent to wtype, ydotool, xdotool, wl-clipboard (not runnable here), and window probes."""

from __future__ import annotations

import json

import pytest

from dictation.output import Chord, InjectionError, Selection
from dictation.output.clipboard import WlClipboard, XclipClipboard
from dictation.output.environment import Session
from dictation.output.keys import WtypeKeys, XdotoolKeys, YdotoolKeys
from dictation.output.process import ProcResult, SystemHost
from dictation.output.windows import WindowInfo, choose_chord, focused_window
from tests.output.fakes import FakeHost, FakeSelectionTools

WAYLAND = Session("wayland", "sway", wayland_display="wayland-1")
X11 = Session("x11", display=":0")
XDOTOOL_RELEASE = ("keyup", "Shift_L", "Shift_R", "Control_L", "Control_R", "Alt_L", "Alt_R", "Super_L", "Super_R")
XDOTOOL_RELEASE += ("ISO_Level3_Shift",)
RELEASE_MODIFIERS = ["29:0", "97:0", "42:0", "54:0", "56:0", "100:0", "125:0", "126:0"]


def test_wtype_chords_press_and_release_their_modifiers():
    host = FakeHost({"wtype"})
    keys = WtypeKeys(host, WAYLAND)
    keys.send_chord(Chord.CTRL_SHIFT_V)
    keys.send_chord(Chord.SHIFT_INSERT)
    assert host.argvs() == [
        ("wtype", "-s", "50", "-M", "ctrl", "-M", "shift", "-k", "v", "-m", "shift", "-m", "ctrl"),
        ("wtype", "-s", "50", "-M", "shift", "-k", "Insert", "-m", "shift"),
    ]


def test_wtype_types_from_stdin_so_a_leading_dash_is_text():
    host = FakeHost({"wtype"})
    WtypeKeys(host, WAYLAND).type_text("-rf Grüße", 40)
    assert host.calls == [(("wtype", "-s", "50", "-d", "40", "-"), "-rf Grüße".encode())]


def test_ydotool_releases_held_modifiers_then_sends_keycodes():
    host = FakeHost({"ydotool"})
    YdotoolKeys(host, WAYLAND).send_chord(Chord.CTRL_V)
    assert host.argvs() == [("ydotool", "key", *RELEASE_MODIFIERS, "29:1", "47:1", "47:0", "29:0")]


def test_ydotool_types_from_stdin_after_releasing_modifiers():
    host = FakeHost({"ydotool"})
    YdotoolKeys(host, WAYLAND).type_text("-rf secret", 20)
    assert host.calls == [
        (("ydotool", "key", *RELEASE_MODIFIERS), None),
        (("ydotool", "type", "--key-delay", "20", "--file", "/dev/stdin"), b"-rf secret"),
    ]


def test_ydotool_refuses_non_ascii_without_sending_anything():
    host = FakeHost({"ydotool"})
    with pytest.raises(InjectionError) as info:
        YdotoolKeys(host, WAYLAND).type_text("Grüße", 12)
    assert not info.value.input_sent and host.calls == []


def test_xdotool_type_clears_modifiers_and_slows_down_for_non_ascii_without_xmodmap():
    host = FakeHost({"xdotool"})
    keys = XdotoolKeys(host, X11)
    keys.type_text("-n hello", None)
    keys.type_text("你好", None)
    keys.type_text("你好", 5)
    typing = ("xdotool", *XDOTOOL_RELEASE, "type", "--delay")
    assert host.calls == [  # the text on stdin, never in argv
        ((*typing, "12", "--file", "-"), b"-n hello"),
        ((*typing, "40", "--file", "-"), "你好".encode()),
        ((*typing, "5", "--file", "-"), "你好".encode()),
    ]


def _keymap_with_free(*free):
    lines = [f"keycode {k} =" for k in free] + ["keycode  38 = a A a A", "keycode 248 = U00FC"]
    return ProcResult(("xmodmap", "-pke"), 0, stdout=("\n".join(lines) + "\n").encode())


def test_xdotool_binds_non_ascii_characters_before_typing_and_unbinds_after():
    host = FakeHost(
        {"xdotool", "xmodmap"},
        responder=lambda argv, _: _keymap_with_free(8, 93, 97, 120, 200) if argv[1:] == ("-pke",) else None,
    )  # noqa: E501
    keys = XdotoolKeys(host, X11)
    keys.type_text("Grüße 你好", None)
    keys.keymap.release_now()
    typed = [(argv, data) for argv, data in host.calls if argv != ("xmodmap", "-pke")]
    assert typed == [  # bindings and text on stdin: the characters never show in argv
        (("xmodmap", "-"), b"keycode 8 = U00DF\nkeycode 93 = U00FC\nkeycode 97 = U4F60\nkeycode 120 = U597D\n"),
        (("xdotool", *XDOTOOL_RELEASE, "type", "--delay", "12", "--file", "-"), "Grüße 你好".encode()),
        (("xmodmap", "-"), b"keycode 8 =\nkeycode 93 =\nkeycode 97 =\nkeycode 120 =\n"),
    ]


def test_more_distinct_characters_than_spare_keycodes_are_typed_in_segments():
    host = FakeHost(
        {"xdotool", "xmodmap"},
        responder=lambda argv, _: _keymap_with_free(8, 93, 97) if argv[1:] == ("-pke",) else None,
    )  # noqa: E501
    keys = XdotoolKeys(host, X11)
    keys.keymap.grace_s = 0.01
    keys.type_text("äöü ßé", None)  # 5 characters, 3 spare keycodes, one kept for xdotool: 2 per segment
    keys.keymap.release_now()
    typed = [data.decode() for argv, data in host.calls if argv[0] == "xdotool"]
    assert typed == ["äö", "ü ß", "é"]


@pytest.mark.parametrize(
    "result, input_sent",
    [
        (ProcResult(("xdotool",), None, error="not found"), False),
        (ProcResult(("xdotool",), None, error="timed out after 5.0 s"), True),
        (ProcResult(("xdotool",), 1, stderr=b"Can't open display"), True),  # typing may have started
    ],
)
def test_typing_failures_say_whether_input_may_have_been_sent(result, input_sent):
    host = FakeHost({"xdotool"}, responder=lambda argv, _: result)
    with pytest.raises(InjectionError) as info:
        XdotoolKeys(host, X11).type_text("hello", 12)
    assert info.value.input_sent is input_sent


def test_chord_that_exits_non_zero_sent_nothing():
    host = FakeHost({"xdotool"}, responder=lambda argv, _: ProcResult(argv, 1, stderr=b"boom"))
    with pytest.raises(InjectionError, match="sending ctrl\\+v: xdotool exited with 1: boom") as info:
        XdotoolKeys(host, X11).send_chord(Chord.CTRL_V)
    assert not info.value.input_sent


@pytest.mark.parametrize("clipboard_class", [WlClipboard, XclipClipboard])
def test_clipboard_snapshot_and_restore_of_an_image(clipboard_class):
    tools = FakeSelectionTools()
    host = FakeHost({"wl-copy", "wl-paste", "xclip"}, responder=tools)
    clipboard = clipboard_class(host)
    png = b"\x89PNG\r\n\x1a\nimage bytes"
    clipboard._write(png, Selection.CLIPBOARD, "image/png")

    snapshot = clipboard.snapshot()
    clipboard.write_text("dictated")
    assert clipboard.read_text() == "dictated"
    clipboard.restore(snapshot)

    assert (snapshot.kind, snapshot.mime, snapshot.data) == ("data", "image/png", png)
    assert tools.store["clipboard"] == (("image/png",), png)
    assert clipboard.read_text() is None


def test_wl_clipboard_commands_for_primary_and_clear():
    tools = FakeSelectionTools()
    host = FakeHost({"wl-copy", "wl-paste"}, responder=tools)
    clipboard = WlClipboard(host)
    empty = clipboard.snapshot(Selection.PRIMARY)
    clipboard.write_text("Grüße 你好", Selection.PRIMARY)
    assert clipboard.read_text(Selection.PRIMARY) == "Grüße 你好"
    clipboard.restore(empty, Selection.PRIMARY)
    assert empty.kind == "empty"
    assert host.argvs() == [
        ("wl-paste", "--primary", "--list-types"),
        ("wl-copy", "--primary"),
        ("wl-paste", "--primary", "--list-types"),
        ("wl-paste", "--primary", "--no-newline", "--type", "text/plain;charset=utf-8"),
        ("wl-copy", "--primary", "--clear"),
    ]


def test_system_host_reports_missing_tools_and_timeouts():
    host = SystemHost({"PATH": "/nonexistent"})
    assert host.which("sh") is None
    missing = host.run(["/nonexistent/tool"])
    assert (missing.ok, missing.failure()) == (False, "tool: not found")
    slow = SystemHost().run(["sleep", "5"], timeout=0.2)
    assert slow.timed_out and not slow.ok


def _xprop(wm_class):
    def respond(argv, _input):
        if argv[:2] == ("xdotool", "getwindowfocus"):
            return ProcResult(argv, 0, stdout=b"123\n")
        return ProcResult(argv, 0, stdout=wm_class.encode())

    return respond


@pytest.mark.parametrize(
    "xprop, chord",
    [
        ('WM_CLASS(STRING) = "kitty", "kitty"\n', Chord.CTRL_SHIFT_V),
        ('WM_CLASS(STRING) = "gnome-terminal-server", "Gnome-terminal"\n', Chord.CTRL_SHIFT_V),
        ('WM_CLASS(STRING) = "xterm", "XTerm"\n', Chord.SHIFT_INSERT),
        ('WM_CLASS(STRING) = "urxvt", "URxvt"\n', Chord.SHIFT_INSERT),
        ('WM_CLASS(STRING) = "Navigator", "firefox"\n', Chord.CTRL_V),
        ("WM_CLASS:  not found.\n", Chord.SHIFT_INSERT),
    ],
)
def test_x11_chord_follows_the_focused_window_class(xprop, chord):
    host = FakeHost({"xdotool", "xprop"}, responder=_xprop(xprop))
    window = focused_window(X11, host)
    assert choose_chord("auto", X11, window)[0] is chord


def test_extra_terminal_classes_and_fixed_chords():
    window = WindowInfo("1", ("myterm", "MyTerm"))
    assert choose_chord("auto", X11, window)[0] is Chord.CTRL_V
    assert choose_chord("auto", X11, window, ("MyTerm",))[0] is Chord.CTRL_SHIFT_V
    assert choose_chord("ctrl+v", X11, WindowInfo("1", ("kitty",)))[0] is Chord.CTRL_V
    assert choose_chord("auto", Session("macos"), window)[0] is Chord.CMD_V
    assert choose_chord("auto", Session("windows"), WindowInfo())[0] is Chord.CTRL_V


def test_hyprland_and_sway_report_the_focused_app():
    hypr = FakeHost(
        {"hyprctl"},
        responder=lambda argv, _: ProcResult(argv, 0, json.dumps({"class": "foot", "initialClass": "foot"}).encode()),
    )
    window = focused_window(Session("wayland", "hyprland", wayland_display="w"), hypr)
    assert window.classes == ("foot", "foot")
    assert choose_chord("auto", WAYLAND, window)[0] is Chord.CTRL_SHIFT_V

    tree = {
        "type": "root",
        "nodes": [{"type": "output", "nodes": [{"type": "con", "focused": False, "app_id": "firefox", "nodes": []}]}],
        "floating_nodes": [{"type": "floating_con", "focused": True, "app_id": "Alacritty", "nodes": []}],
    }
    sway = FakeHost({"swaymsg"}, responder=lambda argv, _: ProcResult(argv, 0, json.dumps(tree).encode()))
    assert focused_window(WAYLAND, sway).classes == ("Alacritty",)


def test_gnome_wayland_window_is_unknown_so_shift_insert():
    window = focused_window(Session("wayland", "gnome", wayland_display="w"), FakeHost())
    assert window.classes == () and "gnome" in window.note
    assert choose_chord("auto", WAYLAND, window)[0] is Chord.SHIFT_INSERT
