"""The model's raw output → (language, text) (docs/model.md §7.3): the ``language X<asr_text>`` prefix, a
forced language, runs of repeated characters or phrases collapsed, and control characters other
than newline and tab removed (`dictation.textclean`: typed into a terminal they would act).
"""

from __future__ import annotations

from dictation.asr.text.tokenizer import ASR_TEXT
from dictation.textclean import strip_controls

REPEAT_THRESHOLD = 20
_MAX_PATTERN = 20


def _collapse_char_runs(s: str, threshold: int) -> str:
    """A character repeated more than ``threshold`` times in a row becomes one copy."""
    out: list[str] = []
    i = 0
    while i < len(s):
        j = i
        while j < len(s) and s[j] == s[i]:
            j += 1
        out.append(s[i] if j - i > threshold else s[i:j])
        i = j
    return "".join(out)


def _collapse_pattern_run(s: str, threshold: int) -> str:
    """The first substring (1-20 chars) repeated at least ``threshold`` times becomes one copy.

    Scanning starts left to right at positions that leave room for ``2 * threshold`` characters,
    as the reference does; after the first collapse the rest is processed again.
    """
    n = len(s)
    for i in range(0, n - 2 * threshold + 1):
        for k in range(1, _MAX_PATTERN + 1):
            if i + k * threshold > n:
                break
            pattern = s[i : i + k]
            if all(s[i + r * k : i + (r + 1) * k] == pattern for r in range(1, threshold)):
                end = i + threshold * k
                while s[end : end + k] == pattern and end + k <= n:
                    end += k
                return s[:i] + pattern + _collapse_pattern_run(s[end:], threshold)
    return s


def fix_repetitions(text: str, threshold: int = REPEAT_THRESHOLD) -> str:
    """Undo the decoding loops a model can fall into on long or noisy audio."""
    return _collapse_pattern_run(_collapse_char_runs(text, threshold), threshold)


def parse_output(raw: str, forced_language: str | None = None) -> tuple[str, str]:
    """Raw decoded text → ``(language, text)``; ``("", "")`` for no speech (``language None``)."""
    s = strip_controls(raw or "").strip()
    if not s:
        return "", ""
    s = fix_repetitions(s)
    if forced_language:
        return forced_language, s
    if ASR_TEXT not in s:
        return "", s.strip()
    meta, text = s.split(ASR_TEXT, 1)
    text = text.strip()
    if "language none" in meta.lower():
        return "", text
    language = ""
    for line in meta.splitlines():
        line = line.strip()
        if not line:
            continue
        if line.lower().startswith("language "):
            value = line[len("language ") :].strip()
            if value:
                language = value[:1].upper() + value[1:].lower()
            break
    return language, text
