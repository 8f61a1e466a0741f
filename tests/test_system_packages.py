"""The one list of system packages (`dictation.system_packages`) is what the docs say, what the test
machine installs, and complete for the installed PySide6: every shared library its Qt libraries and
platform plugins link against (read from their ELF files) is either in the wheel, a base library,
or in the list; and every library in the Qt rows is one of those."""

from __future__ import annotations

import re
import struct
import sys
from pathlib import Path

import pytest

from dictation import preflight, system_packages
from dictation.system_packages import BASE_LIBRARIES, GROUPS, install_command, names, packages

REPO = Path(__file__).resolve().parents[1]
README_GROUPS = ("build", "venv", "microphone", "qt", "x11")
EXAMPLE_GROUPS = ("build", "venv", "microphone", "qt", "x11", "gnome-tray")  # install.md's Ubuntu GNOME X11
TEST_MACHINE_GROUPS = ("microphone", "qt", "qt-wayland", "x11", "wlroots")  # what the suite runs for real
# What the app loads from the PySide6 wheel (the modules it imports, Qt's libraries behind them,
# the xcb and Wayland platform plugins with what they load next): relative to PySide6/.
PYSIDE_FILES = (
    "QtCore.abi3.so",
    "QtGui.abi3.so",
    "QtWidgets.abi3.so",
    "QtNetwork.abi3.so",
    "QtSvg.abi3.so",
    "Qt/lib/libQt6Core.so.6",
    "Qt/lib/libQt6Gui.so.6",
    "Qt/lib/libQt6Widgets.so.6",
    "Qt/lib/libQt6Network.so.6",
    "Qt/lib/libQt6Svg.so.6",
    "Qt/lib/libQt6DBus.so.6",
    "Qt/lib/libQt6XcbQpa.so.6",
    "Qt/lib/libQt6WaylandClient.so.6",
    "Qt/plugins/platforms/libqxcb.so",
    "Qt/plugins/platforms/libqwayland.so",
    "Qt/plugins/platforminputcontexts/libcomposeplatforminputcontextplugin.so",
    "Qt/plugins/wayland-shell-integration/libxdg-shell.so",
    "Qt/plugins/iconengines/libqsvgicon.so",
    "Qt/plugins/imageformats/libqsvg.so",
)


def apt_packages_in(markdown: str) -> list[list[str]]:
    """The package names of each ``sudo apt install`` command in the markdown's code blocks."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", markdown, re.S):
        joined = block.replace("\\\n", " ")
        for line in joined.splitlines():
            words = line.split()
            if words[:3] == ["sudo", "apt", "install"]:
                commands.append(words[3:])
    return commands


def test_the_readme_installs_what_the_list_says():
    commands = apt_packages_in((REPO / "README.md").read_text(encoding="utf-8"))
    assert names(packages(*README_GROUPS), "apt") in commands
    assert "libxcb-cursor0" in names(packages(*README_GROUPS), "apt")


def test_the_install_guide_table_and_example_are_the_list():
    guide = (REPO / "docs" / "guide" / "install.md").read_text(encoding="utf-8")
    rows = [line for line in guide.splitlines() if line.startswith("| ") and "`" in line]
    assert rows == [system_packages.table_row(g.key) for g in GROUPS]
    assert apt_packages_in(guide)[0] == names(packages(*EXAMPLE_GROUPS), "apt")


def test_the_test_machine_installs_every_runtime_package():
    listed = {
        line.strip()
        for line in (REPO / "tests" / "system-packages.txt").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert set(names(packages(*TEST_MACHINE_GROUPS), "apt")) - listed == set()


def elf_needed(path: Path) -> list[str]:
    """The DT_NEEDED entries of a 64-bit little-endian ELF file (its dynamic section and string table)."""
    data = path.read_bytes()
    assert data[:4] == b"\x7fELF" and data[4] == 2 and data[5] == 1, f"{path}: not a 64-bit little-endian ELF"
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    # Elf64_Shdr: name, type, flags, addr, offset, size, link, info, addralign, entsize
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    needed = []
    for section in sections:
        if section[1] != 6:  # SHT_DYNAMIC
            continue
        strings = sections[section[6]][4]
        for offset in range(section[4], section[4] + section[5], 16):
            tag, value = struct.unpack_from("<qQ", data, offset)
            if tag == 0:  # DT_NULL
                break
            if tag == 1:  # DT_NEEDED
                start = strings + value
                needed.append(data[start : data.index(b"\0", start)].decode())
    return needed


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ELF files of the Linux wheel")
def test_the_qt_rows_are_exactly_what_the_installed_pyside6_links_against():
    root = preflight.default_plugins_root()
    assert root is not None, "PySide6 is not installed from its wheel"
    pyside = root.parents[1]
    bundled = {p.name for p in (pyside / "Qt" / "lib").iterdir()}
    needed: dict[str, str] = {}
    for name in PYSIDE_FILES:
        for soname in elf_needed(pyside / name):
            own = soname in bundled or soname.startswith(preflight.QT_OWN)  # Qt, ICU, PySide6, Shiboken
            if not own and soname not in BASE_LIBRARIES:
                needed.setdefault(soname, name)
    listed = set(system_packages.libraries("qt", "qt-wayland"))
    assert {s: f for s, f in needed.items() if s not in listed} == {}  # a library PySide6 needs is unlisted
    assert listed - set(needed) == set()  # a listed library nothing needs


def test_every_listed_library_loads_here():
    """The test machine has them all (else the checks of doctor and preflight would say so)."""
    assert system_packages.missing_libraries(system_packages.libraries()) == {}


def test_install_commands_per_package_manager():
    qt_cursor = system_packages.for_library("libxcb-cursor.so.0")
    assert [qt_cursor.name(m) for m in ("apt", "dnf", "pacman", "zypper")] == [
        "libxcb-cursor0",
        "xcb-util-cursor",
        "xcb-util-cursor",
        "'libxcb-cursor.so.0()(64bit)'",
    ]
    assert install_command(packages("venv"), "dnf") == ""  # Fedora's Python has venv
    assert install_command(packages("x11"), "pacman") == "sudo pacman -S xdotool xclip xorg-xprop xorg-xmodmap"
    assert install_command(packages("qt"), "pacman").count("libglvnd") == 1  # one package, two libraries
    assert system_packages.fix_for_libraries(["libxcb-cursor.so.0", "libfoo.so.3"], "apt") == (
        "`sudo apt install libxcb-cursor0` and the package that provides libfoo.so.3"
    )
    assert system_packages.for_tool("wl-paste").apt == "wl-clipboard"
    assert system_packages.for_tool("portaudio").apt == "libportaudio2"
    assert system_packages.for_tool("nothing-like-it") is None
    which = {"pacman": "/usr/bin/pacman"}.get
    assert system_packages.package_manager(which) == "pacman"
    assert system_packages.package_manager(lambda tool: None) == "apt"
