"""What a day of dictations (`test_day_e2e.py`) left behind, counted against what was dictated.

Three sources, each compared with the list of dictations the test made:

- the history: every dictation that was not cancelled has exactly one entry, identified by the clip
  its saved recording holds (`day.locate_clip`); its outcome says it was typed (or, for the take
  cut by kill -9, recovered at the next start), with text. A cancelled one has none.
- the saved recordings: each holds its clip from the clip's first sample (the speech started at the
  press, or after it): a recording that began after the speech did is a clipped start, in ms.
- the target window: its text is exactly the typed entries' texts, in order, nothing missing and
  nothing between them; and no key press of the hotkey's Space ever reached it (a leak).

Every finding is one line naming the dictation (its number and pattern) and what happened.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from tests.e2e.day import Clip, KeyEvent, locate_clip

TYPED_OUTCOMES = ("pasted", "typed")
CLIP_TOLERANCE_S = 0.02  # a block boundary; espeak's first sample is already speech (clips are trimmed)


@dataclass
class Dictation:
    n: int  # 1-based, in the order they were made
    pattern: str  # e.g. "back-to-back", "launch +0.3 s (push_to_talk)"
    clip: Clip
    expect: str = "typed"  # "typed", "cancelled" or "recovered"
    pressed: float = 0.0  # wall clock of the press (or the `start` command)
    released: float = 0.0  # of the release that ended it (0: ended otherwise)
    detail: str = ""  # how it was pressed, for the message
    # presses of Space that may reach the target: 1 for a press that came before the app's grab
    # existed (its own key-press; an auto-repeat is still a leak), else 0
    leak_allowed: int = 0

    def record(self) -> dict:
        """What the test did, as JSON (kept beside the run's files, to look at a failure again)."""
        return {
            "n": self.n,
            "pattern": self.pattern,
            "clip": str(self.clip.path),
            "expect": self.expect,
            "pressed": self.pressed,
            "released": self.released,
        }

    def name(self) -> str:
        detail = f", {self.detail}" if self.detail else ""
        return f"dictation #{self.n} ({self.pattern}{detail}, {self.clip.seconds:.2f} s of speech)"


@dataclass
class Report:
    lost: list[str] = field(default_factory=list)
    leaked: list[str] = field(default_factory=list)
    clipped: list[str] = field(default_factory=list)
    other: list[str] = field(default_factory=list)
    marks: dict[int, set[str]] = field(default_factory=dict)  # dictation number -> kinds found for it

    def add(self, kind: str, line: str, d: Dictation | None = None) -> None:
        getattr(self, kind).append(line)
        if d is not None:
            self.marks.setdefault(d.n, set()).add(kind)

    def lines(self) -> list[str]:
        return self.lost + self.leaked + self.clipped + self.other

    def summary(self, dictations: list[Dictation]) -> str:
        def count(kind: str, ds: list[Dictation]) -> int:
            return sum(kind in self.marks.get(d.n, ()) for d in ds)

        head = (
            f"{len(dictations)} dictations: {count('lost', dictations)} lost, {count('leaked', dictations)} "
            f"with leaked keys, {count('clipped', dictations)} with a clipped start; {len(self.lines())} findings"
        )
        patterns = list(dict.fromkeys(d.pattern for d in dictations))
        table = ["lost / leaked / clipped, by pattern:"]
        for pattern in patterns:
            ds = [d for d in dictations if d.pattern == pattern]
            figures = " / ".join(str(count(kind, ds)) for kind in ("lost", "leaked", "clipped"))
            table.append(f"  {pattern}: {figures} of {len(ds)}")
        return "\n".join([head, *table, *self.lines()])


SAVED = re.compile(r"recording \d+ saved: (?P<path>\S*rec-(?P<t>\d{8}T\d{6}\.\d{3})Z\.wav) \((?P<what>[^)]*)\)")
NO_SPEECH = "No speech recognised"


@dataclass(frozen=True)
class SavedTake:
    """A "recording N saved: PATH (…)" line of the app's log."""

    path: Path
    started: float  # wall clock, from the recording's file name
    what: str  # "1.9 s", "3.5 s; it began 0.20 s after the press"


def saved_takes(log: str) -> list[SavedTake]:
    takes = []
    for m in SAVED.finditer(log):
        started = datetime.strptime(m["t"], "%Y%m%dT%H%M%S.%f").replace(tzinfo=timezone.utc).timestamp()
        takes.append(SavedTake(Path(m["path"]), started, m["what"]))
    return takes


def _why_no_entry(d: Dictation, takes: list[SavedTake], log: str) -> tuple[str, bool]:
    """What the app's log and the recording say about a dictation that has no history entry, and
    whether the recording it made lacks the start of the speech."""
    from dictation.audio.wav import load_audio_16k

    end = (d.released or d.pressed + d.clip.seconds) + 0.5
    mine = [t for t in takes if d.pressed - 1.0 <= t.started <= end]
    if not mine:
        return "the app never recorded it (no recording began between its press and its release)", False
    take = mine[0]
    held, clipped = "its file is gone", False
    if take.path.is_file():
        found = locate_clip(load_audio_16k(take.path), [d.clip])
        if found is None:
            held = "the file holds none of the speech"
        elif found.clipped_s > CLIP_TOLERANCE_S:
            held, clipped = f"the file lacks the first {found.clipped_s * 1000:.0f} ms of the speech", True
        else:
            held = "the file holds all of the speech"
    notes = log.count(NO_SPEECH)
    said = f"; the log says {NO_SPEECH!r} for {notes} takes of the day" if notes else ""
    return f"the app recorded it ({take.path.name}, {take.what}: {held}) but kept no history entry{said}", clipped


def _entry_owner(entry, dictations: list[Dictation], found) -> Dictation | None:
    """The dictation an entry belongs to: the clip its recording holds, else the last press before
    the entry was made (a recording that holds none of its speech)."""
    if found is not None:
        return dictations[found.clip]
    created = entry.created.timestamp()
    before = [d for d in dictations if d.pressed <= created + 0.2]
    return before[-1] if before else None


def check_history(dictations: list[Dictation], entries: list, log: str, report: Report) -> dict[int, list]:
    """Which entries belong to which dictation (by ``Dictation.n``), with the history findings."""
    from dictation.audio.wav import load_audio_16k

    clips = [d.clip for d in dictations]
    takes = saved_takes(log)
    owned: dict[int, list] = {d.n: [] for d in dictations}
    found_of: dict[int, object] = {}
    for entry in entries:
        found = None
        if entry.audio_path is not None and entry.audio_path.is_file():
            audio = load_audio_16k(entry.audio_path)
            # the dictations pressed around the entry's making first (cross-correlating is slow)
            created = entry.created.timestamp()
            near = [d.clip for d in dictations if created - 8 <= d.pressed <= created + 2]
            found = locate_clip(audio, near) if near else None
            if found is None:
                found = locate_clip(audio, clips)
        found_of[entry.id] = found
        owner = _entry_owner(entry, dictations, found)
        if owner is None:
            report.add("other", f"history entry #{entry.id} ({entry.outcome!r}) belongs to no dictation of the day")
            continue
        owned[owner.n].append(entry)
    for d in dictations:
        mine = owned[d.n]
        if d.expect == "cancelled":
            for entry in mine:
                report.add(
                    "lost",
                    f"{d.name()}: cancelled, yet history entry #{entry.id} holds it (outcome {entry.outcome!r})",
                    d,
                )
            continue
        if not mine:
            why, clipped = _why_no_entry(d, takes, log)
            report.add("lost", f"{d.name()}: LOST - no history entry: {why}", d)
            if clipped:
                report.marks[d.n].add("clipped")
            continue
        if len(mine) > 1:
            report.add("other", f"{d.name()}: split over history entries {[e.id for e in mine]}", d)
        entry = mine[0]
        want = TYPED_OUTCOMES if d.expect == "typed" else ("recovered",)
        if entry.outcome not in want or not entry.text.strip():
            report.add(
                "lost",
                f"{d.name()}: LOST - history entry #{entry.id} says {entry.outcome!r} with "
                f"{len(entry.text.strip())} characters of text (expected {' or '.join(want)}, with text)",
                d,
            )
        found = found_of[entry.id]
        if entry.audio_path is None or not entry.audio_path.is_file():
            report.add(
                "other", f"{d.name()}: history entry #{entry.id} has no recording on disk ({entry.audio_path})", d
            )
        elif found is None or found.clip != d.n - 1:
            report.add(
                "clipped",
                f"{d.name()}: CLIPPED - its recording (history entry #{entry.id}) holds none of its speech",
                d,
            )
        elif found.clipped_s > CLIP_TOLERANCE_S:
            report.add(
                "clipped",
                f"{d.name()}: CLIPPED START - the recording (history entry #{entry.id}) begins "
                f"{found.clipped_s * 1000:.0f} ms into the speech",
                d,
            )
    return owned


def as_field_shows(text: str) -> str:
    """``text`` as a plain-text field holds it once pasted: every line break is one newline, a no-break
    space a space (Qt's ``toPlainText``). Nothing else is changed."""
    return re.sub(r"\r\n|[\r\u2028\u2029]", "\n", text).replace("\xa0", " ")


def align(pieces: list[str], text: str) -> tuple[list[bool], list[tuple[int, int, int]]]:
    """The cheapest reading of ``text`` as ``pieces`` in order, some of them missing, with extra text
    between them: a missing piece costs its length, an extra character one. Returns which pieces are
    there, and the extra stretches as (start, end, index of the piece they come before). Exact, where a
    first-match search is not: two dictations may well give the same text."""
    n, size = len(pieces), len(text)
    inf = 1 << 60
    cost = [[inf] * (size + 1) for _ in range(n + 1)]
    move = [[0] * (size + 1) for _ in range(n + 1)]  # 1 piece there, 2 piece missing, 3 extra character
    cost[0][0] = 0
    for i in range(n + 1):
        row = cost[i]
        for p in range(size + 1):
            c = row[p]
            if c >= inf:
                continue
            if p < size and c + 1 < row[p + 1]:
                row[p + 1], move[i][p + 1] = c + 1, 3
            if i < n:
                nxt, piece = cost[i + 1], pieces[i]
                if piece and text.startswith(piece, p) and c < nxt[p + len(piece)]:
                    nxt[p + len(piece)], move[i + 1][p + len(piece)] = c, 1
                if c + max(1, len(piece)) < nxt[p]:
                    nxt[p], move[i + 1][p] = c + max(1, len(piece)), 2
    there = [False] * n
    extra: list[tuple[int, int, int]] = []
    i, p = n, size
    while i or p:
        if move[i][p] == 3:
            if extra and extra[-1][0] == p:
                extra[-1] = (p - 1, extra[-1][1], i)
            else:
                extra.append((p - 1, p, i))
            p -= 1
        else:
            i -= 1
            if move[i + 1][p] == 1:
                there[i] = True
                p -= len(pieces[i])
    return there, extra[::-1]


PASTED = re.compile(r"^(?P<t>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*dictation\.output\.paste: pasted ", re.M)


def paste_times(log: str) -> list[float]:
    """When the app sent each paste, from its log (local time, as logging writes it), in order."""
    return [datetime.strptime(m["t"], "%Y-%m-%d %H:%M:%S,%f").timestamp() for m in PASTED.finditer(log)]


def _held_at(t: float, dictations: list[Dictation]) -> str:
    held = [d for d in dictations if d.released and d.pressed <= t <= d.released]
    if not held:
        return ""
    return f" (sent {t - held[0].pressed:.1f} s after the press of dictation #{held[0].n}, while its hotkey was held)"


def check_typed(
    dictations: list[Dictation], owned: dict[int, list], target_text: str, log: str, report: Report
) -> None:
    """The target's text against the typed entries, in history order: missing, extra, reordered."""
    field = as_field_shows(target_text)
    by_entry = {e.id: d for d in dictations for e in owned[d.n]}
    typed = sorted(
        (e for entries in owned.values() for e in entries if e.outcome in TYPED_OUTCOMES and e.text),
        key=lambda e: e.id,
    )
    pieces = [as_field_shows(e.text) for e in typed]
    there, extra = align(pieces, field)
    stretches = [field[a:b] for a, b, _ in extra]
    pasted = [e.id for e in typed if e.outcome == "pasted"]
    sent = paste_times(log)
    sent_at = dict(zip(pasted, sent, strict=True)) if len(sent) == len(pasted) else {}
    for k, entry in enumerate(typed):
        if there[k]:
            continue
        d = by_entry[entry.id]
        late = [j for j, stretch in enumerate(stretches) if pieces[k] in stretch]
        where = _held_at(sent_at[entry.id], dictations) if entry.id in sent_at else ""
        if late:  # it arrived, but not in its place
            j = late[0]
            stretches[j] = stretches[j].replace(pieces[k], "", 1)
            where += f"; not in its place: it arrived out of order, {_after(typed, there, extra[j][2], by_entry)}"
        report.add(
            "lost",
            f"{d.name()}: LOST - history entry #{entry.id} says {entry.outcome!r}, but its text "
            f"({_short(entry.text)}) never arrived{where}",
            d,
        )
    for (_a, _b, i), stretch in zip(extra, stretches, strict=True):
        if stretch:
            report.add("leaked", f"EXTRA TEXT ({_short(stretch)}) arrived, {_after(typed, there, i, by_entry)}")


def _short(text: str) -> str:
    return f"{text!r}" if len(text) <= 40 else f"{text[:40]!r}…, {len(text)} characters"


def _after(typed: list, there: list[bool], i: int, by_entry: dict) -> str:
    """Where a stretch read after the first ``i`` pieces lies: after the last of them that arrived."""
    present = [k for k in range(i) if there[k]]
    if not present:
        return "at the start of the field"
    return f"after the text of dictation #{by_entry[typed[present[-1]].id].n}"


def check_keys(dictations: list[Dictation], events: list[KeyEvent], report: Report) -> None:
    """Any press of Space that reached the target is the hotkey leaking (the app pastes, it never types)."""
    spaces = [e for e in events if e.key == "Key_Space"]
    for d in dictations:
        end = (d.released or d.pressed) + 0.5
        mine = [e for e in spaces if d.pressed - 0.05 <= e.t <= end]
        if len(mine) > d.leak_allowed:
            report.add(
                "leaked",
                f"{d.name()}: LEAKED KEYS - {len(mine)} press{'es' if len(mine) > 1 else ''} of the hotkey's Space "
                "(auto-repeat included) reached the target window",
                d,
            )
        spaces = [e for e in spaces if e not in mine]
    for e in spaces:
        report.add("leaked", f"LEAKED KEY - a Space press reached the target window at {e.t:.2f}, in no dictation")
