"""``dictation bench``: speed, memory and agreement of our engine's variants. See benchmarks/README.md
(in the source repository; an installed copy has no benchmarks/ folder).

Modules: ``options`` (command line; import-light), ``checkpoints`` (random checkpoints at the real
sizes, pre-quantized copies), ``runner`` (contenders, timing, agreement), ``report`` (tables).
Importing this package does not import torch. The official implementation is a contender only from a
checkout: ``benchmarks/bench_asr.py`` passes ``benchmarks/official_contender.py`` in, so the package
never loads the reference implementation.
"""

from __future__ import annotations

import argparse

from dictation.bench.options import add_arguments, check_args, parse_args

__all__ = ["add_arguments", "check_args", "main", "parse_args", "run"]


def run(args: argparse.Namespace, official=None) -> int:
    """Run on parsed options (``add_arguments`` + ``check_args``); returns an exit code. ``official``:
    the official contender module (benchmarks/official_contender.py), or None for ours only."""
    from dictation.bench.runner import run as _run

    return _run(args, official)


def main(argv: list[str] | None = None, prog: str | None = None, official=None) -> int:
    """Command-line entry: parse ``argv`` (default: sys.argv) and run."""
    import logging

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    return run(parse_args(argv, prog, official=official is not None), official)
