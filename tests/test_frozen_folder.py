"""What the Linux one-folder app carries, checked without building it.

A PyInstaller build takes minutes, so the spec runs here against a stand-in for PyInstaller: its
Analysis hands over the libraries a real build collected on a Debian 12 machine (with the real files
of this machine where they exist), and the test looks at what reaches COLLECT. The ELF reading that
decides what is Python's own runtime, and the glibc floor that build_app.sh prints, run on real
files of this machine and are compared with binutils' readelf (tests/system-packages.txt).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "packaging" / "pyinstaller" / "dictation.spec"

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the Linux folder")


def load_linux_libs():
    spec = importlib.util.spec_from_file_location("linux_libs_under_test", ROOT / "packaging" / "linux_libs.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


linux_libs = load_linux_libs()


def system_library(name: str) -> str | None:
    """Where this machine's dynamic loader finds ``name`` (ldconfig's cache), or None."""
    ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"
    try:
        out = subprocess.run([ldconfig, "-p"], capture_output=True, text=True, timeout=30).stdout
    except OSError:
        return None
    for line in out.splitlines():
        m = re.match(rf"\s*{re.escape(name)} \(([^)]*)\) => (\S+)", line)
        if m and ("x86-64" in m.group(1)) == (sysconfig.get_platform().endswith("x86_64")):
            return m.group(2)
    return None


def stdlib_extension(module: str) -> str | None:
    folder = Path(sysconfig.get_config_var("DESTSHARED") or "")
    found = sorted(folder.glob(f"{module}.cpython-*.so"))
    return str(found[0]) if found else None


# Libraries a build on Debian 12 copied from /usr/lib besides Python's runtime (the issue names the first six).
HOST_ONLY = [
    "libportaudio.so.2",
    "libxcb-cursor.so.0",
    "libasound.so.2",
    "libjack.so.0",
    "libsystemd.so.0",
    "libstdc++.so.6",
    "libgcc_s.so.1",
    "libX11.so.6",
    "libdbus-1.so.3",
    "libfontconfig.so.1",
    "libglib-2.0.so.0",
]
PYTHON_RUNTIME = ["libssl.so.3", "libcrypto.so.3", "libffi.so.8"]


# --- the policy, on a made-up dependency graph ------------------------------------------------------


def test_only_pythons_runtime_stays_of_the_system_libraries():
    lib = "/usr/lib/x86_64-linux-gnu"
    binaries = [
        ("libpython3.11.so.1.0", "/usr/lib/x86_64-linux-gnu/libpython3.11.so.1.0", "BINARY"),
        ("python3.11/lib-dynload/_ssl.so", "/usr/lib/python3.11/lib-dynload/_ssl.so", "EXTENSION"),
        ("libssl.so.3", f"{lib}/libssl.so.3", "BINARY"),
        ("libcrypto.so.3", f"{lib}/libcrypto.so.3", "BINARY"),  # only through libssl
        ("libz.so.1", f"{lib}/libz.so.1", "BINARY"),  # libpython's and Qt's
        ("libportaudio.so.2", f"{lib}/libportaudio.so.2", "BINARY"),  # sounddevice's hook
        ("libasound.so.2", f"{lib}/libasound.so.2", "BINARY"),  # PortAudio's
        ("libstdc++.so.6", f"{lib}/libstdc++.so.6", "BINARY"),  # torch's and Qt's
        ("PySide6/Qt/lib/libQt6Gui.so.6", "/venv/site-packages/PySide6/Qt/lib/libQt6Gui.so.6", "BINARY"),
        ("torch/lib/libgomp-a34b3233.so.1", "/venv/site-packages/torch/lib/libgomp-a34b3233.so.1", "BINARY"),
        ("numpy/_core/_multiarray_umath.so", "/usr/lib/python3/dist-packages/numpy/_core/x.so", "EXTENSION"),
        ("libpydep.so.1", "/usr/lib/python3/dist-packages/foo/libpydep.so.1", "BINARY"),  # a package's own
        ("libwhl-1234.so", "/usr/local/lib/python3.11/site-packages/foo.libs/libwhl-1234.so", "BINARY"),
    ]
    graph = {
        "/usr/lib/x86_64-linux-gnu/libpython3.11.so.1.0": ["libz.so.1", "libc.so.6"],
        "/usr/lib/python3.11/lib-dynload/_ssl.so": ["libssl.so.3"],
        f"{lib}/libssl.so.3": ["libcrypto.so.3"],
        f"{lib}/libportaudio.so.2": ["libasound.so.2"],
    }
    kept, dropped = linux_libs.split_host_libraries(binaries, needed=lambda src: graph.get(src, []))
    assert sorted(d for d, *_ in dropped) == ["libasound.so.2", "libportaudio.so.2", "libstdc++.so.6"]
    assert kept == [e for e in binaries if e[0] not in {"libasound.so.2", "libportaudio.so.2", "libstdc++.so.6"}]


def test_system_library_folders():
    assert linux_libs.is_system_library("/usr/lib/x86_64-linux-gnu/libportaudio.so.2")
    assert linux_libs.is_system_library("/lib64/libstdc++.so.6")
    assert linux_libs.is_system_library("/usr/local/lib/libportaudio.so.2")
    assert not linux_libs.is_system_library("/usr/lib/python3/dist-packages/PySide6/Qt/lib/libQt6Core.so.6")
    assert not linux_libs.is_system_library("/home/me/.venv/lib/python3.11/site-packages/torch/lib/libc10.so")
    assert not linux_libs.is_system_library("/opt/hostedtoolcache/Python/3.11.9/x64/lib/libpython3.11.so.1.0")


# --- the spec, with PyInstaller stood in for -------------------------------------------------------


class Recorder:
    """PyInstaller's build targets: each records what it was given and passes it on."""

    def __init__(self, collected: list[tuple[str, str, str]]):
        self.collected = collected
        self.calls: dict[str, list] = {}

    def namespace(self) -> dict:
        recorder = self

        class Analysis:
            def __init__(self, scripts, **kwargs):
                recorder.calls["Analysis"] = [scripts, kwargs]
                self.binaries = list(recorder.collected)
                self.datas, self.pure, self.scripts = [], [], []

        def target(name):
            def make(*args, **kwargs):
                recorder.calls.setdefault(name, []).append((args, kwargs))
                return types.SimpleNamespace(name=name)

            return make

        return {
            "SPECPATH": str(SPEC.parent),
            "Analysis": Analysis,
            "PYZ": target("PYZ"),
            "EXE": target("EXE"),
            "COLLECT": target("COLLECT"),
            "BUNDLE": target("BUNDLE"),
        }


