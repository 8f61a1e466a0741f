"""The vocabulary the model is given as its context, and the words it learns from corrections.

The model's context (docs/model.md §7) is built from two sources (`model_context`): the user's own
text ("Vocabulary and context", ``transcription.context``) and, after it, the words learned from
corrections (``transcription.learned_words``, each with where it came from). Both live in the
settings file, which is owner-only (`dictation.private`).

`new_words` finds what a correction taught: the transcript as the model heard it and the user's
corrected text are lined up word by word (case and punctuation ignored), and from what the user
changed it keeps names and terms: capitalised words inside a sentence, words with inner capitals,
digits or symbols ("PySide6", "gRPC", "Node.js", "C++"), and lower-case words that replaced
something that sounds different ("kubectl" for "cube cuddle", not "wanted" for "want" or "effect"
for "affect"). Function words, numbers, words the model did write somewhere in the same dictation
and words already in the vocabulary are left out. Adjacent capitalised words, with a title before
them ("Dr. Nguyen", "Jean-Luc Picard"), stay one name. No Qt here: the history window and the
settings page call it.
"""

from __future__ import annotations

import difflib
import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone

from dictation.asr.limits import MAX_CONTEXT_CHARS
from dictation.config.settings import LearnedWord, TranscriptionSettings

log = logging.getLogger(__name__)

MAX_WORDS_PER_CORRECTION = 12  # a rewritten dictation is not a list of terms
MAX_NAME_WORDS = 4  # "Visual Studio Code", "Dr. Jean-Luc Picard"; longer is a sentence
MAX_WORD_CHARS = 80
LEARNED_SEPARATOR = ", "

# Chinese and Japanese are written without spaces: a run of them is one token, never learned from (it
# would be a whole phrase); a Latin term inside it ("用Kubernetes部署") is a word of its own.
_UNSPACED = "\u3040-\u30ff\u3400-\u9fff\uf900-\ufaff"
_UNSPACED_SCRIPT = re.compile(f"[{_UNSPACED}]")
_W = f"[^\\W{_UNSPACED}]"
# A word: letters or digits, with inner apostrophes, hyphens, dots and & inside ("don't", "Jean-Luc",
# "Node.js", "AT&T"), and + or # at its end ("C++", "F#").
_WORD = re.compile(f"[{_UNSPACED}]+|{_W}(?:(?:{_W}|['’.&+#-])*(?:{_W}|[+#]))?")
_SENTENCE_END = ".!?…。！？\n"
# Abbreviated titles: "Dr. Nguyen" is kept as one name, "Dr." alone is not a term.
_TITLES = frozenset({"dr", "mr", "mrs", "ms", "prof", "st", "mme", "sr", "sra"})

# Function words and the most common verbs, which a correction changes for grammar, not vocabulary.
_FUNCTION_WORDS_TEXT = """
a an the and or but nor so yet if then than that this these those there here where when what which who
whom whose why how not no yes i me my mine we us our ours you your yours he him his she her hers it its
they them their theirs one ones some any all each every both either neither few many much more most
less least other another such own same very too also just only even still already again ever never
always often now soon later today tomorrow yesterday of to in on at by for from with without about
into onto over under above below up down out off through between among before after during until
since while because as like per via is am are was were be been being have has had having do does did
done doing will would shall should can could may might must ought get gets got go goes went gone say
says said make makes made let lets okay ok oh uh um hmm yeah well please thanks thank its it's i'm
i've i'd i'll you're you've you'd you'll he's she's we're we've we'd we'll they're they've they'd
they'll that's there's here's what's who's don't doesn't didn't isn't aren't wasn't weren't won't
wouldn't can't cannot couldn't shouldn't haven't hasn't hadn't let's
der die das den dem des ein eine einen einem einer eines und oder aber doch denn wenn dann als wie
dass daß ob weil nicht kein keine ja nein ich mich mir mein meine wir uns unser du dich dir dein er
ihn ihm sein seine sie ihr ihre es man wer was wo wann warum wie welche welcher welches dieser diese
dieses jener hier da dort in im an am auf aus bei mit nach von vom zu zum zur für über unter vor
hinter neben zwischen durch gegen ohne um bis seit während ist bin bist sind seid war waren wäre
sein gewesen habe hast hat haben hatte hatten wird werden wurde wurden kann können muss müssen soll
sollen will wollen darf mag auch noch schon nur sehr so mal eben halt also gerade immer nie jetzt
heute morgen gestern bitte danke herr herrn frau
le la les un une des du de et ou mais donc car si que qui quoi où quand comment ne pas je tu il elle
nous vous ils elles ce cette ces mon ma mes ton ta tes son sa ses dans sur sous avec sans pour par
est sont été être avoir ai as a ont oui non
el la los las un una unos unas y o pero si que quien cuando donde como no yo tú él ella nosotros
ellos ellas este esta estos estas mi mis tu tus su sus en con sin para por es son ser estar está
sí del al
"""


