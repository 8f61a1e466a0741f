"""`dictation doctor`: the checks under faked environments (PATH, session variables, /dev/input, torch
builds, microphones), the exact fixes, the report, and the command's JSON and exit code."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from dictation import doctor
from dictation.audio import devices as audio_devices
from dictation.audio.devices import PORTAUDIO_MISSING, AudioDeviceError, InputDevice
from dictation.config.settings import Adapter, Settings
from dictation.doctor import (
    AREAS,
    BIND_COMMANDS_FIX,
    CUDA_TORCH_FIX,
    NO_MODEL_FIX,
    YDOTOOLD_FIX,
    Check,
    GpuInfo,
    TorchBuild,
    format_report,
    run_checks,
)
from dictation.hotkeys import Environment, HotkeyBackend, choose_backend
from dictation.hotkeys.choose import backend_availability
from dictation.hotkeys.evdev_backend import EvdevBackend, GroupInfo
from tests.test_cli import run_cli

EVDEV_FIX = "`sudo usermod -aG input $USER`, then log out and back in"
REAL_BUS_NAME_HAS_OWNER = doctor.session.bus_name_has_owner  # before the fixture replaces it


@pytest.fixture(autouse=True)
def private_home(tmp_path, monkeypatch):
    monkeypatch.setenv("DICTATION_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(doctor.session, "bus_name_has_owner", lambda name, env=None: None)


@pytest.fixture
def make_path(tmp_path):
    """A PATH folder holding do-nothing executables with the given names."""

    def make(*tools: str) -> str:
        folder = tmp_path / f"bin{len(list(tmp_path.glob('bin*')))}"
        folder.mkdir()
        for tool in tools:
            exe = folder / tool
            exe.write_text("#!/bin/sh\nexit 0\n")
            exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
        return str(folder)

    return make


def find(checks: list[Check], area: str, name: str) -> Check:
    matches = [c for c in checks if (c.area, c.name) == (area, name)]
    assert len(matches) == 1, f"{area}/{name} in {[(c.area, c.name) for c in checks]}"
    return matches[0]


def wayland(desktop: str, path: str, **more: str) -> dict[str, str]:
    return {
        "PATH": path,
        "XDG_SESSION_TYPE": "wayland",
        "WAYLAND_DISPLAY": "wayland-1",
        "XDG_CURRENT_DESKTOP": desktop,
        **more,
    }


def x11(path: str, **more: str) -> dict[str, str]:
    return {"PATH": path, "XDG_SESSION_TYPE": "x11", "DISPLAY": ":0", **more}


# --- hotkeys: the package's own availability, with every backend asked at most once -------------


class FakeBackend(HotkeyBackend):
    def __init__(self, name: str, ok: bool, reason: str, log: list[str]):
        super().__init__()
        self.name, self._result, self._log = name, (ok, reason), log

    def is_available(self):
        self._log.append(self.name)
        return self._result

    def _start(self):
        pass

    def _stop(self):
        pass


def fakes(log: list[str], **results: tuple[bool, str]) -> dict:
    defaults = {
        "portal": (True, "portal v2"),
        "evdev": (True, "reads 1 keyboard"),
        "x11": (True, "XGrabKey"),
        "pynput": (True, "XRecord"),
    }
    defaults.update(results)
    return {name: (lambda n=name, r=r: FakeBackend(n, *r, log)) for name, r in defaults.items()}


def test_backend_availability_reuses_the_choice_and_asks_the_untried_ones():
    log: list[str] = []
    factories = fakes(log)
    choice = choose_backend("auto", environment=Environment("linux", "wayland", "KDE"), factories=factories)
    assert choice.name == "portal" and log == ["portal"]
    assert dict(choice.probed) == {"portal": (True, "portal v2")}
    result = backend_availability(choice, factories)
    assert log == ["portal", "evdev"]  # portal not asked twice; pynput is ruled out on Wayland, never asked
    assert result["evdev"] == (True, "reads 1 keyboard")
    assert result["pynput"][0] is None and "XWayland" in result["pynput"][1]


def test_backend_availability_with_a_named_backend_asks_the_others_too():
    log: list[str] = []
    factories = fakes(log, evdev=(False, "permission denied"))
    choice = choose_backend("evdev", environment=Environment("linux", "x11"), factories=factories)
    result = backend_availability(choice, factories)
    assert sorted(log) == ["evdev", "portal", "pynput", "x11"]
    assert result == {
        "portal": (True, "portal v2"),
        "evdev": (False, "permission denied"),
        "x11": (True, "XGrabKey"),
        "pynput": (True, "XRecord"),
    }


def evdev_denied(tmp_path, group: GroupInfo):
    folder = tmp_path / "input"
    folder.mkdir(exist_ok=True)
    for name in ("event0", "event1"):
        (folder / name).touch()

    def open_device(path):
        raise PermissionError(13, "Permission denied", path)

    return lambda: EvdevBackend(input_dir=str(folder), open_device=open_device, group_info=lambda: group)


def test_evdev_without_the_input_group_on_a_wayland_desktop_without_a_portal(tmp_path, make_path, monkeypatch):
    log: list[str] = []
    factories = {
        **fakes(log, portal=(False, "xdg-desktop-portal is not running on the session bus (is it installed?)")),
        "evdev": evdev_denied(tmp_path, GroupInfo(user="alice")),
    }
    monkeypatch.setattr(doctor.hotkeys, "hotkey_factories", lambda: factories)
    checks = run_checks(Settings(), env=wayland("KDE", make_path()), platform="linux", areas=["Hotkeys"])
    active = find(checks, "Hotkeys", "Active backend")
    assert active.status == "problem"
    assert "no global hotkey backend works in this Wayland session (KDE)" in active.detail
    portal_fix = "`sudo apt install xdg-desktop-portal xdg-desktop-portal-kde`, then log out and back in"
    assert active.fix == f"{portal_fix}; or {EVDEV_FIX}; or {BIND_COMMANDS_FIX}"
    evdev = find(checks, "Hotkeys", "evdev")
    assert evdev.status == "warning"
    assert "can't read" in evdev.detail and "/input/event0 and 1 more (permission denied)" in evdev.detail
    assert evdev.fix == EVDEV_FIX
    assert find(checks, "Hotkeys", "portal").fix == portal_fix
    pynput = find(checks, "Hotkeys", "pynput")
    assert (pynput.status, pynput.fix) == ("info", None) and "XWayland" in pynput.detail
    assert "pynput" not in log  # ruled out on Wayland, so never asked


def test_evdev_joined_the_group_but_not_logged_in_again(tmp_path, make_path, monkeypatch):
    factories = {
        **fakes([], portal=(False, "no GlobalShortcuts")),
        "evdev": evdev_denied(tmp_path, GroupInfo(user="alice", in_group_database=True)),
    }
    monkeypatch.setattr(doctor.hotkeys, "hotkey_factories", lambda: factories)
    checks = run_checks(Settings(), env=wayland("niri", make_path()), platform="linux", areas=["Hotkeys"])
    evdev = find(checks, "Hotkeys", "evdev")
    assert evdev.fix == "log out and back in (or reboot): a new group membership counts only in a new login session"
    assert find(checks, "Hotkeys", "portal").fix is None  # nothing to install: niri has no GlobalShortcuts


def test_the_active_backend_is_ok_and_the_others_are_notes(tmp_path, make_path, monkeypatch):
    factories = {
        **fakes([], portal=(False, "xdg-desktop-portal is not running on the session bus (is it installed?)")),
        "evdev": evdev_denied(tmp_path, GroupInfo(user="alice")),
    }
    monkeypatch.setattr(doctor.hotkeys, "hotkey_factories", lambda: factories)
    checks = run_checks(Settings(), env=x11(make_path()), platform="linux", areas=["Hotkeys"])
    active = find(checks, "Hotkeys", "Active backend")
    assert active.status == "ok" and active.detail.startswith("x11 (picked automatically; X11 session)")
    evdev = find(checks, "Hotkeys", "evdev")
    assert (evdev.status, evdev.fix) == ("info", EVDEV_FIX)  # the fix is offered, but nothing is broken


def test_a_named_backend_that_cannot_work_is_a_problem(tmp_path, make_path, monkeypatch):
    factories = {**fakes([]), "evdev": evdev_denied(tmp_path, GroupInfo(user="alice"))}
    monkeypatch.setattr(doctor.hotkeys, "hotkey_factories", lambda: factories)
    settings = Settings()
    settings = settings.replace(hotkeys=settings.hotkeys.replace(backend="evdev"))
    checks = run_checks(settings, env=x11(make_path()), platform="linux", areas=["Hotkeys"])
    active = find(checks, "Hotkeys", "Active backend")
    assert active.status == "problem" and "evdev is chosen in the settings" in active.detail
    assert active.fix == f"{EVDEV_FIX}; or set Hotkey backend to Automatic on the General page"
    assert find(checks, "Hotkeys", "pynput").detail == "available, not used (the settings choose evdev): XRecord"


# --- session --------------------------------------------------------------------------------------


def test_session_kinds(make_path, monkeypatch):
    path = make_path()
    checks = run_checks(Settings(), env=wayland("sway", path), platform="linux", areas=["Session"])
    assert find(checks, "Session", "Display server").status == "ok"
    assert find(checks, "Session", "Display server").detail.startswith("Wayland (XDG_SESSION_TYPE=wayland")
    assert find(checks, "Session", "Desktop").detail == "sway"

    checks = run_checks(Settings(), env=x11(path), platform="linux", areas=["Session"])
    assert find(checks, "Session", "Display server").detail.startswith("X11 (")

    checks = run_checks(Settings(), env={"PATH": path}, platform="linux", areas=["Session"])
    display = find(checks, "Session", "Display server")
    assert display.status == "problem"
    assert display.fix == (
        "start dictation from inside your desktop session (a terminal there, the app menu or autostart), "
        "where DISPLAY or WAYLAND_DISPLAY is set"
    )

    checks = run_checks(
        Settings(), env={"PATH": path, "XDG_SESSION_TYPE": "wayland"}, platform="linux", areas=["Session"]
    )
    assert find(checks, "Session", "Display server").status == "warning"


def test_tray_guess_from_the_session_bus(make_path, monkeypatch):
    env = wayland("ubuntu:GNOME", make_path())
    monkeypatch.setattr(
        doctor.session, "bus_name_has_owner", lambda name, env=None: name == "org.kde.StatusNotifierWatcher"
    )
    assert find(run_checks(env=env, platform="linux", areas=["Session"]), "Session", "System tray").status == "ok"

    monkeypatch.setattr(doctor.session, "bus_name_has_owner", lambda name, env=None: False)
    tray = find(run_checks(env=env, platform="linux", areas=["Session"]), "Session", "System tray")
    assert tray.status == "warning" and "status window" in tray.detail
    assert tray.fix == (
        "install and enable the AppIndicator extension: `sudo apt install gnome-shell-extension-appindicator`, "
        "then turn it on in the Extensions app and log out and back in"
    )
    # on X11 a panel may still offer an XEmbed tray: only a note
    tray = find(run_checks(env=x11(make_path()), platform="linux", areas=["Session"]), "Session", "System tray")
    assert tray.status == "info"


def test_the_tray_advice_fits_the_desktop():
    """The running app's answer (live): waybar only where a Wayland compositor may use it."""
    from dictation.doctor import tray_check

    openbox = tray_check(False, {"DISPLAY": ":0", "XDG_SESSION_TYPE": "x11"}, "linux", live=True)
    assert openbox.status == "warning" and "waybar" not in openbox.fix  # before: "(waybar: the `tray` module)"
    assert "tint2" in openbox.fix and "panel" in openbox.fix
    xfce = tray_check(False, {"DISPLAY": ":0", "XDG_CURRENT_DESKTOP": "XFCE"}, "linux", live=True)
    assert xfce.fix == openbox.fix
    sway = tray_check(False, {"WAYLAND_DISPLAY": "wayland-1", "SWAYSOCK": "/run/sway.sock"}, "linux", live=True)
    assert "swaybar" in sway.fix and "waybar" in sway.fix and "tint2" not in sway.fix
    hyprland = tray_check(
        False, {"WAYLAND_DISPLAY": "wayland-1", "XDG_CURRENT_DESKTOP": "Hyprland"}, "linux", live=True
    )
    assert "waybar" in hyprland.fix and "tint2" not in hyprland.fix


