"""XDG desktop portal backend: org.freedesktop.portal.GlobalShortcuts over D-Bus (jeepney).

The Wayland way to get global shortcuts with press *and* release: the desktop (KDE Plasma 6,
GNOME 48+, Hyprland via xdph; not niri) owns the key grab and tells us when a shortcut is activated
and deactivated. Flow, all on one worker thread so `start()` never waits for the user:

1. connect to the session bus; register our app id with the host registry when one is given
   (xdg-desktop-portal >= 1.19.1; GNOME needs it for apps that aren't Flatpaks);
2. read the interface version; subscribe to Request::Response before each call, since the reply
   can arrive as soon as the call returns;
3. CreateSession -> Response(session_handle); BindShortcuts -> the desktop may show a consent
   dialog; Response(0, shortcuts) lists what was bound and how to trigger it, 1 means dismissed;
4. Activated / Deactivated signals for our session, from the portal's own connection only,
   become (name, True/False). A repeated Activated is suppressed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import secrets
import threading
import time
from collections.abc import Mapping
from typing import Any

from dictation.hotkeys.base import HotkeyBackend
from dictation.hotkeys.errors import HotkeyBackendError
from dictation.hotkeys.hotkey import Hotkey
from dictation.hotkeys.keys import KEYS, MODIFIER_SIDES, PORTAL_MODIFIER_ORDER, PORTAL_MODIFIERS, modifier_class

log = logging.getLogger(__name__)

PORTAL_BUS = "org.freedesktop.portal.Desktop"
PORTAL_PATH = "/org/freedesktop/portal/desktop"
SHORTCUTS_IFACE = "org.freedesktop.portal.GlobalShortcuts"
REQUEST_IFACE = "org.freedesktop.portal.Request"
SESSION_IFACE = "org.freedesktop.portal.Session"
REGISTRY_IFACE = "org.freedesktop.host.portal.Registry"
RESPONSE_OK, RESPONSE_CANCELLED = 0, 1

_NOT_RUNNING = {"org.freedesktop.DBus.Error.ServiceUnknown", "org.freedesktop.DBus.Error.NameHasNoOwner"}
_NO_INTERFACE = {
    "org.freedesktop.DBus.Error.UnknownInterface",
    "org.freedesktop.DBus.Error.UnknownProperty",
    "org.freedesktop.DBus.Error.UnknownMethod",
    "org.freedesktop.DBus.Error.InvalidArgs",
}
NO_PORTAL_HINT = "this desktop offers no global shortcuts to apps (niri and most wlroots desktops don't)"


def portal_trigger(hotkey: Hotkey) -> str:
    """Preferred trigger in the freedesktop shortcuts-spec syntax: 'CTRL+ALT+space', 'F9', 'Control_R'.

    The spec has no left/right modifiers, so "right_ctrl+space" becomes "CTRL+space"; a lone
    modifier key is named by its keysym. It is only a preference: the user can change it in the
    desktop's dialog, and what was bound comes back as ``bound_triggers``.
    """
    classes = {modifier_class(m) for m in hotkey.modifiers}
    mods = [PORTAL_MODIFIERS[m] for m in PORTAL_MODIFIER_ORDER if m in classes]
    key = MODIFIER_SIDES[hotkey.key][0] if hotkey.key in MODIFIER_SIDES else hotkey.key
    return "+".join([*mods, KEYS[key].xkb])


def session_bus_address(env: Mapping[str, str] | None = None) -> str | None:
    env = os.environ if env is None else env
    address = env.get("DBUS_SESSION_BUS_ADDRESS")
    if address:
        return address
    runtime = env.get("XDG_RUNTIME_DIR") or (f"/run/user/{os.getuid()}" if hasattr(os, "getuid") else "")
    if not runtime:
        return None
    path = os.path.join(runtime, "bus")
    return f"unix:path={path}" if os.path.exists(path) else None


class _Stopped(Exception):
    pass


class PortalBackend(HotkeyBackend):
    name = "portal"

    def __init__(
        self,
        *,
        bus_address: str | None = None,
        app_id: str | None = None,
        descriptions: Mapping[str, str] | None = None,
        parent_window: str = "",
        call_timeout: float = 10.0,
    ) -> None:
        super().__init__()
        self._bus_address = bus_address
        self._app_id = app_id
        self._descriptions = dict(descriptions or {})
        self._parent_window = parent_window
        self._call_timeout = call_timeout
        self._thread: threading.Thread | None = None
        self._router: Any = None
        self._conn: Any = None
        self._owner = ""
        self._session = ""
        self._active: set[str] = set()
        self.bound_triggers: dict[str, str] = {}  # binding name -> the desktop's trigger description
        self.version = 0
        self.repeats_suppressed = 0

    # --- D-Bus plumbing -----------------------------------------------------------------------
    def _address(self) -> str:
        address = self._bus_address or session_bus_address()
        if not address:
            raise HotkeyBackendError("no D-Bus session bus (DBUS_SESSION_BUS_ADDRESS is unset)", backend=self.name)
        return address

    def _connect(self) -> None:
        try:
            from jeepney.io.threading import DBusRouter, open_dbus_connection
        except ImportError as exc:
            raise HotkeyBackendError("the Python package 'jeepney' is not installed", backend=self.name) from exc
        address = self._address()
        try:
            self._conn = open_dbus_connection(bus=address)
        except (OSError, RuntimeError, ValueError, TimeoutError) as exc:
            raise HotkeyBackendError(f"can't connect to the D-Bus session bus: {exc}", backend=self.name) from exc
        self._router = DBusRouter(self._conn)

    def _disconnect(self) -> None:
        router, conn, self._router, self._conn = self._router, self._conn, None, None
        if router is not None:
            router.close()
        if conn is not None:
            conn.close()

    def _call(self, msg: Any) -> tuple:
        from jeepney.wrappers import unwrap_msg

        try:
            reply = self._router.send_and_get_reply(msg, timeout=self._call_timeout)
        except TimeoutError as exc:
            raise HotkeyBackendError(
                f"the desktop portal did not answer within {self._call_timeout:g} s", backend=self.name
            ) from exc
        return unwrap_msg(reply)

    def _portal(self, interface: str, path: str = PORTAL_PATH) -> Any:
        from jeepney import DBusAddress

        return DBusAddress(path, bus_name=PORTAL_BUS, interface=interface)

    def _query_version(self) -> int:
        from jeepney import Properties
        from jeepney.wrappers import DBusErrorResponse

        try:
            (variant,) = self._call(Properties(self._portal(SHORTCUTS_IFACE)).get("version"))
        except DBusErrorResponse as exc:
            if exc.name in _NOT_RUNNING:
                reason = "xdg-desktop-portal is not running on the session bus (is it installed?)"
            elif exc.name in _NO_INTERFACE:
                reason = f"the desktop portal has no GlobalShortcuts interface: {NO_PORTAL_HINT}"
            else:
                reason = f"the desktop portal refused: {exc.name}: {' '.join(map(str, exc.data))}"
            raise HotkeyBackendError(reason, backend=self.name) from exc
        return int(variant[1])

    def _register_app(self) -> None:
        from jeepney import new_method_call
        from jeepney.wrappers import DBusErrorResponse

        msg = new_method_call(self._portal(REGISTRY_IFACE), "Register", "sa{sv}", (self._app_id, {}))
        try:
            self._call(msg)
        except DBusErrorResponse as exc:
            level = logging.DEBUG if exc.name in _NO_INTERFACE | _NOT_RUNNING else logging.WARNING
            log.log(level, "portal host registry: %s %s (continuing without an app id)", exc.name, exc.data)

    # --- availability -------------------------------------------------------------------------
    def is_available(self) -> tuple[bool, str]:
        try:
            self._connect()
            try:
                version = self._query_version()
            finally:
                self._disconnect()
        except HotkeyBackendError as exc:
            return False, str(exc)
        return True, f"desktop portal GlobalShortcuts version {version}"

    # --- session ------------------------------------------------------------------------------
    def _start(self) -> None:
        try:
            import jeepney  # noqa: F401
        except ImportError as exc:
            raise HotkeyBackendError("the Python package 'jeepney' is not installed", backend=self.name) from exc
        self._active = set()
        self.bound_triggers = {}
        self._session = ""
        self._thread = threading.Thread(target=self._run, name="hotkeys-portal", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from jeepney.wrappers import DBusErrorResponse

        try:
            self._connect()
            events = self._subscribe()
            self._create_and_bind(events)
            while not self._stopped.is_set() and self._session:  # the desktop may close the session
                with contextlib.suppress(queue.Empty):
                    self._dispatch(events.get(timeout=0.2))
        except _Stopped:
            pass
        except HotkeyBackendError as exc:
            self._report(str(exc), fatal=True)
        except DBusErrorResponse as exc:
            hint = "" if self._app_id else " (some desktops only answer apps that register an app id)"
            text = " ".join(map(str, exc.data))
            self._report(f"the desktop portal refused the shortcut request: {exc.name}: {text}{hint}", fatal=True)
        except Exception as exc:
            log.exception("portal hotkeys failed")
            self._report(f"the desktop portal connection failed: {type(exc).__name__}: {exc}", fatal=True)
        finally:
            self._close_session()
            self._disconnect()

    def _subscribe(self) -> queue.Queue:
        from jeepney import MatchRule
        from jeepney.bus_messages import message_bus

        if self._app_id:
            self._register_app()  # must precede every other portal call on this connection
        self.version = self._query_version()
        (self._owner,) = self._call(message_bus.GetNameOwner(PORTAL_BUS))
        sender = self._conn.unique_name.lstrip(":").replace(".", "_")
        events: queue.Queue = queue.Queue()
        for fields in (
            {"interface": REQUEST_IFACE, "member": "Response", "path_namespace": f"{PORTAL_PATH}/request/{sender}"},
            {"interface": SHORTCUTS_IFACE, "path": PORTAL_PATH},
            {"interface": SESSION_IFACE, "member": "Closed"},
        ):
            self._router.filter(MatchRule(type="signal", **fields), queue=events)
            self._call(message_bus.AddMatch(MatchRule(type="signal", sender=PORTAL_BUS, **fields)))
        return events

    def _request(self, events: queue.Queue, msg: Any, what: str, timeout: float | None) -> dict:
        """Make a portal call that answers through a Request object; return its results."""
        (handle,) = self._call(msg)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._stopped.is_set():
                raise _Stopped
            if deadline is not None and time.monotonic() > deadline:
                raise HotkeyBackendError(
                    f"the desktop portal did not answer {what} in {timeout:g} s", backend=self.name
                )
            try:
                signal = events.get(timeout=0.2)
            except queue.Empty:
                continue
            if self._is_response(signal, handle):
                response, results = signal.body
                if response == RESPONSE_OK:
                    return {key: value for key, (_sig, value) in results.items()}
                if response == RESPONSE_CANCELLED:
                    raise HotkeyBackendError(
                        f"the desktop's {what} was dismissed, so no portal hotkey is active — start hotkeys again "
                        "to be asked again, or bind `dictation toggle` in the desktop's keyboard settings",
                        backend=self.name,
                    )
                raise HotkeyBackendError(f"the desktop portal failed {what} (response {response})", backend=self.name)
            self._dispatch(signal)

    def _is_response(self, signal: Any, handle: str) -> bool:
        from jeepney.low_level import HeaderFields

        fields = signal.header.fields
        return (
            fields.get(HeaderFields.member) == "Response"
            and fields.get(HeaderFields.path) == handle
            and fields.get(HeaderFields.sender) == self._owner
        )

    def _create_and_bind(self, events: queue.Queue) -> None:
        from jeepney import new_method_call

        portal = self._portal(SHORTCUTS_IFACE)
        token = f"dictation_{secrets.token_hex(6)}"
        options = {"handle_token": ("s", token), "session_handle_token": ("s", token)}
        msg = new_method_call(portal, "CreateSession", "a{sv}", (options,))
        results = self._request(events, msg, "shortcut session request", self._call_timeout)
        self._session = str(results.get("session_handle", ""))
        if not self._session:
            raise HotkeyBackendError("the desktop portal created a session without a handle", backend=self.name)
        shortcuts = [
            (
                name,
                {
                    "description": ("s", self._descriptions.get(name, name)),
                    "preferred_trigger": ("s", portal_trigger(hk)),
                },
            )
            for name, hk in self.bindings.items()
        ]
        options = {"handle_token": ("s", f"dictation_{secrets.token_hex(6)}")}
        body = (self._session, shortcuts, self._parent_window, options)
        msg = new_method_call(portal, "BindShortcuts", "oa(sa{sv})sa{sv}", body)
        # The user may take as long as they like in the consent dialog; stop() still interrupts.
        results = self._request(events, msg, "shortcut dialog", None)
        self._update_triggers(results.get("shortcuts", []))
        missing = [name for name in self.bindings if name not in self.bound_triggers]
        if len(missing) == len(self.bindings):
            raise HotkeyBackendError(
                "the desktop bound none of the shortcuts — assign them in the desktop's shortcut settings",
                backend=self.name,
            )
        self._ready.set()
        if missing:
            names = ", ".join(repr(n) for n in missing)
            self._report(f"the desktop did not bind {names}; assign it in the desktop's shortcut settings", fatal=False)

    def _update_triggers(self, shortcuts: list) -> None:
        for name, props in shortcuts:
            if name in self.bindings:
                self.bound_triggers[name] = str(props.get("trigger_description", ("s", ""))[1])

    def _dispatch(self, signal: Any) -> None:
        from jeepney.low_level import HeaderFields

        fields = signal.header.fields
        if fields.get(HeaderFields.sender) != self._owner:
            return  # anyone on the bus can emit signals; only the portal's count
        member, body = fields.get(HeaderFields.member), signal.body
        if member == "Closed":
            if self._session and fields.get(HeaderFields.path) == self._session:
                self._session = ""
                self._report("the desktop closed the shortcut session; portal hotkeys stopped", fatal=True)
            return
        if not body or body[0] != self._session:
            return  # another session's signal
        if member in ("Activated", "Deactivated"):
            name, pressed = body[1], member == "Activated"
            if name not in self.bindings:
                return
            if pressed == (name in self._active):
                self.repeats_suppressed += pressed
                return
            (self._active.add if pressed else self._active.discard)(name)
            self._emit([(name, pressed)])
        elif member == "ShortcutsChanged":
            self._update_triggers(body[1])

    def _close_session(self) -> None:
        session, self._session = self._session, ""
        if not session or self._router is None:
            return
        from jeepney import new_method_call

        try:
            self._call(new_method_call(self._portal(SESSION_IFACE, session), "Close"))
        except Exception:
            log.debug("closing the portal session failed", exc_info=True)

    def _stop(self) -> None:
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=self._call_timeout + 1)
