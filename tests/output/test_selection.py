"""Which backend is chosen in which session, and why the others are not (fake environments)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from dictation.output import (
    BACKEND_NAMES,
    OutputOptions,
    available_backends,
    choose_backend,
    detect_session,
    diagnose,
)
from dictation.output import keys as keys_module
from tests.output.fakes import FakeHost, FakeSelectionTools

X11 = {"DISPLAY": ":0", "XDG_SESSION_TYPE": "x11", "XDG_CURRENT_DESKTOP": "XFCE"}
GNOME = {
    "WAYLAND_DISPLAY": "wayland-0",
    "DISPLAY": ":0",
    "XDG_SESSION_TYPE": "wayland",
    "XDG_CURRENT_DESKTOP": "ubuntu:GNOME",
}
KDE = {"WAYLAND_DISPLAY": "wayland-0", "DISPLAY": ":1", "XDG_SESSION_TYPE": "wayland", "XDG_CURRENT_DESKTOP": "KDE"}
HYPRLAND = {"WAYLAND_DISPLAY": "wayland-1", "HYPRLAND_INSTANCE_SIGNATURE": "abc_123", "XDG_CURRENT_DESKTOP": "Hyprland"}
SWAY = {"WAYLAND_DISPLAY": "wayland-1", "SWAYSOCK": "/run/user/1000/sway-ipc.sock"}
SOCKET = "/run/user/1000/.ydotool_socket"
X_TOOLS = {"xdotool", "xclip", "xsel", "xprop"}
WL_TOOLS = {"wl-copy", "wl-paste", "wtype", "xdotool"}  # xdotool too: it must not be picked on Wayland


@pytest.fixture(autouse=True)
def pynput_present(monkeypatch):
    monkeypatch.setattr(keys_module, "pynput_installed", lambda: True)


def statuses(env, tools=(), files=(), platform="linux", **options):
    host = FakeHost(tools, files, environment={**env, "XDG_RUNTIME_DIR": "/run/user/1000"})
    return {s.name: s for s in diagnose(OutputOptions(**options), env, platform=platform, host=host)}


def available(env, tools=(), files=(), platform="linux"):
    host = FakeHost(tools, files, environment={**env, "XDG_RUNTIME_DIR": "/run/user/1000"})
    return available_backends(None, env, platform=platform, host=host)


@pytest.mark.parametrize(
    "env, tools, files, platform, expected",
    [
        (X11, X_TOOLS, (), "linux", ["xdotool-paste", "xdotool-type", "pynput-type", "pynput-paste", "clipboard"]),
        (
            X11,
            {"xdotool", "xsel"},
            (),
            "linux",
            ["xdotool-paste", "xdotool-type", "pynput-type", "pynput-paste", "clipboard"],
        ),
        (X11, {"xclip"}, (), "linux", ["pynput-type", "pynput-paste", "clipboard"]),
        (X11, {"xdotool"}, (), "linux", ["xdotool-type", "pynput-type"]),
        (GNOME, WL_TOOLS, (), "linux", ["clipboard"]),
        (GNOME, WL_TOOLS | {"ydotool"}, {SOCKET}, "linux", ["ydotool-paste", "ydotool-type", "clipboard"]),
        (KDE, WL_TOOLS | {"ydotool"}, (), "linux", ["clipboard"]),
        (HYPRLAND, WL_TOOLS, (), "linux", ["wtype-paste", "wtype-type", "clipboard"]),
        (
            SWAY,
            WL_TOOLS | {"ydotool"},
            {"/tmp/.ydotool_socket"},
            "linux",
            ["wtype-paste", "ydotool-paste", "wtype-type", "ydotool-type", "clipboard"],
        ),
        (SWAY, {"wl-copy", "wtype"}, (), "linux", ["wtype-type"]),
        ({}, {"pbcopy", "pbpaste"}, (), "darwin", ["pynput-paste", "pynput-type", "clipboard"]),
        ({}, (), (), "win32", ["pynput-type"]),
        ({}, X_TOOLS | WL_TOOLS, (), "linux", []),
    ],
    ids=[
        "x11",
        "x11-xsel",
        "x11-no-xdotool",
        "x11-no-clipboard-tool",
        "gnome",
        "gnome-ydotool",
        "kde-no-ydotoold",
        "hyprland",
        "sway-all",
        "sway-no-wl-paste",
        "macos",
        "windows",
        "no-display",
    ],
)
def test_available_backends_in_order(env, tools, files, platform, expected):
    assert available(env, tools, files, platform) == expected


@pytest.mark.parametrize(
    "env, tools, files, platform, name, reason",
    [
        (X11, {"xclip"}, (), "linux", "xdotool-paste", "xdotool not installed"),
        (X11, {"xdotool"}, (), "linux", "xdotool-paste", "neither xclip nor xsel is installed"),
        (X11, X_TOOLS, (), "linux", "wtype-type", "wtype not installed"),
        (X11, X_TOOLS | {"wtype"}, (), "linux", "wtype-type", "not a Wayland session"),
        (GNOME, WL_TOOLS, (), "linux", "wtype-paste", "gnome has no virtual-keyboard protocol"),
        (GNOME, WL_TOOLS, (), "linux", "xdotool-type", "Wayland session: xdotool reaches only XWayland windows"),
        (GNOME, WL_TOOLS, (), "linux", "pynput-type", "Wayland session: pynput reaches only XWayland windows"),
        (KDE, WL_TOOLS, (), "linux", "wtype-type", "kde has no virtual-keyboard protocol"),
        (KDE, WL_TOOLS | {"ydotool"}, (), "linux", "ydotool-paste", "ydotoold is not running (no socket at " + SOCKET),
        (SWAY, {"wl-copy", "wtype"}, (), "linux", "wtype-paste", "wl-paste not installed"),
        ({"XDG_SESSION_TYPE": "wayland"}, WL_TOOLS, (), "linux", "wtype-type", "WAYLAND_DISPLAY is not set"),
        ({}, (), (), "win32", "pynput-paste", "clipboard access is not supported on Windows yet"),
        ({}, (), (), "win32", "ydotool-type", "ydotool is Linux-only"),
        ({}, X_TOOLS, (), "linux", "xdotool-paste", "no graphical session"),
    ],
)
def test_reasons_for_unavailable_backends(env, tools, files, platform, name, reason):
    status = statuses(env, tools, files, platform)[name]
    assert not status.ok
    assert status.reason.startswith(reason), status.reason


def test_pynput_missing_is_explained(monkeypatch):
    monkeypatch.setattr(keys_module, "pynput_installed", lambda: False)
    assert statuses({}, platform="win32")["pynput-type"].reason == "pynput is not installed"


def test_auto_chain_description_names_the_session_and_every_reason():
    host = FakeHost(WL_TOOLS, environment=GNOME)
    chain = choose_backend(None, GNOME, platform="linux", host=host)
    text = chain.describe()
    assert text.splitlines()[0] == "output: wayland, gnome, WAYLAND_DISPLAY=wayland-0; backend auto"
    assert "1. wtype-paste: unavailable, gnome has no virtual-keyboard protocol" in text
    assert "ydotool-paste: unavailable, ydotool not installed" in text
    assert "fallback clipboard: available, clipboard via wl-clipboard" in text
    assert [s.name for s in chain.statuses()] == [
        "wtype-paste",
        "ydotool-paste",
        "wtype-type",
        "ydotool-type",
        "clipboard",
    ]
    assert not chain.is_available()


def test_named_backend_skips_the_session_heuristics_but_not_the_tool_checks():
    host = FakeHost(WL_TOOLS, environment=GNOME)
    forced = choose_backend(OutputOptions(backend="wtype-paste"), GNOME, platform="linux", host=host)
    assert [b.name for b in forced.backends] == ["wtype-paste"]
    assert forced.is_available().ok  # the user says wtype works on their GNOME

    missing = choose_backend(OutputOptions(backend="ydotool-type"), GNOME, platform="linux", host=host)
    assert missing.is_available().reason == "ydotool-type: ydotool not installed"


def test_clipboard_only_backend_by_name_has_no_fallback_and_counts_as_success():
    tools = FakeSelectionTools()
    host = FakeHost(X_TOOLS, environment=X11, responder=tools)
    chain = choose_backend(OutputOptions(backend="clipboard"), X11, platform="linux", host=host)
    assert chain.fallback is None
    result = chain.deliver("copy me")
    assert (result.ok, result.on_clipboard, result.method) == (True, True, "clipboard")
    assert tools.store["clipboard"][1] == b"copy me"
    assert not any("xdotool" in argv for argv in host.argvs())


def test_unknown_backend_name_is_an_error():
    with pytest.raises(ValueError, match="unknown output backend 'xdotoool'"):
        choose_backend(OutputOptions(backend="xdotoool"), X11, platform="linux", host=FakeHost())


def test_settings_like_objects_are_accepted():
    settings = SimpleNamespace(output_backend="xdotool-type", paste_chord="ctrl+v", restore_delay_ms=1500, other=1)
    options = OutputOptions.coerce(settings)
    assert (options.backend, options.paste_chord, options.restore_delay_ms) == ("xdotool-type", "ctrl+v", 1500)
    assert options.restore_clipboard is True  # default for what the settings object lacks
    with pytest.raises(ValueError, match="paste_chord"):
        OutputOptions(paste_chord="ctrl+x")
    assert OutputOptions().restore_delay_ms >= 1000


@pytest.mark.parametrize(
    "env, kind, desktop",
    [
        (X11, "x11", "xfce"),
        (GNOME, "wayland", "gnome"),
        (KDE, "wayland", "kde"),
        (HYPRLAND, "wayland", "hyprland"),
        (SWAY, "wayland", "sway"),
        ({"WAYLAND_DISPLAY": "wayland-0", "NIRI_SOCKET": "/run/niri.sock"}, "wayland", "niri"),
        ({"WAYLAND_DISPLAY": "w", "XDG_CURRENT_DESKTOP": "river"}, "wayland", "river"),
        ({"WAYLAND_DISPLAY": "w", "XDG_CURRENT_DESKTOP": "pop:GNOME"}, "wayland", "gnome"),
        ({"WAYLAND_DISPLAY": "w", "DESKTOP_SESSION": "plasmawayland"}, "wayland", "kde"),
        ({"WAYLAND_DISPLAY": "w", "XDG_CURRENT_DESKTOP": "SomethingNew"}, "wayland", "somethingnew"),
        ({"DISPLAY": ":0", "WAYLAND_DISPLAY": "wayland-0", "XDG_SESSION_TYPE": "x11"}, "x11", None),
        ({"DISPLAY": ":0", "WAYLAND_DISPLAY": "wayland-0"}, "wayland", None),
        ({"DISPLAY": ":0", "XDG_SESSION_TYPE": "tty"}, "x11", None),
        ({"XDG_SESSION_TYPE": "tty"}, "none", None),
    ],
)
def test_detect_session(env, kind, desktop):
    session = detect_session(env, platform="linux")
    assert (session.kind, session.desktop) == (kind, desktop)


def test_detect_session_on_windows_and_macos_ignores_x_variables():
    assert detect_session({"DISPLAY": ":0"}, platform="win32").kind == "windows"
    assert detect_session({"DISPLAY": ":0"}, platform="darwin").kind == "macos"


@pytest.mark.parametrize("env", [X11, SWAY, GNOME], ids=["x11", "sway", "gnome"])
@pytest.mark.parametrize("backend", [b for b in BACKEND_NAMES if not b.startswith("pynput")])
def test_no_backend_puts_the_text_on_a_command_line(env, backend):
    """Every tool of every backend gets the text on stdin: command lines are public (ps)."""
    tools = FakeSelectionTools()
    env = {**env, "XDG_RUNTIME_DIR": "/run/user/1000"}
    host = FakeHost(X_TOOLS | WL_TOOLS | {"ydotool", "xmodmap"}, {SOCKET}, environment=env, responder=tools)
    chain = choose_backend(OutputOptions(backend=backend, restore_delay_ms=0), env, platform="linux", host=host)
    chain.deliver("Zyxquorblat quibbleflux")
    chain.deliver("Grüße 你好 naïve")  # xdotool binds these with xmodmap first; ydotool refuses them
    chain.flush()
    assert host.calls, "nothing ran"
    secrets = ("Zyxquorblat", "quibbleflux", "Grüße", "ü", "ß", "你", "好", "ï", "U00FC", "U4F60")
    assert [argv for argv in host.argvs() if any(s in a for a in argv for s in secrets)] == []
    assert any(data and b"Zyxquorblat" in data for _, data in host.calls)  # it went somewhere: stdin
