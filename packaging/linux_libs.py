"""What the Linux one-folder app carries from the build machine, and the oldest glibc it runs on.

Two uses (packaging/release.md, "What the Linux folder carries"):

- ``pyinstaller/dictation.spec`` loads this file and calls `split_host_libraries` on the libraries
  PyInstaller collected. PyInstaller copies every shared library a collected module links to from
  wherever the build machine has it, so the folder would depend on what that machine happened to
  have installed (PortAudio, ALSA, JACK, systemd, libstdc++, the X and GTK stacks, ...), and those
  copies would run against the user's sound server, X server and graphics drivers. The folder
  carries no library from the system library folders except Python's own runtime: the
  libraries that libpython and the standard library's extension modules link to (OpenSSL, libffi,
  zlib, ...). Everything else comes from the user's system, exactly as for a pip install of the
  same wheels: the same system packages (README.md) are needed.
- ``build_app.sh`` runs ``python packaging/linux_libs.py dist/dictation [--max 2.35]`` after the
  build: it prints the newest glibc (and libstdc++) symbol version any file in the folder needs,
  which is the oldest glibc the folder runs on, and with ``--max`` fails when that is newer.

The ELF files are read with the standard library only (no binutils, no ldd).
"""

from __future__ import annotations

import argparse
import os
import struct
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

# --- reading ELF files ------------------------------------------------------------------------------

ELF_MAGIC = b"\x7fELF"
SHT_DYNAMIC = 6
SHT_GNU_VERDEF = 0x6FFFFFFD
SHT_GNU_VERNEED = 0x6FFFFFFE
DT_NEEDED = 1
FAMILIES = {"GLIBC": "glibc", "GLIBCXX": "libstdc++", "CXXABI": "libstdc++ (C++ ABI)", "GCC": "libgcc_s"}


class NotElf(ValueError):
    pass


@dataclass
class ElfInfo:
    """The libraries one ELF file links (DT_NEEDED), the symbol versions it needs from them, and the
    versions it defines itself."""

    needed: list[str] = field(default_factory=list)  # ["libc.so.6", ...]
    versions_needed: dict[str, set[str]] = field(default_factory=dict)  # "libc.so.6" -> {"GLIBC_2.34", ...}
    versions_defined: set[str] = field(default_factory=set)


def _string(data: bytes, offset: int) -> str:
    return data[offset : data.index(b"\0", offset)].decode("ascii", errors="replace")


def read_elf(path: str | os.PathLike) -> ElfInfo:
    """What ``path`` links and needs; NotElf for a file that is not ELF, ValueError (naming the file) when
    it cannot be read as one."""
    data = Path(path).read_bytes()
    if data[:4] != ELF_MAGIC:
        raise NotElf(f"{path}: not an ELF file")
    if data[4] not in (1, 2) or data[5] not in (1, 2):
        raise ValueError(f"{path}: unknown ELF class or byte order")
    wide, order = data[4] == 2, "<" if data[5] == 1 else ">"
    try:
        if wide:
            shoff, shentsize, shnum = struct.unpack_from(order + "Q10xHH", data, 0x28)
            section, dyn = struct.Struct(order + "IIQQQQIIQQ"), struct.Struct(order + "qQ")
        else:
            shoff, shentsize, shnum = struct.unpack_from(order + "I10xHH", data, 0x20)
            section, dyn = struct.Struct(order + "IIIIIIIIII"), struct.Struct(order + "iI")
        sections = [section.unpack_from(data, shoff + i * shentsize) for i in range(shnum)]
        out = ElfInfo()
        for _name, kind, _flags, _addr, offset, size, link, info, _align, _entsize in sections:
            strtab = sections[link][4] if kind in (SHT_DYNAMIC, SHT_GNU_VERNEED, SHT_GNU_VERDEF) else 0
            if kind == SHT_DYNAMIC:
                for at in range(offset, offset + size, dyn.size):
                    tag, value = dyn.unpack_from(data, at)
                    if tag == 0:
                        break
                    if tag == DT_NEEDED:
                        out.needed.append(_string(data, strtab + value))
            elif kind == SHT_GNU_VERNEED:
                entry = offset
                for _ in range(info):  # sh_info: the number of entries
                    _version, count, file_at, aux, following = struct.unpack_from(order + "HHIII", data, entry)
                    names = out.versions_needed.setdefault(_string(data, strtab + file_at), set())
                    at = entry + aux
                    for _ in range(count):
                        _hash, _flags2, _other, name_at, next_aux = struct.unpack_from(order + "IHHII", data, at)
                        names.add(_string(data, strtab + name_at))
                        at += next_aux
                    if not following:
                        break
                    entry += following
            elif kind == SHT_GNU_VERDEF:
                entry = offset
                for _ in range(info):
                    _version, _flags2, _index, count, _hash, aux, following = struct.unpack_from(
                        order + "HHHHIII", data, entry
                    )
                    if count:
                        (name_at,) = struct.unpack_from(order + "I", data, entry + aux)
                        out.versions_defined.add(_string(data, strtab + name_at))
                    if not following:
                        break
                    entry += following
        return out
    except (struct.error, IndexError, ValueError) as exc:
        raise ValueError(f"{path}: broken ELF file ({exc})") from None


