"""What each setting allows, for the settings window, the validator and the tolerant loader.

- :func:`field_info` lists every user-visible field with its label, help, choices and limits.
- :func:`validate` returns one :class:`FieldError` per bad field of a settings object.
- :func:`to_dict` / :func:`from_dict` convert to and from JSON data. ``from_dict`` never fails: each
  bad value is replaced by its default and reported as a :class:`Problem`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import typing
from dataclasses import dataclass
from typing import Any

from dictation.config.settings import Settings


@dataclass(frozen=True)
class FieldError:
    key: str  # dotted path, e.g. "output.restore_delay_ms" or "engine.adapters[0].weight"
    message: str

    def __str__(self) -> str:
        return f"{self.key}: {self.message}"


@dataclass(frozen=True)
class Problem:
    """A value the loader could not use, and what it did instead."""

    key: str
    value: Any
    reason: str
    action: str  # e.g. "using the default 1500" or "dropped"
    private: bool = False  # the value may hold the user's words: never shown (logs, notifications)

    def __str__(self) -> str:
        if self.private:
            return f"{self.key}: the value {self.reason}; {self.action}"
        shown = repr(self.value)
        if len(shown) > 80:
            shown = shown[:77] + "..."
        return f"{self.key}: {shown} {self.reason}; {self.action}"


@dataclass(frozen=True)
class FieldInfo:
    """One setting as the settings window needs it."""

    path: tuple[str, ...]  # attribute names from the root, e.g. ("output", "restore_delay_ms")
    group: str  # first element of path ("" for fields of list items)
    group_label: str
    label: str
    help: str
    kind: str  # "bool", "int", "float", "str", "choice" or "list"
    default: Any
    open_choices: bool = False  # choices are suggestions; other values matching pattern are fine
    pattern: str | None = None
    pattern_help: str = ""
    minimum: float | None = None
    maximum: float | None = None
    unit: str = ""
    max_length: int | None = None
    multiline: bool = False
    required: bool = False
    item_fields: tuple[FieldInfo, ...] = ()  # for kind == "list": the fields of one item
    item_type: type | None = None
    _choices: Any = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def key(self) -> str:
        return ".".join(self.path)

    @property
    def name(self) -> str:
        return self.path[-1]

    @property
    def choices(self) -> tuple[tuple[str, str], ...] | None:
        """(value, label) pairs, or None; resolved on first use (the language list is lazy)."""
        return _resolve_choices(self._choices)

    def get(self, settings: Any) -> Any:
        value = settings
        for name in self.path:
            value = getattr(value, name)
        return value

    def set(self, settings: Any, value: Any) -> Any:
        """A copy of ``settings`` with this field set to ``value`` (not validated)."""
        if len(self.path) == 1:
            return dataclasses.replace(settings, **{self.path[0]: value})
        head = getattr(settings, self.path[0])
        inner = dataclasses.replace(self, path=self.path[1:])
        return dataclasses.replace(settings, **{self.path[0]: inner.set(head, value)})


def _resolve_choices(choices: Any) -> tuple[tuple[str, str], ...] | None:
    if choices is None:
        return None
    return tuple(choices() if callable(choices) else choices)


def _json_key(f: dataclasses.Field) -> str:
    return f.metadata.get("key") or f.name


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _item_type(cls: type, f: dataclasses.Field) -> type | None:
    hint = _hints(cls)[f.name]
    if typing.get_origin(hint) is tuple:
        return typing.get_args(hint)[0]
    return None


def _kind(cls: type, f: dataclasses.Field) -> str:
    if _item_type(cls, f) is not None:
        return "list"
    if f.metadata.get("choices") is not None and not f.metadata.get("open_choices"):
        return "choice"
    return {bool: "bool", int: "int", float: "float", str: "str"}[_hints(cls)[f.name]]


def _leaf_fields(cls: type) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(cls) if not f.metadata.get("hidden") and not f.metadata.get("group")]


def _info(cls: type, f: dataclasses.Field, path: tuple[str, ...], group: str, group_label: str) -> FieldInfo:
    m = f.metadata
    item = _item_type(cls, f)
    items = tuple(_info(item, g, (g.name,), "", "") for g in _leaf_fields(item)) if item else ()
    return FieldInfo(
        path=path,
        group=group,
        group_label=group_label,
        label=m["label"],
        help=m["help"],
        kind=_kind(cls, f),
        default=f.default,
        open_choices=m["open_choices"],
        pattern=m["pattern"],
        pattern_help=m["pattern_help"],
        minimum=m["minimum"],
        maximum=m["maximum"],
        unit=m["unit"],
        max_length=m["max_length"],
        multiline=m["multiline"],
        required=m["required"],
        item_fields=items,
        item_type=item,
        _choices=m["choices"],
    )


def field_info(cls: type = Settings) -> tuple[FieldInfo, ...]:
    """Every user-visible field of ``cls`` (Settings by default), group by group, in order."""
    out = []
    for g in dataclasses.fields(cls):
        if g.metadata.get("group"):
            group_cls = _hints(cls)[g.name]
            for f in _leaf_fields(group_cls):
                out.append(_info(group_cls, f, (g.name, f.name), g.name, g.metadata["label"]))
    for f in _leaf_fields(cls):
        out.append(_info(cls, f, (f.name,), "", ""))
    return tuple(out)


# --- checking one value -------------------------------------------------------------------------


def _check(cls: type, f: dataclasses.Field, value: Any) -> tuple[Any, str | None]:
    """(normalized value, None) if ``value`` is allowed for field ``f`` of ``cls``, else (value, reason).

    List fields are checked item by item by the callers, not here.
    """
    m = f.metadata
    if _is_default(f, value):
        return value, None
    hint = _hints(cls)[f.name]
    if hint is bool:
        return (value, None) if isinstance(value, bool) else (value, "is not true or false")
    if hint is int:
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            return value, "is not a whole number"
    elif hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return value, "is not a number"
        value = float(value)
    elif hint is str:
        if not isinstance(value, str):
            return value, "is not text"
        if m["normalize"] is not None:
            value = m["normalize"](value)
            if _is_default(f, value):
                return value, None
    if hint in (int, float):
        lo, hi = m["minimum"], m["maximum"]
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            unit = f" {m['unit']}" if m["unit"] else ""
            return value, f"is out of range {_num(lo)}..{_num(hi)}{unit}"
        return value, None
    if m["required"] and not value.strip():
        return value, "is empty"
    if m["max_length"] is not None and len(value) > m["max_length"]:
        return value, f"is longer than {m['max_length']} characters"
    choices = _resolve_choices(m["choices"])
    allowed = [c for c, _ in choices] if choices else []
    if choices and not m["open_choices"] and value not in allowed:
        return value, f"is not one of {', '.join(allowed)}"
    if m["pattern"] and value not in allowed and not re.fullmatch(m["pattern"], value):
        return value, f"is not {m['pattern_help'] or 'of the form ' + m['pattern']}"
    return value, None


def _is_default(f: dataclasses.Field, value: Any) -> bool:
    """Defaults are allowed by construction (except an empty required one). Answering early also
    keeps the default language from importing the engine for its language list."""
    return value == f.default and type(value) is type(f.default) and not f.metadata["required"]


def _num(x: float | None) -> str:
    if x is None:
        return ""
    return str(int(x)) if float(x).is_integer() else str(x)


def validate(settings: Any) -> list[FieldError]:
    """One error per bad field (list items included); empty when everything is allowed."""
    errors: list[FieldError] = []
    _validate(settings, "", errors)
    return errors


def _validate(obj: Any, prefix: str, errors: list[FieldError]) -> None:
    cls = type(obj)
    for f in dataclasses.fields(cls):
        if f.metadata.get("hidden"):
            continue
        value = getattr(obj, f.name)
        key = f"{prefix}{f.name}"
        if f.metadata.get("group"):
            if isinstance(value, _hints(cls)[f.name]):
                _validate(value, key + ".", errors)
            else:
                errors.append(FieldError(key, f"is not {_hints(cls)[f.name].__name__}"))
        elif (item := _item_type(cls, f)) is not None:
            if not isinstance(value, (tuple, list)):
                errors.append(FieldError(key, "is not a list"))
                continue
            for i, entry in enumerate(value):
                if not isinstance(entry, item):
                    errors.append(FieldError(f"{key}[{i}]", f"is not a {item.__name__}"))
                else:
                    _validate(entry, f"{key}[{i}].", errors)
        else:
            normalized, reason = _check(cls, f, value)
            if reason is None and normalized != value:
                reason = f"should be written {normalized!r}"
            if reason is not None:
                shown = "the value" if f.metadata.get("private") else repr(value)
                errors.append(FieldError(key, f"{shown} {reason}"))


# --- JSON data ----------------------------------------------------------------------------------


def to_dict(obj: Any) -> dict[str, Any]:
    """JSON-ready data: known fields in declaration order, then the unknown keys kept from loading."""
    out: dict[str, Any] = {}
    cls = type(obj)
    for f in dataclasses.fields(cls):
        if f.metadata.get("hidden"):
            continue
        value = getattr(obj, f.name)
        if f.metadata.get("group"):
            value = to_dict(value)
        elif _item_type(cls, f) is not None:
            value = [to_dict(v) for v in value]
        out[_json_key(f)] = value
    for k, v in obj.extra.items():
        out.setdefault(k, v)
    return out


def from_dict(cls: type, data: Any, prefix: str = "", private: bool = False) -> tuple[Any, list[Problem]]:
    """Build ``cls`` from JSON data, keeping every usable value; never raises.

    Missing keys take their defaults silently (a newer field in an older file). Unusable values
    take their defaults and are reported. Unknown keys go to ``extra``. List items with an unusable
    ``required`` field are dropped (and reported); their other bad fields are reset. Problems with
    fields marked ``private`` (and with the whole file) do not carry the value into their message.
    """
    problems: list[Problem] = []
    if not isinstance(data, dict):
        whole = not prefix  # the whole file: it may hold anything, vocabulary included
        key = prefix.rstrip(".") or "settings"
        problems.append(Problem(key, data, "is not an object", "using the defaults", private or whole))
        return cls(), problems
    values: dict[str, Any] = {}
    known = set()
    for f in dataclasses.fields(cls):
        if f.metadata.get("hidden"):
            continue
        jkey = _json_key(f)
        known.add(jkey)
        if jkey not in data:
            continue
        raw = data[jkey]
        key = f"{prefix}{jkey}"
        hidden = private or bool(f.metadata.get("private"))
        if f.metadata.get("group"):
            values[f.name], sub = from_dict(_hints(cls)[f.name], raw, key + ".", hidden)
            problems += sub
        elif (item := _item_type(cls, f)) is not None:
            values[f.name] = _items(item, raw, key, problems, hidden)
        else:
            value, reason = _check(cls, f, raw)
            if reason is None:
                values[f.name] = value
            else:
                problems.append(Problem(key, raw, reason, f"using the default {f.default!r}", hidden))
    extra = {k: v for k, v in data.items() if k not in known}
    return cls(**values, extra=extra), problems


def _items(item: type, raw: Any, key: str, problems: list[Problem], private: bool = False) -> tuple:
    if not isinstance(raw, list):
        problems.append(Problem(key, raw, "is not a list", "using the default ()", private))
        return ()
    out = []
    for i, entry in enumerate(raw):
        obj, sub = from_dict(item, entry, f"{key}[{i}].", private)
        required = [f for f in _leaf_fields(item) if f.metadata["required"]]
        missing = [f for f in required if _check(item, f, getattr(obj, f.name))[1] is not None]
        if not isinstance(entry, dict) or missing:
            what = "is not an object" if not isinstance(entry, dict) else f"has no usable {_json_key(missing[0])!r}"
            problems.append(Problem(f"{key}[{i}]", entry, what, "dropped", private))
            continue
        problems += sub
        out.append(obj)
    return tuple(out)
