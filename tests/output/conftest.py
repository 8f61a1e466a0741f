"""A real X display (Xvfb) and a real target window for the output tests.

The tools are required, not optional: a missing Xvfb/xdotool/xclip/xsel/xprop or PySide6 fails
these tests (CI installs them: apt xvfb xdotool xclip xsel x11-utils x11-xserver-utils + the libxcb
bits Qt needs).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.waiting import wait_until

REQUIRED_TOOLS = ("Xvfb", "xdotool", "xclip", "xsel", "xprop", "xmodmap")
TARGET_APP = Path(__file__).with_name("target_app.py")
TARGET_TITLE = "dictation-output-target"


def _stop(proc: subprocess.Popen, timeout: float = 5.0) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)


@pytest.fixture(scope="session")
def xvfb(tmp_path_factory):
    """Start Xvfb on a free display (-displayfd); yields the environment for X11 clients."""
    missing = [tool for tool in REQUIRED_TOOLS if shutil.which(tool) is None]
    if missing:
        pytest.fail(
            f"missing {', '.join(missing)}: apt-get install xvfb xdotool xclip xsel x11-utils x11-xserver-utils"
        )
    with running_xvfb(tmp_path_factory.mktemp("xvfb") / "xvfb.log") as display:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("WAYLAND_", "XDG_SESSION", "XDG_CURRENT"))}
        env.update(DISPLAY=display, XDG_SESSION_TYPE="x11", QT_QPA_PLATFORM="xcb")
        env.pop("SWAYSOCK", None)
        env.pop("HYPRLAND_INSTANCE_SIGNATURE", None)
        wait_until(lambda: _run(env, "xdotool", "getmouselocation").returncode == 0, 10, what="X server")
        yield env


@contextlib.contextmanager
def running_xvfb(log_path: Path, screen: str = "1280x800x24") -> Iterator[str]:
    """Xvfb on a free display number (-displayfd), stopped on exit; yields its DISPLAY (":N")."""
    read_fd, write_fd = os.pipe()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            ["Xvfb", "-displayfd", str(write_fd), "-screen", "0", screen, "-nolisten", "tcp"],
            pass_fds=(write_fd,),
            stdout=log,
            stderr=log,
        )
    os.close(write_fd)
    try:
        # Xvfb writes the display number once it accepts connections.
        ready, _, _ = select.select([read_fd], [], [], 20)
        number = os.read(read_fd, 64).decode().strip() if ready else ""
        if not number.isdigit():
            pytest.fail(f"Xvfb did not start: {log_path.read_text(errors='replace')[-500:]}")
        yield f":{number}"
    finally:
        os.close(read_fd)
        _stop(proc)


def _run(env, *argv, input: bytes | None = None, timeout: float = 10) -> subprocess.CompletedProcess:
    if input is None:
        return subprocess.run(argv, env=env, capture_output=True, timeout=timeout, check=False)
    # xclip/xsel fork a selection owner that keeps any pipe open: no pipes on output (e2e pitfall 4).
    return subprocess.run(
        argv, env=env, input=input, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=timeout, check=False
    )


def read_lines(stream, timeout: float, pending: bytearray) -> Iterator[str]:
    """Lines from a child's stdout pipe as they come, until `timeout` or the end of the output.

    Reads the file descriptor itself: a buffered `readline()` after `select()` can swallow a second
    line that came in the same read (the target's Qt warning, then "ok clear"), and `select()` then
    waits for input that already arrived. `pending` keeps a partial line for the next call."""
    fd = stream.fileno()
    end = time.monotonic() + timeout
    while True:
        while b"\n" in pending:
            line, _, rest = bytes(pending).partition(b"\n")
            pending[:] = rest
            yield line.decode("utf-8", "replace") + "\n"
        ready, _, _ = select.select([fd], [], [], max(0.0, end - time.monotonic()))
        data = os.read(fd, 65536) if ready else b""
        if not data:
            return
        pending += data


class Target:
    """The target window process: read what arrived, clear it, give it focus."""

    def __init__(self, env, out: Path):
        self.env = env
        self.out = out
        self.proc = subprocess.Popen(
            [sys.executable, str(TARGET_APP), str(out)],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            encoding="utf-8",
        )
        self._pending = bytearray()  # read from stdout, not yet a whole line
        self._expect("READY", 30)
        found = wait_until(self._search, 15, what="the target window")
        self.window = found.split()[0]

    def _search(self) -> str:
        result = _run(self.env, "xdotool", "search", "--name", f"^{TARGET_TITLE}$")
        return result.stdout.decode().strip() if result.returncode == 0 else ""

    def _expect(self, line: str, timeout: float) -> None:
        seen = []
        for got in read_lines(self.proc.stdout, timeout, self._pending):
            seen.append(got)
            if got.strip() == line:
                return
        pytest.fail(f"target app did not answer {line!r}; output: {''.join(seen)[-2000:]}")

    def command(self, command: str) -> None:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        self._expect(f"ok {command}", 15)

    def text(self) -> str:
        try:
            return self.out.read_text(encoding="utf-8")
        except FileNotFoundError:
            return ""

    def wait_for_text(self, expected: str, timeout: float = 15) -> str:
        """Poll until the field holds `expected`; returns what it holds either way, for the assert."""
        end = time.monotonic() + timeout
        while time.monotonic() < end and self.text() != expected:
            time.sleep(0.05)
        time.sleep(0.2)  # let late keys arrive, so a duplicate or extra character is caught too
        return self.text()

    def focused(self) -> bool:
        result = _run(self.env, "xdotool", "getwindowfocus")
        return result.stdout.decode().strip() == self.window

    def reset(self) -> None:
        """Empty field, focused, the default window class."""
        self.set_class("target_app.py")
        self.command("clear")
        if not self.focused():
            _run(self.env, "xdotool", "windowfocus", "--sync", self.window)
        wait_until(self.focused, 10, what="focus on the target window")
        wait_until(lambda: self.text() == "", 10, what="the field to clear")

    def set_class(self, name: str) -> None:
        _run(self.env, "xdotool", "set_window", "--classname", name, "--class", name, self.window)

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        _stop(self.proc)
        self.proc.stdout.close()


@pytest.fixture(scope="session")
def target_session(xvfb, tmp_path_factory):
    try:
        import PySide6  # noqa: F401  (the target window needs it)
    except ImportError:
        pytest.fail("PySide6 is needed for the target window: pip install PySide6-Essentials")
    target = Target(xvfb, tmp_path_factory.mktemp("target") / "text.txt")
    yield target
    target.close()


@pytest.fixture
def target(target_session):
    target_session.reset()
    return target_session


class WaylandTarget(Target):
    """The same target app as a native Wayland client of the headless sway."""

    def _node(self) -> dict | None:
        result = _run(self.env, "swaymsg", "-t", "get_tree")
        if result.returncode != 0:
            return None
        stack = [json.loads(result.stdout)]
        while stack:
            node = stack.pop()
            if node.get("name") == TARGET_TITLE and node.get("type") in ("con", "floating_con"):
                return node
            stack.extend(node.get("nodes", []) + node.get("floating_nodes", []))
        return None

    def _search(self) -> str:
        node = self._node()
        return str(node["id"]) if node else ""

    def focused(self) -> bool:
        node = self._node()
        return bool(node and node.get("focused"))

    def reset(self) -> None:
        self.command("clear")
        if not self.focused():
            _run(self.env, "swaymsg", f"[con_id={self.window}]", "focus")
        wait_until(self.focused, 10, what="focus on the target window")
        wait_until(lambda: self.text() == "", 10, what="the field to clear")


SWAY_TOOLS = ("sway", "swaymsg", "wtype", "wl-copy", "wl-paste")


@pytest.fixture(scope="session")
def sway():
    """A headless sway (wlroots) compositor; yields the environment for its Wayland clients.

    sway refuses to run as root, so under root (CI) it runs as nobody, with a runtime directory
    that nobody owns (root clients can still reach its sockets)."""
    missing = [tool for tool in SWAY_TOOLS if shutil.which(tool) is None]
    if missing:
        pytest.fail(f"missing {', '.join(missing)}: apt-get install sway wtype wl-clipboard")
    runtime = Path(tempfile.mkdtemp(prefix="dictation-wl-"))
    (runtime / "config").write_text("xwayland disable\noutput HEADLESS-1 resolution 1280x800\n")
    argv = ["sway", "-c", str(runtime / "config")]
    if os.geteuid() == 0:
        os.chown(runtime, 65534, 65534)
        argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *argv]
    base = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "SWAYSOCK")}
    base.update(XDG_RUNTIME_DIR=str(runtime), HOME=str(runtime))
    compositor_env = {**base, "WLR_BACKENDS": "headless", "WLR_LIBINPUT_NO_DEVICES": "1", "WLR_RENDERER": "pixman"}
    with open(runtime / "sway.log", "wb") as log:
        proc = subprocess.Popen(argv, env=compositor_env, stdout=log, stderr=log, start_new_session=True)
    try:

        def sockets():
            names = os.listdir(runtime)
            wayland = [n for n in names if n.startswith("wayland-") and not n.endswith(".lock")]
            ipc = [n for n in names if n.startswith("sway-ipc")]
            return (wayland[0], str(runtime / ipc[0])) if wayland and ipc else None

        display, ipc = wait_until(lambda: proc.poll() is None and sockets(), 15, what="sway's sockets")
        env = {**base, "WAYLAND_DISPLAY": display, "SWAYSOCK": ipc, "XDG_SESSION_TYPE": "wayland"}
        env.update(XDG_CURRENT_DESKTOP="sway", QT_QPA_PLATFORM="wayland")
        wait_until(lambda: _run(env, "swaymsg", "-t", "get_version").returncode == 0, 10, what="sway IPC")
        yield env
    finally:
        _stop(proc)
        shutil.rmtree(runtime, ignore_errors=True)


@pytest.fixture(scope="session")
def wl_target_session(sway, tmp_path_factory):
    target = WaylandTarget(sway, tmp_path_factory.mktemp("wl-target") / "text.txt")
    yield target
    target.close()


@pytest.fixture
def wl_target(wl_target_session):
    wl_target_session.reset()
    return wl_target_session


class WlClipboardView:
    """The test's own view of the Wayland clipboard, through wl-clipboard."""

    def __init__(self, env):
        self.env = env

    def set_text(self, text: str) -> None:
        _run(self.env, "wl-copy", input=text.encode("utf-8"))
        wait_until(lambda: self.text() == text, 10, what=f"the clipboard to hold {text!r}")

    def set_data(self, data: bytes, mime: str) -> None:
        _run(self.env, "wl-copy", "--type", mime, input=data)
        wait_until(lambda: self.get(mime) == data, 10, what=f"the clipboard to hold {mime}")

    def types(self) -> list[str]:
        result = _run(self.env, "wl-paste", "--list-types")
        return result.stdout.decode().split() if result.returncode == 0 else []

    def get(self, mime: str) -> bytes | None:
        result = _run(self.env, "wl-paste", "--no-newline", "--type", mime)
        return result.stdout if result.returncode == 0 else None

    def text(self) -> str | None:
        data = self.get("text/plain;charset=utf-8")
        return None if data is None else data.decode("utf-8")


@pytest.fixture
def wl_clipboard(sway):
    return WlClipboardView(sway)


class XClipboard:
    """The test's own view of the X clipboard (as the user's other apps would see it). Setting waits
    until the server reports the new content: xclip's parent exits before its child owns it."""

    def __init__(self, env):
        self.env = env

    def set_text(self, text: str, selection: str = "clipboard") -> None:
        _run(self.env, "xclip", "-selection", selection, "-i", input=text.encode("utf-8"))
        wait_until(lambda: self.text(selection) == text, 10, what=f"the {selection} to hold {text!r}")

    def set_data(self, data: bytes, mime: str) -> None:
        _run(self.env, "xclip", "-selection", "clipboard", "-i", "-t", mime, input=data)
        wait_until(lambda: self.get(mime) == data, 10, what=f"the clipboard to hold {mime}")

    def clear(self, selection: str = "clipboard") -> None:
        _run(self.env, "xsel", f"--{selection}", "--clear")
        wait_until(lambda: self.targets(selection) == [], 10, what=f"the {selection} to be empty")

    def targets(self, selection: str = "clipboard") -> list[str]:
        result = _run(self.env, "xclip", "-selection", selection, "-o", "-t", "TARGETS")
        return result.stdout.decode().split() if result.returncode == 0 else []

    def get(self, mime: str = "UTF8_STRING", selection: str = "clipboard") -> bytes | None:
        result = _run(self.env, "xclip", "-selection", selection, "-o", "-t", mime)
        return result.stdout if result.returncode == 0 else None

    def text(self, selection: str = "clipboard") -> str | None:
        data = self.get("UTF8_STRING", selection)
        return None if data is None else data.decode("utf-8")


@pytest.fixture
def xclipboard(xvfb):
    return XClipboard(xvfb)


@pytest.fixture
def output(request):
    """Factory for output chains (on the Xvfb display unless `env` says otherwise); each chain is
    flushed afterwards (keymap bindings undone, pending clipboard restores run)."""
    from dictation.output import OutputOptions, choose_backend

    chains = []

    def make(backend="xdotool-paste", *, env=None, restore_delay_ms=3_600_000, **options):
        options = OutputOptions(backend=backend, restore_delay_ms=restore_delay_ms, **options)
        chains.append(choose_backend(options, env or request.getfixturevalue("xvfb")))
        return chains[-1]

    yield make
    for chain in chains:
        chain.flush()


# Every tool the output package may run (dictation/output/*.py); the argv logger wraps those installed.
OUTPUT_TOOLS = ("xdotool", "xmodmap", "xclip", "xsel", "xprop", "wtype", "wl-copy", "wl-paste", "ydotool")
OUTPUT_TOOLS += ("swaymsg", "hyprctl", "pbcopy", "pbpaste")


class ArgvLog:
    """Wrappers for the output tools, first on PATH: each records its command line, then runs the real
    tool with the same arguments and stdin. So a test sees every command line a child process had,
    which is what `ps` shows every local user."""

    def __init__(self, folder: Path, env: dict[str, str]):
        self.log = folder / "argv.log"
        shims = folder / "bin"
        shims.mkdir(parents=True)
        for tool in OUTPUT_TOOLS:
            real = shutil.which(tool, path=env.get("PATH", os.defpath))
            if real is None:
                continue
            script = shims / tool
            # One record per run: NUL-separated arguments, then a record separator (0x1e).
            script.write_text(
                f"#!/bin/sh\nprintf '%s\\0' \"$0\" \"$@\" >> '{self.log}'\nprintf '\\036' >> '{self.log}'\n"
                f"exec '{real}' \"$@\"\n"
            )
            script.chmod(0o755)
        self.env = {**env, "PATH": f"{shims}{os.pathsep}{env.get('PATH', os.defpath)}"}

    def argvs(self) -> list[tuple[str, ...]]:
        try:
            raw = self.log.read_bytes()
        except FileNotFoundError:
            return []
        records = [r for r in raw.split(b"\x1e") if r]
        return [tuple(a.decode("utf-8", "surrogateescape") for a in r.split(b"\0")[:-1]) for r in records]

    def leaks(self, secrets: list[str]) -> list[tuple[str, ...]]:
        """Command lines holding any of ``secrets``."""
        return [argv for argv in self.argvs() if any(s in arg for arg in argv for s in secrets)]


@pytest.fixture
def argv_log(tmp_path):
    """``argv_log(env)``: an ArgvLog whose ``env`` runs the output tools through its recording wrappers."""
    made = []

    def make(env: dict[str, str]) -> ArgvLog:
        made.append(ArgvLog(tmp_path / f"argv{len(made)}", env))
        return made[-1]

    return make
