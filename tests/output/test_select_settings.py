"""The settings' output method and tool narrow the backend chain (select.plan_backends), and the
app's OutputSettings map onto OutputOptions."""

from __future__ import annotations

import pytest

from dictation.config.settings import OutputSettings, Replacement, Settings
from dictation.output import OutputOptions, TextOptions, apply_textops, choose_backend, plan_backends
from dictation.output import keys as keys_module
from tests.output.fakes import FakeHost, FakeSelectionTools

X11 = {"DISPLAY": ":0", "XDG_SESSION_TYPE": "x11", "XDG_CURRENT_DESKTOP": "XFCE"}
GNOME = {"WAYLAND_DISPLAY": "wayland-0", "DISPLAY": ":0", "XDG_SESSION_TYPE": "wayland", "XDG_CURRENT_DESKTOP": "GNOME"}
X_TOOLS = {"xdotool", "xclip", "xsel", "xprop"}
WL_TOOLS = {"wl-copy", "wl-paste", "wtype", "xdotool"}


@pytest.fixture(autouse=True)
def pynput_present(monkeypatch):
    monkeypatch.setattr(keys_module, "pynput_installed", lambda: True)


@pytest.mark.parametrize(
    "session, backend, method, names, forced",
    [
        ("x11", "auto", "auto", ("xdotool-paste", "xdotool-type", "pynput-type"), False),
        ("x11", "auto", "paste", ("xdotool-paste",), False),
        ("x11", "auto", "type", ("xdotool-type", "pynput-type"), False),
        ("wayland", "auto", "paste", ("wtype-paste", "ydotool-paste"), False),
        ("wayland", "auto", "type", ("wtype-type", "ydotool-type"), False),
        ("wayland", "ydotool", "auto", ("ydotool-paste", "ydotool-type"), True),
        ("wayland", "wtype", "type", ("wtype-type",), True),
        # no auto entry for the tool in this session: its backends, paste first
        ("wayland", "xdotool", "auto", ("xdotool-paste", "xdotool-type"), True),
        ("wayland", "xdotool", "type", ("xdotool-type",), True),
        ("x11", "pynput", "auto", ("pynput-type",), True),
        ("x11", "pynput", "paste", ("pynput-paste",), True),
        ("x11", "wtype", "auto", ("wtype-paste", "wtype-type"), True),
        ("macos", "pynput", "type", ("pynput-type",), True),
        # a full backend name is taken as it is; the method does not override it
        ("x11", "xdotool-paste", "type", ("xdotool-paste",), True),
        ("wayland", "clipboard", "paste", ("clipboard",), True),
    ],
)
def test_backend_chain_for_tool_and_method(session, backend, method, names, forced):
    assert plan_backends(session, backend, method) == (names, forced)


def test_unknown_tool_or_method_is_an_error():
    with pytest.raises(ValueError, match="unknown output backend 'xdotoool'; known: auto, xdotool, wtype"):
        plan_backends("x11", "xdotoool")
    with pytest.raises(ValueError, match="unknown output method 'dictate'"):
        plan_backends("x11", "auto", "dictate")
    with pytest.raises(ValueError, match="method must be one of"):
        OutputOptions(method="dictate")


def test_typing_only_never_touches_the_clipboard():
    """method=type: the text arrives as key presses and the user's clipboard is left alone."""
    tools = FakeSelectionTools()
    host = FakeHost(X_TOOLS, environment=X11, responder=tools)
    chain = choose_backend(OutputOptions(method="type"), X11, platform="linux", host=host)
    assert [b.name for b in chain.backends] == ["xdotool-type", "pynput-type"]
    assert chain.describe().splitlines()[0].endswith("backend auto, type only")
    result = chain.deliver("hello")
    assert result.ok and result.method == "xdotool-type"
    typed = [data for argv, data in host.calls if argv[0] == "xdotool" and "type" in argv]
    assert typed == [b"hello"]
    assert tools.store == {}  # nothing was put on any clipboard


def test_a_named_tool_skips_the_session_heuristics_but_not_the_tool_checks():
    """xdotool on GNOME Wayland reaches XWayland windows only; the user chose it anyway."""
    host = FakeHost(WL_TOOLS, environment=GNOME)
    chain = choose_backend(OutputOptions(backend="xdotool", method="type"), GNOME, platform="linux", host=host)
    assert [b.name for b in chain.backends] == ["xdotool-type"]
    assert chain.is_available().ok

    missing = choose_backend(OutputOptions(backend="ydotool"), GNOME, platform="linux", host=host)
    assert [b.name for b in missing.backends] == ["ydotool-paste", "ydotool-type"]
    assert missing.is_available().reason.startswith("ydotool-paste: ydotool not installed")


def test_output_options_from_the_apps_settings():
    assert OutputOptions.from_settings(Settings().output) == OutputOptions(restore_delay_ms=1500)
    custom = OutputSettings(
        method="type",
        backend="wtype",
        paste_chord="ctrl+shift+v",
        restore_clipboard=False,
        restore_delay_ms=2500,
        trailing_space=False,
    )
    options = OutputOptions.from_settings(custom)
    assert (options.method, options.backend, options.paste_chord) == ("type", "wtype", "ctrl+shift+v")
    assert (options.restore_clipboard, options.restore_delay_ms) == (False, 2500)
    assert plan_backends("wayland", options.backend, options.method) == (("wtype-type",), True)


def test_text_options_from_the_apps_settings():
    output = OutputSettings(
        trailing_space=True,
        capitalize_first=True,
        replacements=(Replacement(from_="pie side", to="PySide"), Replacement(from_="Cat", to="dog")),
    )
    options = TextOptions.from_settings(output)
    assert apply_textops(" pie side and cat and Cat", options) == "PySide and cat and dog "  # exact case
    assert apply_textops("", options) == ""

    plain = TextOptions.from_settings(OutputSettings(trailing_space=False, capitalize_first=False))
    assert apply_textops(" hello ", plain) == "hello"
