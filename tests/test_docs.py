"""The README and the user guide stay true to the tree and to the command line.

- every relative link and image in README.md and docs/**/*.md points at a file that exists, and
  every `#anchor` at a heading of the target page (GitHub's heading ids);
- the screenshots in docs/images are all used, each under 200 kB and together under 2 MB;
- every `dictation <command>` written in code (inline or in a block) is a real subcommand of
  `dictation.cli.build_parser()`;
- every setting appears in docs/guide/settings.md with its real default;
- no comment or docstring points at a document outside the repository (in code, not at the issue
  tracker either), and every `docs/model.md §N` a file cites is a section of docs/model.md.
"""

from __future__ import annotations

import argparse
import io
import json
import re
import tokenize
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = sorted([REPO / "README.md", *(REPO / "docs").rglob("*.md")])
IMAGES = REPO / "docs" / "images"
MAX_IMAGE_BYTES = 200_000
MAX_IMAGES_BYTES = 2_000_000

FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.S | re.M)
CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)
LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t]*#*[ \t]*$", re.M)
# `dictation WORD` where `dictation` starts a command: at the start of a line or code span, after a
# shell separator, `exec`, `=`, a quote, or as `$dictation` / a path ending in /dictation.
COMMAND = re.compile(r"(?:^|[;&|('\"=]|\bexec,?)[ \t]*(?:\$|\S*/)?dictation[ \t]+([a-z][a-z0-9-]*)", re.M)
# Words after "dictation" in code that are not commands: the message `dictation is not running`.
NOT_COMMANDS = {"is"}


def prose(text: str) -> str:
    """The text without fenced code blocks and inline code (links inside them are not links)."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def code(text: str) -> list[str]:
    """The fenced code blocks and inline code spans of a Markdown text."""
    blocks = [m.group(0) for m in FENCE.finditer(text)]
    spans = [m.group(2) for m in CODE_SPAN.finditer(FENCE.sub("", text))]
    return blocks + spans


def slug(heading: str) -> str:
    """GitHub's id for a heading: markup gone, lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text stays
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    found: set[str] = set()
    for match in HEADING.finditer(FENCE.sub("", text)):
        base = slug(match.group(2))
        name, n = base, 0
        while name in found:
            n += 1
            name = f"{base}-{n}"
        found.add(name)
    return found


def broken_links(path: Path, text: str) -> list[str]:
    """'target: why' for each relative link or image of ``text`` (the page at ``path``) that fails."""
    problems = []
    for target in LINK.findall(prose(text)):
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):  # https:, mailto: ...
            continue
        file_part, _, anchor = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        if not resolved.exists():
            problems.append(f"{target}: {resolved} does not exist")
            continue
        if anchor and resolved.suffix == ".md" and anchor not in anchors(resolved.read_text(encoding="utf-8")):
            problems.append(f"{target}: no heading #{anchor} in {resolved.name}")
    return problems


def subcommands() -> set[str]:
    from dictation.cli import build_parser

    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return set(sub.choices)


def unknown_commands(text: str, known: set[str]) -> list[str]:
    words = {word for snippet in code(text) for word in COMMAND.findall(snippet)}
    return sorted(words - known - NOT_COMMANDS)


def rel(path: Path) -> str:
    return str(path.relative_to(REPO))


