"""What a dictation asks the output to do, in order: text, key presses, taking back the previous one.

A dictation with voice commands (`dictation.spoken`) is a `Plan`: its steps are text (a ``str``;
"new line" and "new paragraph" are line breaks inside it), `Keys` ("press enter", "tab") and `Undo`
("scratch that": Backspace once per character of the previous dictation, when that is safe:
`undo.UndoLog`). `OutputChain.perform` runs them; a plan of text alone goes the usual way
(`OutputChain.deliver`). `plan_for` turns parsed actions into a plan with the text options applied
to the text: replacements to each piece, the capital to the first, the trailing space only when the
dictation ends in text (not after a line break or a key).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from dictation.output.textops import TextOptions, apply


@dataclass(frozen=True)
class Keys:
    """A key pressed ``count`` times: "enter", "tab" or "backspace" (`keys.KEYS`)."""

    key: str
    count: int = 1


@dataclass(frozen=True)
class Undo:
    """Remove what the previous dictation typed, if it is safe (`undo.UndoLog.check`)."""


Step = str | Keys | Undo
# How a key shows in the text kept in the history ("as typed"): what it puts into a text field.
KEY_TEXT = {"enter": "\n", "tab": "\t"}


@dataclass(frozen=True)
class Plan:
    steps: tuple[Step, ...] = ()
    taken_back: bool = False  # "..., scratch that": the dictation took itself back, nothing is typed

    @property
    def plain(self) -> bool:
        """Only text: delivered as one text, as without voice commands."""
        return all(isinstance(step, str) for step in self.steps)

    @property
    def text(self) -> str:
        """The text as typed (for the history): the text steps, and Enter and Tab as what they type."""
        typed = (
            s if isinstance(s, str) else KEY_TEXT.get(s.key, "") * s.count
            for s in self.steps
            if not isinstance(s, Undo)
        )
        return "".join(typed)

    @property
    def undoes(self) -> bool:
        return any(isinstance(step, Undo) for step in self.steps)


_COMMAND_STEPS: dict[str, Step] = {"enter": Keys("enter"), "tab": Keys("tab"), "scratch": Undo()}
_BREAKS = {"new_line": "\n", "new_paragraph": "\n\n"}


def plan_for(actions: Iterable[Any], options: TextOptions) -> Plan:
    """The plan for parsed actions (`dictation.spoken.Action`: ``kind`` "text" or a command name); no
    actions at all is a dictation that took itself back (`Plan.taken_back`)."""
    actions = list(actions)
    steps: list[Step] = []
    text = ""
    first = True
    for action in actions:
        if action.kind == "text":
            capital = options.capitalize_first and first
            piece = dataclasses.replace(options, capitalize_first=capital, trailing_space=False)
            text += apply(action.text, piece)
            first = False
        elif action.kind in _BREAKS:
            text += _BREAKS[action.kind]
        else:
            if text:
                steps.append(text)
                text = ""
            steps.append(_COMMAND_STEPS[action.kind])
    ends_in_text = bool(actions) and actions[-1].kind == "text"
    if options.trailing_space and ends_in_text and text and not text[-1].isspace():
        text += " "
    if text:
        steps.append(text)
    return Plan(tuple(steps), taken_back=not actions)
