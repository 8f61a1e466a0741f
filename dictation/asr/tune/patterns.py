"""Regular expressions from files we did not write (a LoRA adapter's config), matched with a bound.

PEFT's ``target_modules`` (a string) and the keys of ``rank_pattern`` / ``alpha_pattern`` are
regular expressions that PEFT matches with Python's ``re``. ``re`` backtracks: ``(.*)*X`` against a
40-character module name does not finish in the lifetime of the machine, and the match holds the
interpreter lock the whole time, so every thread of the process (the GUI thread, the IPC server,
the SIGTERM handler) stops with it.

So a pattern that can backtrack is matched in a child process (``python -I -S`` running this file,
or the frozen app's ``dictation _match-patterns``) with a wall-clock deadline (:data:`TIMEOUT_S`)
and an address-space limit: the child is killed at the deadline, whatever the pattern does, while
the caller waits without holding the lock. The child uses ``re`` itself, so the semantics are
exactly PEFT's. Patterns without repetition or alternation (none of ``* + ? { |``) cannot
backtrack more than linearly and are matched here, in-process, at no extra cost (unless there are
very many); they are what PEFT writes for per-layer ranks (``model.layers.0.self_attn.q_proj``)
and plain names (``q_proj``).

Weighed and not taken: refusing nested quantifiers is defeated without any (``(a|a)(a|a)...``,
``.*.*.*.*.*.*X``); the ``regex`` package's timeout bounds matching but not compiling
(``(?:x{65535}){65535}`` exhausts memory while it compiles) and its semantics differ from ``re``
at the edges; a linear-time engine (RE2) refuses look-arounds that PEFT accepts.

This module imports only the standard library at its top: it is the child's program too (the parent
starts the child through ``dictation.spawn``, imported where it is used).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Sequence

TIMEOUT_S = 3.0  # wall clock for one child (its start-up included, ~50 ms on an idle machine)
MEMORY_BYTES = 1 << 30  # the child's address space (where the platform can limit it)
MAX_PATTERN_CHARS = 10_000  # longer patterns are refused before compiling
IN_PROCESS_MATCHES = 100_000  # a table with more (patterns x names) goes to the child whatever its patterns
CHILD_ARG = "_match-patterns"  # `dictation _match-patterns`: the child in the frozen app
_BACKTRACKING = frozenset("*+?{|")


class PatternError(ValueError):
    """A pattern is invalid, or the matcher could not run."""


class PatternTimeout(PatternError):
    """Matching did not finish within the deadline; ``tables`` are the indices of the tables that
    were being matched (those with a pattern that can backtrack)."""

    def __init__(self, tables: list[int]) -> None:
        super().__init__("matching did not finish in time")
        self.tables = tables


def can_backtrack(pattern: str) -> bool:
    """False only for patterns that cannot backtrack more than linearly (no repetition, no alternation)."""
    return not _BACKTRACKING.isdisjoint(pattern)


def check_pattern(pattern: str) -> None:
    """Raise PatternError unless ``pattern`` is a valid ``re`` pattern of a sane length (compiling is linear)."""
    if len(pattern) > MAX_PATTERN_CHARS:
        raise PatternError(f"longer than {MAX_PATTERN_CHARS} characters")
    try:
        re.compile(pattern)
    except (re.error, RecursionError, OverflowError, ValueError) as exc:
        raise PatternError(str(exc) or type(exc).__name__) from None


FULL = "full"  # re.fullmatch(pattern, name): PEFT's target_modules string
SUFFIX = "suffix"  # the pattern matches the end of the name at a dot: PEFT's rank_pattern / alpha_pattern keys


def wrapped(pattern: str, mode: str) -> str:
    """The expression ``re.fullmatch`` runs for ``pattern`` in ``mode`` (PEFT wraps the keys the same way)."""
    return pattern if mode == FULL else rf"(?:.*\.)?(?:{pattern})"


def first_matches(tables: Sequence[tuple[str, Sequence[str]]], names: Sequence[str]) -> list[list[int | None]]:
    """For every table ``(mode, patterns)`` and every name: the index of the first pattern that
    matches the name, or None.

    Tables holding a pattern that can backtrack are matched in one child process that is killed
    after :data:`TIMEOUT_S` seconds, raising PatternTimeout. Invalid patterns raise PatternError
    (validate them with check_pattern first to name them).
    """
    for mode, patterns in tables:
        for pattern in patterns:
            check_pattern(wrapped(pattern, mode))
    risky = [
        i
        for i, (_, patterns) in enumerate(tables)
        if any(can_backtrack(p) for p in patterns) or len(patterns) * len(names) > IN_PROCESS_MATCHES
    ]
    safe = [i for i in range(len(tables)) if i not in risky]
    out: list[list[int | None]] = [[] for _ in tables]
    for i, result in zip(safe, _first_matches([tables[i] for i in safe], names), strict=True):
        out[i] = result
    if risky:
        results = _in_child([[tables[i][0], list(tables[i][1])] for i in risky], list(names), TIMEOUT_S)
        if results is None:
            raise PatternTimeout(risky)
        for i, result in zip(risky, results, strict=True):
            out[i] = result
    return out


def _first_matches(tables, names) -> list[list[int | None]]:
    out = []
    for mode, patterns in tables:
        compiled = [re.compile(wrapped(p, mode)) for p in patterns]
        out.append([next((i for i, c in enumerate(compiled) if c.fullmatch(n)), None) for n in names])
    return out


def child_command() -> list[str]:
    """How to start the child: this file under an isolated interpreter, or the frozen app itself."""
    if getattr(sys, "frozen", False):
        return [sys.executable, CHILD_ARG]
    return [sys.executable, "-I", "-S", os.path.abspath(__file__)]


def _in_child(tables: list, names: list[str], timeout: float) -> list[list[int | None]] | None:
    """The child's answer; None if it did not finish in time or failed (out of memory)."""
    from dictation import spawn  # not at the top: the child runs this file without the package

    job = json.dumps({"tables": tables, "names": names})
    try:
        proc = spawn.run(child_command(), input=job, capture_output=True, text=True, encoding="utf-8", timeout=timeout)
    except subprocess.TimeoutExpired:
        return None  # run() killed it
    except OSError as exc:
        raise PatternError(f"the pattern matcher could not be started ({exc})") from None
    if proc.returncode != 0:
        return None
    try:
        results = json.loads(proc.stdout)
    except ValueError:
        return None
    shaped = isinstance(results, list) and len(results) == len(tables)
    if not shaped or not all(isinstance(r, list) and len(r) == len(names) for r in results):
        return None
    return results


def child_main() -> int:
    """The child: a job on stdin (``{"tables": [[mode, [pattern, ...]], ...], "names": [...]}``),
    the first-match indices on stdout."""
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))
    except (ImportError, ValueError, OSError):  # Windows, or a lower hard limit already
        pass
    job = json.load(sys.stdin)
    json.dump(_first_matches(job["tables"], job["names"]), sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(child_main())
