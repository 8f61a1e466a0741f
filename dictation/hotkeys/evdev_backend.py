"""evdev backend: read key events straight from /dev/input/event* (Linux; works under Wayland and X11).

Reading needs read permission on the device nodes, which normally means membership in the `input`
group. We never grab a device: the keys still reach every other program. Keyboards are found by
their capabilities (any device that can send one of the bound keys), so a foot pedal that sends F9
works too. Devices are re-scanned every couple of seconds, so a keyboard plugged in later is picked
up and an unplugged one is dropped (releasing whatever it held).
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import selectors
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from dictation.hotkeys.base import HotkeyBackend
from dictation.hotkeys.combo import ComboTracker
from dictation.hotkeys.errors import HotkeyBackendError
from dictation.hotkeys.hotkey import Hotkey
from dictation.hotkeys.keys import KEYS

log = logging.getLogger(__name__)

EV_SYN, EV_KEY, SYN_DROPPED = 0x00, 0x01, 3  # linux/input-event-codes.h
KEY_UP, KEY_DOWN, KEY_REPEAT = 0, 1, 2
FIX_COMMAND = "sudo usermod -aG input $USER"


def _ecodes() -> Any:
    from evdev import ecodes

    return ecodes


def evdev_code_names() -> dict[int, str]:
    """evdev key code -> physical key name."""
    ecodes = _ecodes()
    return {getattr(ecodes, info.evdev): name for name, info in KEYS.items()}


def evdev_codes(hotkey: Hotkey) -> tuple[frozenset[int], ...]:
    """For each part of ``hotkey``, the evdev KEY_* codes that satisfy it ("ctrl" -> both Ctrl keys)."""
    ecodes = _ecodes()
    return tuple(frozenset(getattr(ecodes, KEYS[k].evdev) for k in alts) for alts in hotkey.physical_parts())


@dataclass(frozen=True)
class GroupInfo:
    """What we know about the `input` group, for explaining a permission error."""

    user: str
    group_exists: bool = True
    in_group_now: bool = False  # this process has the group (login session started after joining)
    in_group_database: bool = False  # /etc/group lists the user (maybe not yet effective)


def current_group_info() -> GroupInfo:
    import grp
    import pwd

    try:
        user = pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        user = os.environ.get("USER", "you")
    try:
        group = grp.getgrnam("input")
    except KeyError:
        return GroupInfo(user=user, group_exists=False)
    try:
        primary = pwd.getpwnam(user).pw_gid
    except KeyError:
        primary = -1
    return GroupInfo(
        user=user,
        in_group_now=group.gr_gid in os.getgroups() or os.getegid() == group.gr_gid,
        in_group_database=user in group.gr_mem or primary == group.gr_gid,
    )


def explain_permission_denied(denied: Sequence[str], info: GroupInfo) -> str:
    """One line: which devices we can't read, why, and the exact fix."""
    first = denied[0] if denied else "/dev/input/event*"
    more = f" and {len(denied) - 1} more" if len(denied) > 1 else ""
    what = f"can't read {first}{more} (permission denied)"
    if not info.group_exists:
        return (
            f"{what}, and this system has no 'input' group: give your user read access to /dev/input/event* "
            "with a udev rule, or use the desktop's shortcut portal or the `dictation toggle` command"
        )
    if info.in_group_now:
        return (
            f"{what} although you are in the 'input' group: check `ls -l /dev/input/event*` — the devices "
            "should belong to group 'input' with read permission (g+r)"
        )
    if info.in_group_database:
        return (
            f"{what}: {info.user} was added to the 'input' group, but this login session started before that — "
            "log out and back in (or reboot)"
        )
    return (
        f"{what}: add yourself to the 'input' group with `{FIX_COMMAND}`, then log out and back in "
        "(note: every program you run can then read your keystrokes)"
    )


@dataclass
class ScanResult:
    devices: list[Any] = field(default_factory=list)  # open devices that can send a wanted key
    denied: list[str] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)  # readable, but not a keyboard for our keys


def _open_default(path: str) -> Any:
    from evdev import InputDevice

    return InputDevice(path, readonly=True)


def scan_devices(paths: Iterable[str], open_device: Callable[[str], Any], wanted: frozenset[int]) -> ScanResult:
    """Open each path; keep devices whose key capabilities include a wanted code."""
    result = ScanResult()
    for path in paths:
        try:
            device = open_device(path)
        except PermissionError:
            result.denied.append(path)
            continue
        except OSError as exc:
            result.failed.append((path, os.strerror(exc.errno) if exc.errno else str(exc)))
            continue
        try:
            keys = set(device.capabilities().get(EV_KEY, ()))
        except OSError as exc:
            keys = set()
            result.failed.append((path, str(exc)))
        if keys & wanted:
            result.devices.append(device)
        else:
            result.ignored.append(path)
            device.close()
    return result


