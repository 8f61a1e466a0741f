"""The Microphone area: the audio library (sounddevice and PortAudio), the sound server, the
microphones the audio system lists, and the one the settings choose."""

from __future__ import annotations

from pathlib import Path

from dictation.doctor.check import Check, Context

SOUND_SERVER_FIX = (
    "start the sound server: `systemctl --user start pipewire pipewire-pulse wireplumber` (or `pulseaudio --start`)"
)


def checks(ctx: Context) -> list[Check]:
    from dictation.audio import devices as audio

    area = "Microphone"
    try:
        sd = audio.import_sounddevice()
    except audio.AudioDeviceError as exc:
        text = str(exc)
        if "PortAudio library not found" in text:
            fix = f"{ctx.install('portaudio')}, then start dictation again"
        elif "sounddevice package is not installed" in text:
            fix = "`pip install sounddevice`"
        else:
            fix = None
        return [Check(area, "Audio library", "problem", text, fix)]
    try:
        portaudio = sd.get_portaudio_version()[1].split(", revision")[0]
    except Exception:  # noqa: BLE001 - only for the detail line
        portaudio = "PortAudio"
    checks = [Check(area, "Audio library", "ok", f"sounddevice {getattr(sd, '__version__', '?')}, {portaudio}")]
    try:
        devices = audio.list_input_devices()
    except audio.AudioDeviceError as exc:
        devices, error = [], str(exc)
    else:
        error = ""
    server = _sound_server(ctx)
    if server is not None:
        found, detail = server
        if found:
            checks.append(Check(area, "Sound server", "ok", detail))
        else:
            checks.append(Check(area, "Sound server", "info" if devices else "warning", detail, SOUND_SERVER_FIX))
    if not devices:
        detail = error or "no microphone found: the audio system lists no input devices"
        checks.append(Check(area, "Microphones", "problem", detail, _microphone_fix(ctx)))
        return checks
    names = ", ".join(f"[{d.index}] {d.name}{' (default)' if d.is_default else ''}" for d in devices[:8])
    more = f" and {len(devices) - 8} more" if len(devices) > 8 else ""
    count = "1 input device" if len(devices) == 1 else f"{len(devices)} input devices"
    checks.append(Check(area, "Microphones", "ok", f"{count}: {names}{more}"))
    spec = ctx.settings.recording.input_device.strip()
    spec = "" if spec == "default" else spec  # as the controller reads it
    try:
        device = audio.find_input_device(spec or None, devices)
    except audio.AudioDeviceError as exc:
        checks.append(
            Check(
                area,
                "Selected microphone",
                "problem",
                str(exc),
                "plug it in, or choose another microphone on the Recording page (`dictation devices` lists them)",
            )
        )
    else:
        which = f"{spec!r}" if spec else "the system default"
        default = "" if spec or device.is_default else " (PortAudio reports no default input: the first one is used)"
        checks.append(
            Check(
                area,
                "Selected microphone",
                "ok",
                f"{which}: [{device.index}] {device.name}, {device.default_samplerate} Hz{default}",
            )
        )
    return checks


def _sound_server(ctx: Context) -> tuple[bool, str] | None:
    """(found, detail) for PipeWire / PulseAudio on Linux; None elsewhere."""
    if not ctx.linux:
        return None
    if ctx.env.get("PULSE_SERVER"):
        return True, f"PulseAudio server {ctx.env['PULSE_SERVER']} (PULSE_SERVER)"
    runtime = ctx.env.get("XDG_RUNTIME_DIR")
    if not runtime:
        return False, "XDG_RUNTIME_DIR is unset, so no PipeWire or PulseAudio server can be found"
    found = [
        name
        for name, sub in (("PipeWire", "pipewire-0"), ("PulseAudio", "pulse/native"))
        if (Path(runtime) / sub).exists()
    ]
    if found:
        return True, f"{' with '.join(found)} socket in {runtime}"
    return False, f"no PipeWire or PulseAudio socket in {runtime}: only ALSA devices can be used"


def _microphone_fix(ctx: Context) -> str:
    if ctx.platform == "darwin":
        return (
            "allow microphone access for the app that runs dictation: System Settings → Privacy & Security → Microphone"
        )
    if ctx.platform.startswith("win"):
        return "Settings → Privacy & security → Microphone: turn on access for desktop apps, and plug a microphone in"
    return (
        "plug a microphone in and check that the sound server sees it (`pactl list short sources`, or "
        f"`arecord -l` for ALSA); if it doesn't, {SOUND_SERVER_FIX}; in a Flatpak or Snap, allow microphone access"
    )
