"""The ``dictation`` command. Heavy imports (torch, Qt) happen inside the subcommands.

The package: parser.py builds the command line; engine_commands.py runs the engine's subcommands
(transcribe, quantize, train-adapter, ...); app_commands.py the app, the requests to the running app
and the commands about this computer; terminal.py writes errors and progress on stderr."""

from __future__ import annotations

import argparse
import logging
import sys

from dictation.cli.app_commands import cmd_app
from dictation.cli.parser import build_parser

__all__ = ["LOG_FORMAT", "build_parser", "cmd_app", "main"]

LOG_FORMAT = "%(levelname)s %(name)s: %(message)s"


def main(argv: list[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    if words in ([], ["-v"], ["--verbose"]):  # the app, at once: building the parser imports the
        # engine's option tables, and every millisecond before the hotkey is grabbed is one a press
        # can leak a key (dictation.launch)
        verbose = bool(words)
        logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format=LOG_FORMAT)
        return cmd_app(argparse.Namespace(command=None, verbose=verbose))
    if words[:1] == ["_match-patterns"]:  # dictation.asr.tune.patterns.CHILD_ARG
        from dictation.asr.tune import patterns

        return patterns.child_main()  # the frozen app as the regular-expression child (not a user command)
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format=LOG_FORMAT)
    if args.command is None:
        return cmd_app(args)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return 130