def test_bus_name_has_owner_without_a_bus_is_none(tmp_path):
    bus_name_has_owner = REAL_BUS_NAME_HAS_OWNER
    assert bus_name_has_owner("org.kde.StatusNotifierWatcher", {"XDG_RUNTIME_DIR": str(tmp_path)}) is None
    env = {"DBUS_SESSION_BUS_ADDRESS": f"unix:path={tmp_path}/no-such-bus"}
    assert bus_name_has_owner("org.kde.StatusNotifierWatcher", env) is None


# --- output ---------------------------------------------------------------------------------------


def test_wayland_wlroots_with_wtype_and_wl_clipboard(make_path):
    env = wayland("sway", make_path("wtype", "wl-copy", "wl-paste"))
    checks = run_checks(Settings(), env=env, platform="linux", areas=["Output"])
    delivery = find(checks, "Output", "Text delivery")
    assert delivery.status == "ok" and delivery.detail.startswith("wtype-paste: clipboard via wl-clipboard")
    assert find(checks, "Output", "wtype").status == "ok"
    ydotool = find(checks, "Output", "ydotool")
    assert (ydotool.status, ydotool.fix) == ("info", "`sudo apt install ydotool`")


def test_wayland_wlroots_without_tools(make_path):
    checks = run_checks(Settings(), env=wayland("sway", make_path()), platform="linux", areas=["Output"])
    delivery = find(checks, "Output", "Text delivery")
    assert delivery.status == "problem"
    assert delivery.fix == "`sudo apt install wtype wl-clipboard`"
    assert (find(checks, "Output", "wtype").status, find(checks, "Output", "wtype").fix) == (
        "warning",
        "`sudo apt install wtype`",
    )
    assert find(checks, "Output", "wl-clipboard").fix == "`sudo apt install wl-clipboard`"


