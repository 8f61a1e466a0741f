"""A real virtual microphone: a private PulseAudio server with a 16 kHz mono null sink whose monitor is
remapped into a source (../shared/e2e-recipe.md). What is played into the sink comes out of the
default ALSA device, so sounddevice (PortAudio -> ALSA -> pulse plugin) records it as from a mic.

It needs the system packages pulseaudio, pulseaudio-utils, libasound2-plugins and libportaudio2;
without them the test that uses it fails (CI installs them), it is never skipped.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.waiting import wait_until

PULSE_TOOLS = ("pulseaudio", "pactl", "pacat", "paplay")
APT_HINT = "apt-get install pulseaudio pulseaudio-utils libasound2-plugins libportaudio2"


@dataclass
class VirtualMic:
    root: Path
    env: dict[str, str]
    log: Path

    def play(self, wav: Path) -> subprocess.Popen:
        """Start playing a WAV into the virtual sink (paplay returns when it has been played)."""
        return subprocess.Popen(
            ["paplay", "--device=vsink", str(wav)], env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )

    def pulse_log(self) -> str:
        return self.log.read_text(errors="replace")[-3000:] if self.log.exists() else "(no pulseaudio log)"


def _ok(cmd: list[str], env: dict[str, str]) -> bool:
    try:
        return subprocess.run(cmd, env=env, capture_output=True, timeout=10).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def _sink_latency_us(env: dict[str, str]) -> float:
    out = subprocess.run(["pactl", "list", "sinks"], env=env, capture_output=True, text=True, timeout=10).stdout
    for line in out.splitlines():
        fields = line.split()
        if fields[:1] == ["Latency:"] and len(fields) > 1:
            return float(fields[1])
    return float("inf")


def _stop(proc: subprocess.Popen | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


@pytest.fixture(scope="session")
def pulse_server(tmp_path_factory) -> Iterator[VirtualMic]:
    """The PulseAudio daemon with the virtual sink and microphone, once per test session."""
    missing = [tool for tool in PULSE_TOOLS if shutil.which(tool) is None]
    if missing:
        pytest.fail(f"virtual microphone: {', '.join(missing)} not found; install them: {APT_HINT}")
    from dictation.audio.devices import AudioDeviceError, import_sounddevice

    try:
        import_sounddevice()
    except AudioDeviceError as exc:
        pytest.fail(f"virtual microphone: {exc}")

    root = tmp_path_factory.mktemp("pulse")
    runtime = root / "xdg"
    runtime.mkdir(mode=0o700)
    socket = root / "pulse.sock"
    log = root / "pulse.log"
    env = {k: v for k, v in os.environ.items() if k != "DBUS_SESSION_BUS_ADDRESS"} | {
        "XDG_RUNTIME_DIR": str(runtime),  # the daemon's pid file and runtime state stay private
        "XDG_CONFIG_HOME": str(root / "config"),  # no user client.conf, no cookie written to $HOME
        "PULSE_SERVER": f"unix:{socket}",  # every client (ALSA plugin, pactl, paplay) talks to it
    }
    mic = VirtualMic(root, env, log)
    pulse = keeper = None
    try:
        # Same process group as pytest: a Ctrl-C stops the daemon too.
        pulse = subprocess.Popen(
            [
                "pulseaudio",
                "-n",  # no default.pa: no hardware detection, no suspend-on-idle
                "--daemonize=no",
                "--exit-idle-time=-1",
                f"--log-target=file:{log}",
                f"--load=module-native-protocol-unix socket={socket} auth-anonymous=1",
                "--load=module-null-sink sink_name=vsink rate=16000 channels=1"
                " sink_properties=device.description=VirtualSpeaker",
                "--load=module-remap-source master=vsink.monitor source_name=vmic"
                " source_properties=device.description=VirtualMic",
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

        def answering() -> bool:
            if pulse.poll() is not None:
                pytest.fail(f"pulseaudio exited with {pulse.returncode}:\n{mic.pulse_log()}")
            return _ok(["pactl", "info"], env)

        wait_until(answering, 20, "pulseaudio to answer")
        for cmd in (["pactl", "set-default-sink", "vsink"], ["pactl", "set-default-source", "vmic"]):
            subprocess.run(cmd, env=env, check=True, capture_output=True, timeout=10)
        # The "keeper": an endless low-latency silent stream. Without it the null sink renders 2 s
        # ahead and captured audio arrives late and garbled (recipe, pitfall 1).
        keeper = subprocess.Popen(
            ["pacat", "--playback", "--latency-msec=20", "--raw", "--format=s16le", "--rate=16000"]
            + ["--channels=1", "--device=vsink", "/dev/zero"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_until(lambda: _sink_latency_us(env) < 50_000, 20, "the virtual sink's latency to drain")
        yield mic
    finally:
        _stop(keeper)
        _stop(pulse)


@pytest.fixture
def virtual_mic(pulse_server: VirtualMic, monkeypatch) -> Iterator[VirtualMic]:
    """The virtual microphone as this process's default input, for one test.

    Only PULSE_SERVER is set in this process, and only during the test, so later tests see the
    environment they expect.
    """
    from dictation.audio.devices import rescan_devices

    monkeypatch.setenv("PULSE_SERVER", pulse_server.env["PULSE_SERVER"])
    # PortAudio enumerates devices once; if sounddevice was loaded before the server existed,
    # its ALSA "default" does not point at PulseAudio yet (recipe, pitfall 2).
    rescan_devices()
    yield pulse_server
    monkeypatch.undo()
    rescan_devices()  # forget the server's devices
