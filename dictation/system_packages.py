"""Every system package the app needs on Linux, in one place, per distribution family.

README.md ("Install and run"), docs/guide/install.md (its table and example command) and
tests/system-packages.txt are checked against `GROUPS` by tests/test_system_packages.py;
`dictation doctor` and the start-up check (`dictation.preflight`) turn missing libraries and tools
into the install command for the package manager found here (`package_manager`).

A `Package` names one package for apt (Debian, Ubuntu), dnf (Fedora) and pacman (Arch), with the
shared libraries (sonames) the app loads from it and the commands it runs from it. ``None`` for
dnf or pacman means that distribution needs nothing extra (its Python includes venv). zypper
(openSUSE) gets RPM capabilities such as ``libxcb-cursor.so.0()(64bit)`` for libraries, which name
the library rather than guess a package name, and the tool's own name for commands.

The Qt rows are the libraries outside the PySide6 wheel that its Qt libraries and the xcb and
Wayland platform plugins link against (tests/test_system_packages.py reads them from the installed
wheel's ELF files, so a PySide6 update that needs another library fails that test). The C library,
libstdc++, libgcc, zlib and zstd are left out: every system that runs Python and its package
manager has them (`BASE_LIBRARIES`).

Qt-free and import-light (the start-up check runs before Qt is loaded).
"""

from __future__ import annotations

import ctypes
import os
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass

MANAGERS = ("apt", "dnf", "pacman", "zypper")
INSTALL = {
    "apt": "sudo apt install",
    "dnf": "sudo dnf install",
    "pacman": "sudo pacman -S",
    "zypper": "sudo zypper install",
}
# Sonames every Linux system with Python and a package manager has (glibc, the C++ runtime, zlib, zstd).
BASE_LIBRARIES = frozenset(
    {
        "ld-linux-x86-64.so.2",
        "ld-linux-aarch64.so.1",
        "libc.so.6",
        "libm.so.6",
        "libdl.so.2",
        "libpthread.so.0",
        "librt.so.1",
        "libresolv.so.2",
        "libstdc++.so.6",
        "libgcc_s.so.1",
        "libz.so.1",
        "libzstd.so.1",
    }
)


@dataclass(frozen=True)
class Package:
    apt: str
    dnf: str | None
    pacman: str | None
    libraries: tuple[str, ...] = ()  # sonames the app loads from it
    tools: tuple[str, ...] = ()  # commands the app runs from it
    zypper: str | None = None  # where the name is known; else a library's RPM capability or the tool's name

    def name(self, manager: str) -> str | None:
        """This package's name for ``manager``; None where that distribution needs nothing."""
        if manager == "apt":
            return self.apt
        if manager in ("dnf", "pacman"):
            return getattr(self, manager)
        if manager == "zypper":
            if self.zypper:
                return self.zypper
            if self.libraries:
                return f"'{self.libraries[0]}()(64bit)'"
            return self.tools[0] if self.tools else self.dnf
        raise ValueError(f"unknown package manager {manager!r}; known: {', '.join(MANAGERS)}")


@dataclass(frozen=True)
class Group:
    key: str
    purpose: str  # what the packages are for, as the install guide's table says it
    packages: tuple[Package, ...]


def _lib(apt: str, dnf: str, pacman: str, *libraries: str) -> Package:
    return Package(apt, dnf, pacman, libraries=libraries)


def _tool(apt: str, dnf: str, pacman: str, *tools: str) -> Package:
    return Package(apt, dnf, pacman, tools=tools or (apt,))


