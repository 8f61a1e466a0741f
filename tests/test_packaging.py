"""Packaging and desktop integration: the wheel, the PNG icons, the app-menu entry and the systemd unit.

- The wheel is built from a copy of the checkout (no network: the build backend comes from this
  environment), installed into a fresh virtual environment that borrows this one's packages
  (torch and the rest) but not this checkout, and run from outside the repository.
- The committed PNGs must be what tools/make_icons.py renders from the SVGs now, and the tray
  icons must stand out at 16 px on a white and on a black panel.
- `dictation install-desktop` writes and removes its files under a temp HOME; the entries pass
  desktop-file-validate (desktop-file-utils, in tests/system-packages.txt) and the unit passes
  systemd-analyze verify where systemd is installed.
"""

from __future__ import annotations

import configparser
import json
import os
import shlex
import shutil
import site
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from pathlib import Path

import pytest

import dictation
from dictation import autostart, desktop, resources
from dictation.audio.wav import write_wav
from tests.oracle import synth_audio
from tests.test_autostart import parse_exec

ROOT = Path(__file__).resolve().parents[1]
# What the wheel is built from: the checkout's files, without caches, build output or environments.
SOURCE_ENTRIES = (
    "pyproject.toml",
    "MANIFEST.in",
    "README.md",
    "LICENSE",
    "dictation",
    "tests",
    "benchmarks",
    "tools",
    "docs",
    "packaging",
)
IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", "build", "dist", "*.egg-info", ".*")


def clean_env(**extra: str) -> dict[str, str]:
    """The environment for programs of the test venv: nothing pointing back at this checkout."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    return {**env, "HF_HUB_OFFLINE": "1", "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1", **extra}


STALE_MODULE = "removed_module.py"


def run(args, cwd, timeout=120, **env):
    proc = subprocess.run(
        [str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=clean_env(**env)
    )
    assert proc.returncode == 0, f"{args}\n{proc.stdout}\n{proc.stderr}"
    return proc


# --- the wheel -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """A copy of the checkout's files, with the leftovers of an earlier build."""
    src = tmp_path_factory.mktemp("src")
    for name in SOURCE_ENTRIES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=IGNORED)
        elif path.is_file():
            shutil.copy2(path, src / name)
    # What an earlier `pip install .` of an older checkout leaves behind: setuptools' staging folder
    # with a module that has since been removed. It must not ship again.
    stale = src / "build" / "lib" / "dictation" / STALE_MODULE
    stale.parent.mkdir(parents=True)
    stale.write_text("raise ImportError('removed long ago')\n", encoding="utf-8")
    return src


@pytest.fixture(scope="module")
def wheel(source, tmp_path_factory) -> Path:
    src = source
    out = tmp_path_factory.mktemp("wheels")
    # --no-build-isolation: setuptools comes from this environment (torch requires it), no download.
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", src, "-w", out], out)
    (found,) = out.glob("dictation-*.whl")
    return found


