"""What the settings mean for each part the controller drives (Qt-free): the session's rules, the
engine's options, the output chain's, and the messages that follow from a setting.

`dictation.app.controller` applies them; they are kept apart so that they read (and test) without Qt.
"""

from __future__ import annotations

from typing import Any

from dictation import session as S
from dictation.config import Settings


def session_settings(settings: Settings) -> S.SessionSettings:
    return S.SessionSettings(mode=S.Mode(settings.hotkeys.mode), max_recording_s=float(settings.recording.max_seconds))


def engine_options(settings: Settings, device: str | None = None) -> Any:
    from dictation.asr.engine import EngineOptions

    e = settings.engine
    adapters = tuple(adapter_spec(a) for a in e.adapters if a.enabled)
    return EngineOptions(
        model=e.model,
        device=device or e.device,
        dtype=e.dtype,
        variant=None if e.variant == "auto" else e.variant,
        adapters=adapters,
        skip_bad_adapters=True,  # a bad adapter is switched off (ModelLifecycle.adapters_skipped); the model loads
    )


def engine_key(settings: Settings) -> tuple:
    """What a model load depends on: a change here reloads the model."""
    e = settings.engine
    return (e.model, e.device, e.dtype, e.variant, e.adapters)


def adapter_spec(adapter: Any) -> str:
    """The engine's ``DIR[:weight]`` for a settings Adapter."""
    return adapter.path if adapter.weight == 1.0 else f"{adapter.path}:{adapter.weight:g}"


def parse_path(spec: str) -> str:
    """The folder of an engine adapter spec (``DIR`` or ``DIR:weight``)."""
    from dictation.asr.tune.adapter_files import parse_adapter_spec

    return parse_adapter_spec(spec)[0]


def without_adapters(settings: Settings, skipped: list[tuple[str, str]]) -> Settings:
    """``settings`` with the adapters the engine left out of a load (spec, why) switched off."""
    reasons = dict(skipped)
    adapters = tuple(
        a.replace(enabled=False) if a.enabled and adapter_spec(a) in reasons else a for a in settings.engine.adapters
    )
    return settings.replace(engine=settings.engine.replace(adapters=adapters))


def adapters_skipped_message(skipped: list[tuple[str, str]], saved: bool) -> str:
    """What the user is told when adapters were switched off (``saved``: the settings say so now)."""
    reasons_text = "; ".join(
        reason if reason.startswith(parse_path(spec)) else f"{spec}: {reason}" for spec, reason in skipped
    )
    what = "A LoRA adapter was" if len(skipped) == 1 else f"{len(skipped)} LoRA adapters were"
    them = "it" if len(skipped) == 1 else "them"
    return f"{what} switched off and the model loaded without {them}: {reasons_text}. " + (
        f"Switch {them} on again in Settings → Model once fixed."
        if saved
        else f"The settings could not be saved, so the next start tries {them} again."
    )


def output_options(settings: Settings) -> Any:
    from dictation.output import OutputOptions

    return OutputOptions.from_settings(settings.output)


def late_start_message(gap: float, keep_open: bool) -> str:
    """What the user is told about a take that began ``gap`` seconds after its press."""
    why = (
        "the microphone was not recording yet"
        if keep_open
        else "the microphone opens at each press; Settings → Recording → Keep the microphone open avoids that"
    )
    return f"The recording began {gap * 1000:.0f} ms after the press ({why}): words spoken in that moment are missing."
