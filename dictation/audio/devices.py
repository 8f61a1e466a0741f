"""Microphones as PortAudio sees them: listing, choosing one by index or name, and PortAudio's absence.

`sounddevice` is imported lazily and only here (and by the capture backend through
`import_sounddevice`), so a missing PortAudio library becomes one clear line instead of an
``OSError`` from deep inside ``import sounddevice``: the Linux wheels do not bundle PortAudio.

PortAudio enumerates devices once, when it is initialised; a microphone plugged in later, or a
sound server started later, stays invisible until `rescan_devices` re-initialises it.
"""

from __future__ import annotations

import logging
from types import ModuleType
from typing import Any, NamedTuple

log = logging.getLogger(__name__)

PORTAUDIO_MISSING = (
    "PortAudio library not found: install it (Debian/Ubuntu: sudo apt install libportaudio2; "
    "Fedora: sudo dnf install portaudio; Arch: sudo pacman -S portaudio)"
)


class AudioDeviceError(RuntimeError):
    """No microphone can be listed or opened; the message is one line meant for the user."""


class InputDevice(NamedTuple):  # a record, not a dataclass: opened at launch (dictation.launch)
    """One capture device. ``index`` is PortAudio's, valid until the next `rescan_devices`."""

    index: int
    name: str
    default_samplerate: int
    channels: int  # maximum input channels
    is_default: bool
    hostapi: str = ""


def import_sounddevice() -> ModuleType:
    """``import sounddevice``, turning a missing PortAudio or package into `AudioDeviceError`."""
    try:
        import sounddevice
    except OSError as exc:  # raised by sounddevice itself when dlopen finds no libportaudio
        if "portaudio" in str(exc).lower():
            raise AudioDeviceError(PORTAUDIO_MISSING) from None
        raise AudioDeviceError(f"cannot load the audio library: {exc}") from None
    except ImportError as exc:
        raise AudioDeviceError(f"the sounddevice package is not installed (pip install sounddevice): {exc}") from None
    return sounddevice


def import_early_portaudio() -> Any:
    """PortAudio for the microphone opened at launch: called directly (`dictation.audio.portaudio`,
    no sounddevice import to wait for) where the library is found under its Linux names, else
    sounddevice. Raises `AudioDeviceError`."""
    from dictation.audio import portaudio

    try:
        loaded = portaudio.load()
    except portaudio.PortAudioError as exc:
        raise AudioDeviceError(f"cannot start the audio system: {exc}") from None
    return loaded if loaded is not None else import_sounddevice()


def list_input_devices(sd: Any = None) -> list[InputDevice]:
    """Every device with at least one input channel, in PortAudio's order (``sd``: sounddevice, or
    what `import_early_portaudio` gave)."""
    sd = import_sounddevice() if sd is None else sd
    try:
        raw = list(sd.query_devices())
        hostapis = [api["name"] for api in sd.query_hostapis()]
    except sd.PortAudioError as exc:
        raise AudioDeviceError(f"cannot list audio devices: {exc}") from None
    default_index = _default_input_index(sd)
    devices = []
    for info in raw:
        if info["max_input_channels"] <= 0:
            continue
        api = info.get("hostapi", -1)
        devices.append(
            InputDevice(
                index=int(info["index"]),
                name=str(info["name"]),
                default_samplerate=int(round(info["default_samplerate"])),
                channels=int(info["max_input_channels"]),
                is_default=int(info["index"]) == default_index,
                hostapi=hostapis[api] if 0 <= api < len(hostapis) else "",
            )
        )
    return devices


def _default_input_index(sd: Any) -> int | None:
    try:
        return int(sd.query_devices(kind="input")["index"])
    except (sd.PortAudioError, ValueError, KeyError, TypeError):
        return None  # PortAudio has no default input (no devices, or no server)


def find_input_device(spec: int | str | None, devices: list[InputDevice]) -> InputDevice:
    """The device ``spec`` names: None = the default input, an index, or a name.

    A name matches exactly (case-insensitive) first, then as a substring; a substring that fits
    devices with different names is refused as ambiguous rather than guessed. Several devices with
    the same name (Windows lists one per host API) resolve to the first, as PortAudio lists them.
    """
    if not devices:
        raise AudioDeviceError("no microphone found (the audio system lists no input devices)")
    if spec is None or spec == "":
        for device in devices:
            if device.is_default:
                return device
        return devices[0]
    if isinstance(spec, int) or (isinstance(spec, str) and spec.strip().isdigit()):
        index = int(spec)
        for device in devices:
            if device.index == index:
                return device
        raise AudioDeviceError(f"no microphone with index {index} (available: {_names(devices)})")
    wanted = spec.strip().casefold()
    exact = [d for d in devices if d.name.casefold() == wanted]
    if exact:
        return exact[0]
    partial = [d for d in devices if wanted in d.name.casefold()]
    if len({d.name for d in partial}) > 1:
        raise AudioDeviceError(f"microphone name {spec!r} is ambiguous: it matches {_names(partial)}")
    if partial:
        return partial[0]
    raise AudioDeviceError(f"no microphone named {spec!r} (available: {_names(devices)})")


def _names(devices: list[InputDevice]) -> str:
    return ", ".join(f"[{d.index}] {d.name}" for d in devices) or "none"


def format_devices(devices: list[InputDevice]) -> str:
    """The `dictation devices` listing: one line per microphone, the default marked with ``*``."""
    if not devices:
        return "No microphones found."
    width = max(len(str(d.index)) for d in devices)
    lines = []
    for d in devices:
        mark = "*" if d.is_default else " "
        api = f"{d.hostapi}, " if d.hostapi else ""
        channels = "1 channel" if d.channels == 1 else f"{d.channels} channels"
        lines.append(f"{mark} {d.index:>{width}}  {d.name}  ({api}{channels}, {d.default_samplerate} Hz)")
    lines.append("* = default input. Choose one by index or by name.")
    return "\n".join(lines)


def rescan_devices() -> None:
    """Re-initialise PortAudio so that devices (or a sound server) that appeared since start are seen.

    PortAudio closes every open stream when it terminates: call this only while no stream is open.
    """
    from dictation.audio import portaudio

    portaudio.release()  # the launch's own hold, or the terminate below would only count down
    sd = import_sounddevice()
    try:
        sd._terminate()  # sounddevice has no public rescan; these are its init/exit helpers
        sd._initialize()
    except sd.PortAudioError as exc:
        raise AudioDeviceError(f"cannot re-initialise the audio system: {exc}") from None
    log.info("audio devices rescanned")