def test_wheel_carries_the_resources_and_only_the_package(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    dist_info = f"dictation-{dictation.__version__}.dist-info/"
    assert all(n.startswith(("dictation/", dist_info)) for n in names), [
        n for n in names if not n.startswith(("dictation/", dist_info))
    ]
    assert not any(part in ("tests", "benchmarks", "tools", "packaging") for n in names for part in n.split("/"))
    data = {n.removeprefix("dictation/resources/") for n in names if n.startswith("dictation/resources/")}
    expected = {resources.icon_name(s) for s in (*resources.ICON_STATES, resources.APP_ICON)}
    expected |= {resources.png_icon_name(s, n) for s in (*resources.ICON_STATES, "app") for n in resources.PNG_SIZES}
    expected |= {resources.sound_name(cue) for cue in resources.SOUNDS}
    expected |= {resources.DESKTOP_TEMPLATE, resources.SERVICE_TEMPLATE}
    expected |= {f"spoken/{code}.json" for code in resources.SPOKEN_LANGUAGES}
    assert expected <= data, expected - data
    assert "dictation/asr/nn/native/decode_step.c" in names  # compiled on the user's machine (native_step.py)
    assert f"{dist_info}entry_points.txt" in names
    assert "dictation = dictation.cli:main" in zipfile.ZipFile(wheel).read(f"{dist_info}entry_points.txt").decode()
    assert f"dictation/{STALE_MODULE}" not in names  # the build starts from an empty build/lib


def test_wheel_declares_the_license_and_carries_its_text(wheel):
    """An SPDX expression (PEP 639), not the deprecated table, and the LICENSE file in the wheel."""
    archive = zipfile.ZipFile(wheel)
    dist_info = f"dictation-{dictation.__version__}.dist-info/"
    metadata = archive.read(f"{dist_info}METADATA").decode()
    headers = metadata.split("\n\n", 1)[0].splitlines()
    assert "License-Expression: Apache-2.0" in headers
    assert "License-File: LICENSE" in headers
    assert not any(h.startswith("License:") for h in headers)
    license_text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert archive.read(f"{dist_info}licenses/LICENSE").decode() == license_text
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
    assert "END OF TERMS AND CONDITIONS" in license_text
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert 'license = "Apache-2.0"' in pyproject


def test_the_source_distribution_builds_the_same_wheel(source, wheel, tmp_path):
    """`python -m build` makes an sdist and builds the wheel from it: the sdist must carry the build
    backend (pyproject.toml's backend-path) and the LICENSE."""
    build_sdist = (
        "import sys; sys.path.insert(0, 'packaging/build_backend'); import dictation_build; "
        f"print(dictation_build.build_sdist({str(tmp_path)!r}))"
    )
    name = run([sys.executable, "-c", build_sdist], source).stdout.strip().splitlines()[-1]
    sdist = tmp_path / name
    with tarfile.open(sdist) as tar:
        members = {m.split("/", 1)[1] for m in tar.getnames() if "/" in m}
    assert {"pyproject.toml", "LICENSE", "packaging/build_backend/dictation_build.py"} <= members
    out = tmp_path / "from-sdist"
    run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", sdist, "-w", out],
        tmp_path,
    )
    (rebuilt,) = out.glob("dictation-*.whl")
    assert sorted(zipfile.ZipFile(rebuilt).namelist()) == sorted(zipfile.ZipFile(wheel).namelist())


def test_the_cpu_torch_route_is_documented_for_pip_and_pipx_alike():
    """pipx makes its own environment, so torch cannot be installed into it first: its CPU route passes
    PyTorch's index through --pip-args. The update advice keeps the chosen build."""
    from dictation.doctor import CPU_TORCH_URL

    pipx_cpu = f'pipx install --pip-args="--extra-index-url {CPU_TORCH_URL}" .'
    pip_cpu = f"pip install torch --index-url {CPU_TORCH_URL} && pip install ."
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    guide = (ROOT / "docs" / "guide" / "install.md").read_text(encoding="utf-8")
    assert pip_cpu in readme and pipx_cpu in readme
    pipx_section = guide.split("### With pipx", 1)[1].split("\n### ", 1)[0]
    assert pipx_cpu in pipx_section
    assert "--force-reinstall torch" not in pipx_section  # the swap that left the NVIDIA packages behind
    update = next(line for line in guide.split("\n- ") if line.startswith("Update:"))
    assert "pipx runpip dictation install ." in update
    assert "(or `pipx install --force .`)" not in update


def test_build_outputs_and_the_build_environment_are_ignored_by_git(tmp_path):
    """release.md builds in .venv-build/ and writes build/ and dist/: none of it may be committed."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    paths = [".venv-build/bin/python", "build/lib/dictation/cli.py", "dist/dictation/dictation"]
    proc = subprocess.run(["git", "check-ignore", "--no-index", *paths], cwd=ROOT, capture_output=True, text=True)
    assert proc.stdout.split() == paths, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    """A fresh venv with the wheel installed; torch & co. come from this environment's site-packages."""
    env_dir = tmp_path_factory.mktemp("venv") / "env"
    run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", env_dir], env_dir.parent)
    python = env_dir / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    probe = "import sysconfig; print(sysconfig.get_path('purelib'))"
    purelib = Path(run([python, "-c", probe], env_dir).stdout.strip())
    # When the tests run in a venv, --system-site-packages reaches the base interpreter's packages,
    # not this venv's: add this environment's site-packages by path (appended after the venv's
    # own, and without running their .pth files, so an editable install of this checkout stays out).
    (purelib / "borrowed-test-env.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", wheel], env_dir)
    return env_dir


def venv_bin(venv: Path, name: str) -> Path:
    return venv / ("Scripts" if os.name == "nt" else "bin") / (name + (".exe" if os.name == "nt" else ""))


