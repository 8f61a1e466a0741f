"""Delivery into a real Wayland window: headless sway (wlroots), wtype, wl-clipboard, a Qt client."""

from __future__ import annotations

import pytest

from dictation.output import Chord, OutputOptions, choose_backend

FANCY = "Grüße 你好, naïve café €—“ok”"
PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4


def test_wtype_types_unicode_without_losing_the_first_key(sway, wl_target, wl_clipboard, output):
    wl_clipboard.set_text("untouched")
    result = output("wtype-type", env=sway).deliver("Grüße 你好")

    assert (result.method, result.ok) == ("wtype-type", True), result.message
    assert wl_target.wait_for_text("Grüße 你好") == "Grüße 你好"  # sway + Qt lost the "G" without a settle wait
    assert wl_clipboard.text() == "untouched"


def test_auto_chain_on_sway_pastes_with_wtype_and_restores_the_clipboard(sway, wl_target, wl_clipboard):
    chain = choose_backend(OutputOptions(restore_delay_ms=1000), sway)
    assert "1. wtype-paste: available, clipboard via wl-clipboard, keys via wtype on sway" in chain.describe()
    wl_clipboard.set_text("previous ✓")

    result = chain.deliver(FANCY)

    assert (result.method, result.ok, result.chord) == ("wtype-paste", True, Chord.CTRL_V), result.message
    assert result.window_class == "dictation-output-target"  # the Qt client's app_id, from swaymsg
    assert wl_target.wait_for_text(FANCY) == FANCY
    outcome = result.restore.wait(15)
    assert outcome is not None and outcome.restored, outcome
    assert wl_clipboard.text() == "previous ✓"


def test_wayland_paste_restores_an_image_and_respects_a_newer_copy(sway, wl_target, wl_clipboard, output):
    out = output("wtype-paste", env=sway)
    wl_clipboard.set_data(PNG, "image/png")
    first = out.deliver("one ")
    assert wl_target.wait_for_text("one ") == "one "
    assert first.restore.run_now().restored
    assert wl_clipboard.get("image/png") == PNG

    second = out.deliver("two")
    assert wl_target.wait_for_text("one two") == "one two"
    wl_clipboard.set_text("copied meanwhile")
    outcome = second.restore.run_now()
    assert not outcome.restored and wl_clipboard.text() == "copied meanwhile"


SECRET = "Zyxquorblat Grüße 你好 naïve"


@pytest.mark.parametrize("backend", ["wtype-type", "wtype-paste"])
def test_the_text_is_on_no_command_line(sway, wl_target, wl_clipboard, argv_log, output, backend):
    """Command lines are public (ps, /proc/PID/cmdline): wtype and wl-copy get the text on stdin."""
    log = argv_log(sway)
    wl_clipboard.set_text("before")
    result = output(backend, env=log.env).deliver(SECRET)
    assert result.ok, result.message
    assert wl_target.wait_for_text(SECRET) == SECRET
    if result.restore is not None:
        result.restore.run_now()

    tools = {argv[0].rsplit("/", 1)[-1] for argv in log.argvs()}
    assert "wtype" in tools and (backend == "wtype-type" or "wl-copy" in tools)
    secrets = [w for w in SECRET.split() if len(w) > 3] + [ch for ch in SECRET if not ch.isascii()]
    assert log.leaks(secrets) == []
