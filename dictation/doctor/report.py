"""Running the checks and reporting them: `run_checks` (every area in `AREAS` order, never raising),
the readable report and the JSON one, and `dictation doctor [--json]` itself (`main`)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from dictation import __version__
from dictation.config.settings import Settings
from dictation.doctor.check import AREAS, Check, Context
from dictation.doctor.engine import checks as engine_checks
from dictation.doctor.files import checks as files_checks
from dictation.doctor.hotkeys import checks as hotkeys_checks
from dictation.doctor.microphone import checks as microphone_checks
from dictation.doctor.model import checks as model_checks
from dictation.doctor.output import checks as output_checks
from dictation.doctor.session import checks as session_checks

MARKS = {"ok": "✔", "info": "·", "warning": "!", "problem": "✘"}
ASCII_MARKS = {"ok": "+", "info": "-", "warning": "!", "problem": "x"}


def run_checks(
    settings: Settings | None = None,
    *,
    env: Mapping[str, str] | None = None,
    platform: str | None = None,
    areas: Iterable[str] = AREAS,
) -> list[Check]:
    """Every check of ``areas`` (default: all), in area order. Never raises.

    ``settings``: None reads settings.json without changing it (the app repairs it when it starts).
    ``env`` and ``platform`` default to os.environ and sys.platform.
    """
    env = dict(os.environ if env is None else env)
    platform = sys.platform if platform is None else platform
    try:
        stored, notes, path = load_settings_readonly()
    except Exception as exc:  # noqa: BLE001 - reported below, a run never fails
        stored, notes, path = Settings(), (f"cannot read the settings: {type(exc).__name__}: {exc}",), None
    ctx = Context(settings if settings is not None else stored, env, platform, notes, path)
    checks: list[Check] = []
    for area in areas:
        function = AREA_CHECKS[area]
        try:
            checks += function(ctx)
        except Exception as exc:  # noqa: BLE001 - a broken check is itself the finding
            checks.append(
                Check(
                    area,
                    f"{area} checks",
                    "problem",
                    f"the {area.lower()} checks failed: {type(exc).__name__}: {exc}",
                    "please report this with the output of `dictation doctor --json`",
                )
            )
    return checks


def has_problems(checks: Iterable[Check]) -> bool:
    return any(c.status == "problem" for c in checks)


def summary(checks: list[Check]) -> str:
    counts = {s: sum(c.status == s for c in checks) for s in ("problem", "warning")}
    if not any(counts.values()):
        return "No problems found."
    parts = [f"{n} {s}{'' if n == 1 else 's'}" for s, n in counts.items() if n]
    return ", ".join(parts) + "."


def format_report(checks: list[Check], *, ascii_only: bool = False) -> str:
    """The readable report: checks grouped by area with ✔ / · / ! / ✘ marks and their fixes."""
    marks = ASCII_MARKS if ascii_only else MARKS
    order = [a for a in AREAS if any(c.area == a for c in checks)]
    order += [a for a in dict.fromkeys(c.area for c in checks) if a not in order]
    lines = [f"dictation {__version__}: diagnostics"]
    for area in order:
        lines += ["", area]
        for check in (c for c in checks if c.area == area):
            detail = check.detail.replace("\n", "\n      ")
            lines.append(f"  {marks[check.status]} {check.name}: {detail}")
            if check.fix:
                lines.append(f"      fix: {check.fix}")
    lines += ["", summary(checks)]
    return "\n".join(lines)


def report_dict(checks: list[Check]) -> dict[str, Any]:
    return {
        "version": __version__,
        "problems": sum(c.status == "problem" for c in checks),
        "warnings": sum(c.status == "warning" for c in checks),
        "areas": [a for a in AREAS if any(c.area == a for c in checks)],
        "checks": [c.to_dict() for c in checks],
    }


def main(as_json: bool = False) -> int:
    """`dictation doctor [--json]`: print the report; 1 if any check found a problem, else 0."""
    checks = run_checks()
    if as_json:
        print(json.dumps(report_dict(checks), ensure_ascii=False, indent=2))
    else:
        encoding = getattr(sys.stdout, "encoding", None) or "ascii"
        try:
            "".join(MARKS.values()).encode(encoding)
            ascii_only = False
        except (UnicodeEncodeError, LookupError):
            ascii_only = True
        print(format_report(checks, ascii_only=ascii_only))
    return 1 if has_problems(checks) else 0


def load_settings_readonly(path: Path | None = None) -> tuple[Settings, tuple[str, ...], Path]:
    """The settings in settings.json and what is wrong in the file, without writing anything.

    (SettingsStore.load repairs and rewrites a bad file; a diagnosis must not.)
    """
    from dictation.config.migrations import migrate
    from dictation.config.schema import from_dict
    from dictation.config.settings import SCHEMA_VERSION
    from dictation.config.store import VERSION_KEY, default_path

    path = default_path() if path is None else path
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return Settings(), (), path
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return Settings(), (f"not valid JSON ({exc})",), path
    if not isinstance(data, dict):
        return Settings(), ("not a JSON object",), path
    version = data.pop(VERSION_KEY, 0)
    if isinstance(version, int) and not isinstance(version, bool) and 0 <= version < SCHEMA_VERSION:
        data = migrate(data, version, SCHEMA_VERSION)
    settings, problems = from_dict(Settings, data)
    return settings, tuple(str(p) for p in problems), path


AREA_CHECKS: dict[str, Callable[[Context], list[Check]]] = {
    "Session": session_checks,
    "Hotkeys": hotkeys_checks,
    "Output": output_checks,
    "Microphone": microphone_checks,
    "Engine": engine_checks,
    "Model": model_checks,
    "Files": files_checks,
}