def test_installed_wheel_runs_from_outside_the_checkout(venv, ckpt_untied, tmp_path):
    """`dictation --version` and `dictation transcribe` of the installed wheel, started from tmp_path."""
    dictation_exe = venv_bin(venv, "dictation")
    proc = run([dictation_exe, "--version"], tmp_path)
    assert proc.stdout.strip() == f"dictation {dictation.__version__}"

    probe = textwrap.dedent("""
        import json
        from importlib.resources import files
        import dictation
        from dictation import resources
        root = files("dictation.resources")
        print(json.dumps({
            "module": dictation.__file__,
            "files": sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and p.suffix != ".pyc"),
            "sound": str(resources.sound_path("start")),
            "png": str(resources.resource_path(resources.png_icon_name("idle", 16))),
        }))
    """)
    found = json.loads(run([venv_bin(venv, "python"), "-c", probe], tmp_path).stdout)
    assert Path(found["module"]).is_relative_to(venv) and not Path(found["module"]).is_relative_to(ROOT)
    for key in ("sound", "png"):
        assert Path(found[key]).is_relative_to(venv) and Path(found[key]).is_file()
    assert {"dictation.desktop", "dictation.service", "icons/app.svg", "icons/png/256/app.png"} <= set(found["files"])

    wav = tmp_path / "speech.wav"
    write_wav(wav, synth_audio(2.0, seed=5), 16000)
    args = ["transcribe", wav, "--model", ckpt_untied, "--device", "cpu", "--max-new-tokens", "4", "--json"]
    row = json.loads(run([dictation_exe, *args], tmp_path, timeout=180).stdout)
    assert row["file"] == str(wav) and row["audio_seconds"] == pytest.approx(2.0)
    assert len(row["token_ids"]) == 4 and row["text"]

    from dictation.asr import AsrEngine, EngineOptions
    from dictation.audio.wav import load_audio_16k

    engine = AsrEngine(EngineOptions(model=str(ckpt_untied), device="cpu"))
    assert row["token_ids"] == engine.transcribe(load_audio_16k(wav), max_new_tokens=4).token_ids


def test_installed_app_menu_entry_starts_the_venv(venv, tmp_path):
    """From a venv (or pipx) install, the entries name that venv's interpreter by absolute path."""
    home = tmp_path / "home"
    home.mkdir()
    env = {"HOME": str(home), "XDG_DATA_HOME": "", "XDG_CONFIG_HOME": ""}
    run([venv_bin(venv, "dictation"), "install-desktop", "--systemd"], tmp_path, **env)
    entry = desktop_entry(home / ".local/share/applications/dictation.desktop")
    argv = parse_exec(entry["Exec"])
    assert argv == [str(venv_bin(venv, "python")), "-m", "dictation"]
    assert run([*argv, "--version"], tmp_path).stdout.startswith("dictation ")
    unit = read_unit(home / ".config/systemd/user/dictation.service")
    assert systemd_argv(unit["Service"]["ExecStart"]) == argv
    run([venv_bin(venv, "dictation"), "install-desktop", "--uninstall"], tmp_path, **env)
    assert not list(home.rglob("*.desktop")) and not list(home.rglob("*.service"))


# --- PNG icons -----------------------------------------------------------------------------------------

QT_SCRIPT_HEAD = textwrap.dedent("""
    import json, sys
    import numpy as np
    from PySide6.QtGui import QGuiApplication, QImage
    app = QGuiApplication([])
    def pixels(image):  # premultiplied RGBA as float array [h, w, 4]: transparent pixels compare equal
        image = image.convertToFormat(QImage.Format.Format_RGBA8888_Premultiplied)
        h, w = image.height(), image.width()
        data = np.frombuffer(image.constBits(), np.uint8).reshape(h, image.bytesPerLine())[:, : w * 4]
        return data.reshape(h, w, 4).astype(np.float64)
""")


