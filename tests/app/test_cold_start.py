"""A press in the first moment after launch, below the whole-app test
(tests/e2e/test_cold_start_e2e.py): commands carry their send time and are recorded from it, a
start is answered once the microphone records and says so when audio after the press is missing,
the microphone and the hotkeys are ready before the command socket exists, and a second copy
started meanwhile waits for the first instead of opening the microphone too."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from dictation import ipc
from dictation import takes as takes_module
from dictation.app import commands as commands_module
from dictation.app import controller as controller_module
from dictation.app import hotkey_input, model_lifecycle
from dictation.app import ipc as app_ipc
from dictation.app.ipc import IpcServer
from dictation.config import Settings
from dictation.hotkeys.errors import HotkeyBackendError
from dictation.ipc import claim_instance, send_command, server_name
from dictation.session import Status
from tests.app.controller_fakes import FakeHotkeys, hotkey_chooser
from tests.app.rig import speech
from tests.app.started import stop_started_apps


@pytest.fixture
def runtime(short_tmp, monkeypatch):
    folder = short_tmp  # the socket's path stays under 107 bytes (tests/conftest.py)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(folder))
    return folder


def client(command: str, timeout: float = 5.0) -> tuple[threading.Thread, dict]:
    """`send_command` on a thread (the server needs the Qt loop); the box gets the reply or error."""
    box: dict = {}

    def run():
        box["t0"] = time.monotonic()
        try:
            box["reply"] = send_command(command, timeout=timeout)
        except ipc.IpcError as exc:
            box["error"] = exc
        box["t1"] = time.monotonic()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, box


# --- the request carries its send time; an answer may come later -------------------------------------


def test_the_client_sends_its_monotonic_time_and_the_server_hands_it_on(qtbot, runtime):
    seen = []
    server = IpcServer(lambda command, sent, answer: seen.append((command, sent)) or {"ok": True})
    assert server.listen()
    try:
        thread, box = client("start")
        qtbot.waitUntil(lambda: not thread.is_alive(), timeout=7000)
        assert box["reply"] == {"ok": True}
        [(command, sent)] = seen
        assert command == "start" and box["t0"] <= sent <= box["t1"]  # one clock for both processes
    finally:
        server.close()


@pytest.mark.parametrize("sent", ['"12.5"', "true", "null", "1e999", "[1]"], ids=str)
def test_a_send_time_that_is_not_a_number_is_none(qtbot, runtime, sent):
    seen = []
    server = IpcServer(lambda command, sent, answer: seen.append(sent) or {"ok": True})
    assert server.listen()
    box: dict = {}

    def raw():
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(5)
            s.connect(server_name())
            s.sendall(b'{"command": "status", "sent": ' + sent.encode() + b"}\n")
            box["reply"] = s.recv(4096)

    try:
        thread = threading.Thread(target=raw)
        thread.start()
        qtbot.waitUntil(lambda: not thread.is_alive(), timeout=7000)
        assert json.loads(box["reply"]) == {"ok": True} and seen == [None]
    finally:
        server.close()


def test_a_deferred_answer_reaches_the_client(qtbot, runtime):
    answers = []
    server = IpcServer(lambda command, sent, answer: answers.append(answer))  # answered later
    assert server.listen()
    try:
        thread, box = client("start")
        qtbot.waitUntil(lambda: bool(answers), timeout=7000)
        time.sleep(0.2)
        assert thread.is_alive()  # still waiting for its answer
        answers[0]({"ok": True, "status": "recording", "late_ms": 120})
        answers[0]({"ok": False})  # a second answer goes nowhere
        qtbot.waitUntil(lambda: not thread.is_alive(), timeout=7000)
        assert box["reply"] == {"ok": True, "status": "recording", "late_ms": 120}
    finally:
        server.close()


def test_an_answer_never_given_is_given_by_the_server_before_the_client_gives_up(qtbot, runtime, monkeypatch):
    monkeypatch.setattr(app_ipc, "DEFERRED_LIMIT_S", 0.3)
    server = IpcServer(lambda command, sent, answer: None)
    assert server.listen()
    try:
        thread, box = client("start")
        qtbot.waitUntil(lambda: not thread.is_alive(), timeout=7000)
        assert box["reply"] == {"ok": False, "message": "start: the app did not answer within 0.3 s"}
    finally:
        server.close()


def test_a_socket_about_to_listen_is_waited_for_a_moment(runtime):
    """The app binds its socket, then listens: a `dictation start` sent in between is not refused."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(server_name())  # the socket file exists; connecting is refused until listen()

    def listen_later():
        time.sleep(0.1)
        listener.listen(1)
        conn, _ = listener.accept()
        with conn:
            conn.recv(4096)
            conn.sendall(b'{"ok": true, "status": "recording"}\n')

    thread = threading.Thread(target=listen_later)
    thread.start()
    try:
        assert send_command("start", timeout=5) == {"ok": True, "status": "recording"}
    finally:
        thread.join(10)
        listener.close()
        os.unlink(server_name())