class EvdevBackend(HotkeyBackend):
    name = "evdev"

    def __init__(
        self,
        *,
        input_dir: str = "/dev/input",
        open_device: Callable[[str], Any] | None = None,
        group_info: Callable[[], GroupInfo] = current_group_info,
        rescan_interval: float = 2.0,
        platform: str = sys.platform,
    ) -> None:
        super().__init__()
        self._input_dir = input_dir
        self._open_device = open_device or _open_default
        self._group_info = group_info
        self._rescan_interval = rescan_interval
        self._platform = platform
        self._tracker: ComboTracker | None = None
        self._thread: threading.Thread | None = None
        self._wake_r = self._wake_w = -1
        self._devices: dict[str, Any] = {}  # path -> open device
        self._held: dict[str, set[str]] = {}  # path -> key names it holds down
        self._holders: Counter[str] = Counter()  # key name -> number of devices holding it
        self._skipped: set[str] = set()  # paths tried and not used (re-tried once they disappear)

    def _paths(self) -> list[str]:
        return sorted(glob.glob(os.path.join(self._input_dir, "event*")))

    def _wanted(self) -> frozenset[int]:
        ecodes = _ecodes()
        if not self.bindings:  # availability check: anything with a space bar counts as a keyboard
            return frozenset({ecodes.KEY_SPACE})
        return frozenset().union(*(c for hk in self.bindings.values() for c in evdev_codes(hk)))

    def _unusable_reason(self, scan: ScanResult, n_paths: int) -> str:
        if scan.denied:
            return explain_permission_denied(scan.denied, self._group_info())
        if scan.failed:
            path, why = scan.failed[0]
            return f"can't open {path}: {why}"
        return f"none of the {n_paths} input devices in {self._input_dir} is a keyboard that has the bound keys"

    def is_available(self) -> tuple[bool, str]:
        if not self._platform.startswith("linux"):
            return False, "evdev exists only on Linux"
        try:
            _ecodes()
        except ImportError:
            return False, "the Python package 'evdev' is not installed (pip install evdev)"
        paths = self._paths()
        if not paths:
            return False, f"no input devices in {self._input_dir} (a container or sandbox without /dev/input?)"
        scan = scan_devices(paths, self._open_device, self._wanted())
        names = [getattr(d, "name", d.path) for d in scan.devices]
        for device in scan.devices:
            device.close()
        if not names:
            return False, self._unusable_reason(scan, len(paths))
        note = f"; {len(scan.denied)} device(s) unreadable" if scan.denied else ""
        return True, f"reads {len(names)} keyboard(s) from {self._input_dir} ({', '.join(names)}){note}"

    @property
    def repeats_suppressed(self) -> int:
        return self._tracker.repeats_suppressed if self._tracker else 0

    @property
    def device_paths(self) -> list[str]:
        return sorted(self._devices)

    def _start(self) -> None:
        if not self._platform.startswith("linux"):
            raise HotkeyBackendError("evdev exists only on Linux", backend=self.name)
        try:
            wanted = self._wanted()
        except ImportError as exc:
            raise HotkeyBackendError("the Python package 'evdev' is not installed", backend=self.name) from exc
        paths = self._paths()
        scan = scan_devices(paths, self._open_device, wanted)
        if not scan.devices:
            raise HotkeyBackendError(self._unusable_reason(scan, len(paths)), backend=self.name)
        if scan.denied:
            log.warning("evdev: %s", explain_permission_denied(scan.denied, self._group_info()))
        self._tracker = ComboTracker(self.bindings)
        self._code_names = evdev_code_names()
        self._wanted_codes = wanted
        self._devices = {d.path: d for d in scan.devices}
        self._held = {d.path: set() for d in scan.devices}
        self._holders = Counter()
        self._skipped = set(scan.denied) | set(scan.ignored) | {p for p, _ in scan.failed}
        self._wake_r, self._wake_w = os.pipe()
        self._thread = threading.Thread(target=self._run, name="hotkeys-evdev", daemon=True)
        self._thread.start()
        self._ready.set()

    # --- listener thread -------------------------------------------------------------------
    def _run(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self._wake_r, selectors.EVENT_READ, None)
        for device in self._devices.values():
            selector.register(device.fd, selectors.EVENT_READ, device)
        next_scan = time.monotonic() + self._rescan_interval
        try:
            while not self._stopped.is_set():
                for key, _ in selector.select(max(0.0, next_scan - time.monotonic())):
                    if key.data is None:
                        return
                    self._read(key.data, selector)
                if time.monotonic() >= next_scan:
                    self._rescan(selector)
                    next_scan = time.monotonic() + self._rescan_interval
        except Exception as exc:
            log.exception("evdev listener failed")
            self._report(f"the evdev key reader stopped: {type(exc).__name__}: {exc}", fatal=True)
        finally:
            selector.close()

    def _read(self, device: Any, selector: selectors.BaseSelector) -> None:
        try:
            events = list(device.read())
        except BlockingIOError:
            return
        except OSError as exc:
            self._drop(device, selector, os.strerror(exc.errno) if exc.errno else str(exc))
            return
        for event in events:
            self.handle_event(device, event)

    def handle_event(self, device: Any, event: Any) -> None:
        """Apply one `evdev.InputEvent` read from ``device`` (called on the listener thread)."""
        if event.type == EV_SYN and event.code == SYN_DROPPED:
            self._resync(device)
            return
        if event.type != EV_KEY:
            return
        name = self._code_names.get(event.code)
        if name is None:
            return
        if event.value in (KEY_DOWN, KEY_REPEAT):
            self._key_down(device.path, name)
        elif event.value == KEY_UP:
            self._key_up(device.path, name)

    def _key_down(self, path: str, name: str) -> None:
        held = self._held.setdefault(path, set())
        if name in held:  # auto-repeat (value 2): the tracker counts and drops it
            self._emit(self._tracker.press(name))
            return
        held.add(name)
        self._holders[name] += 1
        if self._holders[name] == 1:
            self._emit(self._tracker.press(name))

    def _key_up(self, path: str, name: str) -> None:
        held = self._held.get(path, set())
        if name not in held:
            return
        held.discard(name)
        self._holders[name] -= 1
        if self._holders[name] == 0:
            self._emit(self._tracker.release(name))

    def _resync(self, device: Any) -> None:
        """The kernel dropped events: ask the device which keys are down now."""
        try:
            down = {self._code_names[c] for c in device.active_keys() if c in self._code_names}
        except OSError:
            down = set()
        for name in sorted(self._held.get(device.path, set()) - down):
            self._key_up(device.path, name)
        for name in sorted(down - self._held.get(device.path, set())):
            self._key_down(device.path, name)

    def _drop(self, device: Any, selector: selectors.BaseSelector, why: str) -> None:
        for name in sorted(self._held.get(device.path, set())):
            self._key_up(device.path, name)  # a key held on an unplugged keyboard is released
        self._held.pop(device.path, None)
        self._devices.pop(device.path, None)
        with contextlib.suppress(KeyError, ValueError):
            selector.unregister(device.fd)
        with contextlib.suppress(OSError):
            device.close()
        name = getattr(device, "name", device.path)
        if self._devices:
            self._report(f"keyboard {name!r} ({device.path}) went away: {why}", fatal=False)
        else:
            self._report(f"the last keyboard ({name!r}) went away: {why}; waiting for one to come back", fatal=False)

    def _rescan(self, selector: selectors.BaseSelector) -> None:
        paths = set(self._paths())
        self._skipped &= paths  # a path that disappeared is tried again when it comes back
        new = sorted(paths - set(self._devices) - self._skipped)
        if not new:
            return
        scan = scan_devices(new, self._open_device, self._wanted_codes)
        self._skipped |= set(scan.denied) | set(scan.ignored) | {p for p, _ in scan.failed}
        for device in scan.devices:
            self._devices[device.path] = device
            self._held[device.path] = set()
            selector.register(device.fd, selectors.EVENT_READ, device)
            log.info("evdev: now reading %s (%s)", getattr(device, "name", "?"), device.path)
        if scan.denied:
            log.warning("evdev: %s", explain_permission_denied(scan.denied, self._group_info()))

    def _stop(self) -> None:
        if self._wake_w >= 0:
            os.write(self._wake_w, b"x")
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)
        for device in self._devices.values():
            with contextlib.suppress(OSError):
                device.close()
        self._devices.clear()
        for fd in (self._wake_r, self._wake_w):
            if fd >= 0:
                os.close(fd)
        self._wake_r = self._wake_w = -1