def test_install_commands_follow_the_package_manager(make_path):
    checks = run_checks(Settings(), env=x11(make_path("dnf")), platform="linux", areas=["Output"])
    delivery = find(checks, "Output", "Text delivery")  # pynput types when xdotool is missing
    assert delivery.status == "ok" and delivery.detail.startswith("pynput-type:")
    assert "cannot type non-ASCII text" in delivery.detail
    xdotool = find(checks, "Output", "xdotool")
    assert (xdotool.status, xdotool.fix) == ("info", "`sudo dnf install xdotool`")
    assert find(checks, "Output", "xmodmap").fix == "`sudo dnf install xmodmap`"

    settings = Settings()
    settings = settings.replace(output=settings.output.replace(backend="xdotool"))
    checks = run_checks(settings, env=x11(make_path("dnf")), platform="linux", areas=["Output"])
    delivery = find(checks, "Output", "Text delivery")
    assert delivery.status == "problem" and delivery.fix == "`sudo dnf install xdotool xclip`"
    assert find(checks, "Output", "xdotool").status == "warning"
    checks = run_checks(settings, env=x11(make_path("pacman", "xsel")), platform="linux", areas=["Output"])
    assert find(checks, "Output", "Text delivery").fix == "`sudo pacman -S xdotool`"  # xsel is a clipboard
    assert find(checks, "Output", "xmodmap").fix == "`sudo pacman -S xorg-xmodmap`"


