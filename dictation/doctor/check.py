"""What every check of `dictation doctor` shares: one finding (`Check`), what the checks look at
(`Context`: the settings, the environment and the platform), the statuses and areas in report
order, and small helpers more than one area uses."""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dictation import system_packages
from dictation.config.settings import Settings

STATUSES = ("ok", "info", "warning", "problem")
AREAS = ("Session", "Hotkeys", "Output", "Microphone", "Engine", "Model", "Files")
DBUS_TIMEOUT_S = 1.0  # a diagnosis must be quick: the session bus, the portal, the running app


@dataclass(frozen=True)
class Check:
    """One finding. ``status``: "ok", "info", "warning" or "problem"; ``fix``: what to do, or None."""

    area: str
    name: str
    status: str
    detail: str
    fix: str | None = None

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"unknown check status {self.status!r}; known: {', '.join(STATUSES)}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Context:
    """What the checks look at: the settings, the environment variables and the platform."""

    settings: Settings
    env: Mapping[str, str]
    platform: str
    settings_notes: tuple[str, ...] = ()  # problems found in settings.json (read-only load)
    settings_file: Path | None = None

    def which(self, tool: str) -> str | None:
        return shutil.which(tool, path=self.env.get("PATH", os.defpath))

    @property
    def linux(self) -> bool:
        return self.platform.startswith("linux")

    @property
    def package_manager(self) -> str:
        return system_packages.package_manager(self.which)

    def install(self, *tools: str) -> str:
        """`sudo apt install wtype wl-clipboard`, for this system's package manager (apt if none is
        found): the packages of `dictation.system_packages` that provide ``tools`` (commands or
        package names), else the names themselves."""
        manager = self.package_manager
        packages: list[str] = []
        for tool in tools:
            listed = system_packages.for_tool(tool)
            package = (listed.name(manager) if listed else None) or tool
            if package not in packages:
                packages.append(package)
        return f"`{system_packages.INSTALL[manager]} {' '.join(packages)}`"


def gb(n: int | None) -> str:
    return "?" if n is None else f"{n / 1e9:.1f} GB"


def existing_ancestor(path: Path) -> Path:
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path
