"""Voice commands and spoken punctuation: a transcript -> text pieces and commands. Qt-free, pure.

    from dictation.spoken import parse, table_for, user_table

    table = table_for("German", user_table(settings.commands.phrases))
    actions = parse("Hallo zusammen. Neue Zeile.", table, punctuation=False)
    # (Action("text", "Hallo zusammen."), Action("new_line"))

What the actions become (typed text, Enter and Tab presses, Backspaces for "scratch that") is the
output's part: `dictation.output.steps`.
"""

from dictation.spoken.parse import TEXT, Action, parse
from dictation.spoken.tables import (
    COMMAND_WORDS,
    COMMANDS,
    ENTER,
    NEW_LINE,
    NEW_PARAGRAPH,
    SCRATCH,
    TAB,
    Table,
    TableError,
    builtin_tables,
    table_for,
    user_table,
)

__all__ = [
    "COMMANDS",
    "COMMAND_WORDS",
    "ENTER",
    "NEW_LINE",
    "NEW_PARAGRAPH",
    "SCRATCH",
    "TAB",
    "TEXT",
    "Action",
    "Table",
    "TableError",
    "builtin_tables",
    "parse",
    "table_for",
    "user_table",
]
