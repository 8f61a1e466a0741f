"""The app's subcommands: the tray app itself (`dictation` with no command), the requests to the
running app (`dictation toggle|start|stop|cancel|status|quit`, through dictation.ipc), and the
commands about this computer: `devices`, `doctor`, `install-desktop`. Qt is imported only when the app
starts."""

from __future__ import annotations

import argparse
import json
import logging
import sys

from dictation.cli.terminal import fail


def cmd_devices(args: argparse.Namespace) -> int:
    from dictation.audio.devices import AudioDeviceError, format_devices, list_input_devices

    try:
        print(format_devices(list_input_devices()))
    except AudioDeviceError as exc:
        return fail(str(exc))
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from dictation.doctor import main as doctor_main

    return doctor_main(as_json=args.json)


def cmd_install_desktop(args: argparse.Namespace) -> int:
    from dictation import desktop

    try:
        report = desktop.uninstall() if args.uninstall else desktop.install(systemd=args.systemd)
    except OSError as exc:
        return fail(str(exc))
    print("\n".join(report))
    return 0


def cmd_app(args: argparse.Namespace) -> int:
    from dictation import launch

    logging.getLogger().handlers.clear()  # the app logs to its own file, stderr and log view
    early = launch.begin()  # the hotkey and the microphone, before Qt and torch (dictation.launch)
    try:
        from dictation.app.main import run
    except ImportError as exc:
        early.close()
        from dictation import preflight

        problem = preflight.import_problem(exc)  # a system library of Qt's is missing (libEGL.so.1, ...)
        if problem:
            return preflight.refuse_to_start(problem)
        return fail(f"the desktop app needs PySide6 (pip install PySide6-Essentials): {exc}")
    return run(verbose=args.verbose, early=early)


def cmd_remote(args: argparse.Namespace) -> int:
    """`dictation toggle|start|stop|cancel|status|quit`: one request to the running app."""
    from dictation.ipc import IpcError, NotRunning, send_command

    as_json = args.command == "status" and args.json
    try:
        reply = send_command(args.command)
    except IpcError as exc:
        if as_json:  # the socket the app would listen on, for scripts and bug reports
            running = False if isinstance(exc, NotRunning) else None  # None: there, but not answering
            print(json.dumps({"ok": False, "running": running, "message": str(exc), "socket": _socket()}))
        return fail(str(exc))
    if not reply.get("ok"):
        return fail(str(reply.get("message") or f"the app refused {args.command!r}"))
    if reply.get("warning"):  # e.g. a start the microphone could not honour from the press on
        print(f"dictation: warning: {reply['warning']}", file=sys.stderr)
    if args.command == "status":
        if as_json:
            print(json.dumps({**reply, "running": True, "socket": _socket()}, ensure_ascii=False))
        else:
            model = reply.get("model") or f"not loaded ({reply.get('model_state', '?')})"
            paused = " (paused)" if reply.get("hotkeys_paused") else ""
            print(f"status: {reply.get('status')}\nmodel: {model}\nhotkeys: {reply.get('hotkeys')}{paused}")
            for problem in reply.get("hotkey_problems") or ():
                print(f"hotkey problem: {problem}")
    return 0


def _socket() -> str | None:
    from dictation.ipc import IpcError, socket_path

    try:
        return socket_path()
    except IpcError:
        return None  # no private folder for it: the message says why
