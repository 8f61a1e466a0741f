"""Stage-by-stage speed of our Qwen3-ASR engine next to the official implementation.

A thin wrapper around ``dictation bench`` (the logic lives in ``dictation/bench/``) that adds the
official implementation as a contender (``official_contender.py`` next to this script: the package
itself never loads the reference implementation). Both run in the same process,
on the same random weights at the real model sizes (docs/model.md §1), the same synthetic audio, the same
prompt and the same number of generated tokens. See benchmarks/README.md.

    python benchmarks/bench_asr.py --quick
    python benchmarks/bench_asr.py --sizes 0.6B 1.7B --seconds 5 10 30 --tokens 32 --device cuda --json out.json
    python benchmarks/bench_asr.py --sizes 0.6B --variants fp32 int8 int4 --seconds 5 --tokens 16
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:  # run as a script from anywhere: import dictation from this checkout
    sys.path.insert(0, str(REPO_ROOT))

import official_contender  # noqa: E402  (this folder is on sys.path when run as a script)

from dictation.bench import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(prog="bench_asr.py", official=official_contender))
