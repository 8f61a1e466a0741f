"""Running a script in Triton's interpreter (``TRITON_INTERPRET=1``) in a child process, as the kernel
tests do: the interpreter must be chosen before triton is imported, and this process has imported it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_interpreted(script: str, *argv: str, timeout: int = 600) -> dict:
    """Run ``script`` (Python source) with ``argv`` in the interpreter, from the repository root; return
    the JSON object it prints last. Fails the calling test with the child's stderr if it fails."""
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [sys.executable, "-c", script, *argv], capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