def test_gnome_wayland_needs_ydotool_and_its_daemon(make_path, tmp_path):
    runtime = tmp_path / "run"
    runtime.mkdir()
    env = wayland("GNOME", make_path("wtype", "ydotool", "wl-copy", "wl-paste"), XDG_RUNTIME_DIR=str(runtime))
    checks = run_checks(Settings(), env=env, platform="linux", areas=["Output"])
    delivery = find(checks, "Output", "Text delivery")
    assert delivery.status == "problem" and "only put on the clipboard" in delivery.detail
    assert delivery.fix == YDOTOOLD_FIX
    daemon = find(checks, "Output", "ydotoold")
    assert (daemon.status, daemon.fix) == ("warning", YDOTOOLD_FIX)
    assert find(checks, "Output", "wtype").status == "info"  # installed, but GNOME has no virtual keyboard

    (runtime / ".ydotool_socket").touch()
    checks = run_checks(Settings(), env=env, platform="linux", areas=["Output"])
    assert find(checks, "Output", "Text delivery").detail.startswith("ydotool-paste:")
    assert find(checks, "Output", "ydotoold").status == "ok"


def test_an_unknown_output_tool_in_the_settings(make_path):
    settings = Settings()
    settings = settings.replace(output=settings.output.replace(backend="dotool"))
    checks = run_checks(settings, env=x11(make_path("xdotool", "xclip")), platform="linux", areas=["Output"])
    delivery = find(checks, "Output", "Text delivery")
    assert delivery.status == "problem" and "unknown output backend 'dotool'" in delivery.detail
    assert delivery.fix == "set Output tool to Automatic (or wtype, ydotool, xdotool, pynput) on the Output page"


# --- microphone -----------------------------------------------------------------------------------

FAKE_SD = SimpleNamespace(__version__="0.5.6", get_portaudio_version=lambda: (1, "PortAudio V19.7.0, revision x"))
MICS = [
    InputDevice(0, "Built-in Microphone", 48000, 2, is_default=True),
    InputDevice(3, "USB Headset", 16000, 1, is_default=False),
]


def test_missing_portaudio(make_path, monkeypatch):
    def missing():
        raise AudioDeviceError(PORTAUDIO_MISSING)

    monkeypatch.setattr(audio_devices, "import_sounddevice", missing)
    checks = run_checks(Settings(), env=x11(make_path()), platform="linux", areas=["Microphone"])
    library = find(checks, "Microphone", "Audio library")
    assert library.status == "problem"
    assert library.fix == "`sudo apt install libportaudio2`, then start dictation again"


