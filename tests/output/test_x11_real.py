"""Delivery into a real window on a real X server (Xvfb), read back from the window itself."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import textwrap
import time

import pytest

from dictation.output import Chord, OutputOptions, available_backends, choose_backend

FANCY = "Grüße 你好, naïve café €—“ok”"
PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4  # xclip does not parse it; bytes must come back as they were
# `output(backend, ...)` (conftest) builds a chain on the test display whose restore delay is an hour
# unless a test sets it: most tests trigger the restore themselves with run_now().


def test_xdotool_type_delivers_ascii_and_unicode(xvfb, target, xclipboard, output):
    xclipboard.set_text("untouched")
    keymap_before = keymap(xvfb)
    out = output("xdotool-type")
    result = out.deliver("Hello world. Grüße 你好")

    assert (result.method, result.ok) == ("xdotool-type", True), result.message
    assert target.wait_for_text("Hello world. Grüße 你好") == "Hello world. Grüße 你好"
    assert xclipboard.text() == "untouched"  # typing leaves the clipboard alone
    assert "U4F60" in keymap(xvfb)  # 你 is bound to a spare keycode until after the grace period
    out.flush()
    assert keymap(xvfb) == keymap_before


def keymap(env) -> str:
    return subprocess.run(["xmodmap", "-pke"], env=env, capture_output=True, text=True, check=True).stdout


def test_paste_delivers_unicode_and_restores_previous_clipboard_after_the_delay(xvfb, target, xclipboard, output):
    xclipboard.set_text("previous ✓")
    started = time.monotonic()
    result = output(restore_delay_ms=1000).deliver(FANCY)

    assert result.ok, result.message
    assert (result.method, result.chord, result.window_class) == ("xdotool-paste", Chord.CTRL_V, "target_app.py")
    assert target.wait_for_text(FANCY) == FANCY
    outcome = result.restore.wait(15)
    assert outcome is not None and outcome.restored, outcome
    assert time.monotonic() - started >= 1.0  # not before the target had its second to read it
    assert xclipboard.text() == "previous ✓"
    assert target.text() == FANCY  # the restore did not paste anything itself


def test_paste_leaves_clipboard_alone_when_user_copied_something_else(xvfb, target, xclipboard, output):
    xclipboard.set_text("before")
    result = output().deliver("dictated words")
    assert target.wait_for_text("dictated words") == "dictated words"

    xclipboard.set_text("the user copied this")
    outcome = result.restore.run_now()

    assert not outcome.restored and "changed" in outcome.message
    assert xclipboard.text() == "the user copied this"


def test_paste_restores_an_image_clipboard(xvfb, target, xclipboard, output):
    xclipboard.set_data(PNG, "image/png")
    result = output().deliver("over an image")
    assert target.wait_for_text("over an image") == "over an image"

    outcome = result.restore.run_now()

    assert outcome.restored, outcome.message
    assert "image/png" in xclipboard.targets()
    assert xclipboard.get("image/png") == PNG


def test_paste_clears_the_clipboard_again_when_it_was_empty(xvfb, target, xclipboard, output):
    xclipboard.clear()
    result = output().deliver("secret words")
    assert target.wait_for_text("secret words") == "secret words"

    assert result.restore.run_now().restored
    assert xclipboard.targets() == []  # no owner: the transcript does not linger


def test_back_to_back_dictations_still_restore_the_users_clipboard(xvfb, target, xclipboard, output):
    out = output()
    xclipboard.set_text("user's own text")
    first = out.deliver("one ")
    assert target.wait_for_text("one ") == "one "
    second = out.deliver("two")
    assert target.wait_for_text("one two") == "one two"

    assert first.restore.outcome.message == "cancelled"
    assert second.restore.run_now().restored
    assert xclipboard.text() == "user's own text"


def test_terminal_class_gets_ctrl_shift_v(xvfb, target, xclipboard, output):
    target.set_class("kitty")
    result = output().deliver("ls -l")

    assert result.ok and (result.chord, result.window_class) == (Chord.CTRL_SHIFT_V, "kitty")
    result.restore.cancel()


def test_xterm_class_gets_shift_insert_with_primary_set_and_restored(xvfb, target, xclipboard, output):
    xclipboard.set_text("clip before")
    xclipboard.set_text("primary before", selection="primary")
    target.set_class("XTerm")
    result = output().deliver(FANCY)

    assert result.ok and result.chord == Chord.SHIFT_INSERT
    assert target.wait_for_text(FANCY) == FANCY  # Qt pastes CLIPBOARD on Shift+Insert
    assert xclipboard.text("primary") == FANCY
    outcome = result.restore.run_now()
    assert outcome.restored, outcome.message
    assert (xclipboard.text(), xclipboard.text("primary")) == ("clip before", "primary before")


def test_auto_chain_picks_xdotool_paste_and_delivers(xvfb, target, xclipboard):
    out = choose_backend(OutputOptions(restore_delay_ms=100), xvfb)
    description = out.describe()
    assert "1. xdotool-paste: available" in description
    assert "wtype" not in description

    result = out.deliver(FANCY)

    assert (result.method, result.ok) == ("xdotool-paste", True), result.message
    assert target.wait_for_text(FANCY) == FANCY
    assert result.restore.wait(15) is not None


def test_available_backends_on_x11(xvfb):
    names = available_backends(environment=xvfb)
    assert names[:2] == ["xdotool-paste", "xdotool-type"]
    assert "clipboard" in names
    assert not any(n.startswith(("wtype", "ydotool")) for n in names)


def test_failed_chord_leaves_the_text_on_the_clipboard_and_says_so(xvfb, target, xclipboard, tmp_path, output):
    real = shutil.which("xdotool", path=xvfb.get("PATH"))
    fake = tmp_path / "xdotool"  # a broken xdotool: every key event fails, the rest works
    fake.write_text(
        f'#!/bin/sh\ncase " $* " in *" key "*) echo "cannot send keys" >&2; exit 1;; esac\nexec {real} "$@"\n'
    )
    fake.chmod(0o755)
    env = {**xvfb, "PATH": f"{tmp_path}:{xvfb.get('PATH', '')}"}
    xclipboard.set_text("previous")

    result = output(env=env, restore_delay_ms=100).deliver("keep me")

    assert not result.ok and result.on_clipboard and result.restore is None
    assert "cannot send keys" in result.message and "clipboard" in result.message
    time.sleep(0.3)  # longer than the restore delay: nothing must put "previous" back
    assert xclipboard.text() == "keep me"
    assert target.text() == ""


def test_unavailable_backend_falls_back_to_the_clipboard(xvfb, target, xclipboard, output):
    result = output("wtype-type").deliver("fallback text")

    assert not result.ok and result.on_clipboard
    assert "wtype" in result.message
    assert xclipboard.text() == "fallback text"
    assert target.text() == ""


@pytest.mark.skipif(importlib.util.find_spec("pynput") is None, reason="pynput is optional")
def test_pynput_type_ascii_arrives_and_non_ascii_falls_back_to_clipboard(xvfb, target, xclipboard):
    # In a child process: pynput connects to the DISPLAY of its process's environment at import.
    script = textwrap.dedent("""
        import os
        from dictation.output import OutputOptions, choose_backend
        out = choose_backend(OutputOptions(backend="pynput-type"), os.environ)
        for text in ("hello pynput", "Grüße"):
            r = out.deliver(text)
            print(r.method, r.ok, r.on_clipboard)
    """)
    proc = subprocess.run([sys.executable, "-c", script], env=xvfb, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:2] == ["pynput-type True False", "pynput-type False True"]
    assert target.wait_for_text("hello pynput") == "hello pynput"
    assert xclipboard.text() == "Grüße"


@pytest.mark.parametrize("backend", ["xdotool-type", "xdotool-paste"])
def test_modifiers_still_held_from_the_hotkey_do_not_garble_the_text(xvfb, target, xclipboard, backend, output):
    subprocess.run(["xdotool", "keydown", "ctrl+shift"], env=xvfb, check=True)  # hotkey ctrl+shift+space, half released
    try:
        result = output(backend).deliver("held Grüße")
        assert result.ok, result.message
        assert target.wait_for_text("held Grüße") == "held Grüße"
    finally:
        subprocess.run(["xdotool", "keyup", "ctrl+shift"], env=xvfb, check=True)
    if result.restore is not None:
        result.restore.cancel()


SECRET = "Zyxquorblat Grüße 你好 naïve"  # an unusual word and characters xdotool cannot type unbound


def secrets_of(text: str) -> list[str]:
    """What must never be on a command line: the words, each non-ASCII character and its keysym name."""
    from dictation.output.x11keymap import keysym_name

    chars = sorted({ch for ch in text if not ch.isascii()})
    return [w for w in text.split() if len(w) > 3] + chars + [keysym_name(ch) for ch in chars]


@pytest.mark.parametrize("backend", ["xdotool-type", "xdotool-paste", "auto"])
def test_the_text_is_on_no_command_line(xvfb, target, xclipboard, argv_log, output, backend):
    """Command lines are public (ps, /proc/PID/cmdline): every tool gets the text on stdin."""
    log = argv_log(xvfb)
    xclipboard.set_text("before")
    out = output(backend, env=log.env, method="type" if backend == "auto" else "auto")
    result = out.deliver(SECRET)
    assert result.ok, result.message
    assert target.wait_for_text(SECRET) == SECRET
    if result.restore is not None:
        result.restore.run_now()
    out.flush()  # the keymap bindings are undone too

    tools = {argv[0].rsplit("/", 1)[-1] for argv in log.argvs()}
    assert {"xdotool", "xmodmap"} <= tools if backend != "xdotool-paste" else {"xdotool", "xclip"} <= tools
    assert log.leaks(secrets_of(SECRET)) == []