@pytest.fixture
def fake_pyinstaller(monkeypatch):
    hooks = types.ModuleType("PyInstaller.utils.hooks")
    hooks.collect_data_files = lambda *a, **k: []
    hooks.collect_submodules = lambda *a, **k: []
    hooks.copy_metadata = lambda *a, **k: []
    for name, module in {
        "PyInstaller": types.ModuleType("PyInstaller"),
        "PyInstaller.utils": types.ModuleType("PyInstaller.utils"),
        "PyInstaller.utils.hooks": hooks,
    }.items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.syspath_prepend(str(ROOT))  # the spec does this itself; undone after the test


def run_spec(collected, capsys) -> tuple[Recorder, str]:
    recorder = Recorder(collected)
    code = compile(SPEC.read_text(encoding="utf-8"), str(SPEC), "exec")
    exec(code, recorder.namespace())
    return recorder, capsys.readouterr().err


def collected_on_this_machine() -> list[tuple[str, str, str]]:
    """What PyInstaller collected on Debian 12, with this machine's files (names missing here are left out)."""
    entries = []
    for name in HOST_ONLY + PYTHON_RUNTIME:
        path = system_library(name)
        if path:
            entries.append((name, path, "BINARY"))
    for module in ("_ssl", "_ctypes"):
        path = stdlib_extension(module)
        if path:
            entries.append((f"python3.11/lib-dynload/{os.path.basename(path)}", path, "EXTENSION"))
    site = "/venv/lib/python3.11/site-packages"
    entries += [
        ("torch/lib/libtorch_cpu.so", f"{site}/torch/lib/libtorch_cpu.so", "BINARY"),
        ("libtorch_cpu.so", f"{site}/torch/lib/libtorch_cpu.so", "BINARY"),  # the second copy the spec drops
        ("PySide6/Qt/lib/libQt6Core.so.6", f"{site}/PySide6/Qt/lib/libQt6Core.so.6", "BINARY"),
    ]
    return entries


def test_the_spec_hands_collect_no_library_of_the_build_machine_but_pythons_runtime(fake_pyinstaller, capsys):
    collected = collected_on_this_machine()
    present = {d for d, *_ in collected}
    if not {"libportaudio.so.2", "libstdc++.so.6", "libssl.so.3"} <= present or stdlib_extension("_ssl") is None:
        pytest.skip("this machine lacks the libraries of the Debian 12 build (tests/system-packages.txt has them)")
    recorder, err = run_spec(collected, capsys)
    ((args, _kwargs),) = recorder.calls["COLLECT"]
    binaries = next(a for a in args if isinstance(a, list) and a and isinstance(a[0], tuple))
    names = {os.path.basename(d) for d, *_ in binaries}
    assert not names & set(HOST_ONLY), names & set(HOST_ONLY)
    assert {"libssl.so.3", "libcrypto.so.3"} <= names  # _ssl links them
    if stdlib_extension("_ctypes") and "libffi.so.8" in present:
        assert "libffi.so.8" in names
    dests = {d for d, *_ in binaries}
    assert "torch/lib/libtorch_cpu.so" in dests and "libtorch_cpu.so" not in dests
    assert "PySide6/Qt/lib/libQt6Core.so.6" in dests
    left_out = [n for n in HOST_ONLY if n in present]
    assert f"left out {len(left_out)} libraries of the build machine" in err
    assert all(n in err for n in left_out)