def test_a_socket_nobody_listens_on_is_not_running_after_that_moment(runtime):
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(server_name())  # what a killed app leaves
    try:
        t0 = time.monotonic()
        with pytest.raises(ipc.NotRunning):
            send_command("start", timeout=5)
        assert ipc.REFUSED_RETRY_S <= time.monotonic() - t0 < ipc.REFUSED_RETRY_S + 1.0
    finally:
        listener.close()
        os.unlink(server_name())


# --- the controller: commands recorded from their send time, late or failed starts told -------------


def answered(r, command: str, sent: float | None) -> dict:
    """The controller's answer to ``command``, given at once or later (a start waits for the mic)."""
    box: list[dict] = []
    reply = r.c.handle_ipc(command, sent, box.append)
    if reply is not None:
        return reply
    r.qtbot.waitUntil(lambda: bool(box), timeout=10_000)
    return box[0]


def cancel(r) -> None:
    """Throw the take away and wait until the audio thread has, so nothing records at the teardown."""
    r.c.handle_ipc("cancel")
    r.qtbot.waitUntil(lambda: not r.recorders.recorder.recording, timeout=5000)


def test_start_and_stop_are_recorded_from_the_time_they_were_sent(rig):
    r = rig()
    r.start()
    r.recorders.next_samples(speech())
    sent = r.clock() - 1.2  # the app was busy (starting up) when the command came
    reply = answered(r, "start", sent)
    assert reply["ok"] is True and reply["status"] == "recording"
    assert "late_ms" not in reply and "warning" not in reply
    recorder = r.recorders.recorder
    assert recorder.t_press == sent
    stop_sent = r.clock() - 0.3
    assert r.c.handle_ipc("stop", stop_sent)["ok"]
    r.qtbot.waitUntil(lambda: recorder.t_release is not None, timeout=10_000)
    assert recorder.t_release == stop_sent


@pytest.mark.parametrize("offset", [10.0, -3600.0], ids=["ahead", "an-hour-old"])
def test_a_send_time_off_the_apps_clock_is_replaced_by_the_arrival_time(rig, caplog, offset):
    r = rig()
    r.start()
    r.recorders.next_samples(speech())
    before = r.clock()
    with caplog.at_level(logging.WARNING, logger=controller_module.__name__):
        assert answered(r, "start", before + offset)["ok"] is True
    assert before <= r.recorders.recorder.t_press <= r.clock()
    assert "send time is" in caplog.text and "off this app's clock" in caplog.text
    cancel(r)


def test_a_start_that_begins_after_the_press_is_told_to_the_command_and_the_user(rig):
    r = rig()
    r.start()
    r.recorders.next_samples(speech())
    assert r.c.wait_input_ready(5)  # the recorder exists
    r.recorders.recorder.gap = 0.31  # the microphone was still opening
    reply = answered(r, "start", r.clock())
    assert reply["ok"] is True and reply["status"] == "recording"
    assert reply["late_ms"] == 310
    assert reply["warning"].startswith("The recording began 310 ms after the press (the microphone was not recording")
    assert ("warning", reply["warning"]) in r.notes
    cancel(r)


def test_with_the_microphone_opened_at_each_press_a_late_start_is_answered_but_not_notified(rig, ckpt_untied):
    settings = Settings()
    settings = settings.replace(
        engine=settings.engine.replace(model=str(ckpt_untied), device="cpu"),
        recording=settings.recording.replace(keep_mic_open=False),
    )
    r = rig(settings)
    r.start()
    r.recorders.next_samples(speech())
    assert r.c.wait_input_ready(5)  # the recorder exists
    r.recorders.recorder.gap = 0.2
    reply = answered(r, "start", r.clock())
    assert reply["late_ms"] == 200 and "Keep the microphone open" in reply["warning"]
    assert not [note for note in r.notes if "ms after the press" in note[1]]  # the user chose this
    cancel(r)


