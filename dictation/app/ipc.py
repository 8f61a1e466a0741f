"""The app's side of `dictation toggle | start | stop | cancel | status` and of single-instance.

`IpcServer.listen()` claims the per-user socket named by `dictation.ipc.server_name()`. When another
instance already answers there, it returns False and the caller forwards its request (a second
`dictation` asks the first to show its settings window) and exits. A socket file left behind by a
crashed app answers nothing; it is removed and claimed.

Each connection sends one JSON line and gets one JSON line back (`dictation.ipc` describes the
protocol). The handler runs on the GUI thread and must return at once: it only feeds events to
the session. Sockets are user-only: the folder is 0700 and the server uses UserAccessOption on Windows.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable

from PySide6.QtCore import QObject
from PySide6.QtNetwork import QLocalServer, QLocalSocket

from dictation.ipc import IpcError, NotRunning, send_command, server_name

log = logging.getLogger(__name__)

Handler = Callable[[str], dict]
_MAX_REQUEST = 64 * 1024


class IpcServer(QObject):
    def __init__(self, handler: Handler, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.handler = handler  # replaceable: the app sets its controller's once it exists
        self._server = QLocalServer(self)
        if sys.platform == "win32":  # pragma: no cover - the pipe's ACL; on POSIX the 0700 folder does it
            # (On POSIX this option makes Qt rename its socket over an existing one, which would
            # silently steal the socket of a running instance.)
            self._server.setSocketOptions(QLocalServer.SocketOption.UserAccessOption)
        self._server.newConnection.connect(self._accept)
        self.name = ""

    def listen(self) -> bool:
        """Claim the socket; False when another instance is running (it answered a status request)."""
        self.name = server_name()
        if self._server.listen(self.name):
            log.info("listening for commands on %s", self.name)
            return True
        try:
            send_command("status", timeout=2.0)
            return False
        except NotRunning:
            pass
        except IpcError as exc:
            log.warning("a stale or unresponsive app socket at %s (%s); taking it over", self.name, exc)
        QLocalServer.removeServer(self.name)
        if not self._server.listen(self.name):
            raise IpcError(f"cannot listen on {self.name}: {self._server.errorString()}")
        log.info("listening for commands on %s (removed a stale socket)", self.name)
        return True

    def close(self) -> None:
        if self._server.isListening():
            self._server.close()

    def _accept(self) -> None:
        while (conn := self._server.nextPendingConnection()) is not None:
            conn.setParent(self)
            buffer = bytearray()

            def on_ready(conn: QLocalSocket = conn, buffer: bytearray = buffer) -> None:
                buffer += bytes(conn.readAll().data())
                if b"\n" in buffer or len(buffer) > _MAX_REQUEST:
                    conn.readyRead.disconnect()
                    self._answer(conn, bytes(buffer).split(b"\n", 1)[0])

            conn.readyRead.connect(on_ready)
            conn.disconnected.connect(conn.deleteLater)
            if conn.bytesAvailable():
                on_ready()

    def _answer(self, conn: QLocalSocket, line: bytes) -> None:
        try:
            request = json.loads(line.decode("utf-8"))
            command = request["command"]
            if not isinstance(command, str):
                raise TypeError
        except (UnicodeDecodeError, ValueError, KeyError, TypeError, RecursionError):
            # RecursionError: JSON nested deeper than the parser's recursion limit ("[[[[...").
            reply = {"ok": False, "message": 'bad request: expected one JSON line {"command": ...}'}
        else:
            try:
                reply = self.handler(command)
            except Exception as exc:  # a handler bug must not kill the server; the client hears it
                log.exception("IPC command %r failed", command)
                reply = {"ok": False, "message": f"{command} failed: {exc}"}
        conn.write((json.dumps(reply, ensure_ascii=False) + "\n").encode("utf-8"))
        conn.flush()
        conn.disconnectFromServer()