def test_the_spec_runs_the_environment_hook_first(fake_pyinstaller, capsys):
    recorder, _ = run_spec([], capsys)
    _scripts, kwargs = recorder.calls["Analysis"]
    (hook,) = kwargs["runtime_hooks"]
    assert Path(hook) == ROOT / "packaging" / "pyinstaller" / "rthook_user_env.py" and Path(hook).is_file()
    for excluded in ("transformers", "qwen_asr", "peft", "gguf", "pytest"):
        assert excluded in kwargs["excludes"]


# --- reading ELF files, and the glibc floor ---------------------------------------------------------


def readelf(*args: str) -> str:
    return subprocess.run(["readelf", "-W", *args], capture_output=True, text=True, timeout=60, check=True).stdout


def real_elf_files() -> list[str]:
    files = [system_library(n) for n in ("libportaudio.so.2", "libstdc++.so.6", "libssl.so.3")]
    files += [stdlib_extension("_ssl"), os.path.realpath(sys.executable)]
    return [f for f in files if f]


def test_elf_reading_agrees_with_readelf():
    files = real_elf_files()
    assert files
    for path in files:
        info = linux_libs.read_elf(path)
        assert info.needed == re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", readelf("-d", path)), path
        versions = readelf("-V", path)
        needed_part = versions.split("Version needs section", 1)[1] if "Version needs section" in versions else ""
        expected = set(re.findall(r"Name: (\S+)\s+Flags", needed_part))
        assert set().union(*info.versions_needed.values()) == expected, path
        files_expected = set(re.findall(r"File: (\S+)\s+Cnt", needed_part))
        assert set(info.versions_needed) == files_expected, path
        defs = (
            versions.split("Version definition section", 1)[1].split("Version needs section")[0]
            if ("Version definition section" in versions)
            else ""
        )
        assert info.versions_defined == set(re.findall(r"Name: (\S+)", defs)), path


def newest_glibc(path: str) -> str:
    versions = set().union(*linux_libs.read_elf(path).versions_needed.values())
    return max((v for v in versions if v.startswith("GLIBC_")), key=linux_libs.version_key)


def test_the_floor_is_the_newest_version_needed_and_bundled_ones_do_not_count(tmp_path):
    portaudio, stdcxx = system_library("libportaudio.so.2"), system_library("libstdc++.so.6")
    if not (portaudio and stdcxx):
        pytest.skip("needs libportaudio2 and libstdc++ (tests/system-packages.txt)")
    folder = tmp_path / "dictation" / "_internal"
    folder.mkdir(parents=True)
    shutil.copy(portaudio, folder / "libportaudio.so.2")
    (folder / "README.txt").write_text("not a library", encoding="utf-8")
    found = linux_libs.floors(tmp_path / "dictation")
    assert found["GLIBC"] == (newest_glibc(portaudio), folder / "libportaudio.so.2")
    # libstdc++ in the folder provides the GLIBCXX versions itself: the system need not have them
    shutil.copy(stdcxx, folder / "libstdc++.so.6")
    found = linux_libs.floors(tmp_path / "dictation")
    assert "GLIBCXX" not in found
    newest = max(newest_glibc(portaudio), newest_glibc(stdcxx), key=linux_libs.version_key)
    assert found["GLIBC"][0] == newest


def test_the_floor_command_and_its_limit(tmp_path):
    portaudio = system_library("libportaudio.so.2")
    if not portaudio:
        pytest.skip("needs libportaudio2 (tests/system-packages.txt)")
    (tmp_path / "app").mkdir()
    shutil.copy(portaudio, tmp_path / "app" / "libportaudio.so.2")
    needed = newest_glibc(portaudio).removeprefix("GLIBC_")

    def floor(*args):
        script = ROOT / "packaging" / "linux_libs.py"
        return subprocess.run([sys.executable, script, *args], capture_output=True, text=True, timeout=60)

    ok = floor(str(tmp_path / "app"), "--max", needed)
    assert ok.returncode == 0, ok.stderr
    assert f"needs glibc >= {needed} (GLIBC_{needed}, first needed by libportaudio.so.2)" in ok.stdout
    major, minor = needed.split(".")[:2]
    too_old = f"{major}.{int(minor) - 1}"
    refused = floor(str(tmp_path / "app"), "--max", too_old)
    assert refused.returncode == 1 and f"needs GLIBC_{needed}, newer than glibc {too_old}" in refused.stderr


def test_a_file_that_is_not_elf_or_is_broken_is_named(tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("hello", encoding="utf-8")
    with pytest.raises(linux_libs.NotElf, match="notes.txt: not an ELF file"):
        linux_libs.read_elf(text)
    broken = tmp_path / "libbroken.so"
    broken.write_bytes(b"\x7fELF\x02\x01\x01" + b"\0" * 9 + b"\xff" * 40)
    with pytest.raises(ValueError, match="libbroken.so: broken ELF file"):
        linux_libs.read_elf(broken)
    folder = tmp_path / "app"
    folder.mkdir()
    shutil.copy(broken, folder / "libbroken.so")
    proc = subprocess.run(
        [sys.executable, ROOT / "packaging" / "linux_libs.py", folder], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2 and "libbroken.so: broken ELF file" in proc.stderr