def test_a_hotkey_press_before_the_microphone_records_is_told_to_the_user(rig, caplog):
    r = rig()
    r.start()
    assert r.c.wait_input_ready(5)  # the recorder exists
    r.recorders.recorder.gap = 0.5
    audio = speech()
    with caplog.at_level(logging.INFO, logger=takes_module.__name__):  # the take's saved line
        r.hold(audio)
        r.qtbot.waitUntil(lambda: any("500 ms after the press" in message for _, message in r.notes), timeout=5000)
        r.release(audio)
        r.qtbot.waitUntil(lambda: "recording 1 saved: " in caplog.text, timeout=10_000)
    assert "s; it began 0.50 s after the press)" in caplog.text  # the take's own start gap, logged


def test_a_start_the_microphone_refuses_fails_the_command(rig):
    r = rig()
    r.start()
    assert r.c.wait_input_ready(5)  # the recorder exists
    r.recorders.recorder.fail_start = "device unavailable"
    reply = answered(r, "start", r.clock())
    assert reply["ok"] is False
    assert reply["message"] == "Could not start recording: The microphone could not be opened: device unavailable"


def test_a_start_whose_microphone_is_slow_is_answered_in_time(rig, monkeypatch):
    monkeypatch.setattr(commands_module, "START_REPLY_MS", 200)
    r = rig()
    r.start()
    assert r.c.wait_input_ready(5)  # the recorder exists
    recorder = r.recorders.recorder
    recorder.gap_gate = threading.Event()  # its first block does not come
    try:
        reply = answered(r, "start", r.clock())
        assert reply["ok"] is True and reply["status"] == "recording"
        assert reply["warning"].startswith("The microphone was not recording 0.2 s after the press")
    finally:
        recorder.gap_gate.set()
    r.qtbot.waitUntil(lambda: r.sounds.played[-1:] == ["start"], timeout=5000)  # it records after all
    cancel(r)


def test_a_start_discarded_before_it_began_is_answered(rig):
    r = rig()
    r.start()
    assert r.c.wait_input_ready(5)  # the recorder exists
    recorder = r.recorders.recorder
    recorder.gap_gate = threading.Event()  # the audio thread is still starting the take
    box: list[dict] = []
    try:
        assert r.c.handle_ipc("start", r.clock(), box.append) is None
        r.c.handle_ipc("cancel")
        assert box and box[0]["ok"] is True and box[0]["message"] == controller_module.DISCARDED_MESSAGE
    finally:
        recorder.gap_gate.set()
    r.qtbot.waitUntil(lambda: not recorder.recording, timeout=5000)  # the audio thread dropped it
    assert len(box) == 1 and "start" not in r.sounds.played


# --- start-up: the microphone and the hotkeys first ------------------------------------------------


def test_start_input_opens_the_microphone_and_takes_the_hotkeys_before_the_rest(rig, monkeypatch):
    def broken(self):
        raise HotkeyBackendError("the keyboard went away")

    r = rig()
    threads = []
    real = model_lifecycle.engine_options  # what a model load is built with
    monkeypatch.setattr(
        model_lifecycle,
        "engine_options",
        lambda *args, **kwargs: threads.append(threading.current_thread()) or real(*args, **kwargs),
    )
    r.c.start_input()
    assert r.c.wait_input_ready(5)
    assert r.recorders.recorder.opened and r.hotkeys.running
    assert r.c.session.model_state.value == "loading" and not threads  # the model comes later
    r.start()
    r.qtbot.waitUntil(lambda: bool(threads), timeout=10_000)
    assert threads[0] is not threading.main_thread()  # torch is imported on the engine's thread
    r.wait_status(Status.IDLE)


def test_notes_from_before_the_windows_exist_are_shown_once_they_do(rig, monkeypatch):
    monkeypatch.setattr(FakeHotkeys, "_start", lambda self: (_ for _ in ()).throw(HotkeyBackendError("no keyboard")))
    r = rig()
    r.c.start_input()
    assert r.notes == []  # no tray yet to show it
    r.start()
    assert ("error", "Global hotkeys could not start (fake): no keyboard") in r.notes


# --- the real start-up code ------------------------------------------------------------------------


@pytest.fixture
def app_start(qtbot, runtime, monkeypatch):
    """`dictation.app.main.start()` in this process, shut down afterwards."""
    import signal

    from dictation.app import main as app_main

    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    started = []

    def run():
        app = app_main.start()
        if not isinstance(app, int):
            started.append(app)
        return app

    yield run
    stop_started_apps(started, handlers)


def test_the_socket_exists_only_once_the_microphone_and_the_hotkeys_are_ready(app_start, monkeypatch):
    hotkeys = FakeHotkeys()
    monkeypatch.setattr(hotkey_input, "default_hotkey_chooser", hotkey_chooser(hotkeys))
    seen = {}
    real_listen = IpcServer.listen

    def listen(self):
        controller = self.handler.__self__  # the controller answers from the first request on
        audio = controller._s.audio_worker
        seen.update(configured=audio.wait_configured(0), hotkeys=hotkeys.running)
        return real_listen(self)

    monkeypatch.setattr(IpcServer, "listen", listen)
    app = app_start()
    assert not isinstance(app, int)
    assert seen["configured"] and seen["hotkeys"]


