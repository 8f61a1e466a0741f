"""`dictation.vocabulary`: which words a correction teaches, and the context the model is given."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from dictation.asr.limits import MAX_CONTEXT_CHARS
from dictation.config.settings import LearnedWord, TranscriptionSettings
from dictation.vocabulary import (
    NewWord,
    forget,
    learn,
    learned_source,
    model_context,
    new_words,
    remove_typed_term,
    typed_terms,
    vocabulary_terms,
)

WHEN = datetime(2026, 11, 30, 14, 3, tzinfo=timezone.utc)


def words(heard: str, corrected: str, known=()) -> list[str]:
    return [w.word for w in new_words(heard, corrected, known)]


# --- what a correction teaches ------------------------------------------------------------------

NAMES_AND_TERMS = [
    # (what the model wrote, what the user corrected it to, the words learned)
    (
        "I talked to doctor when about the cube and eighties cluster.",
        "I talked to Dr. Nguyen about the Kubernetes cluster.",
        ["Dr. Nguyen", "Kubernetes"],
    ),
    ("Run cube cuddle get pods.", "Run kubectl get pods.", ["kubectl"]),
    ("We use pie side six for the UI.", "We use PySide6 for the UI.", ["PySide6"]),
    ("Ask Jean Luc Packard.", "Ask Jean-Luc Picard.", ["Jean-Luc Picard"]),
    ("Cooper Netties is great.", "Kubernetes is great.", ["Kubernetes"]),  # capitalised at a sentence start
    ("we call the G R P C endpoint", "we call the gRPC endpoint", ["gRPC"]),
    ("write it in see plus plus", "write it in C++", ["C++"]),
    ("Meet Sarah Connor tomorrow", "Meet Sarah Conner tomorrow", ["Sarah Conner"]),  # the whole name
    ("Send it to Anna", "Send it to Anna and Bartholomew", ["Bartholomew"]),  # a name the model left out
    ("Der Termin mit Herrn Schmitz ist am Dienstag.", "Der Termin mit Herrn Schmidt ist am Dienstag.", ["Schmidt"]),
    ("the note says no JS is needed", "the note says Node.js is needed", ["Node.js"]),
    ("我们用库伯内蒂斯部署", "我们用Kubernetes部署", ["Kubernetes"]),  # a Latin term in Chinese text
    ("the deal with A T and T closed", "the deal with AT&T closed", ["AT&T"]),
]


@pytest.mark.parametrize(("heard", "corrected", "expected"), NAMES_AND_TERMS)
def test_names_and_terms_the_model_did_not_hear_are_found(heard, corrected, expected):
    assert words(heard, corrected) == expected


ORDINARY_FIXES = [
    ("I want to go home.", "I wanted to go home."),  # grammar: another form of the heard word
    ("The affect was large.", "The effect was large."),  # a spelling of a similar word
    ("There going home", "They're going home"),  # function words
    ("the kubernetes cluster", "the Kubernetes cluster"),  # case only
    ("it's ready, isn't it", "It's ready; isn't it?"),  # punctuation only
    ("it costs 40 dollars", "it costs 45 dollars"),  # numbers
    ("I like it", "I really like it"),  # an ordinary word the model left out
    ("put it in the data base", "put it in the database"),  # two heard words joined
    ("Same text.", "Same text."),
    ("交易停止了", "交易停滞不前了"),  # written without spaces: not split into words, not learned from
]


@pytest.mark.parametrize(("heard", "corrected"), ORDINARY_FIXES)
def test_ordinary_fixes_teach_no_words(heard, corrected):
    assert words(heard, corrected) == []


def test_a_word_the_model_wrote_elsewhere_in_the_dictation_is_not_new():
    heard = "Kubernetes runs it. Then cube and eighties restarts it."
    assert words(heard, "Kubernetes runs it. Then Kubernetes restarts it.") == []


def test_words_already_in_the_vocabulary_are_left_out_case_and_punctuation_ignored():
    heard, corrected = NAMES_AND_TERMS[0][:2]
    assert words(heard, corrected, known=["kubernetes", "Dr Nguyen"]) == []
    assert words(heard, corrected, known=["Nguyen"]) == ["Kubernetes"]  # every word of the name is known


def test_what_the_model_heard_is_kept_with_each_word():
    found = new_words("Run cube cuddle get pods and ask doctor when", "Run kubectl get pods and ask Dr. Nguyen")
    assert found == [NewWord("kubectl", "cube cuddle"), NewWord("Dr. Nguyen", "doctor when")]


def test_a_title_alone_or_after_a_sentence_end_is_not_a_word():
    assert words("ask the doctor", "ask the Dr.") == []
    assert words("It was late. Win called.", "It was late. Nguyen called.") == ["Nguyen"]


def test_each_word_once_and_a_rewrite_gives_a_bounded_list():
    assert words("cube cuddle and cube cuddle", "kubectl and kubectl") == ["kubectl"]
    many = " ".join(f"Name{i}x" for i in range(40))
    assert len(words("", many)) == 12


# --- the vocabulary in the settings -------------------------------------------------------------


def learned(*names: str) -> tuple[LearnedWord, ...]:
    return tuple(LearnedWord(word=n, heard="", dictated=WHEN.isoformat(), entry_id=1) for n in names)


def test_the_context_is_the_users_text_alone_without_learned_words():
    t = TranscriptionSettings(context="Kubernetes, PySide6\n")
    assert model_context(t) == "Kubernetes, PySide6\n"
    assert model_context(TranscriptionSettings()) == ""


def test_learned_words_follow_the_users_text_on_a_line_of_their_own():
    t = TranscriptionSettings(context="Kubernetes, PySide6", learned_words=learned("kubectl", "Dr. Nguyen"))
    assert model_context(t) == "Kubernetes, PySide6\nkubectl, Dr. Nguyen"
    assert model_context(t.replace(context="")) == "kubectl, Dr. Nguyen"
    assert vocabulary_terms(t) == ["Kubernetes", "PySide6", "kubectl", "Dr. Nguyen"]


def test_a_learned_word_the_user_also_typed_is_given_once():
    t = TranscriptionSettings(context="kubectl, Helm", learned_words=learned("Kubectl", "gRPC"))
    assert model_context(t) == "kubectl, Helm\ngRPC"


def test_learned_words_never_push_the_context_past_the_engines_limit():
    own = "x" * (MAX_CONTEXT_CHARS - 20)
    t = TranscriptionSettings(context=own, learned_words=learned("kubectl", "Kubernetes", "PySide6"))
    context = model_context(t)
    assert len(context) <= MAX_CONTEXT_CHARS
    assert context == own + "\nkubectl, Kubernetes"  # the newest left out, the user's text whole


def test_learn_records_where_each_word_came_from_and_skips_known_ones():
    t = TranscriptionSettings(context="Kubernetes")
    found = [NewWord("Kubernetes", "cube and eighties"), NewWord("Dr. Nguyen", "doctor when")]
    t2, added = learn(t, found, entry_id=7, dictated=WHEN)
    assert added == ["Dr. Nguyen"]
    assert t2.learned_words == (
        LearnedWord(word="Dr. Nguyen", heard="doctor when", dictated="2026-11-30T14:03:00+00:00", entry_id=7),
    )
    t3, again = learn(t2, [NewWord("dr nguyen", "")], entry_id=8, dictated=WHEN)
    assert again == [] and t3 == t2
    assert "Your correction of the dictation from" in learned_source(t2.learned_words[0])
    assert "doctor when" in learned_source(t2.learned_words[0])


def test_learn_stops_when_the_vocabulary_is_full():
    t = TranscriptionSettings(context="x" * (MAX_CONTEXT_CHARS - 12))
    t2, added = learn(t, [NewWord("kubectl", ""), NewWord("Kubernetes", "")], entry_id=1, dictated=WHEN)
    assert added == ["kubectl"]
    assert model_context(t2).endswith("\nkubectl")


def test_forget_removes_one_learned_word():
    t = TranscriptionSettings(learned_words=learned("kubectl", "gRPC"))
    assert [w.word for w in forget(t, "kubectl").learned_words] == ["gRPC"]


def test_typed_terms_and_removing_one_keep_the_rest_as_written():
    text = "Kubernetes, PySide6; Dr. Nguyen\nHelm"
    assert typed_terms(text) == ["Kubernetes", "PySide6", "Dr. Nguyen", "Helm"]
    assert remove_typed_term(text, "Kubernetes") == "PySide6; Dr. Nguyen\nHelm"
    assert remove_typed_term(text, "Dr. Nguyen") == "Kubernetes, PySide6\nHelm"
    assert remove_typed_term(text, "Helm") == "Kubernetes, PySide6; Dr. Nguyen"
    assert remove_typed_term("Helm", "Helm") == ""
    assert remove_typed_term(text, "absent") == text
