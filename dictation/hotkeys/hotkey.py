"""`Hotkey`: a parsed, validated, normalised key combination ("ctrl+alt+space", "F9", "right_ctrl")."""

from __future__ import annotations

from collections.abc import Iterable

from dictation.hotkeys.errors import HotkeyParseError
from dictation.hotkeys.keys import (
    ALIASES,
    KEYS,
    MODIFIER_SIDES,
    display_name,
    modifier_class,
    normalise_token,
    physical_keys,
)

_EXAMPLES = "names like ctrl, alt, shift, super, right_ctrl, space, esc, enter, F1-F24, a-z, 0-9"


def _sort_key(name: str) -> tuple[int, int]:
    """Canonical modifier order: super, ctrl, alt, shift; generic before left before right."""
    generic = modifier_class(name)
    order = list(MODIFIER_SIDES).index(generic)
    side = 0 if name == generic else 1 + MODIFIER_SIDES[generic].index(name)
    return order, side


class Hotkey:
    """Modifiers plus one main key.

    ``key`` is any key name (a lone modifier such as "right_ctrl" makes a push-to-talk key);
    ``modifiers`` are generic ("ctrl": either side) or sided ("left_alt") modifier names.
    ``str(hotkey)`` is the canonical form, and parsing it gives the same Hotkey back. Immutable and
    hashable; a plain class rather than a dataclass because it is built before the hotkey grab at
    launch, where importing `dataclasses` alone costs about 20 ms (`dictation.launch`).
    """

    __slots__ = ("key", "modifiers")
    key: str
    modifiers: frozenset[str]

    def __init__(self, key: str, modifiers: Iterable[str] = frozenset()) -> None:
        modifiers = frozenset(modifiers)
        if key not in KEYS and key not in MODIFIER_SIDES:
            raise HotkeyParseError(f"unknown key {key!r}")
        for mod in modifiers:
            if modifier_class(mod) is None:
                raise HotkeyParseError(f"{mod!r} is not a modifier")
        if key in modifiers:
            raise HotkeyParseError(f"{display_name(key)!r} appears twice")
        overlap = _overlap([*modifiers, key])
        if overlap:
            raise HotkeyParseError(f"{overlap[0]!r} and {overlap[1]!r} overlap — use one of them")
        object.__setattr__(self, "key", key)
        object.__setattr__(self, "modifiers", modifiers)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"a Hotkey cannot be changed (tried to set {name!r})")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"a Hotkey cannot be changed (tried to delete {name!r})")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Hotkey):
            return NotImplemented
        return (self.key, self.modifiers) == (other.key, other.modifiers)

    def __hash__(self) -> int:
        return hash((self.key, self.modifiers))

    def __repr__(self) -> str:
        return f"Hotkey(key={self.key!r}, modifiers={self.modifiers!r})"

    def __reduce__(self) -> tuple:
        return Hotkey, (self.key, self.modifiers)

    @classmethod
    def parse(cls, text: str) -> Hotkey:
        """Parse a readable hotkey string; raise `HotkeyParseError` with a one-line reason."""
        return parse_hotkey(text)

    @property
    def parts(self) -> tuple[str, ...]:
        """Modifiers in canonical order, then the main key."""
        return (*sorted(self.modifiers, key=_sort_key), self.key)

    @property
    def is_modifier_only(self) -> bool:
        return modifier_class(self.key) is not None

    def physical_parts(self) -> tuple[tuple[str, ...], ...]:
        """For each part, the physical keys that satisfy it."""
        return tuple(physical_keys(p) for p in self.parts)

    def __str__(self) -> str:
        return "+".join(display_name(p) for p in self.parts)


def _overlap(names: list[str]) -> tuple[str, str] | None:
    """A generic modifier next to one of its sides ('ctrl' with 'right_ctrl') is ambiguous."""
    for generic, sides in MODIFIER_SIDES.items():
        if generic in names:
            for side in sides:
                if side in names:
                    return generic, side
    return None


def _unknown(token: str, raw: str, text: str) -> HotkeyParseError:
    import difflib  # only for the hint: not imported before the hotkey grab at launch

    close = difflib.get_close_matches(token, list(ALIASES), n=1, cutoff=0.6)
    hint = f"did you mean {display_name(ALIASES[close[0]])!r}?" if close else f"use {_EXAMPLES}"
    return HotkeyParseError(f"unknown key {raw.strip()!r} in {text.strip()!r} — {hint}")


def parse_hotkey(text: str) -> Hotkey:
    """'Ctrl + Alt + Space' -> Hotkey('space', {'ctrl', 'alt'}); 'rctrl' -> Hotkey('right_ctrl')."""
    if not isinstance(text, str):
        raise HotkeyParseError(f"a hotkey must be text, not {type(text).__name__}")
    shown = text.strip()
    if not shown:
        raise HotkeyParseError("empty hotkey — type something like 'ctrl+alt+space' or 'F9'")
    raw_tokens = shown.split("+")
    if any(not t.strip() for t in raw_tokens):
        raise HotkeyParseError(f"empty key name in {shown!r} — join keys with a single '+', like 'ctrl+alt+space'")
    names: list[str] = []
    for raw in raw_tokens:
        token = normalise_token(raw)
        if token not in ALIASES:
            raise _unknown(token, raw, text)
        name = ALIASES[token]
        if name in names:
            raise HotkeyParseError(f"{display_name(name)!r} appears twice in {shown!r}")
        names.append(name)
    mains = [n for n in names if modifier_class(n) is None]
    if len(mains) > 1:
        a, b = (display_name(n) for n in mains[:2])
        raise HotkeyParseError(f"{shown!r} has two main keys ({a!r} and {b!r}) — a hotkey is modifiers plus one key")
    # Modifier-only combos ("ctrl+shift") fire in any press order, so which modifier is the "key"
    # is a naming choice: the last in canonical order, which makes str() stable.
    key = mains[0] if mains else sorted(names, key=_sort_key)[-1]
    overlap = _overlap(names)
    if overlap:
        raise HotkeyParseError(f"{overlap[0]!r} and {overlap[1]!r} overlap in {shown!r} — use one of them")
    return Hotkey(key=key, modifiers=frozenset(n for n in names if n != key))
