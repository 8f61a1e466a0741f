"""The app's settings as typed, frozen data (docs/architecture.md, principle 6).

Every field carries its label, help text and limits in ``field(metadata=...)`` so the settings
window can be generated from the classes (see :func:`dictation.config.schema.field_info`), and so
loading and validation share one definition of what is allowed.

Change a value by building a new object: ``s.replace(output=s.output.replace(trailing_space=False))``
(``dataclasses.replace`` works too). Lists are tuples, so a settings object never changes under
the code holding it.

Every group carries an ``extra`` mapping: keys found in the file that this version does not know
(written by a newer version, or by hand). They are kept and written back unchanged.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

from dictation.asr.limits import MAX_CONTEXT_CHARS

# Bump when a key is renamed, moved or changes meaning, and add a step to migrations.MIGRATIONS.
# Adding a field with a default needs no bump: a missing key loads as its default.
SCHEMA_VERSION = 1


def setting(
    default: Any,
    *,
    label: str,
    help: str,
    choices: tuple[tuple[str, str], ...] | Any | None = None,
    open_choices: bool = False,
    pattern: str | None = None,
    pattern_help: str = "",
    minimum: float | None = None,
    maximum: float | None = None,
    unit: str = "",
    max_length: int | None = None,
    multiline: bool = False,
    required: bool = False,
    normalize: Any = None,
    key: str | None = None,
    private: bool = False,
) -> Any:
    """A settings field: its default plus what the UI and the validator need to know.

    ``choices``: ``(value, label)`` pairs, or a zero-argument callable returning them (resolved only
    when needed). ``open_choices``: the choices are suggestions; other values matching ``pattern``
    are allowed too. ``pattern_help``: ``pattern`` in words, for error messages. ``required``: must
    not be empty (list items without it are dropped on load). ``normalize``: applied to a loaded
    string before checking (e.g. lower-casing). ``key``: the JSON key when it differs from the
    attribute name. ``private``: the value is the user's own words (vocabulary, replacements); it
    never appears in a log line or a load/validation message, only its key does.
    """
    meta = {
        "label": label,
        "help": help,
        "choices": choices,
        "open_choices": open_choices,
        "pattern": pattern,
        "pattern_help": pattern_help,
        "minimum": minimum,
        "maximum": maximum,
        "unit": unit,
        "max_length": max_length,
        "multiline": multiline,
        "required": required,
        "normalize": normalize,
        "key": key,
        "private": private,
    }
    return field(default=default, metadata=meta)


def group(cls: type, *, label: str, help: str) -> Any:
    return field(default_factory=cls, metadata={"label": label, "help": help, "group": True})


def _lower(value: str) -> str:
    return value.strip().lower()


def _keys(value: str) -> str:
    """Key chords are written lower-case without spaces: "Ctrl + Alt + Space" -> "ctrl+alt+space"."""
    return "".join(value.split()).lower()


def language_choices() -> tuple[tuple[str, str], ...]:
    """("auto", ...) then (ISO code, name) of every language the engine can be forced to.

    Imported lazily: ``dictation.asr``'s package ``__init__`` imports the engine and with it torch,
    which settings must not pay for at import time.
    """
    from dictation.asr.text.prompt import LANGUAGES

    return (("auto", "Detect automatically"),) + tuple((code, name) for name, code in LANGUAGES)


def _language(value: str) -> str:
    """Accept a code or a name in any case ("German", "DE") and store the code ("de")."""
    key = value.strip().lower()
    if key in ("", "auto"):
        return "auto"
    for code, name in language_choices():
        if key in (code, name.lower()):
            return code
    return value


@dataclass(frozen=True)
class _Group:
    extra: dict[str, Any] = field(default_factory=dict, kw_only=True, repr=False, hash=False, metadata={"hidden": True})

    def replace(self, **changes: Any) -> Any:
        """A copy with ``changes`` applied (``dataclasses.replace``)."""
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class Adapter(_Group):
    path: str = setting(
        "",
        label="Adapter folder",
        help="A LoRA adapter folder (adapter_config.json and adapter_model.safetensors) trained on the "
        "chosen base model.",
        required=True,
    )
    weight: float = setting(
        1.0,
        label="Weight",
        help="How strongly the adapter changes the model: 1 is as trained, 0 is no effect.",
        minimum=0.0,
        maximum=2.0,
    )
    enabled: bool = setting(True, label="Enabled", help="Off keeps the adapter in the list without applying it.")


@dataclass(frozen=True)
class RecentModel(_Group):
    path: str = setting(
        "",
        label="Model folder or file",
        help="A model folder or .gguf file chosen before.",
        required=True,
    )


RECENT_MODELS_KEPT = 8


@dataclass(frozen=True)
class Replacement(_Group):
    from_: str = setting(
        "",
        key="from",
        label="Replace",
        help="Text to look for in each transcript (case-sensitive, exact).",
        required=True,
        private=True,
    )
    to: str = setting("", label="With", help="Text to put in its place; empty removes it.", private=True)


@dataclass(frozen=True)
class EngineSettings(_Group):
    model: str = setting(
        "",
        label="Model",
        help="A Qwen3-ASR model folder, or a Hugging Face repo id such as Qwen/Qwen3-ASR-0.6B (faster) or "
        "Qwen/Qwen3-ASR-1.7B (more accurate). Empty: not chosen yet.",
    )
    device: str = setting(
        "auto",
        label="Device",
        help="Where the model runs. Auto picks a CUDA GPU, else Apple MPS, else the CPU. cuda:N picks GPU number N.",
        choices=(("auto", "Automatic"), ("cpu", "CPU"), ("cuda", "CUDA GPU"), ("mps", "Apple GPU (MPS)")),
        open_choices=True,
        pattern=r"auto|cpu|cuda|cuda:\d+|mps",
        pattern_help="auto, cpu, cuda, cuda:N or mps",
        normalize=_lower,
    )
    dtype: str = setting(
        "auto",
        label="Compute precision",
        help="Number format for the computation. Auto: bf16 on CUDA GPUs that support it, else fp16 on "
        "GPUs; fp32 on the CPU.",
        choices=(("auto", "Automatic"), ("bf16", "bfloat16"), ("fp16", "float16"), ("fp32", "float32")),
        normalize=_lower,
    )
    variant: str = setting(
        "auto",
        label="Weights variant",
        help="Which copy of the weights to load. int8 and int4 use less memory at a small cost in accuracy. "
        "Auto: the variant matching the compute precision.",
        choices=(
            ("auto", "Automatic"),
            ("bf16", "bfloat16"),
            ("fp16", "float16"),
            ("fp32", "float32"),
            ("int8", "8-bit"),
            ("int4", "4-bit"),
        ),
        normalize=_lower,
    )
    adapters: tuple[Adapter, ...] = setting(
        (),
        label="LoRA adapters",
        help="Adapters applied on top of the model, in order (accent, jargon, a language).",
    )
    recent_models: tuple[RecentModel, ...] = setting(
        (),
        label="Recent model folders",
        help=f"Model folders and files chosen before, newest first (at most {RECENT_MODELS_KEPT}), offered "
        "on the Model page and in the tray's Model menu next to the models in the Hugging Face cache.",
    )
    idle_unload_minutes: int = setting(
        0,
        label="Unload after idle",
        help="Free the model's memory after this many minutes without dictation. 0 keeps it loaded: the "
        "next dictation then starts without a reload delay.",
        minimum=0,
        maximum=24 * 60,
        unit="min",
    )

    def with_model(self, spec: str) -> EngineSettings:
        """These settings using model ``spec``. A folder or file (an absolute path, as the settings
        window writes them) moves to the front of ``recent_models``, and so does the folder being
        left (one chosen before this list existed, or by hand, is kept that way). Repo ids are not
        listed: the Hugging Face cache is scanned for those."""
        recent = self.recent_models
        for path in (self.model, spec):
            if path and os.path.isabs(path):
                recent = (RecentModel(path=path), *(r for r in recent if r.path != path))
        return self.replace(model=spec, recent_models=recent[:RECENT_MODELS_KEPT])

    def forget_model(self, path: str) -> EngineSettings:
        """These settings without ``path`` in ``recent_models`` (the model in use stays chosen)."""
        return self.replace(recent_models=tuple(r for r in self.recent_models if r.path != path))

    stream_while_recording: bool = setting(
        True,
        label="Transcribe while recording",
        help="Let the model work on each finished 8-second stretch of audio while you are still speaking, "
        "so less is left to do when you release the key. The text is exactly the same either way. It "
        "works when the microphone records at 16 kHz (most do); otherwise the recording is transcribed "
        "after you release the key.",
    )


@dataclass(frozen=True)
class TranscriptionSettings(_Group):
    language: str = setting(
        "auto",
        label="Language",
        help="Detect the language of each dictation, or always transcribe as this one (helps with short "
        "phrases and mixed-language jargon).",
        choices=language_choices,
        normalize=_language,
    )
    context: str = setting(
        "",
        label="Vocabulary and context",
        help="Names, terms and spellings the model should prefer, e.g. 'Kubernetes, PySide6, Dr. Nguyen'. "
        "A plain list of terms works better than instructions.",
        max_length=MAX_CONTEXT_CHARS,
        multiline=True,
        private=True,
    )


@dataclass(frozen=True)
class RecordingSettings(_Group):
    input_device: str = setting(
        "default",
        label="Microphone",
        help="The input device by name, or 'default' for the system's default microphone.",
        required=True,
    )
    keep_mic_open: bool = setting(
        True,
        label="Keep the microphone open",
        help="Keep the microphone stream running between dictations, so the first word is never cut off "
        "(the last 0.4 s before the key press is kept). Off: the microphone opens at each key press, which "
        "can take a moment, and the system's microphone indicator is on only while you dictate.",
    )
    max_seconds: int = setting(
        300,
        label="Maximum recording length",
        help="Stop recording automatically after this long, in case the key is stuck or forgotten.",
        minimum=5,
        maximum=3600,
        unit="s",
    )
    trim_silence: bool = setting(
        True,
        label="Trim silence",
        help="Cut silence at the start and end before transcribing; a recording with no speech produces no text.",
    )
    sounds: bool = setting(True, label="Sounds", help="Play a short sound when recording starts and stops.")
    sound_volume: int = setting(
        50, label="Sound volume", help="Volume of those sounds.", minimum=0, maximum=100, unit="%"
    )


@dataclass(frozen=True)
class HotkeySettings(_Group):
    mode: str = setting(
        "push_to_talk",
        label="Hotkey mode",
        help="Push to talk: record while the hotkey is held. Toggle: press once to start, again to stop. "
        "Hybrid: hold for push to talk, tap to toggle.",
        choices=(("push_to_talk", "Push to talk"), ("toggle", "Toggle"), ("hybrid", "Hybrid")),
        normalize=_lower,
    )
    hotkey: str = setting(
        "ctrl+alt+space",
        label="Hotkey",
        help="Keys joined with '+', e.g. ctrl+alt+space, f9 or right_ctrl.",
        pattern=r"[^+\s]+(\+[^+\s]+)*",
        pattern_help="keys joined with '+', such as ctrl+alt+space",
        required=True,
        normalize=_keys,
    )
    cancel_key: str = setting(
        "esc",
        label="Cancel key",
        help="Pressed while recording, throws the recording away. Empty: no cancel key.",
        pattern=r"([^+\s]+(\+[^+\s]+)*)?",
        pattern_help="empty, or keys joined with '+', such as esc",
        normalize=_keys,
    )
    backend: str = setting(
        "auto",
        label="Hotkey backend",
        help="How global keys are read. Auto picks what works in this session (the desktop portal on "
        "Wayland, X11 key grabs on X11, pynput on Windows and macOS); evdev needs membership of the 'input' "
        "group. pynput and evdev only listen, so the hotkey's keys also reach the focused window.",
        choices=(
            ("auto", "Automatic"),
            ("x11", "X11 key grab"),
            ("pynput", "pynput"),
            ("evdev", "evdev"),
            ("portal", "Desktop portal"),
        ),
        normalize=_lower,
    )


@dataclass(frozen=True)
class OutputSettings(_Group):
    method: str = setting(
        "auto",
        label="Insert text by",
        help="Paste: put the text on the clipboard and press the paste keys (fast, any script). Type: "
        "simulate key presses (leaves the clipboard alone, slower). Auto: paste, typing where pasting "
        "is unavailable.",
        choices=(("auto", "Automatic"), ("paste", "Pasting"), ("type", "Typing")),
        normalize=_lower,
    )
    backend: str = setting(
        "auto",
        label="Output tool",
        help="Force one tool for sending keys instead of the automatic choice for this desktop.",
        choices=(
            ("auto", "Automatic"),
            ("wtype", "wtype"),
            ("ydotool", "ydotool"),
            ("xdotool", "xdotool"),
            ("pynput", "pynput"),
        ),
        open_choices=True,
        pattern=r"[a-z0-9][a-z0-9_.-]*",
        pattern_help="auto or the name of a tool, such as wtype",
        normalize=_lower,
    )
    paste_chord: str = setting(
        "auto",
        label="Paste keys",
        help="Keys that paste. Auto: Ctrl+Shift+V in terminals, Ctrl+V elsewhere.",
        choices=(
            ("auto", "Automatic"),
            ("ctrl+v", "Ctrl+V"),
            ("ctrl+shift+v", "Ctrl+Shift+V"),
            ("shift+insert", "Shift+Insert"),
        ),
        normalize=_keys,
    )
    restore_clipboard: bool = setting(
        True,
        label="Restore the clipboard",
        help="Put back what was on the clipboard before the dictation was pasted.",
    )
    restore_delay_ms: int = setting(
        1500,
        label="Restore after",
        help="How long to wait after pasting before restoring the clipboard. Slow applications read the "
        "clipboard late; below one second some of them paste the old clipboard instead.",
        minimum=0,
        maximum=10_000,
        unit="ms",
    )
    trailing_space: bool = setting(
        True,
        label="Add a trailing space",
        help="End each dictation with a space so the next one does not run into it.",
    )
    capitalize_first: bool = setting(
        False,
        label="Capitalize the first letter",
        help="Force an upper-case first letter. The model already writes sentence case; this is for "
        "languages or phrases where it does not.",
    )
    replacements: tuple[Replacement, ...] = setting(
        (),
        label="Replacements",
        help="Fix words the model keeps getting wrong: each 'replace' text becomes the 'with' text, in order.",
        private=True,
    )


@dataclass(frozen=True)
class GeneralSettings(_Group):
    history_size: int = setting(
        1000,
        label="History size",
        help="How many past dictations to keep; the oldest are removed first.",
        minimum=10,
        maximum=1_000_000,
        unit="entries",
    )
    keep_recordings: int = setting(
        20,
        label="Keep recordings",
        help="How many of the latest recordings to keep on disk (to re-transcribe or replay). 0 deletes "
        "each recording once its text is safely in the history.",
        minimum=0,
        maximum=100_000,
        unit="recordings",
    )
    start_at_login: bool = setting(False, label="Start at login", help="Start the app when you log in.")
    show_overlay: bool = setting(
        True,
        label="Show recording indicator",
        help="Show a small indicator while recording and transcribing. It never takes the keyboard focus.",
    )
    live_preview: bool = setting(
        True,
        label="Live preview",
        help="While you speak, show a rough transcript of what was heard so far in the recording indicator "
        "(in the tray icon's tooltip where there is no indicator, as on Wayland). It is never typed; the "
        "final text comes when you release the key. Needs 'Transcribe while recording'.",
    )


@dataclass(frozen=True)
class Settings(_Group):
    engine: EngineSettings = group(EngineSettings, label="Model", help="Which model runs, where, and how.")
    transcription: TranscriptionSettings = group(
        TranscriptionSettings, label="Transcription", help="Language and vocabulary."
    )
    recording: RecordingSettings = group(RecordingSettings, label="Recording", help="Microphone and limits.")
    hotkeys: HotkeySettings = group(HotkeySettings, label="Hotkeys", help="How dictation is started and stopped.")
    output: OutputSettings = group(OutputSettings, label="Output", help="How the text reaches the window.")
    general: GeneralSettings = group(GeneralSettings, label="General", help="History, recordings, startup.")
