"""The first moment after `dictation` starts: the hotkey and the microphone, before Qt.

Importing PySide6, the app's modules and (on the engine's thread) torch takes a second or two, and
a user who starts the app and presses the hotkey at once spoke into nothing, while the held chord
auto-repeated into the focused window: the grab did not exist yet. So `begin` runs first thing in
`dictation` (no arguments), before anything heavy is imported:

1. the instance lock (`dictation.ipc.claim_instance`): a second copy takes neither key nor microphone;
2. the settings (the hotkey, the backend, the microphone);
3. the X11 key grab (`X11GrabBackend`, for backend "x11", or "auto" in an X11 session): from here on
   the chord is ours; a press is kept, with the time the X server stamped on it, until the app
   takes the backend over (`EarlyHotkeys`), then handed on in order. A chord already held when the
   grab arrives is seen in the keyboard's state and counts as a press from when the microphone
   began to hear (`x11_backend`, ``held_since``): its take keeps all the microphone heard;
4. the microphone (with "keep the microphone open"), raw and before numpy
   (`dictation.audio.early_stream`): what it hears is held, with the time it came, until the app's
   `Recorder` takes the stream over, so the take holds what is said from the press on, however
   late the app gets to the press.

`dictation.app.main.start` then builds the app around them (`take_recorder`, `take_hotkeys`): no
second grab, no second stream. What is logged meanwhile is held and goes to the app's log once it
has one (`release_log`). A press that comes before the model is ready is recorded and waits for it
(`dictation.session`). Everything here is Qt-free and imports only what these steps need.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from dictation.hotkeys.base import HotkeyBackend
from dictation.hotkeys.hotkey import Hotkey

log = logging.getLogger(__name__)

DICTATE = "dictate"  # the binding names the app uses (dictation.app.hotkey_input)
CANCEL = "cancel"
MICROPHONE_WAIT_S = 5.0  # `begin` returns after this even if the microphone is still opening


def process_age() -> float | None:
    """Seconds since this process started (Linux; None elsewhere), for the log's start-up figures."""
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: start time after boot
        return time.clock_gettime(time.CLOCK_BOOTTIME) - started
    except (OSError, ValueError, IndexError, AttributeError):
        return None