def test_microphones_and_the_chosen_one(make_path, monkeypatch, tmp_path):
    (tmp_path / "pipewire-0").touch()
    env = x11(make_path(), XDG_RUNTIME_DIR=str(tmp_path))
    monkeypatch.setattr(audio_devices, "import_sounddevice", lambda: FAKE_SD)
    monkeypatch.setattr(audio_devices, "list_input_devices", lambda: list(MICS))
    checks = run_checks(Settings(), env=env, platform="linux", areas=["Microphone"])
    assert find(checks, "Microphone", "Audio library").detail == "sounddevice 0.5.6, PortAudio V19.7.0"
    assert find(checks, "Microphone", "Sound server").status == "ok"
    assert find(checks, "Microphone", "Microphones").detail == (
        "2 input devices: [0] Built-in Microphone (default), [3] USB Headset"
    )
    chosen = find(checks, "Microphone", "Selected microphone")
    assert chosen.status == "ok" and chosen.detail.startswith("the system default: [0] Built-in Microphone")

    settings = Settings()
    settings = settings.replace(recording=settings.recording.replace(input_device="Blue Yeti"))
    chosen = find(
        run_checks(settings, env=env, platform="linux", areas=["Microphone"]), "Microphone", "Selected microphone"
    )
    assert chosen.status == "problem" and "no microphone named 'Blue Yeti'" in chosen.detail
    assert (
        chosen.fix == "plug it in, or choose another microphone on the Recording page (`dictation devices` lists them)"
    )


def test_no_microphone_and_no_sound_server(make_path, monkeypatch, tmp_path):
    monkeypatch.setattr(audio_devices, "import_sounddevice", lambda: FAKE_SD)
    monkeypatch.setattr(audio_devices, "list_input_devices", lambda: [])
    checks = run_checks(
        Settings(), env=x11(make_path(), XDG_RUNTIME_DIR=str(tmp_path)), platform="linux", areas=["Microphone"]
    )
    server = find(checks, "Microphone", "Sound server")
    assert server.status == "warning" and server.fix == doctor.SOUND_SERVER_FIX
    mics = find(checks, "Microphone", "Microphones")
    assert mics.status == "problem" and "pactl list short sources" in mics.fix
    checks = run_checks(Settings(), env={"PATH": make_path()}, platform="darwin", areas=["Microphone"])
    assert find(checks, "Microphone", "Microphones").fix == (
        "allow microphone access for the app that runs dictation: System Settings → Privacy & Security → Microphone"
    )


# --- engine ---------------------------------------------------------------------------------------


def engine_checks(monkeypatch, tmp_path, path: str, build: TorchBuild, settings: Settings | None = None):
    monkeypatch.setattr(doctor.engine, "torch_build", lambda: build)
    monkeypatch.setattr(doctor.engine, "NVIDIA_PROC", str(tmp_path / "no-nvidia-proc"))
    return run_checks(settings or Settings(), env={"PATH": path}, platform="linux", areas=["Engine"])


def test_cpu_only_torch_on_a_machine_with_an_nvidia_driver(monkeypatch, tmp_path, make_path):
    cpu = TorchBuild("2.13.0+cpu")
    gpu = find(engine_checks(monkeypatch, tmp_path, make_path("nvidia-smi"), cpu), "Engine", "GPU")
    assert gpu.status == "warning" and gpu.fix == CUDA_TORCH_FIX
    assert "torch 2.13.0+cpu is a CPU-only build" in gpu.detail and "nvidia-smi is installed" in gpu.detail

    gpu = find(engine_checks(monkeypatch, tmp_path, make_path(), cpu), "Engine", "GPU")
    assert (gpu.status, gpu.fix) == ("info", None)

    (tmp_path / "proc-nvidia").mkdir()
    monkeypatch.setattr(doctor.engine, "torch_build", lambda: cpu)
    monkeypatch.setattr(doctor.engine, "NVIDIA_PROC", str(tmp_path / "proc-nvidia"))
    checks = run_checks(Settings(), env={"PATH": make_path()}, platform="linux", areas=["Engine"])
    assert find(checks, "Engine", "GPU").fix == CUDA_TORCH_FIX


def test_on_the_cpu_the_native_step_needs_a_c_compiler(monkeypatch, tmp_path, make_path):
    cpu = TorchBuild("2.13.0+cpu")
    native = find(engine_checks(monkeypatch, tmp_path, make_path("gcc"), cpu), "Engine", "Native CPU step")
    assert native.status == "ok" and native.detail.endswith("gcc at its first use") and native.fix is None
    native = find(engine_checks(monkeypatch, tmp_path, make_path(), cpu), "Engine", "Native CPU step")
    assert native.status == "info" and "PyTorch alone" in native.detail
    assert native.fix == "`sudo apt install gcc`, then restart dictation"


def test_a_cuda_build_that_cannot_use_the_gpu(monkeypatch, tmp_path, make_path):
    monkeypatch.setattr(
        doctor.engine, "cuda_devices", lambda env: (False, "The NVIDIA driver on your system is too old", [])
    )
    settings = Settings()
    settings = settings.replace(engine=settings.engine.replace(device="cuda"))
    checks = engine_checks(monkeypatch, tmp_path, make_path("nvidia-smi"), TorchBuild("2.13.0+cu128", "12.8"), settings)
    gpu = find(checks, "Engine", "GPU")
    assert gpu.status == "warning" and "too old" in gpu.detail
    assert gpu.fix.startswith("update the NVIDIA driver to one that supports CUDA 12.8")
    device = find(checks, "Engine", "Device")
    assert device.status == "warning"
    assert device.fix == "set Device to Automatic or CPU on the Model page (or fix the GPU, see above)"


