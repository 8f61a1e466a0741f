"""Voice commands in a take's way to the window (`Takes.record_text` / `stored` / `delivered`): what is typed,
what the history keeps (the text as typed, the raw transcript beside it), what the user is told."""

from __future__ import annotations

import pytest

from dictation import session as S
from dictation.config import Outcome
from dictation.output import DeliveryResult
from dictation.output.steps import Keys, Plan, Undo
from dictation.output.undo import MOVED
from dictation.takes import Takes
from tests.session.test_takes import FakePort, saved_take, started, transcript


@pytest.fixture
def port() -> FakePort:
    return FakePort()


@pytest.fixture
def takes(port) -> Takes:
    return Takes(port, port.workers)


def record_and_type(takes, port, raw: str, language: str = "English"):
    started(takes)
    takes.saved(1, saved_take())
    takes.transcribed(1, transcript(raw, language))
    takes.record_text(S.DeliverText(1, raw, language))
    [(_, _, fields)] = port.named("history.store_text")
    takes.stored(1)
    return fields, port.named("output.type_text")


def test_a_line_break_is_typed_as_text_and_the_history_keeps_both_texts(takes, port):
    fields, delivered = record_and_type(takes, port, "Hello there. New line.")
    assert (fields["text"], fields["raw_text"]) == ("Hello there.\n", "Hello there. New line.")
    assert delivered == [("output.type_text", 1, "Hello there.\n")]  # text only: delivered as before, one paste


def test_enter_is_a_key_after_the_text(takes, port):
    fields, delivered = record_and_type(takes, port, "Sehr gut. Enter drücken.", "German")
    assert fields["text"] == "Sehr gut.\n"
    assert delivered == [("output.type_text", 1, Plan(("Sehr gut.", Keys("enter"))))]
    takes.delivered(1, DeliveryResult("xdotool-paste", True, "pasted; pressed enter"))
    assert port.named("history.finish_take")[0][2] == {"outcome": Outcome.PASTED}


def test_scratch_that_is_recorded_with_what_it_removed(takes, port):
    fields, delivered = record_and_type(takes, port, "Scratch that.")
    assert (fields["text"], fields["raw_text"]) == ("", "Scratch that.")
    assert delivered == [("output.type_text", 1, Plan((Undo(),)))]
    takes.delivered(1, DeliveryResult("xdotool-type", True, "pressed backspace 12 times", undone=12))
    removed = Outcome.command("scratch that: removed 12 characters")
    assert port.named("history.finish_take")[0][2] == {"outcome": removed}
    assert port.named("notify") == []


def test_scratch_that_refused_is_said_and_recorded(takes, port):
    record_and_type(takes, port, "Scratch that.")
    takes.delivered(1, DeliveryResult("auto", False, "nothing to do", undo_refused=MOVED))
    assert port.named("notify") == [("notify", "warning", f'"Scratch that" was not done: {MOVED}.')]
    outcome = Outcome.failed(f"scratch that not performed: {MOVED}")
    assert port.named("history.finish_take")[0][2] == {"outcome": outcome}
    assert Outcome.is_valid(outcome) and Outcome.is_valid(Outcome.command("scratch that: removed 1 characters"))


def test_a_dictation_that_takes_itself_back_types_nothing(takes, port):
    fields, delivered = record_and_type(takes, port, "Hello there, scratch that.")
    assert fields["text"] == "" and delivered == []
    [(_, _, finish, _, _)] = port.named("history.finish_take")
    assert finish == {"outcome": Outcome.command("scratch that: this dictation was taken back, nothing typed")}
    assert len(takes) == 0


def test_spoken_punctuation_and_commands_follow_the_settings(takes, port):
    commands = port.settings.commands.replace(enabled=False, spoken_punctuation=True)
    port.settings = port.settings.replace(commands=commands)
    fields, delivered = record_and_type(takes, port, "Hello comma world. New line.")
    assert fields["text"] == "Hello, world. New line. "  # the trailing space of the text options
    assert delivered == [("output.type_text", 1, "Hello, world. New line. ")]


def test_retranscribed_entries_keep_the_text_as_it_would_be_typed_and_the_raw_one(takes, port):
    from dictation.takes import Retranscription

    takes.transcribed(Retranscription(7), transcript("Thanks. New paragraph."))
    [(_, _, fields)] = port.named("history.update_entry")
    assert (fields["text"], fields["raw_text"]) == ("Thanks.\n\n", "Thanks. New paragraph.")