# --- what the folder carries -------------------------------------------------------------------------

# Where a Linux system keeps its shared libraries (and /usr/local/lib, where self-built ones go).
SYSTEM_LIBRARY_DIRS = ("/lib", "/lib32", "/lib64", "/libx32", "/usr/lib", "/usr/lib32", "/usr/lib64", "/usr/libx32")
SYSTEM_LIBRARY_DIRS += ("/usr/local/lib", "/usr/local/lib64")


def is_system_library(src: str) -> bool:
    """Whether ``src`` lies in a system library folder (e.g. /usr/lib/x86_64-linux-gnu), and not in a
    Python installation inside one (/usr/lib/python3/dist-packages, ...)."""
    for path in {os.path.normpath(src), os.path.realpath(src)}:
        parts = Path(path).parts
        if any(p.startswith("python") or p in ("site-packages", "dist-packages") for p in parts[1:-1]):
            continue
        if any(path.startswith(d + os.sep) for d in SYSTEM_LIBRARY_DIRS):
            return True
    return False


def is_python_runtime_root(dest: str) -> bool:
    """libpython and the standard library's extension modules (``python3.X/lib-dynload/`` in the folder)."""
    dest = dest.replace("\\", "/")
    return os.path.basename(dest).startswith("libpython") or (dest.startswith("python3") and "/lib-dynload/" in dest)


def split_host_libraries(
    binaries: Iterable[tuple[str, str, str]], needed: Callable[[str], list[str]] | None = None
) -> tuple[list[tuple[str, str, str]], list[tuple[str, str, str]]]:
    """(kept, dropped): PyInstaller's binaries (dest, source, type) without the libraries copied from the
    build machine's system library folders, except libpython and what it and the standard library's
    extension modules link to (directly or through each other). ``needed(source)``: the DT_NEEDED names
    of a file (default: read from the file)."""
    needed = needed or (lambda src: read_elf(src).needed)
    binaries = list(binaries)
    host = {os.path.basename(d): s for d, s, kind in binaries if kind == "BINARY" and is_system_library(s)}
    runtime: set[str] = set()
    todo = [s for d, s, _kind in binaries if is_python_runtime_root(d)]
    seen: set[str] = set()
    while todo:
        src = todo.pop()
        if src in seen:
            continue
        seen.add(src)
        try:
            names = needed(src)
        except (OSError, ValueError):
            continue
        for name in names:
            if name in host and name not in runtime:
                runtime.add(name)
                todo.append(host[name])
    drop = {name for name in host if name not in runtime and not name.startswith("libpython")}
    kept: list[tuple[str, str, str]] = []
    dropped: list[tuple[str, str, str]] = []
    for entry in binaries:
        dest, src, kind = entry
        host_copy = kind == "BINARY" and os.path.basename(dest) in drop and is_system_library(src)
        (dropped if host_copy else kept).append(entry)
    return kept, dropped


# --- the glibc the folder needs ----------------------------------------------------------------------


def version_key(version: str) -> tuple[int, ...]:
    """``GLIBC_2.34`` -> (2, 34); a name without a number sorts first."""
    try:
        return tuple(int(part) for part in version.split("_", 1)[1].split("."))
    except (IndexError, ValueError):
        return ()


def elf_files(folder: Path):
    for root, _dirs, files in os.walk(folder):
        for name in sorted(files):
            path = Path(root, name)
            if path.is_symlink() or not path.is_file():
                continue
            with open(path, "rb") as f:
                if f.read(4) == ELF_MAGIC:
                    yield path


def floors(folder: Path) -> dict[str, tuple[str, Path]]:
    """For each family (GLIBC, GLIBCXX, CXXABI, GCC): the newest version that files in ``folder`` need from
    the system, and a file that needs it. Versions a file in the folder defines itself do not count."""
    files = {path: read_elf(path) for path in elf_files(folder)}
    provided = set().union(*(info.versions_defined for info in files.values()))
    newest: dict[str, tuple[str, Path]] = {}
    for path, info in files.items():
        for names in info.versions_needed.values():
            for name in sorted(names - provided):
                fam = name.split("_", 1)[0]
                if fam in FAMILIES and (fam not in newest or version_key(name) > version_key(newest[fam][0])):
                    newest[fam] = (name, path)
    return newest


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="The oldest glibc (and libstdc++) the files in a folder run on.")
    p.add_argument("folder", type=Path)
    p.add_argument("--max", help="fail when the folder needs a newer glibc than this (e.g. 2.35)")
    args = p.parse_args(argv)
    if not args.folder.is_dir():
        print(f"{args.folder}: not a folder", file=sys.stderr)
        return 2
    try:
        found = floors(args.folder)
    except (OSError, ValueError) as exc:
        print(str(exc), file=sys.stderr)
        return 2
    for fam, (name, path) in sorted(found.items()):
        where = path.relative_to(args.folder)
        print(f"needs {FAMILIES[fam]} >= {name.split('_', 1)[1]} ({name}, first needed by {where})")
    if args.max and "GLIBC" in found and version_key(found["GLIBC"][0]) > version_key(f"GLIBC_{args.max}"):
        print(f"{args.folder} needs {found['GLIBC'][0]}, newer than glibc {args.max}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
