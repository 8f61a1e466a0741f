"""An in-process stand-in for xdg-desktop-portal's GlobalShortcuts, served on a private bus with jeepney.

It owns org.freedesktop.portal.Desktop and implements what PortalBackend uses: the `version`
property, host Registry.Register, CreateSession / BindShortcuts answering through Request::Response
signals (with the request path built from the caller's unique name and handle_token, as the real
portal does), Session.Close, and test hooks to emit Activated / Deactivated / Closed signals.
"""

from __future__ import annotations

import queue
import threading
from typing import Any

from jeepney import DBusAddress, MatchRule, new_error, new_method_return, new_signal
from jeepney.bus_messages import message_bus
from jeepney.io.threading import DBusRouter, Proxy, open_dbus_connection
from jeepney.low_level import HeaderFields

from dictation.hotkeys.portal import (
    PORTAL_BUS,
    PORTAL_PATH,
    REGISTRY_IFACE,
    REQUEST_IFACE,
    SESSION_IFACE,
    SHORTCUTS_IFACE,
)

PROPERTIES_IFACE = "org.freedesktop.DBus.Properties"
UNKNOWN_METHOD = "org.freedesktop.DBus.Error.UnknownMethod"
UNKNOWN_INTERFACE = "org.freedesktop.DBus.Error.UnknownInterface"


class FakePortal:
    def __init__(
        self,
        address: str,
        *,
        version: int = 2,
        has_shortcuts: bool = True,
        registry: bool = True,
        answer_bind: bool = True,
        bind_response: int = 0,
        bind_only: set[str] | None = None,
        triggers: dict[str, str] | None = None,
        bind_error: str | None = None,
    ) -> None:
        self.address = address
        self.version = version
        self.has_shortcuts = has_shortcuts
        self.registry = registry
        self.answer_bind = answer_bind
        self.bind_response = bind_response
        self.bind_only = bind_only
        self.triggers = triggers or {}
        self.bind_error = bind_error
        self.calls: list[tuple[str, tuple]] = []
        self.sessions: list[str] = []
        self.closed_sessions: list[str] = []
        self.bound: list[tuple[str, list]] = []  # (session, shortcuts) per BindShortcuts call
        self._pending: tuple[str, list] | None = None  # (request path, shortcuts) awaiting consent
        self._stop = threading.Event()

    # --- lifecycle ----------------------------------------------------------------------------
    def __enter__(self) -> FakePortal:
        self.conn = open_dbus_connection(bus=self.address)
        self.router = DBusRouter(self.conn)
        self.unique_name = self.conn.unique_name
        self._calls: queue.Queue = queue.Queue()
        self.router.filter(MatchRule(type="method_call"), queue=self._calls)
        (result,) = Proxy(message_bus, self.router, timeout=10).RequestName(PORTAL_BUS, 4)
        assert result == 1, f"could not own {PORTAL_BUS}: {result}"
        self._thread = threading.Thread(target=self._serve, name="fake-portal", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.router.close()
        self.conn.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                msg = self._calls.get(timeout=0.05)
            except queue.Empty:
                continue
            self._handle(msg)

    # --- method calls -------------------------------------------------------------------------
    def _reply(self, msg: Any, signature: str | None = None, body: tuple = ()) -> None:
        self.router.send(new_method_return(msg, signature, body))

    def _error(self, msg: Any, name: str, text: str) -> None:
        self.router.send(new_error(msg, name, "s", (text,)))

    def _request_path(self, sender: str, token: str) -> str:
        return f"{PORTAL_PATH}/request/{sender.lstrip(':').replace('.', '_')}/{token}"

    def _handle(self, msg: Any) -> None:
        fields = msg.header.fields
        iface, member = fields.get(HeaderFields.interface), fields.get(HeaderFields.member)
        path, sender = fields.get(HeaderFields.path), fields.get(HeaderFields.sender)
        self.calls.append((member, msg.body))
        if iface == PROPERTIES_IFACE and member == "Get":
            if msg.body == (SHORTCUTS_IFACE, "version") and self.has_shortcuts:
                self._reply(msg, "v", (("u", self.version),))
            else:
                self._error(msg, UNKNOWN_INTERFACE, f"No such interface {msg.body[0]}")
        elif iface == REGISTRY_IFACE and member == "Register" and self.registry:
            self._reply(msg)
        elif iface == SHORTCUTS_IFACE and member == "CreateSession" and self.has_shortcuts:
            options = msg.body[0]
            request = self._request_path(sender, options["handle_token"][1])
            session = (
                f"{PORTAL_PATH}/session/{sender.lstrip(':').replace('.', '_')}/{options['session_handle_token'][1]}"
            )
            self.sessions.append(session)
            self._reply(msg, "o", (request,))
            self._response(request, 0, {"session_handle": ("s", session)})
        elif iface == SHORTCUTS_IFACE and member == "BindShortcuts" and self.bind_error:
            self._error(msg, self.bind_error, "An app id is required")
        elif iface == SHORTCUTS_IFACE and member == "BindShortcuts" and self.has_shortcuts:
            session, shortcuts, _parent, options = msg.body
            request = self._request_path(sender, options["handle_token"][1])
            self.bound.append((session, shortcuts))
            self._pending = (request, shortcuts)
            self._reply(msg, "o", (request,))
            if self.answer_bind:
                self.answer(self.bind_response)
        elif iface == SESSION_IFACE and member == "Close":
            self.closed_sessions.append(path)
            self._reply(msg)
        else:
            self._error(msg, UNKNOWN_METHOD, f"No such method {iface}.{member}")

    # --- signals ------------------------------------------------------------------------------
    def _signal(self, path: str, iface: str, member: str, signature: str, body: tuple) -> None:
        self.router.send(new_signal(DBusAddress(path, interface=iface), member, signature, body))

    def _response(self, request: str, response: int, results: dict) -> None:
        self._signal(request, REQUEST_IFACE, "Response", "ua{sv}", (response, results))

    def answer(self, response: int = 0) -> None:
        """The user's answer in the consent dialog (0 accept, 1 dismissed)."""
        assert self._pending is not None, "no BindShortcuts call is waiting"
        request, shortcuts = self._pending
        self._pending = None
        bound = [
            (name, {"description": props["description"], "trigger_description": ("s", self._trigger(name, props))})
            for name, props in shortcuts
            if self.bind_only is None or name in self.bind_only
        ]
        self._response(request, response, {"shortcuts": ("a(sa{sv})", bound)} if response == 0 else {})

    def _trigger(self, name: str, props: dict) -> str:
        return self.triggers.get(name) or props.get("preferred_trigger", ("s", ""))[1]

    @property
    def waiting_for_consent(self) -> bool:
        return self._pending is not None

    def activate(self, shortcut: str, session: str | None = None) -> None:
        self._signal(
            PORTAL_PATH, SHORTCUTS_IFACE, "Activated", "osta{sv}", (session or self.sessions[-1], shortcut, 1, {})
        )

    def deactivate(self, shortcut: str, session: str | None = None) -> None:
        self._signal(
            PORTAL_PATH, SHORTCUTS_IFACE, "Deactivated", "osta{sv}", (session or self.sessions[-1], shortcut, 2, {})
        )

    def close_session(self) -> None:
        self._signal(self.sessions[-1], SESSION_IFACE, "Closed", "a{sv}", ({},))
