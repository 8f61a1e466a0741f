"""What a caller may ask of the engine, defined once: the command line, the settings, the engine's
public face (``AsrEngine.transcribe`` / ``stream``) and the app all use these numbers.

No imports: the settings and the command line read it without loading torch.
"""

from __future__ import annotations

MAX_CONTEXT_CHARS = 20_000
"""The longest context ("Vocabulary and context", ``--context``), in characters. A plain list of
terms is a few hundred; 20,000 characters are at most ~20,000 prompt tokens, which with the audio
of a 20-minute pass (15,000 tokens) and the longest output leaves the model's 65,536 positions
room to spare."""

MAX_PASS_SECONDS = 1200.0
"""The longest audio of one model pass, as the official toolkit (longer clips are split, docs/model.md §8)."""

AUTO_TOKENS_BASE = 64
AUTO_TOKENS_PER_SECOND = 10
"""Without an explicit budget, a pass may generate ``64 + 10`` tokens per second of audio: generously
more than anyone speaks (fast speech is about 5 tokens/s), so a long clip is never cut short, while
a looping model still stops."""

MAX_TOKENS_PER_SECOND = 30
"""The most tokens a second of audio can justify, whatever budget is asked for: six times fast
speech, three times the automatic budget. A larger request only lets a looping model run on (a
budget of 10^9 ran without end), so it is lowered to this (``max_new_tokens_for``)."""


def auto_budget(seconds: float) -> int:
    """The token budget of a pass over ``seconds`` of audio when none is given."""
    return int(AUTO_TOKENS_BASE + AUTO_TOKENS_PER_SECOND * seconds)


def max_new_tokens_for(seconds: float) -> int:
    """The most tokens a pass over ``seconds`` of audio may generate, whatever is asked."""
    return int(AUTO_TOKENS_BASE + MAX_TOKENS_PER_SECOND * seconds)


MAX_NEW_TOKENS = max_new_tokens_for(MAX_PASS_SECONDS)
"""The largest token budget accepted at all (36,064: what the longest pass can justify); a request
above it is refused, one below it is lowered to what each pass's audio justifies."""

MAX_ADAPTER_WEIGHT = 10.0
"""The largest size of an adapter's weight (``DIR:WEIGHT``). The weight scales the adapter's change
to the model (``W + weight * delta``): 1 is as trained, 0 is no effect, and the settings offer 0 to
2. At ten times the change it was trained as, the base model's own weights are swamped, and a
weight like 1e30 turns bf16 weights into infinities; neither transcribes."""


def check_context(context: str) -> str | None:
    """None if ``context`` is short enough; else what is wrong, for a message."""
    if len(context) > MAX_CONTEXT_CHARS:
        return f"the context is {len(context):,} characters long, more than the {MAX_CONTEXT_CHARS:,} allowed"
    return None


def check_max_new_tokens(value: int | None) -> str | None:
    """None if ``value`` (None: automatic) is a budget the engine takes; else what is wrong."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        return f"the token budget must be a whole number, not {value!r}"
    if not 1 <= value <= MAX_NEW_TOKENS:
        return (
            f"the token budget must be between 1 and {MAX_NEW_TOKENS:,} (the most a {MAX_PASS_SECONDS / 60:.0f}-minute "
            f"pass can need, {MAX_TOKENS_PER_SECOND} tokens a second), not {value:,}"
        )
    return None
