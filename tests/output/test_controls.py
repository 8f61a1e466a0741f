"""Control characters never reach the focused window: the text options and the typing entry
(`OutputChain.deliver`) remove C0/C1 controls but newline and tab (`dictation.textclean`)."""

from __future__ import annotations

import pytest

from dictation.output import OutputOptions, TextOptions, apply_textops
from dictation.output.environment import Session
from dictation.output.paste import ClipboardKeeper, ClipboardOnlyBackend
from dictation.output.select import OutputChain
from dictation.output.typing_backend import TypingBackend
from dictation.textclean import strip_controls
from tests.output.fakes import FakeClipboard, FakeKeys

EVERY_CONTROL = "".join(chr(c) for c in [*range(0x20), 0x7F, *range(0x80, 0xA0)])


def test_every_c0_and_c1_control_but_newline_and_tab_is_removed():
    assert strip_controls(f"a{EVERY_CONTROL}b") == "a\t\nb"
    # printable text around them is untouched, whatever its script
    text = "Grüße, 你好 — ½ € \u00a0ÿ ✓"
    assert strip_controls(text) == text
    assert strip_controls("line one\r\nline two\x1a\x1b[2J") == "line one\nline two[2J"


@pytest.mark.parametrize("capitalize", [False, True])
def test_the_text_options_remove_controls_before_storing(capitalize):
    options = TextOptions(capitalize_first=capitalize, trailing_space=False)
    assert apply_textops("\x1ahello\x00 world\x9b \x1a", options) == ("Hello" if capitalize else "hello") + " world"
    assert apply_textops("a\tb\nc", options) == ("A" if capitalize else "a") + "\tb\nc"


def test_the_typing_entry_types_no_control_character():
    """A transcript that reached the output some other way (not through the engine's parser) is
    still typed without its controls: a ``\\x1a`` would suspend a terminal's foreground job."""
    options = OutputOptions()
    keeper = ClipboardKeeper(FakeClipboard(), options)
    keys = FakeKeys()
    chain = OutputChain(
        "auto", [TypingBackend("t", keys, options)], ClipboardOnlyBackend(keeper), Session("x11", display=":0"), keeper
    )
    result = chain.deliver("ls\x1a -la\x03\n\tdone\x85")
    assert result.ok
    typed = "ls -la\n\tdone"
    assert keys.sent == [f"type {typed!r} {options.type_delay_ms}"]
