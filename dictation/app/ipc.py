"""The app's side of `dictation toggle | start | stop | cancel | status` and of single-instance.

`IpcServer.listen()` claims the per-user socket named by `dictation.ipc.server_name()`. When another
instance already answers there, it returns False and the caller forwards its request (a second
`dictation` asks the first to show its settings window) and exits. A socket file left behind by a
crashed app answers nothing; it is removed and claimed.

Each connection sends one JSON line and gets one JSON line back (`dictation.ipc` describes the
protocol). The handler, ``handler(command, sent, answer)``, runs on the GUI thread and must return
at once: it only feeds events to the session. ``sent`` is the client's monotonic send time (None
when the request had none or not a number). It returns the reply, or None to answer later through
``answer(reply)`` (a `start` is answered once the recording has begun); a reply not given within
`DEFERRED_LIMIT_S` is given by the server, so no client waits for its own timeout. Sockets are
user-only: the folder is 0700 and the server uses UserAccessOption on Windows.

A client that sends no request line within `IDLE_LIMIT_S` is dropped, and at most `MAX_WAITING`
connections wait for their request: a new one beyond that drops the oldest. So idle clients (a
stuck script, a hundred of them) never lock out the one that asks something, nor use up the app's
file descriptors.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import weakref
from collections.abc import Callable

import shiboken6
from PySide6.QtCore import QObject, QTimer
from PySide6.QtNetwork import QLocalServer, QLocalSocket

from dictation.ipc import IpcError, NotRunning, send_command, server_name

log = logging.getLogger(__name__)

Answer = Callable[[dict], None]
Handler = Callable[[str, "float | None", Answer], "dict | None"]
_MAX_REQUEST = 64 * 1024
DEFERRED_LIMIT_S = 2.5  # under the client's default timeout (3 s)
IDLE_LIMIT_S = 3.0  # a client sends its request at once (dictation.ipc.send_command); one that does not is dropped
MAX_WAITING = 32  # connections waiting for their request line; a new one beyond drops the oldest


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
        self._waiting: list[QLocalSocket] = []  # connected, no request line yet: oldest first

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
        # What a connection holds (its slots, its timers, the `answer` handed to the handler) refers to
        # this server weakly. Qt frees those when it destroys the connection; a strong reference there
        # could be this server's last one when nothing else holds it (a caller that closed and dropped
        # it while a connection's deleteLater was pending). The server would then be freed in the middle
        # of its child's destructor, and delete that child a second time (a segmentation fault).
        me = weakref.ref(self)
        while (conn := self._server.nextPendingConnection()) is not None:
            conn.setParent(self)
            buffer = bytearray()

            def on_ready(conn: QLocalSocket = conn, buffer: bytearray = buffer) -> None:
                buffer += bytes(conn.readAll().data())
                if b"\n" in buffer or len(buffer) > _MAX_REQUEST:
                    conn.readyRead.disconnect()
                    if (server := me()) is not None:
                        server._forget(conn)
                        server._answer(conn, bytes(buffer).split(b"\n", 1)[0])

            def forget(conn: QLocalSocket = conn) -> None:
                if (server := me()) is not None:
                    server._forget(conn)

            def drop_idle(conn: QLocalSocket = conn) -> None:
                if (server := me()) is not None:
                    server._drop(conn, "idle")

            self._waiting.append(conn)
            conn.readyRead.connect(on_ready)
            conn.disconnected.connect(forget)
            conn.disconnected.connect(conn.deleteLater)
            QTimer.singleShot(round(IDLE_LIMIT_S * 1000), conn, drop_idle)
            if conn.bytesAvailable():
                on_ready()
        while len(self._waiting) > MAX_WAITING:
            self._drop(self._waiting[0], "too many connections waiting")

    def _forget(self, conn: QLocalSocket) -> None:
        if conn in self._waiting:
            self._waiting.remove(conn)

    def _drop(self, conn: QLocalSocket, why: str) -> None:
        """Close a connection that sent no request (yet): idle too long, or the oldest of too many."""
        if conn not in self._waiting:
            return  # its request came: it is answered (and closed) by `_answer`
        self._waiting.remove(conn)
        log.debug("dropped a command connection that sent no request (%s)", why)
        conn.abort()  # disconnected -> deleteLater

    def _answer(self, conn: QLocalSocket, line: bytes) -> None:
        try:
            request = json.loads(line.decode("utf-8"))
            command = request["command"]
            if not isinstance(command, str):
                raise TypeError
        except (UnicodeDecodeError, ValueError, KeyError, TypeError, RecursionError):
            # RecursionError: JSON nested deeper than the parser's recursion limit ("[[[[...").
            _reply(conn, {"ok": False, "message": 'bad request: expected one JSON line {"command": ...}'})
            return
        sent = request.get("sent")
        if isinstance(sent, bool) or not isinstance(sent, (int, float)) or not math.isfinite(sent):
            sent = None
        answered = False

        def answer(reply: dict) -> None:
            nonlocal answered
            if not answered and shiboken6.isValid(conn):  # the client may have gone meanwhile
                answered = True
                _reply(conn, reply)  # not self's: this closure may outlive the server (see _accept)

        try:
            reply = self.handler(command, sent, answer)
        except Exception as exc:  # a handler bug must not kill the server; the client hears it
            log.exception("IPC command %r failed", command)
            reply = {"ok": False, "message": f"{command} failed: {exc}"}
        if reply is not None:
            answer(reply)
            return
        late = {"ok": False, "message": f"{command}: the app did not answer within {DEFERRED_LIMIT_S:g} s"}
        QTimer.singleShot(round(DEFERRED_LIMIT_S * 1000), conn, lambda: answer(late))


def _reply(conn: QLocalSocket, reply: dict) -> None:
    conn.write((json.dumps(reply, ensure_ascii=False) + "\n").encode("utf-8"))
    conn.flush()
    conn.disconnectFromServer()
