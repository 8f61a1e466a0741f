"""Voice commands and spoken punctuation (dictation.spoken): where the word tables apply, and where never."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from dictation.spoken import Action, TableError, builtin_tables, parse, table_for, user_table
from dictation.spoken.tables import COMMANDS, parse_table

EN = table_for("English")
DE = table_for("de")


def kinds(actions) -> list[str]:
    return [a.kind if a.kind != "text" else f"text:{a.text}" for a in actions]


@pytest.mark.parametrize(
    "transcript, expected",
    [
        # the whole utterance, with the model's own case and punctuation around the words
        ("New line.", ["new_line"]),
        ("new line", ["new_line"]),
        ("Newline!", ["new_line"]),
        ("New paragraph.", ["new_paragraph"]),
        ("Press enter.", ["enter"]),
        ("Enter.", ["enter"]),
        ("Tab.", ["tab"]),
        ("Scratch that.", ["scratch"]),
        ("Undo that!", ["scratch"]),
        ("New paragraph, new paragraph.", ["new_paragraph", "new_paragraph"]),
        ("Scratch that. Scratch that.", ["scratch", "scratch"]),
        # at the end or the start of an utterance
        ("Hello there. New line.", ["text:Hello there.", "new_line"]),
        ("Hello there, new line", ["text:Hello there", "new_line"]),  # the model's pause comma goes too
        ("New line. Hello there.", ["new_line", "text:Hello there."]),
        ("New paragraph, the results are in.", ["new_paragraph", "text:The results are in."]),
        ("Send it. Press enter.", ["text:Send it.", "enter"]),
        ("Scratch that. I meant Tuesday.", ["scratch", "text:I meant Tuesday."]),
        ("Dear Anna, new line, new line", ["text:Dear Anna", "new_line", "new_line"]),
        # "scratch that" after text takes back this utterance's text: nothing is typed
        ("Hello there, scratch that.", []),
        ("New line. Hello there, scratch that.", []),
        # never inside ordinary text, never part of a word
        ("Add new lines of code here.", ["text:Add new lines of code here."]),
        ("Write a new line parser, then test it.", ["text:Write a new line parser, then test it."]),
        ("It happens periodically.", ["text:It happens periodically."]),
        ("Newlines are tricky.", ["text:Newlines are tricky."]),
        ("Open a new tab.", ["text:Open a new tab."]),  # "tab" counts only alone
        ("Press the enter key.", ["text:Press the enter key."]),
        ("Enter the room.", ["text:Enter the room."]),
        ("I said scratch that twice.", ["text:I said scratch that twice."]),
        ("Tabulate the new line items.", ["text:Tabulate the new line items."]),
    ],
)
def test_english_commands_apply_only_as_the_whole_utterance_or_at_its_edges(transcript, expected):
    assert kinds(parse(transcript, EN)) == expected


@pytest.mark.parametrize(
    "transcript, expected",
    [
        ("Neue Zeile.", ["new_line"]),
        ("Vielen Dank. Neuer Absatz.", ["text:Vielen Dank.", "new_paragraph"]),
        ("Streich das.", ["scratch"]),
        ("Tab.", ["tab"]),
        ("Wir brauchen eine neue Zeilenhöhe.", ["text:Wir brauchen eine neue Zeilenhöhe."]),
        ("Die neue Zeile ist leer, sagte sie.", ["text:Die neue Zeile ist leer, sagte sie."]),
    ],
)
def test_german_commands(transcript, expected):
    assert kinds(parse(transcript, DE)) == expected


def test_a_short_command_counts_whatever_language_the_model_named():
    """A lone "Neue Zeile." is easily detected as English: commands come from every table."""
    assert kinds(parse("Neue Zeile.", EN)) == ["new_line"]
    assert kinds(parse("Nouvelle ligne.", table_for(None))) == ["new_line"]


def test_commands_off_leaves_the_words():
    assert kinds(parse("Hello there. New line.", EN, commands=False)) == ["text:Hello there. New line."]


@pytest.mark.parametrize(
    "transcript, expected",
    [
        ("hello comma world period how are you question mark", "hello, world. How are you?"),
        # the model's own marks next to a spoken one are dropped, not doubled
        ("Hello, comma, world. Period. How are you?", "Hello, world. How are you?"),
        ("How are you? Question mark.", "How are you?"),
        ("Really question mark exclamation mark", "Really?!"),
        ("Note colon buy milk", "Note: buy milk"),
        ("I said open parenthesis maybe close parenthesis okay", "I said (maybe) okay"),
        ("a well hyphen known fact", "a well-known fact"),
        ("He said open quote hi close quote", "He said “hi”"),
        # never inside a word, and ordinary words stay
        ("It happens periodically comma right", "It happens periodically, right"),
        ("The commander wrote a semicolonial essay.", "The commander wrote a semicolonial essay."),
        ("Periods of time.", "Periods of time."),
    ],
)
def test_spoken_punctuation_attaches_like_written_text(transcript, expected):
    assert parse(transcript, EN, punctuation=True) == (Action("text", expected),)


def test_spoken_punctuation_is_off_unless_asked():
    assert parse("hello comma world period", EN) == (Action("text", "hello comma world period"),)


def test_spoken_punctuation_uses_the_utterance_language_only():
    assert parse("Hallo Komma wie geht's Fragezeichen", DE, punctuation=True) == (Action("text", "Hallo, wie geht's?"),)
    # English words are ordinary words in a German dictation, and the other way round
    assert parse("Der period ist vorbei", DE, punctuation=True) == (Action("text", "Der period ist vorbei"),)
    assert parse("a Komma here", EN, punctuation=True) == (Action("text", "a Komma here"),)


NBSP = "\u00a0"


@pytest.mark.parametrize(
    "transcript, expected",
    [
        # French typography: a no-break space before ? ! : ; (never a plain one, which could wrap)
        ("Vous venez point d'interrogation", f"Vous venez{NBSP}?"),
        ("Vous venez ? Point d'interrogation.", f"Vous venez{NBSP}?"),
        ("Attention deux points le train part point final", f"Attention{NBSP}: le train part."),
        ("Oui point-virgule non point d'exclamation", f"Oui{NBSP}; non{NBSP}!"),
        ("Bonjour virgule Anna point final merci", "Bonjour, Anna. Merci"),
    ],
)
def test_french_punctuation_takes_a_no_break_space_before_the_tall_marks(transcript, expected):
    assert parse(transcript, table_for("French"), punctuation=True) == (Action("text", expected),)


@pytest.mark.parametrize(
    "transcript, expected",
    [
        # the capital the model gave the words a mark replaces goes to the word after it
        ("Abre interrogación qué hora es cierra interrogación", "¿Qué hora es?"),
        ("abre interrogación qué hora es cierra interrogación", "¿qué hora es?"),
        ("Hola punto abre exclamación qué bien cierra exclamación", "Hola. ¡Qué bien!"),
        ("Dijo abre interrogación vienes signo de interrogación", "Dijo ¿vienes?"),
    ],
)
def test_spanish_opening_marks_attach_to_the_word_after_them(transcript, expected):
    assert parse(transcript, table_for("Spanish"), punctuation=True) == (Action("text", expected),)


def test_no_break_spaces_stay_french():
    # the same marks in English and German attach with no space
    assert parse("Really question mark", EN, punctuation=True) == (Action("text", "Really?"),)
    assert parse("Wirklich Fragezeichen", DE, punctuation=True) == (Action("text", "Wirklich?"),)


def test_commands_and_punctuation_together():
    actions = parse("Dear Anna comma new line", EN, punctuation=True)
    assert kinds(actions) == ["text:Dear Anna,", "new_line"]


def test_users_own_phrases_for_commands_and_marks():
    phrases = [
        SimpleNamespace(said="next one please", means="New line"),
        SimpleNamespace(said="zap it", means="scratch that"),
        SimpleNamespace(said="slash", means="/"),
        SimpleNamespace(said="   ", means="new line"),  # no words: skipped
    ]
    table = table_for("English", user_table(phrases))
    assert kinds(parse("Next one please.", table)) == ["new_line"]
    assert kinds(parse("Thanks, next one please", table)) == ["text:Thanks", "new_line"]
    assert kinds(parse("Zap it.", table)) == ["scratch"]
    assert kinds(parse("and slash or", table, punctuation=True)) == ["text:and/or"]
    assert kinds(parse("She said next one please and left.", table)) == ["text:She said next one please and left."]


def test_every_packaged_table_loads_with_english_and_german_among_them():
    from dictation.resources import SPOKEN_LANGUAGES

    tables = builtin_tables()
    assert {"en", "english", "de", "german"} <= set(tables)
    assert set(SPOKEN_LANGUAGES) <= set(tables)  # every file the wheel must carry is a table
    for name in ("en", "de"):
        table = tables[name]
        assert set(table.commands.values()) == set(COMMANDS), name
        assert {".", ",", "?", "!", ":"} <= set(table.punctuation.values()), name


@pytest.mark.parametrize(
    "data, words",
    [
        ([], "expected an object with 'language' and 'code'"),
        ({"language": "X", "code": "x", "commands": {"jump": ["hop"]}}, "unknown command 'jump'"),
        ({"language": "X", "code": "x", "punctuation": {".": "period"}}, "expected a list of phrases"),
        ({"language": "X", "code": "x", "punctuation": {".": ["..."]}}, "with words in them"),
    ],
)
def test_a_bad_table_is_one_error_naming_the_file(data, words):
    with pytest.raises(TableError, match=words) as info:
        parse_table(json.loads(json.dumps(data)), "dictation/resources/spoken/xx.json")
    assert str(info.value).startswith("dictation/resources/spoken/xx.json")
