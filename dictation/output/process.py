"""Running the external tools (xdotool, xclip, wl-copy, ...) behind a small seam that tests can fake.

Every backend talks to the outside world through a `Host`: `which()` to find a tool on the
session's PATH, `exists()` for sockets, and `run()` for one command with a timeout. The real
`SystemHost` runs subprocesses with the *session's* environment (DISPLAY, WAYLAND_DISPLAY, ...),
which is not necessarily `os.environ`: tests point it at their own Xvfb. In the frozen app the
bundle's library path is taken out of it first (`dictation.spawn`).
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from dictation import spawn

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProcResult:
    """What one command did. `returncode` is None when it never ran to completion."""

    argv: tuple[str, ...]
    returncode: int | None
    stdout: bytes = b""
    stderr: bytes = b""
    error: str | None = None  # "timed out after 5.0 s", "not found", ...

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    @property
    def timed_out(self) -> bool:
        return self.error is not None and self.error.startswith("timed out")

    def text(self) -> str:
        return self.stdout.decode("utf-8", errors="replace")

    def failure(self) -> str:
        """One line saying why the command failed, for messages shown to the user."""
        tool = os.path.basename(self.argv[0]) if self.argv else "?"
        if self.error:
            return f"{tool}: {self.error}"
        detail = self.stderr.decode("utf-8", errors="replace").strip().splitlines()
        return f"{tool} exited with {self.returncode}" + (f": {detail[-1]}" if detail else "")


class Host(Protocol):
    """The seam between backends and the operating system."""

    environment: Mapping[str, str]

    def which(self, tool: str) -> str | None: ...

    def exists(self, path: str) -> bool: ...

    def run(
        self,
        argv: Sequence[str],
        *,
        input: bytes | None = None,
        timeout: float = 5.0,
        capture_stdout: bool = True,
        env: Mapping[str, str] | None = None,
    ) -> ProcResult: ...


class SystemHost:
    """Runs real commands with `environment` as their whole environment."""

    def __init__(self, environment: Mapping[str, str] | None = None):
        self.environment = dict(os.environ if environment is None else environment)

    def which(self, tool: str) -> str | None:
        return shutil.which(tool, path=self.environment.get("PATH", os.defpath))

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def run(
        self,
        argv: Sequence[str],
        *,
        input: bytes | None = None,
        timeout: float = 5.0,
        capture_stdout: bool = True,
        env: Mapping[str, str] | None = None,
    ) -> ProcResult:
        """Run one command; `env` adds to (overrides) the session environment, which the child gets as
        the user had it (`dictation.spawn.user_environment`).

        `capture_stdout=False` is for tools that fork a daemon which keeps serving a selection
        (xclip -i, xsel -i, wl-copy): a pipe on their stdout/stderr would never reach EOF, so
        stdout goes to /dev/null and stderr to a temporary file (field notes, e2e pitfall 4).
        """
        argv = tuple(argv)
        with tempfile.TemporaryFile() as err_file:
            try:
                proc = spawn.run(
                    argv,
                    input=input,
                    stdin=None if input is not None else subprocess.DEVNULL,
                    stdout=subprocess.PIPE if capture_stdout else subprocess.DEVNULL,
                    stderr=subprocess.PIPE if capture_stdout else err_file,
                    timeout=timeout,
                    env={**self.environment, **(env or {})},
                    check=False,
                )
            except FileNotFoundError:
                return ProcResult(argv, None, error="not found")
            except subprocess.TimeoutExpired:
                log.warning("%s timed out after %.1f s", argv[0], timeout)
                return ProcResult(argv, None, error=f"timed out after {timeout:.1f} s")
            except OSError as exc:
                return ProcResult(argv, None, error=str(exc))
            stderr = proc.stderr if capture_stdout else _read_all(err_file)
        result = ProcResult(argv, proc.returncode, proc.stdout or b"", stderr or b"")
        if not result.ok:
            log.debug("%s", result.failure())
        return result


def _read_all(f) -> bytes:
    f.seek(0)
    return f.read()