@dataclass(frozen=True)
class NewWord:
    """A word or name from a correction: as the user wrote it, and what the model had written there."""

    word: str
    heard: str


@dataclass(frozen=True)
class _Token:
    start: int
    end: int
    text: str
    key: str


def _key(text: str) -> str:
    """A word compared without case or punctuation ("Dr." = "dr", "Node.js" = "nodejs"); + and # stay ("C++")."""
    return "".join(ch for ch in text.casefold() if ch.isalnum() or ch in "+#")


def _phrase_key(text: str) -> str:
    return " ".join(k for k in (_key(m[0]) for m in _WORD.finditer(text)) if k)


_FUNCTION_WORDS = frozenset(_key(word) for word in _FUNCTION_WORDS_TEXT.split())


def _tokens(text: str) -> list[_Token]:
    out = []
    for m in _WORD.finditer(text):
        key = _key(m[0])
        if key:
            out.append(_Token(m.start(), m.end(), m[0], key))
    return out


def _sentence_initials(text: str, tokens: list[_Token]) -> list[bool]:
    """Whether each token starts a sentence (where any word is capitalised); not after a title ("Dr. Nguyen")."""
    out = []
    for i, token in enumerate(tokens):
        before = text[: token.start].rstrip(" \t\"'“‘(«")
        initial = not before or before[-1] in _SENTENCE_END
        if (
            initial
            and i > 0
            and tokens[i - 1].key in _TITLES
            and before.endswith(".")
            and before[:-1].endswith(tokens[i - 1].text)
        ):
            initial = False
        out.append(initial)
    return out


def _is_number(token: _Token) -> bool:
    return not any(ch.isalpha() for ch in token.text)


def _capitalised(token: _Token, sentence_initial: bool) -> bool:
    """Written as a name: an upper-case letter after the first ("gRPC", "McDonald", "NASA"), or a capital
    first letter inside a sentence ("Nguyen")."""
    text = token.text
    if any(ch.isupper() for ch in text[1:]):
        return True
    return text[0].isupper() and not sentence_initial


def _distinctive(token: _Token, sentence_initial: bool) -> bool:
    """A name or a term by its spelling alone."""
    text = token.text
    if _capitalised(token, sentence_initial):
        return True
    if any(ch.isdigit() for ch in text):
        return True  # letters and digits: "pyside6", "gpt4o" (plain numbers are left out before this)
    return any(ch in "+#&" for ch in text) or "." in text


def _variant(key: str, heard: Sequence[str]) -> bool:
    """``key`` is another form or spelling of a heard word ("wanted" for "want", "effect" for "affect",
    "database" for "data base"): a grammar or spelling fix, not a new term."""
    joined = "".join(heard)
    for other in (*heard, joined):
        if len(other) >= 3 and (key.startswith(other) or other.startswith(key)):
            return True
        if difflib.SequenceMatcher(None, key, other).ratio() >= 0.75:
            return True
    return False


