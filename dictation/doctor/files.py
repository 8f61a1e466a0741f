"""The Files area: whether the settings, history, recordings and log can be written, whether other
users can read them (they should not), and what in settings.json can't be used."""

from __future__ import annotations

import os
from pathlib import Path

from dictation.doctor.check import Check, Context, existing_ancestor


def checks(ctx: Context) -> list[Check]:
    from dictation.config.history import default_path as history_path
    from dictation.config.store import default_path as settings_path
    from dictation.paths import log_dir, recordings_dir

    area = "Files"
    checks: list[Check] = []
    for name, path in (
        ("Settings", ctx.settings_file or settings_path()),
        ("History", history_path()),
        ("Recordings", recordings_dir()),
        ("Log", log_dir() / "dictation.log"),
    ):
        exists = path.exists()
        where = path if exists else existing_ancestor(path)
        writable = os.access(where, os.W_OK | (os.X_OK if where.is_dir() else 0))
        state = "" if exists else " (not created yet)"
        if writable:
            checks.append(Check(area, name, "ok", f"{path}{state}"))
            continue
        if where.is_relative_to(Path.home()) and where != Path.home():
            fix = f"`sudo chown -R $USER {where}`"
        else:
            fix = "set DICTATION_HOME to a folder you can write to"
        checks.append(Check(area, name, "problem", f"{path}{state}: {where} is not writable", fix))
    checks += _privacy(ctx)
    if ctx.settings_notes:
        checks.append(
            Check(
                area,
                "Settings file",
                "warning",
                "some values can't be used: " + "; ".join(ctx.settings_notes),
                "nothing to do by hand: the app resets them to their defaults when it starts (keeping a copy of the "
                "file); then set them again in the settings window",
            )
        )
    return checks


def _privacy(ctx: Context) -> list[Check]:
    """Whether other local users can read the history, recordings, settings or log (they should not)."""
    from dictation.paths import private_folders
    from dictation.private import exposed

    if ctx.platform.startswith("win"):
        return []
    folders = private_folders()
    found = exposed(folders)
    if not found:
        existing = [str(f) for f in folders if f.exists()]
        detail = "history, recordings, settings and log are readable by you alone"
        return [Check("Files", "Privacy", "ok", detail + (f" ({', '.join(existing)})" if existing else ""))]
    shown = ", ".join(f"{path} (mode {mode:o})" for path, mode in found[:3])
    more = f" and {len(found) - 3} more" if len(found) > 3 else ""
    detail = f"{len(found)} of your private files and folders can be read by other users: {shown}{more}"
    targets = " ".join(str(f) for f in folders if f.exists())
    fix = f"start dictation once (it makes them private when it starts), or run `chmod -R go= {targets}`"
    return [Check("Files", "Privacy", "problem", detail, fix)]