WL_CLIPBOARD = _tool("wl-clipboard", "wl-clipboard", "wl-clipboard", "wl-copy", "wl-paste")
GROUPS: tuple[Group, ...] = (
    Group(
        "build",
        "building `evdev` (during `pip install`)",
        (
            _tool("gcc", "gcc", "base-devel", "gcc"),
            Package("python3-dev", "python3-devel", "base-devel"),
            Package("linux-libc-dev", "kernel-headers", "linux-api-headers"),
        ),
    ),
    Group("venv", "a virtual environment", (Package("python3-venv", None, None),)),
    Group(
        "microphone",
        "microphone (PortAudio)",
        (Package("libportaudio2", "portaudio", "portaudio", libraries=("libportaudio.so.2",), zypper="libportaudio2"),),
    ),
    Group(
        "qt",
        "the tray and windows (Qt, on X11 and XWayland)",
        (
            _lib("libxcb-cursor0", "xcb-util-cursor", "xcb-util-cursor", "libxcb-cursor.so.0"),
            _lib("libxcb-icccm4", "xcb-util-wm", "xcb-util-wm", "libxcb-icccm.so.4"),
            _lib("libxcb-image0", "xcb-util-image", "xcb-util-image", "libxcb-image.so.0"),
            _lib("libxcb-keysyms1", "xcb-util-keysyms", "xcb-util-keysyms", "libxcb-keysyms.so.1"),
            _lib("libxcb-render-util0", "xcb-util-renderutil", "xcb-util-renderutil", "libxcb-render-util.so.0"),
            _lib("libxcb-util1", "xcb-util", "xcb-util", "libxcb-util.so.1"),
            _lib("libxcb-randr0", "libxcb", "libxcb", "libxcb-randr.so.0"),
            _lib("libxcb-render0", "libxcb", "libxcb", "libxcb-render.so.0"),
            _lib("libxcb-shape0", "libxcb", "libxcb", "libxcb-shape.so.0"),
            _lib("libxcb-shm0", "libxcb", "libxcb", "libxcb-shm.so.0"),
            _lib("libxcb-sync1", "libxcb", "libxcb", "libxcb-sync.so.1"),
            _lib("libxcb-xfixes0", "libxcb", "libxcb", "libxcb-xfixes.so.0"),
            _lib("libxcb-xkb1", "libxcb", "libxcb", "libxcb-xkb.so.1"),
            _lib("libxcb1", "libxcb", "libxcb", "libxcb.so.1"),
            _lib("libx11-xcb1", "libX11-xcb", "libx11", "libX11-xcb.so.1"),
            _lib("libx11-6", "libX11", "libx11", "libX11.so.6"),
            _lib("libxkbcommon-x11-0", "libxkbcommon-x11", "libxkbcommon-x11", "libxkbcommon-x11.so.0"),
            _lib("libxkbcommon0", "libxkbcommon", "libxkbcommon", "libxkbcommon.so.0"),
            _lib("libgl1", "libglvnd-glx", "libglvnd", "libGL.so.1"),
            _lib("libegl1", "libglvnd-egl", "libglvnd", "libEGL.so.1"),
            _lib("libfontconfig1", "fontconfig", "fontconfig", "libfontconfig.so.1"),
            _lib("libfreetype6", "freetype", "freetype2", "libfreetype.so.6"),
            _lib("libglib2.0-0", "glib2", "glib2", "libglib-2.0.so.0", "libgthread-2.0.so.0"),
            _lib("libdbus-1-3", "dbus-libs", "dbus", "libdbus-1.so.3"),
            _lib("libgssapi-krb5-2", "krb5-libs", "krb5", "libgssapi_krb5.so.2"),
            _lib("libbrotli1", "libbrotli", "brotli", "libbrotlidec.so.1", "libbrotlicommon.so.1"),
        ),
    ),
    Group(
        "qt-wayland",
        "native Wayland windows (without them Qt uses XWayland)",
        (
            _lib("libwayland-client0", "libwayland-client", "wayland", "libwayland-client.so.0"),
            _lib("libwayland-cursor0", "libwayland-cursor", "wayland", "libwayland-cursor.so.0"),
        ),
    ),
    Group(
        "x11",
        "inserting text on X11",
        (
            _tool("xdotool", "xdotool", "xdotool"),
            _tool("xclip", "xclip", "xclip"),
            _tool("x11-utils", "xprop", "xorg-xprop", "xprop"),
            _tool("x11-xserver-utils", "xmodmap", "xorg-xmodmap", "xmodmap"),
        ),
    ),
    Group(
        "wlroots",
        "inserting text on Sway, Hyprland and other wlroots compositors",
        (_tool("wtype", "wtype", "wtype"), WL_CLIPBOARD),
    ),
    Group(
        "wayland-ydotool",
        "inserting text on GNOME or KDE under Wayland",
        (_tool("ydotool", "ydotool", "ydotool"), WL_CLIPBOARD),
    ),
    Group(
        "gnome-tray",
        "tray icon on GNOME",
        (
            Package(
                "gnome-shell-extension-appindicator",
                "gnome-shell-extension-appindicator",
                "gnome-shell-extension-appindicator",
            ),
        ),
    ),
    Group(
        "notify",
        "a desktop notification when the app cannot start (`notify-send`)",
        (_tool("libnotify-bin", "libnotify", "libnotify", "notify-send"),),
    ),
)
# Other tools the app or doctor may name, by command: {tool: Package}.
_OTHER_TOOLS = {
    "xsel": _tool("xsel", "xsel", "xsel"),
    "xdg-desktop-portal": _tool("xdg-desktop-portal", "xdg-desktop-portal", "xdg-desktop-portal"),
}


