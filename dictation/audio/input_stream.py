"""The input stream under the `Recorder`: what it needs of a running stream and of the layer that
opens one (`InputStreamLike`, `InputBackend`, so tests can fake PortAudio while running the same
Recorder code), and the real layer, PortAudio through sounddevice (`SoundDeviceBackend`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from dictation.audio.devices import (
    AudioDeviceError,
    InputDevice,
    import_sounddevice,
    list_input_devices,
    rescan_devices,
)

Callback = Callable[[np.ndarray, int, Any, Any], None]


class InputStreamLike(Protocol):
    """What the recorder needs of a running input stream (sounddevice.InputStream, or a test fake)."""

    latency: float  # seconds from the microphone to the callback, as the audio API reports it

    def close(self) -> None: ...


class InputBackend(Protocol):
    """The sounddevice layer, injectable so tests can fake it while running the same Recorder code."""

    def list_devices(self) -> list[InputDevice]: ...

    def open_stream(
        self,
        device: InputDevice,
        samplerate: int,
        channels: int,
        blocksize: int,
        callback: Callback,
        finished_callback: Callable[[], None],
    ) -> InputStreamLike:
        """Open and start a float32 stream; raise `AudioDeviceError` if the device refuses."""
        ...

    def rescan(self) -> None: ...


class SoundDeviceBackend:
    """The real backend: PortAudio through sounddevice."""

    def list_devices(self) -> list[InputDevice]:
        return list_input_devices()

    def open_stream(
        self,
        device: InputDevice,
        samplerate: int,
        channels: int,
        blocksize: int,
        callback: Callback,
        finished_callback: Callable[[], None],
    ) -> InputStreamLike:
        sd = import_sounddevice()
        where = f"cannot open microphone {device.name!r} at {samplerate} Hz, {channels} channel(s)"
        try:
            stream = sd.InputStream(
                device=device.index,
                samplerate=samplerate,
                channels=channels,
                dtype="float32",
                blocksize=blocksize,
                latency="low",
                callback=callback,
                finished_callback=finished_callback,
            )
        except (sd.PortAudioError, ValueError) as exc:
            raise AudioDeviceError(f"{where}: {exc}") from None
        try:
            stream.start()
        except sd.PortAudioError as exc:
            stream.close(ignore_errors=True)
            raise AudioDeviceError(f"{where}: {exc}") from None
        return stream

    def rescan(self) -> None:
        rescan_devices()
