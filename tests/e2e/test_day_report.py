"""The counting of the day-of-use test (`day_report`, `day.locate_clip`) on made-up inputs: what it
calls lost, extra and clipped must be exactly that, or the day's verdict means nothing."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tests.e2e.day import RATE, Clip, locate_clip
from tests.e2e.day_report import Dictation, Report, align, as_field_shows, check_typed


def test_align_finds_every_piece_in_order():
    assert align(["one ", "two ", "three "], "one two three ") == ([True, True, True], [])


def test_align_tells_which_of_two_equal_texts_is_missing():
    # a first-match search would take the third text for the first and call the third one lost
    there, extra = align(["same ", "other ", "same "], "other same ")
    assert there == [False, True, True] and extra == []


def test_align_places_extra_text_between_the_pieces():
    text = "one   two three "
    there, extra = align(["one ", "two ", "three "], text)
    assert there == [True, True, True]
    assert [(text[a:b], before) for a, b, before in extra] == [("  ", 1)]


def test_align_sees_a_piece_out_of_order_as_missing_in_its_place_plus_extra_text():
    text = "one three two "
    assert align(["one ", "two ", "three "], text) == ([True, False, True], [(10, 14, 3)])


@dataclass
class Entry:
    id: int
    outcome: str
    text: str


def _typed(texts: list[str], field: str) -> list[str]:
    dictations = [Dictation(k + 1, "test", _clip(k, 0.6, k)) for k in range(len(texts))]
    owned = {d.n: [Entry(d.n, "pasted", text)] for d, text in zip(dictations, texts, strict=True)}
    report = Report()
    check_typed(dictations, owned, field, "", report)
    return report.lines()


def test_check_typed_names_the_lost_the_reordered_and_the_extra():
    assert _typed(["one ", "two ", "three "], "one two three ") == []
    lines = _typed(["one ", "two ", "three "], "one three two ")
    assert len(lines) == 1 and lines[0].startswith("dictation #2 (test, 0.60 s of speech): LOST")
    assert lines[0].endswith("never arrived; not in its place: it arrived out of order, after the text of dictation #3")
    lines = _typed(["one ", "two ", "three "], " one three x")
    assert lines[0].startswith("dictation #2 (test, 0.60 s of speech): LOST") and lines[0].endswith("never arrived")
    assert lines[1:] == [
        "EXTRA TEXT (' ') arrived, at the start of the field",
        "EXTRA TEXT ('x') arrived, after the text of dictation #3",
    ]


def test_line_breaks_count_as_a_plain_text_field_shows_them():
    assert as_field_shows("a\r\nb\rc\u2029d\xa0e") == "a\nb\nc\nd e"


def _clip(index: int, seconds: float, seed: int) -> Clip:
    rng = np.random.default_rng(seed)
    return Clip(index, Path(f"clip-{index}.wav"), rng.normal(0, 0.2, round(seconds * RATE)))


def test_locate_clip_names_the_clip_and_where_it_starts():
    clips = [_clip(0, 0.8, 1), _clip(1, 1.2, 2), _clip(2, 0.6, 3)]
    recording = np.concatenate([np.zeros(4000), clips[1].samples, np.zeros(2000)])
    found = locate_clip(recording, clips)
    assert found.clip == 1 and found.start_s == 4000 / RATE and found.clipped_s == 0 and found.fit > 0.99


def test_locate_clip_measures_a_start_that_came_late():
    clips = [_clip(0, 0.8, 1), _clip(1, 1.2, 2)]
    recording = np.concatenate([clips[1].samples[3200:], np.zeros(2000)])  # began 200 ms into the speech
    found = locate_clip(recording, clips)
    assert found.clip == 1 and abs(found.clipped_s - 0.2) < 1e-9


def test_locate_clip_finds_nothing_in_silence_or_in_another_sound():
    clips = [_clip(0, 0.8, 1)]
    assert locate_clip(np.zeros(RATE), clips) is None
    assert locate_clip(_clip(1, 1.0, 9).samples, clips) is None