def test_a_usable_gpu_with_too_little_memory_for_the_model(monkeypatch, tmp_path, make_path):
    gpus = [GpuInfo(0, "NVIDIA GeForce GTX 1650", 4 * 2**30, 3 * 2**30)]
    monkeypatch.setattr(doctor.engine, "cuda_devices", lambda env: (True, "", gpus))
    settings = Settings()
    settings = settings.replace(engine=settings.engine.replace(model="Qwen/Qwen3-ASR-1.7B"))
    checks = engine_checks(monkeypatch, tmp_path, make_path(), TorchBuild("2.13.0+cu128", "12.8"), settings)
    gpu = find(checks, "Engine", "GPU")
    assert gpu.status == "ok" and gpu.detail == "cuda:0 NVIDIA GeForce GTX 1650, 4.3 GB total, 3.2 GB free"
    assert find(checks, "Engine", "Device").detail == "Automatic: the model runs on cuda:0"
    memory = find(checks, "Engine", "GPU memory")
    assert memory.status == "warning"
    assert memory.fix == "choose the int8 or int4 weights variant on the Model page, or the 0.6B model"

    settings = settings.replace(engine=settings.engine.replace(variant="int8"))
    checks = engine_checks(monkeypatch, tmp_path, make_path(), TorchBuild("2.13.0+cu128", "12.8"), settings)
    assert not [c for c in checks if c.name == "GPU memory"]


def test_torch_build_is_read_without_importing_torch():
    script = (
        "import sys\nfrom dictation.doctor.engine import torch_build\nb = torch_build()\n"
        "print('torch' in sys.modules, b.version, b.cuda)\n"
        "import torch\nprint(False, torch.__version__, torch.version.cuda)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    first, second = proc.stdout.splitlines()
    assert first == second


# --- model ----------------------------------------------------------------------------------------


def model_checks(settings: Settings) -> list[Check]:
    return run_checks(settings, env={"PATH": os.defpath}, platform="linux", areas=["Model"])


def test_no_model_chosen():
    model = find(model_checks(Settings()), "Model", "Model")
    assert (model.status, model.fix) == ("problem", NO_MODEL_FIX)


def test_a_model_that_is_not_downloaded_and_a_missing_adapter(tmp_path):
    settings = Settings()
    engine = settings.engine.replace(
        model="Qwen/Qwen3-ASR-0.6B",
        adapters=(Adapter(path=str(tmp_path / "gone")), Adapter(path=str(tmp_path / "off"), enabled=False)),
    )
    checks = model_checks(settings.replace(engine=engine))
    model = find(checks, "Model", "Model")
    assert model.status == "problem" and "not in the local Hugging Face cache" in model.detail
    assert model.fix == "`dictation download Qwen/Qwen3-ASR-0.6B` (or download it on the Model page)"
    adapter = find(checks, "Model", "Adapter 1")
    assert adapter.status == "problem" and str(tmp_path / "gone") in adapter.detail
    assert find(checks, "Model", "Adapter 2").status == "info"

    settings = settings.replace(engine=settings.engine.replace(model=str(tmp_path)))
    model = find(model_checks(settings), "Model", "Model")
    assert model.fix == "choose a complete model folder on the Model page (the folder that holds config.json)"


def test_a_good_model_folder_and_low_disk_space(tmp_path, monkeypatch):
    import shutil

    from dictation.asr.checkpoints import hub as models

    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text('{"quantization_config": {"bits": 8}}')
    monkeypatch.setattr(models, "check_model_folder", lambda spec: None)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: SimpleNamespace(total=100 * 10**9, used=0, free=2 * 10**9))
    settings = Settings()
    checks = model_checks(settings.replace(engine=settings.engine.replace(model=str(folder))))
    assert find(checks, "Model", "Model").status == "ok"
    assert "pre-quantized" in find(checks, "Model", "Variant").detail
    disk = find(checks, "Model", "Disk space")
    assert disk.status == "warning" and disk.detail.startswith("2.0 GB free of 100.0 GB")
    assert disk.fix.startswith("free some space there")


# --- files ----------------------------------------------------------------------------------------