@pytest.mark.parametrize("path", DOCS, ids=rel)
def test_links_and_images_resolve(path):
    assert broken_links(path, path.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize("path", DOCS, ids=rel)
def test_dictation_commands_in_docs_exist(path):
    assert unknown_commands(path.read_text(encoding="utf-8"), subcommands()) == []


def test_the_checks_catch_mistakes(tmp_path):
    page = tmp_path / "page.md"
    (tmp_path / "there.md").write_text("# Real heading\n")
    page.write_text("x")
    text = (
        "See [ok](there.md#real-heading), [gone](missing.md), [bad anchor](there.md#nope), "
        "![pic](img/none.png) and [web](https://example.org/x.md).\n"
        "```\ndictation toggle\nbindsym F9 exec /usr/bin/dictation frobnicate\n```\n"
        "Run `dictation doctor` or `dictation levitate`; `pipx runpip dictation install x` is pip's.\n"
    )
    assert broken_links(page, text) == [
        f"missing.md: {tmp_path / 'missing.md'} does not exist",
        "there.md#nope: no heading #nope in there.md",
        f"img/none.png: {tmp_path / 'img' / 'none.png'} does not exist",
    ]
    assert unknown_commands(text, subcommands()) == ["frobnicate", "levitate"]
    assert slug("1. System packages (Linux)") == "1-system-packages-linux"
    assert slug("`dictation bench`") == "dictation-bench"


def test_screenshots_are_used_and_small():
    images = sorted(IMAGES.glob("*.png"))
    assert images, "docs/images holds no screenshots"
    used = {
        (path.parent / target.partition("#")[0]).resolve()
        for path in DOCS
        for target in LINK.findall(prose(path.read_text(encoding="utf-8")))
    }
    assert [rel(p) for p in images if p.resolve() not in used] == [], "screenshots no page shows"
    assert [rel(p) for p in images if p.stat().st_size > MAX_IMAGE_BYTES] == []
    assert sum(p.stat().st_size for p in images) <= MAX_IMAGES_BYTES


def test_settings_reference_lists_every_setting_with_its_default():
    from dictation.config.schema import field_info

    rows = [
        line
        for line in (REPO / "docs" / "guide" / "settings.md").read_text(encoding="utf-8").splitlines()
        if line.startswith("|")
    ]
    problems = []
    for info in field_info():
        key = ".".join(info.path)
        row = next((r for r in rows if f"| `{key}` |" in r), None)
        default = list(info.default) if isinstance(info.default, tuple) else info.default
        if row is None:
            problems.append(f"{key}: not in the table")
        elif f"| `{json.dumps(default)}` |" not in row:
            problems.append(f"{key}: the default is {json.dumps(default)}")
    assert problems == []


# --- what comments point at --------------------------------------------------------------------------
# Comments and docstrings point at docs/ or say it in place: never at a document outside the
# repository (the model specification or the design notes in a shared folder). The words are split so
# that this file does not match itself.
OUTSIDE = re.compile("|".join(["spec" + " §", "DESIGN" + r"\.md", "qwen3-asr-" + "spec", "field-" + "notes"]))
# In code (.py, .sh), the issue tracker is outside too: say what the issue said instead.
TRACKER = re.compile(r"\bissue" + r" \d+", re.I)
MODEL_DOC = REPO / "docs" / "model.md"
MODEL_CITE = re.compile(r"docs/model\.md,? §(\d+(?:\.\d+)?)((?:(?:,| and) §?\d+(?:\.\d+)?)*)")
SOURCES = sorted(
    path
    for folder in ("dictation", "benchmarks", "tests", "packaging")
    for pattern in ("*.py", "*.sh", "*.md")
    for path in (REPO / folder).rglob(pattern)
)


def words_of(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every comment and string of a Python file; every line of another file."""
    text = path.read_text(encoding="utf-8")
    if path.suffix != ".py":
        return list(enumerate(text.splitlines(), 1))
    kinds = {tokenize.COMMENT, tokenize.STRING, getattr(tokenize, "FSTRING_MIDDLE", tokenize.STRING)}
    tokens = tokenize.generate_tokens(io.StringIO(text).readline)
    return [(token.start[0], token.string) for token in tokens if token.type in kinds]


def outside_pointers(path: Path) -> list[str]:
    patterns = [OUTSIDE] if path.suffix == ".md" else [OUTSIDE, TRACKER]
    return [
        f"{line}: {found[0]}"
        for line, words in words_of(path)
        for pattern in patterns
        if (found := pattern.search(words))
    ]


def model_sections(text: str) -> set[str]:
    """The section numbers of docs/model.md: "## 5. The encoder" -> "5", "### 5.4 Attention" -> "5.4"."""
    titles = [m.group(2) for m in HEADING.finditer(FENCE.sub("", text))]
    return {n.group(1) for title in titles if (n := re.match(r"(\d+(?:\.\d+)*)\.?\s", title))}


def cited_model_sections(text: str) -> list[str]:
    found = []
    for match in MODEL_CITE.finditer(text):
        found.append(match.group(1))
        found += re.findall(r"\d+(?:\.\d+)?", match.group(2))
    return found


def test_no_comment_points_outside_the_repository():
    assert [f"{rel(path)}:{hit}" for path in SOURCES if path != Path(__file__) for hit in outside_pointers(path)] == []


def test_every_cited_model_section_exists():
    sections = model_sections(MODEL_DOC.read_text(encoding="utf-8"))
    missing = [
        f"{rel(path)}: docs/model.md §{number}"
        for path in [*SOURCES, *DOCS]
        for number in cited_model_sections(path.read_text(encoding="utf-8"))
        if number not in sections
    ]
    assert missing == []


def test_the_pointer_checks_catch_mistakes(tmp_path):
    source = tmp_path / "m.py"
    source.write_text(
        f'"""Encoder ({"spec"} §4.2)."""\n'
        f"x = 1  # see {'DESIGN'}.md principle 4\n"
        'y = "plain words"  # docs/model.md §5.2\n'
        f"z = 2  # the fused kernels ({'issue'} 16)\n"
    )
    assert [hit.split(": ", 1)[1] for hit in outside_pointers(source)] == ["spec §", "DESIGN.md", "issue 16"]
    notes = tmp_path / "results.md"
    notes.write_text(f"Measured for {'issue'} 16, see {'field'}-notes.\n")
    assert [hit.split(": ", 1)[1] for hit in outside_pointers(notes)] == ["field-notes"]
    sections = model_sections("# T\n\n## 1. Dims\n\n### 1.2 Tie\n\n```\n## 9. not a heading\n```\n")
    assert sections == {"1", "1.2"}
    assert cited_model_sections("(docs/model.md §5.2, §5.4 and §7) docs/model.md, §3") == ["5.2", "5.4", "7", "3"]