def new_words(heard: str, corrected: str, known: Iterable[str] = ()) -> list[NewWord]:
    """The names and terms the user wrote in ``corrected`` that the model had not written in ``heard``,
    in the order they appear, without those already in ``known`` (vocabulary terms); see the module
    docstring for which words count."""
    heard_tokens, tokens = _tokens(heard), _tokens(corrected)
    heard_keys = {t.key for t in heard_tokens}
    known_phrases = {_phrase_key(term) for term in known}
    known_words = {word for phrase in known_phrases for word in phrase.split()}
    matcher = difflib.SequenceMatcher(None, [t.key for t in heard_tokens], [t.key for t in tokens], autojunk=False)
    block_of: dict[int, tuple[int, int, bool]] = {}  # corrected index -> heard span, whether a replacement
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag in ("replace", "insert"):
            for j in range(j1, j2):
                block_of[j] = (i1, i2, tag == "replace")

    initial = _sentence_initials(corrected, tokens)

    def candidate(j: int) -> bool:
        token = tokens[j]
        if j not in block_of or token.key in heard_keys or token.key in _FUNCTION_WORDS or token.key in _TITLES:
            return False
        if _is_number(token) or _UNSPACED_SCRIPT.search(token.text):
            return False
        if _distinctive(token, initial[j]):
            return True
        i1, i2, replaced = block_of[j]
        if not replaced or len(token.key) < 3:
            return False  # an ordinary word the model left out, or a short one
        return not _variant(token.key, [t.key for t in heard_tokens[i1:i2]])

    def name_part(j: int) -> bool:
        """Can stand in a name next to a new word: capitalised, not a function word."""
        token = tokens[j]
        if token.key in _FUNCTION_WORDS or _is_number(token):
            return False
        return token.key not in _TITLES and (candidate(j) or _capitalised(token, initial[j]))

    def adjacent(a: int, b: int) -> bool:
        gap = corrected[tokens[a].end : tokens[b].start]
        if tokens[a].key in _TITLES:
            return gap.strip() == "." and gap[0] == "."  # "Dr. Nguyen", not "Dr Nguyen" or "the dr, Nguyen"
        return gap.strip() == ""

    found: list[NewWord] = []
    seen: set[str] = set()
    j = 0
    while j < len(tokens) and len(found) < MAX_WORDS_PER_CORRECTION:
        if not candidate(j):
            j += 1
            continue
        start = end = j
        if _capitalised(tokens[j], initial[j]) or tokens[j].text[0].isupper():
            while start > 0 and adjacent(start - 1, start) and not initial[start] and name_part(start - 1):
                start -= 1
            if start > 0 and not initial[start] and tokens[start - 1].key in _TITLES and adjacent(start - 1, start):
                start -= 1
            while end + 1 < len(tokens) and adjacent(end, end + 1) and name_part(end + 1) and not initial[end + 1]:
                end += 1
        if end - start + 1 > MAX_NAME_WORDS:
            start = end = j
        j = end + 1
        word = " ".join(corrected[tokens[start].start : tokens[end].end].split())
        key = _phrase_key(word)
        if key in seen or key in known_phrases or all(k in known_words or k in _TITLES for k in key.split()):
            continue
        if len(word) > MAX_WORD_CHARS:
            continue
        seen.add(key)
        spans = [block_of[i][:2] for i in range(start, end + 1) if i in block_of]
        i1, i2 = min(s[0] for s in spans), max(s[1] for s in spans)
        said = heard[heard_tokens[i1].start : heard_tokens[i2 - 1].end] if i2 > i1 else ""
        found.append(NewWord(word, " ".join(said.split())))
    return found


# --- the vocabulary in the settings -------------------------------------------------------------

_TERM_SEPARATORS = re.compile(r"([,;\n])")


def typed_terms(context: str) -> list[str]:
    """The user's own vocabulary as a list: the text split at commas, semicolons and line ends."""
    terms = (part.strip() for part in _TERM_SEPARATORS.split(context)[::2])
    return list(dict.fromkeys(t for t in terms if t))