class EarlyHotkeys(HotkeyBackend):
    """A hotkey backend started before the app (``listen``) whose reports wait, stamped with their
    time, until the app starts it (``start``: the hand-over), then go on in the order they came.
    Reports carry their time as a third argument (``on_event(name, pressed, t)``): the X server's
    stamp of the key event where the backend has one (`X11GrabBackend.event_time`), else the time
    it was reported."""

    def __init__(self, inner: HotkeyBackend, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.name = inner.name  # type: ignore[misc]
        self.inner = inner
        self._clock = clock
        self._lock = threading.Lock()
        self._attached = False  # the app has taken over: reports go straight to it
        self._held: list[tuple[Any, ...]] = []  # ("event", name, pressed, t) | ("error", error)
        self._handed: set[str] = set()  # bindings whose press was handed on and not yet their release

    @property
    def problems(self) -> list[str]:
        return list(getattr(self.inner, "problems", []))

    @property
    def repeats_suppressed(self) -> int:
        return int(getattr(self.inner, "repeats_suppressed", 0))

    @property
    def keys_taken(self) -> int | None:
        """The keys the inner grab took from the windows (x11), for the output's hold
        (`dictation.output.hold`): without it, a paste the grab swallowed would count as arrived."""
        return getattr(self.inner, "keys_taken", None)

    def settle(self, timeout: float = 5.0) -> bool:
        """Catch up with the inner backend's events (x11: the X server's), as `X11GrabBackend.settle`."""
        settle = getattr(self.inner, "settle", None)
        return settle(timeout) if settle is not None else True

    def is_available(self) -> tuple[bool, str]:
        return self.inner.is_available()

    def listen(self, bindings: Mapping[str, Hotkey | str], disabled: Iterable[str] = ()) -> None:
        """Start the inner backend now, holding its reports. Raises what its start raises."""
        self.inner.start(bindings, self._heard, self._failed, disabled=disabled)

    def held(self) -> list[tuple[Any, ...]]:
        with self._lock:
            return list(self._held)

    def wait_ready(self, timeout: float) -> bool:
        return self.inner.wait_ready(timeout)

    def _start(self) -> None:
        inner = self.inner
        if inner.running and inner.bindings == self.bindings:
            for name in self.bindings:
                inner.set_enabled(name, self.is_enabled(name))
        else:  # other keys by now (or stopped): start afresh; nothing held belongs to these bindings
            inner.stop()
            with self._lock:
                self._held.clear()
            inner.start(self.bindings, self._heard, self._failed, disabled=self._disabled)
        # Handed on from a thread of its own, so a Qt receiver gets them queued, in order, once its
        # event loop runs (not in the middle of the app's start-up); new reports wait for them.
        threading.Thread(target=self._hand_over, name="hotkeys-handover", daemon=True).start()

    def _hand_over(self) -> None:
        with self._lock:
            held, self._held = self._held, []
            for item in held:
                self._deliver(item)
            self._attached = True

    def stop(self) -> None:
        """Stop listening, also before the hand-over."""
        super().stop()
        self.inner.stop()

    def _stop(self) -> None:
        with self._lock:
            self._attached = False
            self._held.clear()

    def _enabled_changed(self, name: str, enabled: bool) -> None:
        self.inner.set_enabled(name, enabled)

    def _heard(self, name: str, pressed: bool) -> None:
        t = getattr(self.inner, "event_time", None)
        self._receive(("event", name, pressed, self._clock() if t is None else t))

    def _failed(self, error: Any) -> None:
        self._receive(("error", error))

    def _receive(self, item: tuple[Any, ...]) -> None:
        with self._lock:
            if self._attached:
                self._deliver(item)
            else:
                self._held.append(item)

    def _deliver(self, item: tuple[Any, ...]) -> None:
        if self._stopped.is_set():
            return
        try:
            if item[0] == "event":
                name, pressed = item[1], item[2]
                # a release of a press handed on goes out also when the binding was disabled since
                # (Esc cancels, the app disables the cancel key): the output's hold must see it up
                if self._on_event is not None and (self.is_enabled(name) or (not pressed and name in self._handed)):
                    (self._handed.add if pressed else self._handed.discard)(name)
                    self._on_event(name, pressed, item[3])  # type: ignore[call-arg]
            elif self._on_error is not None:
                self._on_error(item[1])
        except Exception:
            log.exception("hotkey callback failed for %s", item[:3])


class _HeldLog(logging.Handler):
    """Records logged before the app's log exists."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


class Early:
    """What `begin` took: hand each part to the app once (``take_*``), or `close` it all."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.instance: Any = None  # dictation.ipc.InstanceLock; None: another app has it (or error)
        self.instance_error: Exception | None = None
        self.store: Any = None  # SettingsStore
        self.report: Any = None  # its LoadReport
        self.hotkeys: EarlyHotkeys | None = None
        self.hotkeys_preference = ""
        self.hotkeys_ready_at: float | None = None
        self.stream: Any = None  # an open dictation.audio.early_stream.EarlyStream
        self.recorder_key: tuple | None = None  # (device, max_seconds, keep_open) the app's recorder needs
        self._log: _HeldLog | None = None
        self._opening: threading.Thread | None = None  # opens the microphone

    def first_audio(self) -> float | None:
        """When the microphone opened here began to hear (None: not open, or not yet)."""
        stream = self.stream
        return None if stream is None else stream.opened_at

    def describe(self) -> str:
        """What was taken, and when after the process started (for the log)."""
        age = process_age()
        started = None if age is None else time.monotonic() - age

        def when(t: float | None) -> str:
            return "" if t is None or started is None else f" {(t - started) * 1000:.0f} ms after the process started"

        stream = self.stream
        return (
            f"hotkeys grabbed ({self.hotkeys.name}){when(self.hotkeys_ready_at)}"
            if self.hotkeys is not None
            else "hotkeys left to the app"
        ) + (f", microphone open{when(stream.opened_at)}" if stream is not None else ", microphone left to the app")

    def wait_microphone(self, timeout: float | None = None) -> None:
        """Until the microphone was opened (or failed to open), at most ``timeout`` seconds."""
        if self._opening is not None:
            self._opening.join(timeout)

    # -- the hand-over ------------------------------------------------------------------------------
    def take_recorder(self, device: str | None, max_seconds: float, keep_open: bool) -> Any:
        """A Recorder over the open microphone when the app asks for the same one (once); else None
        (and the microphone is closed). Its `open` takes the stream over (`EarlyInputBackend`)."""
        self.wait_microphone()
        stream, self.stream = self.stream, None
        if stream is None:
            return None
        if self.recorder_key != (device, max_seconds, keep_open):
            stream.close()
            return None
        from dictation.audio.capture import Recorder
        from dictation.audio.early_stream import EarlyInputBackend

        return Recorder(device, max_seconds=max_seconds, keep_open=keep_open, backend=EarlyInputBackend(stream))

    def take_hotkeys(self, preference: str) -> EarlyHotkeys | None:
        """The started hotkeys when the app asks for the same backend preference (once); else None
        (and they are stopped)."""
        hotkeys, self.hotkeys = self.hotkeys, None
        if hotkeys is not None and preference != self.hotkeys_preference:
            hotkeys.stop()
            return None
        return hotkeys

    def release_log(self) -> None:
        """Hand what was logged so far to the handlers the root logger has now (the app's)."""
        held, self._log = self._log, None
        if held is None:
            return
        logging.getLogger().removeHandler(held)
        for record in held.records:
            logging.getLogger(record.name).handle(record)

    def close(self) -> None:
        """Let go of whatever the app did not take (it is not going to run)."""
        hotkeys, self.hotkeys = self.hotkeys, None
        if hotkeys is not None:
            hotkeys.stop()
        self.wait_microphone()
        stream, self.stream = self.stream, None
        if stream is not None:
            stream.close()
        instance, self.instance = self.instance, None
        if instance is not None:
            instance.release()
        self.release_log()


def begin(environ: Mapping[str, str] | None = None) -> Early:
    """Take the instance lock, then the hotkey and the microphone the settings name (module docstring).

    Never raises for what it takes: whatever fails here is left to the app, which tries again and
    tells the user as usual."""
    early = Early()
    # The default microphone, which most settings name, opens on its own thread as soon as PortAudio
    # is loaded and the lock is ours: loading it and the sound server's answers are mostly waiting,
    # done while this thread reads the lock and the settings. Settings that name another microphone
    # (or none ahead of time) close it again.
    claimed = threading.Event()
    early._opening = threading.Thread(
        target=_open_default_microphone, args=(early, claimed), name="microphone-at-start", daemon=True
    )
    early._opening.start()
    if (environ if environ is not None else os.environ).get("DISPLAY"):  # the x11 backend may connect
        threading.Thread(target=_resolve_processor_name, name="uname-at-start", daemon=True).start()
    root = logging.getLogger()
    early._log = _HeldLog()
    root.addHandler(early._log)
    root.setLevel(min(root.level or logging.INFO, logging.INFO))
    from dictation.ipc import IpcError, claim_instance

    try:
        early.instance = claim_instance()
    except IpcError as exc:
        early.instance_error = exc
    finally:
        claimed.set()
    if early.instance is None:  # another app runs or is starting (it keeps the keys and the microphone)
        return early
    from dictation import launch_note
    from dictation.paths import config_dir

    settings_file = config_dir() / "settings.json"
    source = launch_note.file_identity(settings_file)
    settings = launch_note.read(settings_file, source)
    if settings is None:  # the settings changed since the last launch (or its first): read them
        from dictation.config.store import SettingsStore

        early.store = SettingsStore(settings_file)
        early.report = early.store.load_report()
        settings = early.report.settings
    early.recorder_key = recorder_key(settings.recording)
    if early.recorder_key[0] is not None or not settings.recording.keep_mic_open:
        early.wait_microphone()
        if early.stream is not None:
            early.stream.close()
            early.stream = None
        if settings.recording.keep_mic_open:  # a named microphone, opened while the key is grabbed
            early._opening = threading.Thread(
                target=_open_microphone, args=(early, early.recorder_key[0]), name="microphone-at-start", daemon=True
            )
            early._opening.start()
    early.hotkeys = _start_hotkeys(settings.hotkeys, environ, early.first_audio)
    if early.hotkeys is not None:
        early.hotkeys_preference = settings.hotkeys.backend
    # the grab first: its moment is stamped when it is confirmed, not after the microphone's wait
    if early.hotkeys is not None and early.hotkeys.wait_ready(MICROPHONE_WAIT_S):
        early.hotkeys_ready_at = time.monotonic()
    early.wait_microphone(MICROPHONE_WAIT_S)
    if early.report is not None:  # for the next launch, now that the keys are ours
        launch_note.write(settings_file, settings, source)
    log.info("start-up: %s", early.describe())
    return early


def recorder_key(recording: Any) -> tuple[str | None, float, bool]:
    """(device, max_seconds, keep_open) the app's recorder is made with for these settings
    (`dictation.app.controller.recorder_config`)."""
    device = None if recording.input_device in ("", "default") else recording.input_device
    return device, float(recording.max_seconds) + 5.0, bool(recording.keep_mic_open)


def _start_hotkeys(
    hotkeys: Any, environ: Mapping[str, str] | None, held_since: Callable[[], float | None]
) -> EarlyHotkeys | None:
    """The x11 grab where the app's chooser would pick it first (`dictation.hotkeys.choose`)."""
    from dictation.hotkeys.choose import Environment
    from dictation.hotkeys.hotkey import parse_hotkey

    if hotkeys.backend not in ("auto", "x11"):
        return None
    if hotkeys.backend == "auto" and Environment.detect(environ).session != "x11":
        return None
    try:
        if parse_hotkey(hotkeys.hotkey).is_modifier_only:  # watched through pynput: left to the app
            return None
        from dictation.hotkeys.x11_backend import X11GrabBackend
    except Exception as exc:  # a hotkey that does not parse, no python-xlib: the app says so
        log.info("hotkeys left to the app: %s", exc)
        return None
    bindings = {DICTATE: hotkeys.hotkey}
    if hotkeys.cancel_key:
        bindings[CANCEL] = hotkeys.cancel_key
    early = EarlyHotkeys(X11GrabBackend((environ or os.environ).get("DISPLAY")))
    # A chord already down when the grab arrives went down at some unknown moment after the start:
    # its take reaches back to the microphone's first audio (nothing it heard is left out), and
    # the backend's warning says that what came before may be missing, without a made-up amount.
    early.inner.held_since = held_since  # type: ignore[attr-defined]
    try:
        early.listen(bindings, disabled={CANCEL})  # the cancel key only while recording (HotkeyInput)
    except Exception as exc:
        log.info("hotkeys left to the app: %s", exc)
        return None
    return early


def _resolve_processor_name() -> None:
    """python-xlib reads `platform.uname()` as it connects, and the processor name in it runs
    `uname -p` (10-15 ms of waiting on the thread that grabs the hotkey): asked for here, beside the
    lock and the settings, it is known by then."""
    import platform

    platform.uname().processor  # noqa: B018 (resolves and caches it)


def _open_default_microphone(early: Early, claimed: threading.Event) -> None:
    from dictation.audio.devices import AudioDeviceError, import_early_portaudio

    try:
        import_early_portaudio()  # loads and initialises PortAudio
    except AudioDeviceError as exc:  # the app's audio worker tries again and says so
        log.info("microphone left to the app: %s", exc)
        return
    claimed.wait()
    if early.instance is not None:
        _open_microphone(early, None)


def _open_microphone(early: Early, device: str | None) -> None:
    from dictation.audio.devices import AudioDeviceError
    from dictation.audio.early_stream import EarlyStream

    stream = EarlyStream()
    try:
        stream.open(device)
    except (AudioDeviceError, OSError) as exc:  # the app's audio worker tries again and says so
        log.info("microphone left to the app: %s", exc)
        return
    early.stream = stream
