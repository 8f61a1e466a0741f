"""A transcript -> what to do: text pieces and commands (docs/architecture.md, "Voice commands").

Rules:

- A command counts only as the whole utterance or at its start or end, never inside the text: in
  "add new lines of code here" nothing happens, "Hello there. New line." types "Hello there." and a
  line break. Several may follow each other ("New paragraph, new paragraph"). Phrases of the table's
  ``alone`` part ("tab", "enter") count only as the whole utterance (with other commands at most).
- The model's own punctuation around a command is dropped: "New line." is the command alone; in
  "Hello there, new line" the comma before the command goes too (the model heard a pause there).
- "Scratch that" removes what this utterance said before it ("Hello there, scratch that" types
  nothing); at the start, or alone, it removes the previous dictation: a `SCRATCH` action, which the
  output performs only when that is safe (dictation/output/undo.py).
- Spoken punctuation (when asked): a punctuation word becomes its mark wherever it stands as a whole
  word ("periodically" stays), attached as written text wants it: no space before a closing mark,
  none after an opening one, none around a joining one; the model's own marks next to the spoken
  one are dropped ("Hello, comma, world" -> "Hello, world"), and a letter after a sentence end is
  capitalised.
"""

from __future__ import annotations

from dataclasses import dataclass

from dictation.spoken.tables import NEW_LINE, NEW_PARAGRAPH, SCRATCH, SENTENCE_END, WORD, Table

TEXT = "text"
# Marks the model writes on its own where it hears a pause: dropped next to a command or a spoken mark.
MODEL_MARKS = ",.;:!?…"
NO_BREAK_SPACE = "\u00a0"  # before a French "?", "!", ":", ";" (the table's ``spaced`` marks)


@dataclass(frozen=True)
class Action:
    """One thing an utterance asks for: ``kind`` is `TEXT` (with ``text``) or a command name
    (`dictation.spoken.tables.COMMANDS`)."""

    kind: str
    text: str = ""


def parse(transcript: str, table: Table, *, commands: bool = True, punctuation: bool = False) -> tuple[Action, ...]:
    """The actions ``transcript`` asks for, in order (see the module docstring)."""
    matches = list(WORD.finditer(transcript))
    tokens = [m.group().casefold().replace("’", "'") for m in matches]
    if not commands:
        return _text_actions((), _punctuate(transcript.strip(), table) if punctuation else transcript.strip(), ())
    every = {**table.commands, **table.alone}
    whole = _segment(tokens, every)
    if whole is not None and tokens:
        return _resolve([Action(name) for name in whole])
    start: list[str] = []
    i = 0
    while (found := _match_at(tokens, i, table.commands)) is not None:
        start.append(found[0])
        i += found[1]
    end: list[str] = []
    j = len(tokens)
    while j > i and (found := _match_before(tokens, j, table.commands, i)) is not None:
        end.insert(0, found[0])
        j -= found[1]
    begin = matches[i - 1].end() if i else 0
    stop = matches[j].start() if j < len(tokens) else len(transcript)
    text = transcript[begin:stop]
    if i:
        text = text.lstrip().lstrip(MODEL_MARKS).lstrip()
    text = text.rstrip()
    if j < len(tokens):
        text = text.rstrip(",;:").rstrip()
    if punctuation:
        text = _punctuate(text, table)
    if start and start[-1] in (NEW_LINE, NEW_PARAGRAPH):
        text = _capitalise(text)
    return _text_actions(start, text, end)


def _text_actions(start, text: str, end) -> tuple[Action, ...]:
    actions = [Action(name) for name in start]
    if text:
        actions.append(Action(TEXT, text))
    return _resolve(actions + [Action(name) for name in end])


def _resolve(actions: list[Action]) -> tuple[Action, ...]:
    """ "Scratch that" takes back what came before it in the utterance; with nothing before it, it
    stays, to take back the previous dictation."""
    out: list[Action] = []
    for action in actions:
        if action.kind == SCRATCH and out and out[-1].kind != SCRATCH:
            while out and out[-1].kind != SCRATCH:
                out.pop()
            continue
        out.append(action)
    return tuple(out)


def _match_at(tokens: list[str], i: int, phrases: dict[tuple[str, ...], str]) -> tuple[str, int] | None:
    """The longest phrase starting at token ``i``: (its name, its length)."""
    best = None
    for words, name in phrases.items():
        if tuple(tokens[i : i + len(words)]) == words and (best is None or len(words) > best[1]):
            best = (name, len(words))
    return best


def _match_before(tokens: list[str], j: int, phrases: dict[tuple[str, ...], str], floor: int):
    """The longest phrase ending just before token ``j`` and starting at ``floor`` or later."""
    best = None
    for words, name in phrases.items():
        k = j - len(words)
        if k >= floor and tuple(tokens[k:j]) == words and (best is None or len(words) > best[1]):
            best = (name, len(words))
    return best


def _segment(tokens: list[str], phrases: dict[tuple[str, ...], str]) -> list[str] | None:
    """``tokens`` as a sequence of phrases only (longest first), or None if any word is left over."""
    names: list[str] = []
    i = 0
    while i < len(tokens):
        found = _match_at(tokens, i, phrases)
        if found is None:
            return None
        names.append(found[0])
        i += found[1]
    return names


def _capitalise(text: str) -> str:
    for k, ch in enumerate(text):
        if ch.isalpha():
            return text[:k] + ch.upper() + text[k + 1 :] if ch.islower() else text
        if not ch.isspace() and ch not in "\"'“„«(¿¡":
            return text
    return text


def _punctuate(text: str, table: Table) -> str:
    """Punctuation words in ``text`` replaced by their marks (see the module docstring)."""
    if not table.punctuation:
        return text
    matches = list(WORD.finditer(text))
    tokens = [m.group().casefold().replace("’", "'") for m in matches]
    out = ""
    own = 0  # out[:own] ends with a mark we put there: never stripped as the model's
    pos = 0  # text[:pos] is dealt with
    capital = False
    i = 0
    while i < len(tokens):
        found = _match_at(tokens, i, table.punctuation)
        if found is None:
            i += 1
            continue
        mark, length = found
        chunk = text[pos : matches[i].start()]
        out += _capitalise(chunk) if capital and chunk.strip() else chunk
        if chunk.strip():
            capital = False
        style = table.style(mark)
        if style == "open":
            if out and not out[-1].isspace():
                out += " "
        else:
            kept, tail = out[:own], out[own:].rstrip()
            out = kept + (tail.rstrip(MODEL_MARKS) if style == "close" else tail)
            if style == "close" and mark in table.spaced and out:
                out = out.rstrip() + NO_BREAK_SPACE
        out += mark
        own = len(out)
        pos = matches[i + length - 1].end()
        while pos < len(text) and text[pos] in MODEL_MARKS:
            pos += 1
        if style != "close":
            while pos < len(text) and text[pos].isspace():
                pos += 1
        if mark in SENTENCE_END or (style == "open" and text[matches[i].start()].isupper()):
            capital = True  # after an opening mark: the capital the model gave the words it replaced
        i += length
    rest = text[pos:]
    if _needs_space(out, rest):
        rest = " " + rest
    out += _capitalise(rest) if capital else rest
    return out.strip()


def _needs_space(out: str, rest: str) -> bool:
    """A closing mark followed straight by a word ("comma,world" from the model) gets its space."""
    return bool(out) and out[-1] in ",.;:!?…)”" and bool(rest) and rest[0].isalnum()