def vocabulary_terms(transcription: TranscriptionSettings) -> list[str]:
    """Every term the model is given: the user's own, then the learned ones."""
    return typed_terms(transcription.context) + [w.word for w in transcription.learned_words]


def _context_parts(transcription: TranscriptionSettings) -> tuple[str, list[str], int]:
    """(the user's text with the line end before the learned words, the learned words that fit in the
    engine's limit after it, how many do not)."""
    own = transcription.context
    typed = {_phrase_key(t) for t in typed_terms(own)}
    words = [w.word for w in transcription.learned_words if _phrase_key(w.word) not in typed]
    head = own.rstrip() + "\n" if own.strip() else ""
    room = MAX_CONTEXT_CHARS - len(head)
    kept: list[str] = []
    used = 0
    for word in words:
        used += len(word) + (len(LEARNED_SEPARATOR) if kept else 0)
        if used > room:
            break
        kept.append(word)
    return head, kept, len(words) - len(kept)


def learned_left_out(transcription: TranscriptionSettings) -> int:
    """How many learned words `model_context` leaves out for want of room."""
    return _context_parts(transcription)[2]


def model_context(transcription: TranscriptionSettings) -> str:
    """The context the model is given: the user's text as written, then the learned words on a line of
    their own (a plain list of terms, which works better than instructions). Learned words that would
    take it past the engine's limit are left out, the newest first, so the user's own text always
    reaches the model; without learned words it is the user's text unchanged."""
    head, kept, left_out = _context_parts(transcription)
    if left_out:
        log.warning("%d learned words do not fit in the context after the user's own text; left out", left_out)
    return head + LEARNED_SEPARATOR.join(kept) if kept else transcription.context


def learn(
    transcription: TranscriptionSettings,
    words: Iterable[NewWord],
    *,
    entry_id: int,
    dictated: datetime,
) -> tuple[TranscriptionSettings, list[str]]:
    """``transcription`` with ``words`` added to the learned words (those not in the vocabulary yet and
    that still fit in the context), and the words added."""
    known = {_phrase_key(t) for t in vocabulary_terms(transcription)}
    when = dictated.astimezone(timezone.utc).isoformat(timespec="seconds")
    learned = list(transcription.learned_words)
    added = []
    for new in words:
        key = _phrase_key(new.word)
        if not key or key in known or len(new.word) > MAX_WORD_CHARS:
            continue
        entry = LearnedWord(word=new.word, heard=new.heard, dictated=when, entry_id=max(entry_id, 0))
        if _context_parts(transcription.replace(learned_words=(*learned, entry)))[2]:
            break  # the vocabulary is full
        learned.append(entry)
        known.add(key)
        added.append(new.word)
    return transcription.replace(learned_words=tuple(learned)), added


def forget(transcription: TranscriptionSettings, word: str) -> TranscriptionSettings:
    """``transcription`` without the learned ``word``."""
    return transcription.replace(learned_words=tuple(w for w in transcription.learned_words if w.word != word))


def remove_typed_term(context: str, term: str) -> str:
    """The user's text without ``term`` (one of `typed_terms`) and its separator; the rest as written."""
    parts = _TERM_SEPARATORS.split(context)  # item, separator, item, ...
    for i in range(0, len(parts), 2):
        if parts[i].strip() == term:
            del parts[max(i - 1, 0) : i + 1 if i else 2]  # with the separator before it (after the first)
            break
    else:
        return context
    return "".join(parts).strip()


def learned_source(word: LearnedWord) -> str:
    """Where a learned word came from, for the settings page: the corrected dictation's local time and
    what the model had heard."""
    try:
        when = datetime.fromisoformat(word.dictated).astimezone().strftime("%Y-%m-%d %H:%M")
    except ValueError:
        when = "an earlier dictation"
    heard = f" (heard as “{word.heard}”)" if word.heard else ""
    return f"Your correction of the dictation from {when}{heard}"
