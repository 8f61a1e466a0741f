"""Reading and writing ``settings.json``: tolerant load, atomic save (docs/architecture.md, principle 6).

Load never fails and never throws a user's settings away:

- no file: the defaults (nothing is written);
- bad JSON, or values that are unusable: every usable value is kept, each unusable one is reset to
  its default and logged by name, the original file is copied to ``settings.json.bad-<UTC time>``,
  and the repaired settings are written back (so the same problem is not reported on every start);
- an older schema: the original is copied to ``settings.json.v<N>``, migrated, and written back;
- a newer schema (a downgrade): loaded as far as understood; its version number and unknown keys
  are kept, so the newer version can still read what this one writes;
- a file larger than `MAX_SETTINGS_BYTES` (no settings this app writes come near it): not read, not
  copied; it is renamed aside to ``settings.json.too-large-<UTC time>`` and the defaults are used.

Save writes a temporary file in the same folder, flushes it to disk, then renames it over the old
file: a crash or a full disk leaves either the old file or the new one, never a mix. The folder is
0700 and the file and its backups 0600 (`dictation.private`): they hold the user's vocabulary.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from dictation.config.migrations import migrate
from dictation.config.schema import FieldError, Problem, from_dict, to_dict, validate
from dictation.config.settings import SCHEMA_VERSION, Settings
from dictation.private import make_private, private_dir

log = logging.getLogger(__name__)

VERSION_KEY = "schema_version"
KEEP_BAD_BACKUPS = 5
# The vocabulary is capped at 20,000 characters; with every other setting and a long list of
# replacements a real file is tens of kilobytes. A larger one is not the app's (and reading and
# backing up 30 MB at every start is no use): it is set aside unread.
MAX_SETTINGS_BYTES = 1 << 20


class SettingsError(ValueError):
    """Settings that cannot be saved because some fields are invalid; ``errors`` names them."""

    def __init__(self, errors: list[FieldError]):
        self.errors = errors
        super().__init__("invalid settings: " + "; ".join(str(e) for e in errors))


@dataclass(frozen=True)
class LoadReport:
    """What :meth:`SettingsStore.load_report` found, for a notification in the app."""

    settings: Settings
    problems: tuple[Problem, ...] = ()
    backup: Path | None = None  # where the original file was copied, if anywhere
    migrated_from: int | None = None
    file_version: int | None = None  # None: there was no file
    repaired: bool = False  # the repaired or migrated settings were written back
    notes: tuple[str, ...] = field(default=())


def default_path() -> Path:
    from dictation.paths import config_dir

    return config_dir() / "settings.json"


class SettingsStore:
    """``settings.json`` in one folder. Safe to share between threads (saves are serialized)."""

    def __init__(self, path: Path | str | None = None):
        self.path = Path(path) if path is not None else default_path()
        self._lock = threading.Lock()
        self._file_version = SCHEMA_VERSION

    def load(self) -> Settings:
        return self.load_report().settings

    def load_report(self) -> LoadReport:
        with self._lock:
            return self._load()

    def save(self, settings: Settings) -> None:
        """Write ``settings`` atomically; raises :class:`SettingsError` if any field is invalid and
        ``OSError`` if the file cannot be written (the previous file is then untouched)."""
        errors = validate(settings)
        if errors:
            raise SettingsError(errors)
        with self._lock:
            self._write(settings)

    # --- loading ---------------------------------------------------------------------------------

    def _load(self) -> LoadReport:
        try:
            with open(self.path, "rb") as f:
                raw = f.read(MAX_SETTINGS_BYTES + 1)  # a bounded read: /dev/zero or 30 MB never fill memory
                size = os.fstat(f.fileno()).st_size
        except FileNotFoundError:
            return LoadReport(Settings())
        except OSError as e:
            log.error("cannot read %s (%s); using the default settings", self.path, e)
            return LoadReport(Settings(), notes=(f"cannot read the settings file: {e}",))
        if len(raw) > MAX_SETTINGS_BYTES:
            return self._too_large(size)

        try:
            data = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
            # RecursionError: nested deeper than the parser's recursion limit. The file's text is
            # not shown: it holds the vocabulary and the replacements (the user's own words).
            reason = "is nested too deeply" if isinstance(e, RecursionError) else f"({e})"
            problem = Problem(
                "settings", None, f"is not valid JSON {reason}", "using the default settings", private=True
            )
            return self._repair(Settings(), [problem], file_version=None, migrated_from=None)
        if not isinstance(data, dict):
            problem = Problem("settings", data, "is not a JSON object", "using the default settings", private=True)
            return self._repair(Settings(), [problem], file_version=None, migrated_from=None)

        problems: list[Problem] = []
        version = data.pop(VERSION_KEY, 0)
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            problems.append(
                Problem(VERSION_KEY, version, "is not a version number", f"reading as version {SCHEMA_VERSION}")
            )
            version = SCHEMA_VERSION

        migrated_from = None
        backup = None
        if version < SCHEMA_VERSION:
            backup = self._backup(f"v{version}")
            try:
                data = migrate(data, version, SCHEMA_VERSION)
                migrated_from = version
            except Exception as e:  # a broken step must not cost the user their settings
                log.exception("migrating %s from schema version %d failed", self.path, version)
                problems.append(Problem("settings", version, f"could not be migrated ({e})", "reading it as is"))
        elif version > SCHEMA_VERSION:
            log.warning(
                "%s was written by a newer version (schema %d > %d); keeping what this version does not know",
                self.path,
                version,
                SCHEMA_VERSION,
            )
        self._file_version = max(version, SCHEMA_VERSION)

        settings, bad = from_dict(Settings, data)
        problems += bad
        if problems or migrated_from is not None:
            return self._repair(settings, problems, file_version=version, migrated_from=migrated_from, backup=backup)
        return LoadReport(settings, file_version=version)

    def _repair(
        self,
        settings: Settings,
        problems: list[Problem],
        *,
        file_version: int | None,
        migrated_from: int | None,
        backup: Path | None = None,
    ) -> LoadReport:
        for p in problems:
            log.warning("%s: %s", self.path.name, p)
        if problems and backup is None:  # a migration has already copied the original
            backup = self._backup(f"bad-{_stamp()}")
            self._prune_bad_backups()
        repaired = False
        try:
            self._write(settings)
            repaired = True
        except OSError as e:
            log.error("cannot write the repaired settings to %s: %s", self.path, e)
        if backup is not None:
            log.warning("the original settings file was kept as %s", backup)
        return LoadReport(
            settings,
            problems=tuple(problems),
            backup=backup,
            migrated_from=migrated_from,
            file_version=file_version,
            repaired=repaired,
        )

    def _too_large(self, size: int) -> LoadReport:
        """The file is over `MAX_SETTINGS_BYTES`: renamed aside (not copied), the defaults used."""
        limit = f"{MAX_SETTINGS_BYTES / (1 << 20):g} MB"
        reason = (
            f"is {size / (1 << 20):.1f} MB, over the {limit} a settings file can be" if size else f"is over {limit}"
        )
        aside: Path | None = self._free_name(f"too-large-{_stamp()}")
        try:
            os.replace(self.path, aside)
        except OSError as e:
            reason, action = f"{reason} and cannot be set aside ({e.strerror or e})", "using the default settings"
            aside = None
        else:
            action = f"kept as {aside.name}, unread; using the default settings"
        problem = Problem("settings", None, reason, action, private=True)
        log.warning("%s: %s", self.path.name, problem)
        return LoadReport(Settings(), problems=(problem,), backup=aside)

    def _free_name(self, suffix: str) -> Path:
        target = self.path.with_name(f"{self.path.name}.{suffix}")
        n = 1
        while target.exists():
            n += 1
            target = self.path.with_name(f"{self.path.name}.{suffix}-{n}")
        return target

    def _backup(self, suffix: str) -> Path | None:
        target = self._free_name(suffix)
        try:
            shutil.copy2(self.path, target)
            make_private(target)  # copy2 copied the mode of an older, 0644 original
        except OSError as e:
            log.error("cannot back up %s to %s: %s", self.path, target, e)
            return None
        return target

    def _prune_bad_backups(self) -> None:
        backups = sorted(self.path.parent.glob(f"{self.path.name}.bad-*"), key=lambda p: p.stat().st_mtime)
        for old in backups[:-KEEP_BAD_BACKUPS]:
            try:
                old.unlink()
            except OSError as e:
                log.warning("cannot remove old settings backup %s: %s", old, e)

    # --- writing ---------------------------------------------------------------------------------

    def _write(self, settings: Settings) -> None:
        fields = to_dict(settings)
        fields.pop(VERSION_KEY, None)  # the store owns the version, whatever an unknown key says
        data = {VERSION_KEY: self._file_version, **fields}
        text = json.dumps(data, indent=2, ensure_ascii=False) + "\n"
        private_dir(self.path.parent)  # the vocabulary and replacements are the user's words
        atomic_write(self.path, text.encode("utf-8"))  # mkstemp: the file is 0600


def atomic_write(path: Path, payload: bytes) -> None:
    """Replace ``path`` with ``payload`` so that readers and crashes see the old or the new file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(folder: Path) -> None:
    """Make the rename itself durable (POSIX); Windows cannot open folders for this."""
    if os.name != "posix":
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems refuse fsync on folders; the rename has still happened
    finally:
        os.close(fd)


def _stamp() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
