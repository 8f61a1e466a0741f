"""Control characters out of a transcript: what a model emits is text, never terminal commands.

A transcript is typed into whatever window has the focus; a C0 or C1 control character in it (a
``\\x1a`` or ``\\x03`` in a terminal, an ESC starting an escape sequence) would act there instead
of being text. `strip_controls` drops every Unicode control character (C0 ``U+0000-U+001F``,
DEL ``U+007F`` and C1 ``U+0080-U+009F``) except newline and tab. It runs where a transcript's text
is made (`dictation.asr.text.parse.parse_output`, so the CLI, the history and typing all get the
clean text), in the text options (`dictation.output.textops.apply`) and where text is typed
(`dictation.output.select.OutputChain.deliver`).
"""

from __future__ import annotations

import re

_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def strip_controls(text: str) -> str:
    """``text`` without control characters other than ``\\n`` and ``\\t``."""
    return _CONTROLS.sub("", text)