def test_a_second_copy_waits_for_a_first_that_is_still_starting(app_start, qtbot, capsys):
    first = claim_instance()  # a first app that has not claimed its socket yet
    assert first is not None
    path = server_name()
    requests = []

    def serve_later():
        time.sleep(0.5)  # the first one's microphone and hotkeys take a moment
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
            listener.bind(path)
            listener.listen(1)
            conn, _ = listener.accept()
            with conn:
                requests.append(json.loads(conn.recv(4096).split(b"\n")[0]))
                conn.sendall(b'{"ok": true}\n')

    server = threading.Thread(target=serve_later)
    server.start()
    try:
        assert app_start() == 0
    finally:
        server.join(10)
        os.unlink(path)
        first.release()
    assert [r["command"] for r in requests] == ["show-settings"]
    assert "already running" in capsys.readouterr().err


def test_a_first_copy_that_never_answers_is_reported(app_start, monkeypatch, capsys):
    from dictation.app import main as app_main

    monkeypatch.setattr(app_main, "FORWARD_WAIT_S", 0.3)
    first = claim_instance()
    try:
        assert app_start() == 1
    finally:
        first.release()
    assert "another dictation is starting but did not answer within 0.3 s" in capsys.readouterr().err


# --- the instance lock -------------------------------------------------------------------------------


def test_the_instance_lock_is_held_by_one_process_at_a_time(runtime, tmp_path):
    lock = claim_instance()
    assert lock is not None and claim_instance() is None  # a second open file of this process too
    assert os.stat(lock.path).st_mode & 0o777 == 0o600
    code = "from dictation.ipc import claim_instance; print(claim_instance() is None)"
    env = {**os.environ}
    other = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert other.stdout.strip() == "True", other.stderr
    lock.release()
    again = claim_instance()
    assert again is not None
    again.release()


def test_a_killed_holder_leaves_the_lock_free(runtime):
    code = (
        "import time; from dictation.ipc import claim_instance; "
        "lock = claim_instance(); print(lock is not None, flush=True); time.sleep(60)"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=dict(os.environ))
    try:
        assert holder.stdout.readline().strip() == "True"
        assert claim_instance() is None
    finally:
        holder.kill()
        holder.wait(10)
    lock = claim_instance()
    assert lock is not None
    lock.release()


def test_a_link_in_place_of_the_lock_file_is_refused(runtime, tmp_path):
    target = tmp_path / "elsewhere"
    target.write_text("")
    (ipc.socket_dir() / "instance.lock").symlink_to(target)
    with pytest.raises(ipc.IpcError, match="instance lock"):
        claim_instance()


# --- the command line says what the app answered -----------------------------------------------------


def serve_once(reply: dict) -> tuple[threading.Thread, list[dict]]:
    """A stand-in app on the socket: answers one request with ``reply``; the requests it got."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(server_name())
    listener.listen(1)
    got: list[dict] = []

    def serve():
        with listener:
            conn, _ = listener.accept()
            with conn:
                got.append(json.loads(conn.recv(4096).split(b"\n")[0]))
                conn.sendall((json.dumps(reply) + "\n").encode())

    thread = threading.Thread(target=serve)
    thread.start()
    return thread, got


def test_the_cli_prints_a_late_starts_warning_and_succeeds(runtime):
    warning = "The recording began 310 ms after the press (the microphone was not recording yet): words …"
    server, got = serve_once({"ok": True, "status": "recording", "late_ms": 310, "warning": warning})
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "dictation", "start"], capture_output=True, text=True, timeout=60, env=dict(os.environ)
    )
    server.join(10)
    os.unlink(server_name())
    assert proc.returncode == 0
    assert proc.stderr == f"dictation: warning: {warning}\n"
    assert got[0]["command"] == "start" and t0 < got[0]["sent"] < time.monotonic()


def test_the_cli_fails_when_the_microphone_cannot_record(runtime):
    message = "Could not start recording: The microphone could not be opened: device unavailable"
    server, _ = serve_once({"ok": False, "message": message})
    proc = subprocess.run(
        [sys.executable, "-m", "dictation", "start"], capture_output=True, text=True, timeout=60, env=dict(os.environ)
    )
    server.join(10)
    os.unlink(server_name())
    assert proc.returncode == 1 and proc.stderr == f"dictation: error: {message}\n"
