"""Word tables: which spoken words are commands and punctuation, per language, plus the user's own.

The tables are package data, one JSON file per language in ``dictation/resources/spoken/``::

    {"language": "English", "code": "en",
     "commands": {"new_line": ["new line", ...], "scratch": ["scratch that", ...], ...},
     "alone": {"enter": ["enter"], "tab": ["tab"]},
     "punctuation": {",": ["comma"], "(": ["open parenthesis"], ...},
     "opening": ["("], "spaced": []}

``commands`` phrases count at the start or end of an utterance (or as all of it); ``alone`` phrases
only as all of it ("tab" alone presses Tab, "open a new tab" stays text). ``punctuation`` maps a mark
to the words for it; ``opening`` names the marks that open (a space before, none after: "(", "„");
"-" and "/" join words (no space either side); every other mark closes (no space before), except
those ``spaced`` names, which take a no-break space before them (French "?", "!", ":", ";").

Command names: `COMMANDS`. A phrase is matched word by word, ignoring case and the punctuation the
model put between the words ("New line." is "new line").
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources

NEW_LINE, NEW_PARAGRAPH, ENTER, TAB, SCRATCH = "new_line", "new_paragraph", "enter", "tab", "scratch"
COMMANDS = (NEW_LINE, NEW_PARAGRAPH, ENTER, TAB, SCRATCH)
# What a user may write for a command in their own phrases (Settings: "It means").
COMMAND_WORDS = {
    "new line": NEW_LINE,
    "new paragraph": NEW_PARAGRAPH,
    "press enter": ENTER,
    "enter": ENTER,
    "tab": TAB,
    "press tab": TAB,
    "scratch that": SCRATCH,
    "undo that": SCRATCH,
}
JOINING = frozenset("-/")
SENTENCE_END = frozenset(".?!…")

# A word: letters, digits and marks, with inner apostrophes or hyphens ("d'interrogation", "point-virgule").
WORD = re.compile(r"[^\W_]+(?:['’\-][^\W_]+)*")


class TableError(ValueError):
    """A word table file cannot be used (names the file and the problem)."""


def words(phrase: str) -> tuple[str, ...]:
    """A phrase as the words it is matched by: case folded, apostrophes unified."""
    return tuple(m.group().casefold().replace("’", "'") for m in WORD.finditer(phrase))


@dataclass(frozen=True)
class Table:
    """What one language (or the merge of several) says: word tuples -> command or mark."""

    commands: dict[tuple[str, ...], str] = field(default_factory=dict)  # at the edges, or alone
    alone: dict[tuple[str, ...], str] = field(default_factory=dict)  # only as the whole utterance
    punctuation: dict[tuple[str, ...], str] = field(default_factory=dict)  # words -> mark
    opening: frozenset[str] = frozenset()
    spaced: frozenset[str] = frozenset()  # closing marks with a no-break space before them

    def merged(self, other: Table) -> Table:
        """This table with ``other``'s entries added (``other`` wins where both name a phrase)."""
        return Table(
            {**self.commands, **other.commands},
            {**self.alone, **other.alone},
            {**self.punctuation, **other.punctuation},
            self.opening | other.opening,
            self.spaced | other.spaced,
        )

    def style(self, mark: str) -> str:
        """ "open", "join" or "close": how ``mark`` attaches to the words around it."""
        if mark in self.opening:
            return "open"
        return "join" if mark in JOINING else "close"


def _phrases(data: object, where: str, known: tuple[str, ...] | None) -> dict[tuple[str, ...], str]:
    if not isinstance(data, dict):
        raise TableError(f"{where}: expected an object of lists of phrases")
    out: dict[tuple[str, ...], str] = {}
    for name, phrases in data.items():
        if known is not None and name not in known:
            raise TableError(f"{where}: unknown command {name!r} (known: {', '.join(known)})")
        if not isinstance(phrases, list) or not all(isinstance(p, str) and words(p) for p in phrases):
            raise TableError(f"{where}.{name}: expected a list of phrases with words in them")
        for phrase in phrases:
            out[words(phrase)] = name
    return out


def parse_table(data: object, source: str) -> tuple[str, str, Table]:
    """(language name, code, Table) from one file's JSON data; TableError names ``source``."""
    if not isinstance(data, dict) or not isinstance(data.get("language"), str) or not isinstance(data.get("code"), str):
        raise TableError(f"{source}: expected an object with 'language' and 'code'")
    opening, spaced = data.get("opening", []), data.get("spaced", [])
    for key, marks in (("opening", opening), ("spaced", spaced)):
        if not isinstance(marks, list) or not all(isinstance(m, str) and m for m in marks):
            raise TableError(f"{source}: {key!r} must be a list of marks")
    table = Table(
        _phrases(data.get("commands", {}), f"{source}: commands", COMMANDS),
        _phrases(data.get("alone", {}), f"{source}: alone", COMMANDS),
        _phrases(data.get("punctuation", {}), f"{source}: punctuation", None),
        frozenset(opening),
        frozenset(spaced),
    )
    return data["language"], data["code"], table


@lru_cache(maxsize=1)
def builtin_tables() -> dict[str, Table]:
    """Every packaged table by lower-case language name and by code ("german" and "de")."""
    out: dict[str, Table] = {}
    folder = resources.files("dictation.resources") / "spoken"
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".json"):
            continue
        source = f"dictation/resources/spoken/{entry.name}"
        try:
            data = json.loads(entry.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise TableError(f"{source}: {exc}") from exc
        name, code, table = parse_table(data, source)
        out[name.casefold()] = out[code.casefold()] = table
    return out


def user_table(phrases: object) -> Table:
    """The user's own phrases (settings ``commands.phrases``: items with ``said`` and ``means``).

    ``means`` is a command in words (`COMMAND_WORDS`: "new line", "press enter", "scratch that", ...)
    or else a punctuation mark. Phrases without words are skipped."""
    commands: dict[tuple[str, ...], str] = {}
    punctuation: dict[tuple[str, ...], str] = {}
    for item in phrases or ():
        said, means = words(getattr(item, "said", "")), getattr(item, "means", "").strip()
        if not said or not means:
            continue
        command = COMMAND_WORDS.get(" ".join(means.casefold().split()))
        if command is not None:
            commands[said] = command
        else:
            punctuation[said] = means
    return Table(commands=commands, punctuation=punctuation)


def table_for(language: str | None, user: Table | None = None) -> Table:
    """The table an utterance in ``language`` (a name or code; None: unknown) is read with.

    Commands: those of every packaged language (a short command is the utterance most often detected
    as the wrong language, and a command phrase only counts at the edges); spoken punctuation: the
    utterance's own language only, as punctuation words are ordinary words inside a sentence. The
    user's phrases count in every language."""
    tables = builtin_tables()
    merged = Table()
    for table in {id(t): t for t in tables.values()}.values():  # each file once (it is under two keys)
        merged = merged.merged(Table(table.commands, table.alone))
    own = tables.get((language or "").strip().casefold())
    if own is not None:
        merged = merged.merged(Table(punctuation=own.punctuation, opening=own.opening, spaced=own.spaced))
    return merged.merged(user) if user is not None else merged
