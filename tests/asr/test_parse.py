"""Output parsing (docs/model.md §7.3), checked case by case and against the official parser."""

import random

import pytest

from dictation.asr.errors import LanguageError
from dictation.asr.text.parse import fix_repetitions, parse_output
from dictation.asr.text.prompt import LANGUAGES, normalize_language


@pytest.mark.parametrize(
    ("raw", "forced", "expected"),
    [
        ("language English<asr_text>Hello world.", None, ("English", "Hello world.")),
        ("language ENGLISH<asr_text> Hello ", None, ("English", "Hello")),
        ("language None<asr_text>", None, ("", "")),
        ("language None<asr_text>stray", None, ("", "stray")),
        ("plain text without tag", None, ("", "plain text without tag")),
        ("", None, ("", "")),
        ("   ", None, ("", "")),
        ("Bonjour tout le monde", "French", ("French", "Bonjour tout le monde")),
        ("language Chinese\nextra\n<asr_text>你好", None, ("Chinese", "你好")),
        ("language chinese<asr_text>你好<asr_text>再见", None, ("Chinese", "你好<asr_text>再见")),
        ("a" * 25 + "b", None, ("", "ab")),
        ("la" * 30 + " end", None, ("", "la end")),
    ],
)
def test_parse_cases(raw, forced, expected):
    assert parse_output(raw, forced) == expected


@pytest.mark.parametrize(
    ("raw", "forced", "expected"),
    [
        ("language English<asr_text>Hello\x1a world.\x1b[2J", None, ("English", "Hello world.[2J")),
        ("language English\x00<asr_text>\x07Line one\r\nline\ttwo\x85\x9b", None, ("English", "Line one\nline\ttwo")),
        ("\x1a\x03", None, ("", "")),
        ("\x08Bonjour", "French", ("French", "Bonjour")),
    ],
)
def test_control_characters_but_newline_and_tab_are_removed(raw, forced, expected):
    """Typed as they are, a ``\\x1a`` flushed part of a terminal line: the text the CLI prints, the
    history stores and the app types comes from here without them."""
    assert parse_output(raw, forced) == expected


def _random_text(rng: random.Random) -> str:
    pieces = []
    for _ in range(rng.randint(0, 6)):
        kind = rng.random()
        if kind < 0.3:
            pieces.append(rng.choice("ab好 ") * rng.randint(1, 45))
        elif kind < 0.6:
            pieces.append(rng.choice(["ha", "abc", "的了", "x y ", "hello "]) * rng.randint(1, 30))
        else:
            pieces.append("".join(rng.choice("abcde 你好。,") for _ in range(rng.randint(0, 30))))
    return "".join(pieces)


@pytest.fixture(scope="module")
def official():
    """The official package's text helpers (imported here: the package is slow to import)."""
    from qwen_asr.inference import utils

    return utils


def test_repetition_fix_matches_official_on_random_strings(official):
    rng = random.Random(1234)
    for _ in range(400):
        text = _random_text(rng)
        assert fix_repetitions(text) == official.detect_and_fix_repetitions(text), text


def test_parse_matches_official_on_random_outputs(official):
    rng = random.Random(99)
    names = [n for n, _ in LANGUAGES] + ["None", "english", "xx"]
    for _ in range(300):
        meta = f"language {rng.choice(names)}" if rng.random() < 0.8 else ""
        raw = meta + ("<asr_text>" if rng.random() < 0.8 else "") + _random_text(rng)
        forced = rng.choice([None, None, "German"])
        assert parse_output(raw, forced) == official.parse_asr_output(raw, forced), raw


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("english", "English"),
        ("EN", "English"),
        ("zh", "Chinese"),
        ("yue", "Cantonese"),
        ("Fil", "Filipino"),
        ("mk", "Macedonian"),
        (" German ", "German"),
        (None, None),
        ("", None),
        ("auto", None),
        ("AUTO", None),
    ],
)
def test_language_names_and_codes(given, expected):
    assert normalize_language(given) == expected


def test_thirty_languages_with_unique_codes():
    assert len(LANGUAGES) == 30
    assert len({c for _, c in LANGUAGES}) == 30


@pytest.mark.parametrize("bad", ["Klingon", "english!", "eng", "Chinese (Sichuan)"])
def test_unknown_language_is_a_clear_error(bad):
    with pytest.raises(LanguageError, match="unsupported language") as info:
        normalize_language(bad)
    assert "English (en)" in str(info.value)
