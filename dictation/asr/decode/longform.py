"""Audio longer than one pass (docs/model.md §8): split at the quietest point near the limit, join results.

The official toolkit transcribes up to 20 minutes in one pass. Longer clips are cut near each
20-minute mark, at the sample of least magnitude inside the quietest 100 ms within ±5 s, so no
word is cut in half; the pieces concatenate back to the original samples exactly.
"""

from __future__ import annotations

import numpy as np

from dictation.asr.limits import MAX_PASS_SECONDS  # read here as longform.MAX_PASS_SECONDS (tests lower it)

SEARCH_SECONDS = 5.0
QUIET_WINDOW_SECONDS = 0.1
MIN_PIECE_SECONDS = 0.5


def split_long_audio(
    audio: np.ndarray, sample_rate: int, max_seconds: float = MAX_PASS_SECONDS, search_seconds: float = SEARCH_SECONDS
) -> list[tuple[np.ndarray, float]]:
    """``[(piece, offset_seconds)]``; one piece, unpadded, when the clip fits in one pass.

    A final piece shorter than half a second is zero-padded to half a second, as the official
    toolkit does, so the encoder always sees a usable input.
    """
    total = len(audio)
    limit = int(max_seconds * sample_rate)
    if total <= limit:
        return [(audio, 0.0)]
    reach = int(search_seconds * sample_rate)
    window = max(4, int(QUIET_WINDOW_SECONDS * sample_rate))
    magnitude = np.abs(audio)
    pieces: list[tuple[np.ndarray, float]] = []
    start = 0
    while total - start > limit:
        target = start + limit
        lo, hi = max(start, target - reach), min(total, target + reach)
        if hi - lo <= window:
            cut = target
        else:
            # Sum of |x| over every window position inside [lo, hi), via a cumulative sum.
            csum = np.concatenate([[0.0], np.cumsum(magnitude[lo:hi], dtype=np.float64)])
            sums = csum[window:] - csum[:-window]
            quiet = int(np.argmin(sums))
            cut = lo + quiet + int(np.argmin(magnitude[lo + quiet : lo + quiet + window]))
        cut = min(max(cut, start + 1), total)
        pieces.append((audio[start:cut], start / sample_rate))
        start = cut
    pieces.append((audio[start:], start / sample_rate))
    min_len = int(MIN_PIECE_SECONDS * sample_rate)
    return [(np.pad(p, (0, min_len - len(p))) if len(p) < min_len else p, off) for p, off in pieces]


def _needs_space(left: str, right: str) -> bool:
    """Scripts written without spaces (CJK, Thai) join directly; others get one space."""
    if not left or not right or left[-1].isspace() or right[0].isspace():
        return False

    def spaceless(ch: str) -> bool:
        code = ord(ch)
        return (
            0x2E80 <= code <= 0x9FFF
            or 0xAC00 <= code <= 0xD7AF
            or 0xF900 <= code <= 0xFAFF
            or 0xFF00 <= code <= 0xFFEF
            or 0x0E00 <= code <= 0x0E7F
            or 0x3000 <= code <= 0x303F
        )

    return not (spaceless(left[-1]) or spaceless(right[0]))


def join_texts(texts: list[str]) -> str:
    out = ""
    for text in texts:
        if not text:
            continue
        out += (" " if _needs_space(out, text) else "") + text
    return out


def merge_languages(languages: list[str]) -> str:
    """Languages of consecutive pieces, repeats and blanks dropped, joined with commas."""
    merged: list[str] = []
    for lang in languages:
        lang = (lang or "").strip()
        if lang and (not merged or merged[-1] != lang):
            merged.append(lang)
    return ",".join(merged)