def group(key: str) -> Group:
    for g in GROUPS:
        if g.key == key:
            return g
    raise KeyError(f"no package group {key!r}; known: {', '.join(g.key for g in GROUPS)}")


def packages(*keys: str) -> list[Package]:
    """The packages of the groups ``keys``, in order, each once."""
    out: list[Package] = []
    for key in keys:
        out += [p for p in group(key).packages if p not in out]
    return out


def names(pkgs: Iterable[Package], manager: str) -> list[str]:
    """Package names for ``manager``, in order, each once (a distribution's package can cover several rows)."""
    out: list[str] = []
    for p in pkgs:
        name = p.name(manager)
        if name and name not in out:
            out.append(name)
    return out


def install_command(pkgs: Iterable[Package], manager: str) -> str:
    """``sudo apt install a b c`` (no backquotes); "" when nothing is to be installed."""
    listed = names(pkgs, manager)
    return f"{INSTALL[manager]} {' '.join(listed)}" if listed else ""


def package_manager(which: Callable[[str], str | None] = shutil.which) -> str:
    """apt, dnf, pacman or zypper: the first found here (apt where none is)."""
    return next((m for m in MANAGERS if which(m)), "apt")


def for_library(soname: str) -> Package | None:
    for g in GROUPS:
        for p in g.packages:
            if soname in p.libraries:
                return p
    return None


def for_tool(tool: str) -> Package | None:
    """The package that provides command ``tool``, or is called ``tool`` somewhere, if listed."""
    listed = [*(p for g in GROUPS for p in g.packages), *_OTHER_TOOLS.values()]
    return next((p for p in listed if tool in p.tools), None) or next(
        (p for p in listed if tool in (p.apt, p.dnf, p.pacman)), None
    )


def libraries(*keys: str) -> list[str]:
    """The sonames of the groups ``keys`` (all library groups by default)."""
    keys = keys or tuple(g.key for g in GROUPS)
    return [lib for p in packages(*keys) for lib in p.libraries]


def load_library(soname: str) -> None:
    """dlopen ``soname`` as the app would (lazy binding, this process's library path); raises OSError.

    What is loaded stays loaded: these are libraries the app maps anyway."""
    ctypes.CDLL(soname, mode=os.RTLD_LAZY | getattr(os, "RTLD_LOCAL", 0))


def missing_libraries(sonames: Iterable[str], load: Callable[[str], None] = load_library) -> dict[str, str]:
    """{soname: the loader's error} for each of ``sonames`` that cannot be loaded here."""
    missing = {}
    for soname in sonames:
        try:
            load(soname)
        except OSError as exc:
            missing[soname] = " ".join(str(exc).split())
    return missing


def fix_for_libraries(sonames: Iterable[str], manager: str) -> str:
    """The install command for the packages that provide ``sonames`` (unlisted ones are named as files)."""
    sonames = list(dict.fromkeys(sonames))
    known = [p for p in (for_library(s) for s in sonames) if p is not None]
    unknown = [s for s in sonames if for_library(s) is None]
    parts = []
    command = install_command(known, manager)
    if command:
        parts.append(f"`{command}`")
    if unknown:
        parts.append(f"the package that provides {', '.join(unknown)}")
    return " and ".join(parts)


def table_row(key: str) -> str:
    """The row of group ``key`` in docs/guide/install.md's table (what for | apt | dnf | pacman)."""
    g = group(key)
    cells = [g.purpose]
    for manager in ("apt", "dnf", "pacman"):
        listed = names(g.packages, manager)
        cells.append(f"`{' '.join(listed)}`" if listed else "(included)")
    return "| " + " | ".join(cells) + " |"