def run_qt(script: str, *args: str) -> dict:
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    proc = subprocess.run(
        [sys.executable, "-c", QT_SCRIPT_HEAD + textwrap.dedent(script), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_committed_pngs_are_what_make_icons_renders(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "make_icons.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "QT_QPA_PLATFORM": "offscreen"},
    )
    assert proc.returncode == 0, proc.stderr
    committed = ROOT / "dictation" / "resources" / "icons" / "png"
    fresh = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.png"))
    assert sorted(p.relative_to(committed).as_posix() for p in committed.rglob("*.png")) == fresh
    expected = [f"{size}/{name}.png" for size in resources.PNG_SIZES for name in (*resources.ICON_STATES, "app")]
    assert sorted(expected) == fresh
    found = run_qt(
        """
        from pathlib import Path
        committed, fresh = Path(sys.argv[1]), Path(sys.argv[2])
        result = {}
        for path in sorted(fresh.rglob("*.png")):
            name = path.relative_to(fresh).as_posix()
            a, b = QImage(str(path)), QImage(str(committed / name))
            if a.size() != b.size():
                result[name] = "size"
                continue
            diff = np.abs(pixels(a) - pixels(b))
            result[name] = [float(diff.max()), float(diff.mean())]
        print(json.dumps(result))
        """,
        str(committed),
        str(tmp_path),
    )
    # Another Qt version may antialias edges a little differently; a changed SVG differs far more.
    stale = {name: d for name, d in found.items() if d == "size" or d[0] > 64 or d[1] > 1.0}
    assert not stale, f"run tools/make_icons.py and commit dictation/resources/icons/png/: {stale}"


def test_tray_icons_stand_out_on_light_and_dark_panels():
    """At 16 px on white and on black, enough of each state icon contrasts with the panel (>= 3:1).

    The measure is the WCAG contrast ratio of the composited pixel against the background, over the
    pixels the icon covers (alpha > 25 %). The dark outline carries the light panel, the bright
    fill the dark one; the icons as first drawn (no outline) had 7 % on white for idle and loading.
    """
    found = run_qt(
        """
        from PySide6.QtCore import QRectF, Qt
        from PySide6.QtGui import QPainter
        from PySide6.QtSvg import QSvgRenderer
        def luminance(rgb):
            c = rgb / 255.0
            c = np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)
            return c @ np.array([0.2126, 0.7152, 0.0722])
        result = {}
        for state, path in json.loads(sys.argv[1]).items():
            renderer = QSvgRenderer(path)
            image = QImage(16, 16, QImage.Format.Format_RGBA8888_Premultiplied)
            image.fill(Qt.GlobalColor.transparent)
            painter = QPainter(image)
            painter.setRenderHint(QPainter.RenderHint.Antialiasing)
            renderer.render(painter, QRectF(0, 0, 16, 16))
            painter.end()
            px = pixels(image)
            alpha = px[..., 3:] / 255.0
            covered = alpha[..., 0] > 0.25
            for name, bg in (("white", 255.0), ("black", 0.0)):
                shown = px[..., :3] + bg * (1 - alpha)  # premultiplied "over"
                lum, lum_bg = luminance(shown), luminance(np.full(3, bg))
                ratio = (np.maximum(lum, lum_bg) + 0.05) / (np.minimum(lum, lum_bg) + 0.05)
                strong = int(((ratio >= 3.0) & covered).sum())
                result[f"{state}/{name}"] = [strong, int(covered.sum())]
        print(json.dumps(result))
        """,
        json.dumps({state: str(resources.icon_path(state)) for state in resources.ICON_STATES}),
    )
    weak = {key: v for key, v in found.items() if v[0] < 30 or v[0] < 0.25 * v[1]}
    assert not weak, f"[pixels with >= 3:1 contrast, pixels covered] at 16 px: {weak}"


# --- app-menu entry, icons, systemd unit ----------------------------------------------------------------


@pytest.fixture
def home(home, monkeypatch):
    """The test's home (tests/conftest.py) with the XDG folders left to their defaults, on Linux."""
    for var in ("XDG_DATA_HOME", "XDG_CONFIG_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(sys, "platform", "linux")
    return home


def desktop_entry(path: Path) -> configparser.SectionProxy:
    parser = configparser.ConfigParser(interpolation=None, strict=True)
    parser.optionxform = str
    parser.read_string(path.read_text(encoding="utf-8"))
    return parser["Desktop Entry"]


def read_unit(path: Path) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None, strict=True)
    parser.optionxform = str
    parser.read_string(path.read_text(encoding="utf-8"))
    return parser


def systemd_argv(value: str) -> list[str]:
    """ExecStart -> argv for the quoting `systemd_exec` uses (shell-like double quotes, %% and $$)."""
    return [arg.replace("%%", "%").replace("$$", "$") for arg in shlex.split(value)]


def test_install_writes_the_menu_entry_and_the_icon(home):
    report = desktop.install()
    entry_path = home / ".local/share/applications/dictation.desktop"
    assert f"wrote {entry_path}" in report
    entry = desktop_entry(entry_path)
    assert entry["Icon"] == "dictation" and entry["Name"] == "Dictation" and entry["Type"] == "Application"
    assert parse_exec(entry["Exec"]) == autostart.launch_command() == [sys.executable, "-m", "dictation"]
    assert "X-GNOME-Autostart-enabled" not in entry
    hicolor = home / ".local/share/icons/hicolor"
    for size in resources.PNG_SIZES:
        png = hicolor / f"{size}x{size}/apps/dictation.png"
        assert png.read_bytes() == resources.read_bytes(resources.png_icon_name("app", size))
    assert (hicolor / "scalable/apps/dictation.svg").read_bytes() == resources.icon_svg("app")
    assert not (home / ".config/systemd").exists()


def test_the_menu_and_autostart_entries_share_the_template(home):
    desktop.install()
    menu = desktop_entry(desktop.desktop_entry_path())
    auto = desktop_entry(autostart.set_enabled(True, "linux"))
    assert menu["Exec"] == auto["Exec"]
    shared = {k: v for k, v in menu.items() if k != "Icon"}
    assert {k: v for k, v in auto.items() if k not in ("Icon", "X-GNOME-Autostart-enabled")} == shared
    assert Path(auto["Icon"]).is_absolute() and Path(auto["Icon"]).is_file()  # works without the hicolor copy


def test_xdg_variables_move_the_files_and_relative_ones_are_ignored(home, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setenv("XDG_CONFIG_HOME", "relative")
    desktop.install(systemd=True)
    assert (tmp_path / "data/applications/dictation.desktop").is_file()
    assert (tmp_path / "data/icons/hicolor/48x48/apps/dictation.png").is_file()
    assert (home / ".config/systemd/user/dictation.service").is_file()


def test_systemd_unit_starts_this_installation_with_the_session(home, tmp_path, monkeypatch):
    odd = tmp_path / "my venv $HOME 100% \"q\" \\ 'x'" / "bin"
    odd.mkdir(parents=True)
    python = odd / "python"
    python.symlink_to(sys.executable)
    monkeypatch.setattr(sys, "executable", str(python))
    report = desktop.install(systemd=True)
    path = home / ".config/systemd/user/dictation.service"
    assert f"wrote {path}" in report
    assert any("systemctl --user enable --now dictation" in line for line in report)
    unit = read_unit(path)
    argv = systemd_argv(unit["Service"]["ExecStart"])
    assert argv == [str(python), "-m", "dictation"]
    proc = subprocess.run([*argv, "--version"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.startswith("dictation "), proc.stderr
    assert unit["Install"]["WantedBy"] == "graphical-session.target"
    assert unit["Unit"]["PartOf"] == "graphical-session.target"
    assert unit["Service"]["Restart"] == "on-failure"


def test_systemd_exec_quoting():
    assert desktop.systemd_exec(["/usr/bin/python3", "-m", "dictation"]) == "/usr/bin/python3 -m dictation"
    assert desktop.systemd_exec(["/a b/py"]) == '"/a b/py"'
    assert desktop.systemd_exec(["50%", "$X"]) == "50%% $$X"
    assert desktop.systemd_exec(['a"b\\c']) == '"a\\"b\\\\c"'
    assert desktop.systemd_exec([""]) == '""'


def test_uninstall_removes_what_install_wrote_and_the_enable_link(home):
    desktop.install(systemd=True)
    unit = desktop.service_path()
    wants = unit.parent / "graphical-session.target.wants"
    wants.mkdir()
    (wants / "dictation.service").symlink_to(unit)  # what `systemctl --user enable` makes
    other = wants / "other.service"
    other.symlink_to(unit.parent / "other.service")
    report = desktop.uninstall()
    assert f"removed {wants / 'dictation.service'}" in report
    assert [p for p in home.rglob("*") if p.is_file() or p.is_symlink()] == [other]  # only the foreign link
    assert desktop.uninstall() == ["nothing to remove"]


def test_files_the_user_wrote_are_left_alone(home):
    entry = desktop.desktop_entry_path()
    entry.parent.mkdir(parents=True)
    mine = "[Desktop Entry]\nType=Application\nName=My dictation\nExec=dictation --mine\n"
    entry.write_text(mine)
    report = desktop.install()
    assert any(line.startswith(f"left alone: {entry}") for line in report)
    assert entry.read_text() == mine
    report = desktop.uninstall()
    assert f"left alone: {entry} was not written by Dictation" in report
    assert entry.read_text() == mine
    assert not (home / ".local/share/icons/hicolor/48x48/apps/dictation.png").exists()


def test_a_write_failure_is_one_line_and_other_platforms_are_refused(home, monkeypatch):
    (home / ".local").write_text("a file where the folder should be")
    with pytest.raises(desktop.DesktopError, match=r"^cannot write .*dictation\.(png|svg): ") as info:
        desktop.install()
    assert "\n" not in str(info.value)
    for platform in ("win32", "darwin"):
        monkeypatch.setattr(sys, "platform", platform)
        with pytest.raises(OSError, match="install-desktop is for Linux"):
            desktop.install()


def test_cli_install_desktop_and_uninstall(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "HOME": str(home), "XDG_DATA_HOME": "", "XDG_CONFIG_HOME": ""}
    cmd = [sys.executable, "-m", "dictation", "install-desktop"]
    proc = subprocess.run([*cmd, "--systemd"], capture_output=True, text=True, timeout=60, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "systemctl --user enable --now dictation" in proc.stdout
    assert (home / ".local/share/applications/dictation.desktop").is_file()
    assert (home / ".config/systemd/user/dictation.service").is_file()
    proc = subprocess.run([*cmd, "--uninstall"], capture_output=True, text=True, timeout=60, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert not [p for p in home.rglob("*") if p.is_file()]


def test_entries_pass_desktop_file_validate(home):
    tool = shutil.which("desktop-file-validate")
    assert tool, "desktop-file-validate is missing: install tests/system-packages.txt (desktop-file-utils)"
    desktop.install()
    paths = [desktop.desktop_entry_path(), autostart.set_enabled(True, "linux")]
    paths.append(ROOT / "packaging" / "linux" / "dictation.desktop")
    for path in paths:
        proc = subprocess.run([tool, str(path)], capture_output=True, text=True, timeout=30)
        assert proc.returncode == 0 and not proc.stdout.strip(), f"{path}: {proc.stdout}{proc.stderr}"


def test_units_are_well_formed_user_services(home):
    """What `systemctl --user` needs from the unit, checked without a running systemd (CI has none)."""
    import configparser
    import shlex

    desktop.install(systemd=True)
    for path in (desktop.service_path(), ROOT / "packaging" / "linux" / "dictation.service"):
        unit = configparser.ConfigParser(interpolation=None, strict=True)
        unit.optionxform = str  # systemd keys are case-sensitive
        unit.read_string(path.read_text(encoding="utf-8"))
        assert set(unit.sections()) == {"Unit", "Service", "Install"}, path
        assert unit["Unit"]["Description"].strip(), path
        assert unit["Install"]["WantedBy"] == "graphical-session.target", path
        assert unit["Unit"]["PartOf"] == "graphical-session.target", path
        command = shlex.split(unit["Service"]["ExecStart"])
        assert Path(command[0]).is_absolute(), f"{path}: ExecStart must be an absolute path"
        if path == desktop.service_path():  # the user install starts this very installation
            assert command[0] == sys.executable and command[1:3] == ["-m", "dictation"]


def test_packaged_linux_files_are_the_templates_filled_for_a_system_install():
    linux = ROOT / "packaging" / "linux"
    filled = resources.desktop_template().replace("{exec}", "dictation").replace("{icon}", "dictation")
    assert (linux / "dictation.desktop").read_text(encoding="utf-8") == filled
    unit = resources.service_template().replace("{exec}", "/usr/bin/dictation")
    assert (linux / "dictation.service").read_text(encoding="utf-8") == unit


# --- PyInstaller ---------------------------------------------------------------------------------------


def test_pyinstaller_spec_and_build_script_parse():
    """The build itself is a release job (packaging/release.md): too heavy for the test suite."""
    spec = ROOT / "packaging" / "pyinstaller" / "dictation.spec"
    compile(spec.read_text(encoding="utf-8"), str(spec), "exec")
    text = spec.read_text(encoding="utf-8")
    for excluded in ("transformers", "qwen_asr", "peft", "gguf", "pytest"):
        assert f'"{excluded}"' in text
    proc = subprocess.run(["bash", "-n", str(ROOT / "packaging" / "build_app.sh")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