def test_files_are_listed_and_settings_are_read_without_writing(tmp_path):
    settings_file = tmp_path / "home" / "config" / "settings.json"
    settings_file.parent.mkdir(parents=True)
    raw = '{"schema_version": 1, "output": {"restore_delay_ms": "soon"}, "engine": {"model": "Qwen/Qwen3-ASR-0.6B"}}'
    settings_file.write_text(raw)
    checks = run_checks(env={"PATH": os.defpath}, platform="linux", areas=["Files", "Model"])
    assert find(checks, "Files", "Settings").detail == str(settings_file)
    assert find(checks, "Files", "History").detail.endswith("history.sqlite3 (not created yet)")
    bad = find(checks, "Files", "Settings file")
    assert bad.status == "warning" and "output.restore_delay_ms" in bad.detail
    assert "Qwen/Qwen3-ASR-0.6B" in find(checks, "Model", "Model").detail  # the file's settings were used
    assert settings_file.read_text() == raw  # the doctor repaired nothing
    assert sorted(p.name for p in settings_file.parent.iterdir()) == ["settings.json"]


def test_private_files_readable_by_others_are_reported(tmp_path):
    home = tmp_path / "home"
    (home / "data" / "recordings").mkdir(parents=True)
    (home / "config").mkdir()
    history = home / "data" / "history.sqlite3"
    history.write_text("x")
    for path in (home / "data", home / "data" / "recordings", home / "config"):
        path.chmod(0o700)
    history.chmod(0o600)
    checks = run_checks(env={"PATH": os.defpath}, platform="linux", areas=["Files"])
    assert find(checks, "Files", "Privacy").status == "ok"

    history.chmod(0o644)  # as an older version wrote it
    (home / "data").chmod(0o755)
    checks = run_checks(env={"PATH": os.defpath}, platform="linux", areas=["Files"])
    privacy = find(checks, "Files", "Privacy")
    assert privacy.status == "problem"
    assert privacy.detail == (
        "2 of your private files and folders can be read by other users: "
        f"{home / 'data'} (mode 755), {history} (mode 644)"
    )
    assert privacy.fix == (
        f"start dictation once (it makes them private when it starts), or run `chmod -R go= {home / 'config'} "
        f"{home / 'data'}`"
    )
    assert stat.S_IMODE(history.stat().st_mode) == 0o644  # the doctor changes nothing


def test_unwritable_folders(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    checks = run_checks(env={"PATH": os.defpath}, platform="linux", areas=["Files"])
    log = find(checks, "Files", "Log")
    assert log.status == "problem" and log.fix == "set DICTATION_HOME to a folder you can write to"
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "home" / "log").mkdir(parents=True)
    checks = run_checks(env={"PATH": os.defpath}, platform="linux", areas=["Files"])
    assert find(checks, "Files", "Log").fix == f"`sudo chown -R $USER {tmp_path / 'home' / 'log'}`"


# --- running, reporting, the command -------------------------------------------------------------


def test_a_failing_check_becomes_a_problem_and_the_rest_still_run(monkeypatch):
    def broken():
        raise RuntimeError("boom")

    monkeypatch.setattr(doctor.engine, "torch_build", broken)
    checks = run_checks(env={"PATH": os.defpath}, platform="linux", areas=["Engine", "Files"])
    failed = find(checks, "Engine", "Engine checks")
    assert failed.status == "problem" and failed.detail == "the engine checks failed: RuntimeError: boom"
    assert find(checks, "Files", "Settings").status == "ok"


def test_format_report():
    checks = [
        Check("Session", "Display server", "ok", "X11"),
        Check("Hotkeys", "evdev", "warning", "can't read /dev/input/event0", EVDEV_FIX),
        Check("Model", "Model", "problem", "no model chosen yet", NO_MODEL_FIX),
        Check("Model", "Variant", "info", "weights auto\nsecond line"),
    ]
    text = format_report(checks)
    lines = text.splitlines()
    assert lines[1:] == [
        "",
        "Session",
        "  ✔ Display server: X11",
        "",
        "Hotkeys",
        "  ! evdev: can't read /dev/input/event0",
        f"      fix: {EVDEV_FIX}",
        "",
        "Model",
        "  ✘ Model: no model chosen yet",
        f"      fix: {NO_MODEL_FIX}",
        "  · Variant: weights auto",
        "      second line",
        "",
        "1 problem, 1 warning.",
    ]
    assert "  x Model: no model chosen yet" in format_report(checks, ascii_only=True)
    with pytest.raises(ValueError, match="unknown check status 'bad'"):
        Check("Model", "Model", "bad", "")


@pytest.mark.parametrize(("status", "code"), [("problem", 1), ("warning", 0), ("ok", 0)])
def test_main_exit_code(monkeypatch, capsys, status, code):
    monkeypatch.setattr(doctor.report, "run_checks", lambda: [Check("Model", "Model", status, "detail")])
    assert doctor.main() == code
    assert "Model: detail" in capsys.readouterr().out
    assert doctor.main(as_json=True) == code
    assert json.loads(capsys.readouterr().out)["checks"][0]["status"] == status


