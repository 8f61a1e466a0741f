"""Clipboard paste, restore and chain fallback rules, with an in-memory clipboard and fake keys."""

from __future__ import annotations

import time

from dictation.output import Chord, InjectionError, OutputOptions, Selection
from dictation.output.environment import Session
from dictation.output.paste import ClipboardKeeper, ClipboardOnlyBackend, ClipboardPasteBackend
from dictation.output.select import OutputChain
from dictation.output.typing_backend import TypingBackend
from tests.output.fakes import FakeClipboard, FakeHost, FakeKeys

SESSION = Session("x11", display=":0")
XPROP = 'WM_CLASS(STRING) = "gedit", "Gedit"\n'


def focused_gedit(argv, _input):
    from dictation.output.process import ProcResult

    if argv[:2] == ("xdotool", "getwindowfocus"):
        return ProcResult(argv, 0, stdout=b"4242\n")
    if argv[0] == "xprop":
        return ProcResult(argv, 0, stdout=XPROP.encode())
    return None


def make(clipboard=None, keys=None, *, typing_keys=None, **options):
    options = OutputOptions(**{"restore_delay_ms": 60_000, **options})
    clipboard = clipboard or FakeClipboard("user text")
    keeper = ClipboardKeeper(clipboard, options)
    host = FakeHost({"xdotool", "xprop"}, responder=focused_gedit)
    paste = ClipboardPasteBackend("fake-paste", keeper, keys or FakeKeys(), SESSION, host, options)
    backends = [paste]
    if typing_keys is not None:
        backends.append(TypingBackend("fake-type", typing_keys, options))
    chain = OutputChain("auto", backends, ClipboardOnlyBackend(keeper), SESSION, keeper)
    return chain, clipboard


def test_paste_sets_verifies_sends_and_restores_later():
    keys = FakeKeys()
    chain, clip = make(keys=keys)

    result = chain.deliver("dictated")

    assert (result.ok, result.method, result.chord, result.window_class) == (True, "fake-paste", Chord.CTRL_V, "Gedit")
    assert keys.sent == ["ctrl+v"]
    assert clip.ops == ["snapshot clipboard", "write clipboard 'dictated'"]
    assert clip.text() == "dictated" and result.restore.pending
    outcome = result.restore.run_now()
    assert outcome.restored and clip.text() == "user text"
    assert outcome.message == "clipboard: restored text (9 characters)"


def test_restore_runs_on_its_own_after_the_delay_without_blocking_deliver():
    chain, clip = make(restore_delay_ms=150)
    started = time.monotonic()
    result = chain.deliver("dictated")
    assert time.monotonic() - started < 0.15  # deliver did not wait for the restore
    assert clip.text() == "dictated"
    outcome = result.restore.wait(5)
    assert outcome.restored and time.monotonic() - started >= 0.15
    assert clip.text() == "user text"


def test_restore_skipped_when_the_user_copied_something_else():
    chain, clip = make()
    result = chain.deliver("dictated")
    clip.set("copied by the user")
    outcome = result.restore.run_now()
    assert not outcome.restored and "changed since the paste" in outcome.message
    assert clip.text() == "copied by the user"


def test_restore_disabled_leaves_the_text_and_takes_no_snapshot():
    chain, clip = make(restore_clipboard=False)
    result = chain.deliver("dictated")
    assert result.ok and result.restore is None and result.on_clipboard
    assert clip.ops == ["write clipboard 'dictated'"]


def test_second_dictation_carries_over_the_users_snapshot():
    chain, clip = make()
    first = chain.deliver("one")
    second = chain.deliver("two")
    assert first.restore.outcome.message == "cancelled"
    assert second.restore.run_now().restored
    assert clip.text() == "user text"


def test_flush_on_quit():
    chain, clip = make()
    chain.deliver("dictated")
    assert chain.flush().restored
    assert clip.text() == "user text"
    assert chain.flush() is None


def test_clipboard_that_does_not_take_the_text_means_no_chord():
    keys = FakeKeys()
    chain, clip = make(FakeClipboard("old", sticky_text="old"), keys)
    chain.keeper.verify_timeout_s = 0.1
    result = chain.deliver("dictated")
    assert not result.ok and keys.sent == []
    assert "did not take the text" in result.message
    assert not result.on_clipboard and "only in history" in result.message


