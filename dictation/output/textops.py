"""Post-processing of a transcript before it is stored and delivered.

`apply(text, options)` runs these steps, in this order:

1. Remove control characters other than newline and tab (`dictation.textclean`: the engine's
   output has none, but any text stored and typed passes here), then leading and trailing
   whitespace (the model's output often starts with a space).
2. Replacements, in list order; each sees the output of the ones before it, so "a" -> "b" then
   "b" -> "c" turns "a" into "c". Literal text (no regular expressions), case-sensitive unless a
   rule says otherwise; `whole_word` matches only where the neighbours are not letters, digits or
   "_" (Unicode-aware: "Grüße" is one word). The replacement is inserted as written.
3. Capitalise the first letter (the first character that is a letter; '"hello' -> '"Hello').
   After the replacements, so a rule that produces the opening word is capitalised too.
4. Trailing space: append one space unless the text is empty or already ends in whitespace. Last,
   so no replacement can remove it; an empty transcript stays empty (no lone space is typed).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dictation.textclean import strip_controls

if TYPE_CHECKING:
    from dictation.config.settings import OutputSettings


@dataclass(frozen=True)
class Replacement:
    find: str
    replace: str
    case_sensitive: bool = True
    whole_word: bool = False

    def __post_init__(self):
        if not self.find:
            raise ValueError("a replacement needs a non-empty text to find")

    def pattern(self) -> re.Pattern[str]:
        body = re.escape(self.find)
        if self.whole_word:
            body = rf"(?<!\w){body}(?!\w)"
        return re.compile(body, 0 if self.case_sensitive else re.IGNORECASE)

    def apply(self, text: str) -> str:
        return self.pattern().sub(lambda _m: self.replace, text)


@dataclass(frozen=True)
class TextOptions:
    replacements: tuple[Replacement, ...] = ()
    capitalize_first: bool = False
    trailing_space: bool = False

    def __post_init__(self):
        object.__setattr__(self, "replacements", tuple(self.replacements))

    @classmethod
    def from_settings(cls, output: OutputSettings) -> TextOptions:
        """The text part of the app's output settings (`dictation.config.settings.OutputSettings`).

        A settings rule (``from_`` -> ``to``) becomes a literal, case-sensitive replacement, as its
        help text promises; rules with an empty ``from_`` are skipped (they would match everywhere).
        """
        return cls(
            replacements=tuple(Replacement(rule.from_, rule.to) for rule in output.replacements if rule.from_),
            capitalize_first=output.capitalize_first,
            trailing_space=output.trailing_space,
        )


def capitalize_first_letter(text: str) -> str:
    for i, ch in enumerate(text):
        if ch.isalpha():
            # title(), not upper(): "ǆ" -> "ǅ"; characters without a case stay as they are.
            return text[:i] + ch.title() + text[i + 1 :]
    return text


def apply(text: str, options: TextOptions) -> str:
    text = strip_controls(text).strip()
    for rule in options.replacements:
        text = rule.apply(text)
    if options.capitalize_first:
        text = capitalize_first_letter(text)
    if options.trailing_space and text and not text[-1].isspace():
        text += " "
    return text