def test_all_checks_are_quick(tmp_path):
    started = time.monotonic()
    checks = run_checks()
    assert time.monotonic() - started < 3.0
    assert [a for a in AREAS if any(c.area == a for c in checks)] == list(AREAS)


def test_doctor_command_json_and_text(tmp_path):
    env = {"DICTATION_HOME": str(tmp_path / "home"), "HF_HUB_CACHE": str(tmp_path / "hf")}
    proc = run_cli("doctor", "--json", env=env)
    report = json.loads(proc.stdout)
    assert report["areas"] == list(AREAS)
    assert {c["area"] for c in report["checks"]} == set(AREAS)
    assert all(set(c) == {"area", "name", "status", "detail", "fix"} for c in report["checks"])
    model = next(c for c in report["checks"] if c["area"] == "Model" and c["name"] == "Model")
    assert (model["status"], model["fix"]) == ("problem", NO_MODEL_FIX)  # nothing chosen in a fresh home
    assert proc.returncode == 1 and report["problems"] >= 1

    proc = run_cli("doctor", env={**env, "PYTHONIOENCODING": "utf-8"})
    assert proc.returncode == 1
    assert proc.stdout.startswith("dictation ")
    for area in AREAS:
        assert f"\n{area}\n" in proc.stdout
    assert f"  ✘ Model: no model chosen yet\n      fix: {NO_MODEL_FIX}" in proc.stdout


def test_a_cuda_torch_build_on_a_machine_without_an_nvidia_gpu(monkeypatch, tmp_path, make_path):
    """PyPI's Linux wheel is the CUDA build; on a machine without NVIDIA it is
    several GB for nothing. Faked machine: no nvidia-smi on PATH, no /proc/driver/nvidia, torch
    says CUDA is unusable."""
    monkeypatch.setattr(doctor.engine, "cuda_devices", lambda env: (False, "", []))
    cuda = TorchBuild("2.13.0+cu128", "12.8")
    gpu = find(engine_checks(monkeypatch, tmp_path, make_path(), cuda), "Engine", "GPU")
    assert gpu.status == "warning"
    assert "torch 2.13.0+cu128 is a CUDA 12.8 build, but this machine shows no NVIDIA GPU" in gpu.detail
    assert gpu.fix == doctor.cpu_torch_fix(True)
    assert "pip install torch --index-url https://download.pytorch.org/whl/cpu" in gpu.fix
    assert "uninstall -y torch triton $(pip freeze | grep -o '^nvidia-" in gpu.fix  # its CUDA libraries too
    assert find(engine_checks(monkeypatch, tmp_path, make_path(), cuda), "Engine", "Device").status == "info"

    # the same build where a driver exists (it could not be used: another check says why), or where
    # torch can use a GPU that nvidia-smi does not show (WSL): no advice to drop CUDA
    gpu = find(engine_checks(monkeypatch, tmp_path, make_path("nvidia-smi"), cuda), "Engine", "GPU")
    assert gpu.status == "warning" and "update the NVIDIA driver" in gpu.fix
    monkeypatch.setattr(
        doctor.engine, "cuda_devices", lambda env: (True, "", [GpuInfo(0, "NVIDIA RTX A2000", 6 * 2**30)])
    )
    assert find(engine_checks(monkeypatch, tmp_path, make_path(), cuda), "Engine", "GPU").status == "ok"
    # a ROCm build is not a CUDA build to swap out
    monkeypatch.setattr(doctor.engine, "cuda_devices", lambda env: (False, "", []))
    rocm = find(
        engine_checks(monkeypatch, tmp_path, make_path(), TorchBuild("2.13.0+rocm6.4", None, "6.4")), "Engine", "GPU"
    )
    assert (rocm.status, rocm.fix) == ("info", None)


def test_the_cpu_build_fix_fits_the_installation():
    assert doctor.cpu_torch_fix(True, "/home/u/dictation/.venv") == (
        "`pip uninstall -y torch triton $(pip freeze | grep -o '^nvidia-[A-Za-z0-9_.-]*')` then "
        "`pip install torch --index-url https://download.pytorch.org/whl/cpu` (about 1.3 GB instead of 5.7 GB)"
    )
    pipx = doctor.cpu_torch_fix(True, "/home/u/.local/share/pipx/venvs/dictation")
    assert pipx.startswith("`pipx runpip dictation uninstall -y torch triton $(pipx runpip dictation freeze")
    assert "`pipx runpip dictation install torch --index-url https://download.pytorch.org/whl/cpu`" in pipx
    assert doctor.cpu_torch_fix(False, "C:\\\\Users\\\\u\\\\dictation\\\\.venv") == (
        "`pip uninstall -y torch` then `pip install torch --index-url https://download.pytorch.org/whl/cpu`"
    )