def test_failed_chord_keeps_text_on_clipboard_and_does_not_fall_back_to_the_clipboard_step():
    keys = FakeKeys(error=InjectionError("xdotool exited with 1"))
    chain, clip = make(keys=keys)
    result = chain.deliver("dictated")
    assert (result.ok, result.on_clipboard, result.input_sent) == (False, True, False)
    expected = "not delivered: fake-paste: xdotool exited with 1; the text is on the clipboard, paste it yourself"
    assert result.message == expected
    assert clip.text() == "dictated"
    assert clip.ops.count("write clipboard 'dictated'") == 1


def test_chain_falls_back_to_typing_when_nothing_was_sent():
    typing = FakeKeys("typer")
    chain, _ = make(keys=FakeKeys(error=InjectionError("chord failed")), typing_keys=typing)
    result = chain.deliver("dictated")
    assert (result.ok, result.method) == (True, "fake-type")
    assert typing.sent == ["type 'dictated' None"]


def test_chain_does_not_retry_when_input_may_have_been_sent():
    typing = FakeKeys("typer")
    keys = FakeKeys(error=InjectionError("xdotool: timed out after 5.0 s", input_sent=True))
    chain, _ = make(keys=keys, typing_keys=typing)
    result = chain.deliver("dictated")
    assert not result.ok and result.input_sent
    assert typing.sent == []  # the text must not arrive twice


def test_unsaveable_clipboard_is_not_overwritten_and_typing_takes_over():
    keys, typing = FakeKeys(), FakeKeys("typer")
    chain, clip = make(FakeClipboard("x", snapshot_kind="unsaved"), keys, typing_keys=typing)
    result = chain.deliver("Grüße")
    assert (result.ok, result.method) == (True, "fake-type")
    assert keys.sent == [] and not any(op.startswith("write") for op in clip.ops)
    assert typing.sent == ["type 'Grüße' None"]


def test_typing_without_unicode_support_refuses_non_ascii_and_the_clipboard_keeps_the_text():
    typing = FakeKeys("ascii-only", unicode_typing=False)
    options = OutputOptions()
    keeper = ClipboardKeeper(FakeClipboard("user"), options)
    chain = OutputChain("auto", [TypingBackend("t", typing, options)], ClipboardOnlyBackend(keeper), SESSION, keeper)
    result = chain.deliver("你好")
    assert typing.sent == []
    assert (result.ok, result.on_clipboard) == (False, True)
    assert "cannot type non-ASCII" in result.message
    assert keeper.clipboard.text() == "你好"


def test_everything_unavailable_reports_each_reason():
    options = OutputOptions()
    keeper = ClipboardKeeper(FakeClipboard(), options)
    keys = FakeKeys(ok=False)
    chain = OutputChain("auto", [TypingBackend("t", keys, options)], ClipboardOnlyBackend(keeper), SESSION, keeper)
    result = chain.deliver("hello")
    assert not result.ok and result.on_clipboard
    assert result.message.startswith("not delivered: t: fake keys missing; the text is on the clipboard")


def test_empty_text_sends_nothing():
    keys = FakeKeys()
    chain, clip = make(keys=keys)
    assert chain.deliver("").ok
    assert keys.sent == [] and clip.ops == []


def test_shift_insert_sets_and_restores_primary_too():
    keys = FakeKeys()
    clip = FakeClipboard("user clip")
    clip.set("user primary", Selection.PRIMARY)
    chain, _ = make(clip, keys, paste_chord="shift+insert")
    result = chain.deliver("dictated")
    assert keys.sent == ["shift+insert"]
    assert (clip.text(), clip.text(Selection.PRIMARY)) == ("dictated", "dictated")
    assert result.restore.run_now().restored
    assert (clip.text(), clip.text(Selection.PRIMARY)) == ("user clip", "user primary")


def test_empty_previous_clipboard_is_restored_as_empty():
    chain, clip = make(FakeClipboard())
    result = chain.deliver("secret")
    assert result.restore.run_now().restored
    assert clip.ops[-1] == "restore clipboard empty" and clip.text() is None
