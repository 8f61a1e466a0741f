"""Transcript post-processing: replacements, capitalisation, trailing space, and their order."""

from __future__ import annotations

import pytest

from dictation.output import Replacement, TextOptions, apply_textops


def run(text, *rules, capitalize=False, space=False):
    return apply_textops(text, TextOptions(rules, capitalize_first=capitalize, trailing_space=space))


@pytest.mark.parametrize(
    "text, rule, expected",
    [
        ("use pyside six now", Replacement("pyside six", "PySide6"), "use PySide6 now"),
        ("Cat and cat", Replacement("cat", "dog"), "Cat and dog"),  # case-sensitive by default
        ("Cat and CAT", Replacement("cat", "dog", case_sensitive=False), "dog and dog"),
        ("cat concatenate cat.", Replacement("cat", "dog", whole_word=True), "dog concatenate dog."),
        ("Grüße grüße", Replacement("grüße", "hallo", whole_word=True), "Grüße hallo"),
        ("straße strasse", Replacement("stra", "X", whole_word=True), "straße strasse"),  # ß is a word character
        ("a+b c++ c++x", Replacement("c++", "C++", whole_word=True), "a+b C++ c++x"),  # literal, not a regex
        ("path is C", Replacement("C", r"C:\new\1"), r"path is C:\new\1"),  # replacement inserted as written
        ("你好世界", Replacement("世界", "朋友"), "你好朋友"),
    ],
)
def test_replacements(text, rule, expected):
    assert run(text, rule) == expected


def test_replacements_apply_in_order_each_on_the_previous_output():
    assert run("a", Replacement("a", "b"), Replacement("b", "c")) == "c"
    assert run("a", Replacement("b", "c"), Replacement("a", "b")) == "b"


def test_documented_order_strip_replace_capitalise_space():
    # The replacement makes the opening word, capitalisation sees it, the space comes last.
    text = run("  k eight s is up ", Replacement("k eight s", "kubernetes"), capitalize=True, space=True)
    assert text == "Kubernetes is up "


@pytest.mark.parametrize(
    "text, expected",
    [
        ("hello world", "Hello world"),
        ('"quoted" start', '"Quoted" start'),
        ("42 apples", "42 Apples"),
        ("élan", "Élan"),
        ("你好 hello", "你好 hello"),  # the first letter has no case: unchanged
        ("", ""),
    ],
)
def test_capitalise_first_letter(text, expected):
    assert run(text, capitalize=True) == expected


def test_trailing_space_is_added_once_and_never_to_empty_text():
    assert run("done", space=True) == "done "
    assert run("done\n", space=True) == "done "  # stripped first, then one space
    assert run("   ", space=True) == ""
    assert run("", Replacement("x", "y"), capitalize=True, space=True) == ""


def test_defaults_only_strip():
    assert run("  as said  ") == "as said"


def test_empty_find_is_rejected():
    with pytest.raises(ValueError):
        Replacement("", "x")
