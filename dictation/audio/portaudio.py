"""PortAudio called directly, for the microphone opened in the app's first moment (`early_stream`).

`import sounddevice` costs about 80 ms of Python on a 2-core machine before it even starts
PortAudio (its own module, `ctypes.util`, `sysconfig`, the class tables), and at launch that time
is taken from the thread grabbing the hotkey: both wait for the same interpreter lock. This module
loads the same library through the same cffi declarations sounddevice ships (`_sounddevice`) and
offers the few calls the early stream needs, with sounddevice's names and shapes
(`query_devices`, `query_hostapis`, `RawInputStream`, `PortAudioError`), so `early_stream` takes
either. PortAudio's own start (`Pa_Initialize`, tens of ms of device probing) runs in C without
the lock. The app's `Recorder` and everything after it still use sounddevice; PortAudio counts its
initialisations, so both can hold it.

`load()` returns None where the library is not found under its Linux names (macOS and Windows
ship it inside sounddevice's data package): the caller then imports sounddevice as before.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

LIBRARY_NAMES = ("libportaudio.so.2", "libportaudio.so")
PA_FLOAT32 = 0x00000001
PA_CONTINUE, PA_ABORT = 0, 2
PA_NO_DEVICE = -1
PA_INPUT_OVERFLOW = 0x00000002


class PortAudioError(Exception):
    """A PortAudio call failed; the message is PortAudio's text."""


class CallbackFlags(int):
    """PortAudio's status flags for a block, read as sounddevice's `CallbackFlags` are."""

    @property
    def input_overflow(self) -> bool:
        return bool(self & PA_INPUT_OVERFLOW)


class PortAudio:
    """The loaded library, initialised once."""

    PortAudioError = PortAudioError

    def __init__(self, ffi: Any, lib: Any) -> None:
        self.ffi, self.lib = ffi, lib

    def check(self, err: int, what: str = "") -> int:
        if err >= 0:
            return err
        text = self.ffi.string(self.lib.Pa_GetErrorText(err)).decode(errors="replace")
        raise PortAudioError(f"{what}: {text}" if what else text)

    def _device(self, index: int) -> dict:
        info = self.lib.Pa_GetDeviceInfo(index)
        if info == self.ffi.NULL:
            raise PortAudioError(f"no device {index}")
        return {
            "index": index,
            "name": self.ffi.string(info.name).decode(errors="replace"),
            "hostapi": info.hostApi,
            "max_input_channels": info.maxInputChannels,
            "default_low_input_latency": info.defaultLowInputLatency,
            "default_samplerate": info.defaultSampleRate,
        }

    def query_devices(self, kind: str | None = None) -> Any:
        """Every device (as sounddevice lists them), or with ``kind="input"`` the default input."""
        if kind == "input":
            index = self.lib.Pa_GetDefaultInputDevice()
            if index == PA_NO_DEVICE:
                raise PortAudioError("no default input device")
            return self._device(index)
        count = self.check(self.lib.Pa_GetDeviceCount(), "cannot count devices")
        return [self._device(i) for i in range(count)]

    def query_hostapis(self) -> list[dict]:
        count = self.check(self.lib.Pa_GetHostApiCount(), "cannot count host APIs")
        apis = []
        for i in range(count):
            info = self.lib.Pa_GetHostApiInfo(i)
            apis.append({"name": "" if info == self.ffi.NULL else self.ffi.string(info.name).decode(errors="replace")})
        return apis

    def RawInputStream(self, **kwargs: Any) -> RawInputStream:  # noqa: N802 (sounddevice's name)
        return RawInputStream(self, **kwargs)


class RawInputStream:
    """An input stream of float32 frames handed to ``callback(data, frames, time_info, status)``
    as a buffer (sounddevice's `RawInputStream` with ``dtype="float32"``, ``latency="low"``)."""

    def __init__(
        self,
        portaudio: PortAudio,
        *,
        device: int,
        samplerate: float,
        channels: int,
        blocksize: int,
        callback: Callable[..., None],
        finished_callback: Callable[[], None],
        dtype: str = "float32",
        latency: str = "low",
    ) -> None:
        if dtype != "float32" or latency != "low":
            raise ValueError("only float32 at low latency")
        ffi, lib = portaudio.ffi, portaudio.lib
        self._pa = portaudio
        info = portaudio._device(device)
        if channels > info["max_input_channels"]:
            raise ValueError(f"device {device} has {info['max_input_channels']} input channel(s)")
        parameters = ffi.new(
            "PaStreamParameters*", (device, channels, PA_FLOAT32, info["default_low_input_latency"], ffi.NULL)
        )
        size = 4 * channels

        @ffi.callback("PaStreamCallback", error=PA_ABORT)
        def on_block(data, output, frames, time_info, status, user_data):
            callback(ffi.buffer(data, frames * size), frames, None, CallbackFlags(status))
            return PA_CONTINUE

        @ffi.callback("PaStreamFinishedCallback")
        def on_finished(user_data):
            finished_callback()

        self._callbacks = (on_block, on_finished)  # PortAudio holds pointers to them
        pointer = ffi.new("PaStream**")
        portaudio.check(
            lib.Pa_OpenStream(pointer, parameters, ffi.NULL, samplerate, blocksize, 0, on_block, ffi.NULL),
            "Error opening RawInputStream",
        )
        self._stream = pointer[0]
        portaudio.check(lib.Pa_SetStreamFinishedCallback(self._stream, on_finished))
        stream_info = lib.Pa_GetStreamInfo(self._stream)
        self.latency = 0.0 if stream_info == ffi.NULL else float(stream_info.inputLatency)
        self.samplerate = samplerate

    def start(self) -> None:
        self._pa.check(self._pa.lib.Pa_StartStream(self._stream), "Error starting stream")

    def close(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            self._pa.check(self._pa.lib.Pa_CloseStream(stream), "Error closing stream")


_loaded: PortAudio | None = None
_lock = threading.Lock()


def load() -> PortAudio | None:
    """The library, initialised (PortAudio's start-up chatter on stderr silenced, as sounddevice
    does); None where it is not found under its Linux names. Raises `PortAudioError` when
    PortAudio loads but cannot start."""
    global _loaded
    with _lock:
        if _loaded is not None:
            return _loaded
        try:
            from _sounddevice import ffi
        except ImportError:
            return None
        lib = None
        for name in LIBRARY_NAMES:
            try:
                lib = ffi.dlopen(name)
                break
            except OSError:
                continue
        if lib is None:
            return None
        portaudio = PortAudio(ffi, lib)
        saved = _silence_stderr()
        try:
            portaudio.check(lib.Pa_Initialize(), "Error initializing PortAudio")
        finally:
            _restore_stderr(saved)
        _loaded = portaudio
        return portaudio


def _silence_stderr() -> int | None:
    try:
        saved = os.dup(2)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        os.close(devnull)
        return saved
    except OSError:
        return None


def _restore_stderr(saved: int | None) -> None:
    if saved is not None:
        os.dup2(saved, 2)
        os.close(saved)


def release() -> None:
    """Drop this module's hold on PortAudio (`Pa_Terminate` once), so that a re-initialisation
    elsewhere (`dictation.audio.devices.rescan_devices`) really restarts it. Streams opened here
    must be closed first."""
    global _loaded
    with _lock:
        loaded, _loaded = _loaded, None
    if loaded is not None:
        loaded.lib.Pa_Terminate()
