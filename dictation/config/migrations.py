"""Upgrades of settings files written by older schema versions.

``MIGRATIONS[n]`` turns the JSON data of version ``n`` into version ``n + 1``; :func:`migrate` chains
them. A step works on plain data and must not fail on odd input: anything it does not recognise is
left in place, and the tolerant loader that runs afterwards resets values that are still unusable.

Version 0 is the flat layout of the early development builds, recognised by having no
``schema_version`` key::

    {"model": "...", "device": "cuda", "language": "German", "vocabulary": ["Kubernetes"],
     "hotkey": "f9", "mode": "ptt", "adapters": ["/loras/accent"], "restore_delay": 0.5}

Version 1 groups the keys (engine, transcription, recording, hotkeys, output, general), writes
languages as ISO codes, the vocabulary as one context text, adapters as objects and the clipboard
restore delay in milliseconds.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

# v0 flat key -> (v1 group, v1 key); values needing conversion are handled in _v0_to_v1.
_V0_PLACES = {
    "model": ("engine", "model"),
    "device": ("engine", "device"),
    "dtype": ("engine", "dtype"),
    "variant": ("engine", "variant"),
    "adapters": ("engine", "adapters"),
    "language": ("transcription", "language"),
    "context": ("transcription", "context"),
    "vocabulary": ("transcription", "context"),
    "input_device": ("recording", "input_device"),
    "max_seconds": ("recording", "max_seconds"),
    "sounds": ("recording", "sounds"),
    "mode": ("hotkeys", "mode"),
    "hotkey": ("hotkeys", "hotkey"),
    "cancel_key": ("hotkeys", "cancel_key"),
    "paste_chord": ("output", "paste_chord"),
    "restore_clipboard": ("output", "restore_clipboard"),
    "restore_delay": ("output", "restore_delay_ms"),
    "trailing_space": ("output", "trailing_space"),
    "history_size": ("general", "history_size"),
}
_V0_MODES = {"ptt": "push_to_talk", "push-to-talk": "push_to_talk", "push_to_talk": "push_to_talk"}


def _v0_to_v1(data: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if key not in _V0_PLACES:
            out[key] = value  # a group already in v1 shape, or a key we do not know: keep it
            continue
        group, name = _V0_PLACES[key]
        if key == "vocabulary" and isinstance(value, list):
            value = ", ".join(str(v) for v in value)
        elif key == "adapters" and isinstance(value, list):
            value = [{"path": v} if isinstance(v, str) else v for v in value]
        elif key == "restore_delay" and isinstance(value, (int, float)) and not isinstance(value, bool):
            value = round(value * 1000)  # seconds -> ms
        elif key == "mode" and isinstance(value, str):
            value = _V0_MODES.get(value.lower(), value)
        target = out.setdefault(group, {})
        if not isinstance(target, dict):
            out[key] = value  # the group key holds something odd; leave both for the loader to report
            continue
        target.setdefault(name, value)  # an explicit v1 value wins over a flat one
    # Language names become ISO codes when the settings are loaded (see settings._language).
    return out


MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {0: _v0_to_v1}


def migrate(data: dict[str, Any], from_version: int, to_version: int) -> dict[str, Any]:
    """Apply every step from ``from_version`` up to ``to_version``; returns new data."""
    data = copy.deepcopy(data)
    for version in range(from_version, to_version):
        step = MIGRATIONS[version]
        data = step(data)
        log.info("settings migrated from schema version %d to %d", version, version + 1)
    return data
