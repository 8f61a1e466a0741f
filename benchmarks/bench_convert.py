"""How long ``dictation convert --to gguf`` takes, and how much memory it holds, on a random checkpoint at
the real size (``dictation/bench/checkpoints.py``, reused from ``--workdir``).

    python benchmarks/bench_convert.py                          # 0.6B, --type Q4_K
    python benchmarks/bench_convert.py --types Q4_K Q6_K Q8_0 --size 1.7B --json convert.json
    python benchmarks/bench_convert.py --encoders --reference   # + each K-quant encoder, fast vs the old one
    python benchmarks/bench_convert.py --size tiny --types Q4_K # smoke run

Before and after a change, in one run: ``--code`` names source trees whose ``dictation`` package does the
conversion (this checkout when not given), e.g. the commit before as plain files:

    mkdir /tmp/before && git archive 8b6189d | tar -x -C /tmp/before
    python benchmarks/bench_convert.py --code /tmp/before . --types Q4_K

Each conversion runs as its own ``python -m dictation convert`` process, as a user runs it: wall time,
CPU time (user + system; above the wall time when both cores work, below it when the machine is busy
with something else) and peak resident memory (the child's ``ru_maxrss``). The load average is printed
beside them: on a shared machine the wall time follows it.

``--encoders`` times ``quantize.encode`` alone on one decoder MLP matrix (bf16, N(0, 0.02)) per K-quant
type, in ns per value; ``--reference`` adds the straightforward encoder the converter used before
(tests/asr/kquants_reference.py; slow: about 10 s per type) on the same matrix, and checks the bytes are
the same.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:  # run as a script from anywhere: import dictation from this checkout
    sys.path.insert(0, str(REPO_ROOT))

K_TYPES = ("Q4_K", "Q5_K", "Q6_K")


def run_convert(code: Path, folder: Path, type_name: str, out: Path, layout: str) -> dict:
    """One ``dictation convert`` child running the package in ``code``: wall seconds, CPU seconds, peak RSS
    (MiB), output size (MiB)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(code), os.environ.get("PYTHONPATH")])))
    cmd = [sys.executable, "-m", "dictation", "convert", "--model", str(folder), "--to", "gguf"]
    cmd += ["--type", type_name, "--gguf-layout", layout, "--out", str(out)]
    load = os.getloadavg()[0]
    start = time.perf_counter()
    # run from inside ``code``: ``python -m`` puts the working directory first on sys.path, so a checkout as
    # the working directory would otherwise shadow the package in ``code``
    child = subprocess.Popen(cmd, env=env, cwd=code, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - start
    output = child.stdout.read().decode(errors="replace") if child.stdout else ""
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise SystemExit(f"dictation convert --type {type_name} failed ({child.returncode}):\n{output[-2000:]}")
    written = sum(p.stat().st_size for p in out.parent.iterdir() if p.name.endswith(".gguf"))
    return {
        "code": str(code),
        "type": type_name,
        "wall_s": round(wall, 2),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
        "peak_rss_mib": round(usage.ru_maxrss / 1024),
        "output_mib": round(written / 2**20),
        "load_before": round(load, 2),
        "load_after": round(os.getloadavg()[0], 2),
    }


def time_encoders(types: list[str], reference: bool) -> list[dict]:
    import numpy as np
    import torch

    from dictation.asr.checkpoints.gguf.quantize import encode

    g = torch.Generator().manual_seed(0)
    matrix = (torch.randn(3072, 1024, generator=g) * 0.02).bfloat16()
    rows = []
    for type_name in types:
        encode(matrix[:8], type_name)  # the thread pool, first calls
        start = time.perf_counter()
        encode(matrix, type_name)
        row = {"type": type_name, "ns_per_value": round((time.perf_counter() - start) / matrix.numel() * 1e9, 1)}
        if reference and type_name in K_TYPES:
            from tests.asr import kquants_reference

            part = matrix  # in one piece, as encode_chunks gave it to the old encoder (4M values at a time)
            blocks = part.float().numpy().reshape(-1, 256)
            start = time.perf_counter()
            old = kquants_reference.ENCODERS[type_name](blocks)
            row["reference_ns_per_value"] = round((time.perf_counter() - start) / part.numel() * 1e9, 1)
            row["same_bytes"] = bool(np.array_equal(old.reshape(-1), encode(part, type_name).reshape(-1)))
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="0.6B", choices=["tiny", "0.6B", "1.7B"])
    p.add_argument("--types", nargs="+", default=["Q4_K"], help="GGUF types to convert to (default Q4_K)")
    p.add_argument("--layout", default="single", choices=["single", "pair"])
    p.add_argument("--code", type=Path, nargs="+", default=[REPO_ROOT], help="source trees to convert with")
    p.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "dictation-bench-convert")
    p.add_argument("--encoders", action="store_true", help="also time each K-quant encoder on one matrix")
    p.add_argument("--reference", action="store_true", help="with --encoders: the old encoder beside it")
    p.add_argument("--no-convert", action="store_true", help="only the encoder timings")
    p.add_argument("--json", type=Path, help="write every number here")
    args = p.parse_args(argv)
    types = [t.upper() for t in args.types]
    result: dict = {"size": args.size, "cpus": os.cpu_count(), "conversions": [], "encoders": []}
    if not args.no_convert:
        from dictation.bench.checkpoints import build_checkpoint

        folder = build_checkpoint(args.size, args.workdir)
        print(f"{'code':24} {'type':6} {'wall s':>7} {'cpu s':>7} {'peak RSS MiB':>13} {'file MiB':>9} {'load':>11}")
        for type_name in types:
            for code in args.code:
                with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
                    row = run_convert(code.resolve(), folder, type_name, Path(tmp) / f"m-{type_name}.gguf", args.layout)
                result["conversions"].append(row)
                print(
                    f"{str(code)[-24:]:24} {type_name:6} {row['wall_s']:7.1f} {row['cpu_s']:7.1f} "
                    f"{row['peak_rss_mib']:13d} {row['output_mib']:9d} "
                    f"{row['load_before']:5.2f}-{row['load_after']:.2f}",
                    flush=True,
                )
    if args.encoders:
        result["encoders"] = time_encoders([t for t in types if t in K_TYPES] or list(K_TYPES), args.reference)
        for row in result["encoders"]:
            extra = ""
            if "reference_ns_per_value" in row:
                old = row["reference_ns_per_value"]
                speedup = old / row["ns_per_value"]
                extra = f"  reference {old} ns/value ({speedup:.0f}x), same bytes: {row['same_bytes']}"
            print(f"encode {row['type']}: {row['ns_per_value']} ns/value{extra}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
