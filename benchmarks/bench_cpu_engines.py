"""Our CPU engine against CrispASR (the ggml engine, PyPI ``crispasr``) on the files our converter writes.

Each contender runs in a process of its own, as a user would run it (import, load, transcribe), so
that peak resident memory, load time and the whole process are each engine's own (resident memory
is read after the load and after the first transcription: weights mapped from the file count only
once touched); runs alternate
between the engines (``--repeats`` rounds) and the median is printed. Same random checkpoint at the
real size (dictation/bench/checkpoints.py), same synthetic clip, forced English, ``--tokens`` greedy
tokens, ``--threads`` threads.

Pairs at the same precision: ours int8 (the prepared variant: ``write_quantized_folder``, what
``dictation quantize`` writes) against CrispASR on our Q8_0 GGUF; ours fp32 against our F16 GGUF.
Decode per token: ours from the engine's own decode timing; CrispASR's as the difference between a
run of ``--tokens`` and one of 2 tokens in one process (its Python API reports no stage times).
The CPU floor is the bytes a decode step must read (the decoder layers and the output head as each
engine stores them) over the memory bandwidth measured here (a large copy, ``--threads`` threads).

The targets are printed with met / not met; benchmarks/README.md lists them.

    python benchmarks/bench_cpu_engines.py --workdir /tmp/cpu_engines
    python benchmarks/bench_cpu_engines.py --workdir /tmp/cpu_engines --crisp-gguf int8=/path/q8_0.gguf
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:  # run as a script from anywhere: import dictation from this checkout
    sys.path.insert(0, str(REPO_ROOT))

GGUF_TYPES = {"int8": "Q8_0", "fp32": "F16"}  # our variant -> the GGUF type CrispASR runs beside it
CRISP_NEEDS = ("audio.mel_filters", "audio.mel_window")  # what CrispASR 0.8.45 requires of the file
DECODE_RATIO = 0.67  # ours int8 decode at most this x CrispASR Q8_0's
APP_RESIDENT = 1.5e9  # the app with the 0.6B int8 loaded, bytes
PREPARED_LOAD_S = 1.0


# --- children: one engine, one process ---------------------------------------------------------------


def _status_bytes(field: str) -> int:
    """A size from this process's /proc/self/status ("VmRSS", "VmHWM"), in bytes."""
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _rss() -> int:
    return _status_bytes("VmRSS")


def _peak() -> int:
    """This process's resident high-water mark (VmHWM). Not ``ru_maxrss``: Linux carries that over
    from the forked parent through exec, so a child of a large parent reported the parent's peak."""
    return _status_bytes("VmHWM")


def child_ours(a: argparse.Namespace) -> dict:
    import torch

    torch.set_num_threads(a.threads)
    from dictation.asr import AsrEngine, EngineOptions
    from dictation.bench.measure import synth_audio

    audio = synth_audio(a.seconds)
    engine = AsrEngine(EngineOptions(model=a.model, device="cpu", variant=a.variant))
    t0 = time.perf_counter()
    engine.prepare()
    load_s = time.perf_counter() - t0
    resident = _rss()
    first = engine.transcribe(audio, language="English", max_new_tokens=a.tokens)
    whole_s = time.time() - a.launched
    in_use = _rss()  # every weight touched: what a warmed-up app holds (mapped weights count once touched)
    decodes = [first.timings["decode_s"] / max(1, first.timings["generated_tokens"] - 1)]
    engine.warm_up()  # the app's one-time set-up, done before its first dictation (the int8 head's oneDNN layout)
    for _ in range(a.warm_runs):
        t = engine.transcribe(audio, language="English", max_new_tokens=a.tokens).timings
        decodes.append(t["decode_s"] / max(1, t["generated_tokens"] - 1))
    model = engine.model
    layers = [m for n, m in model.named_modules() if n.startswith("decoder.layers.") and hasattr(m, "in_features")]
    step_bytes = sum(b.numel() * b.element_size() for m in layers for b in [*m.parameters(), *m.buffers()])
    from dictation.bench.ours import head_bytes

    step_bytes += head_bytes(model)
    return {
        "load_s": load_s,
        "whole_s": whole_s,
        "resident": resident,
        "in_use": in_use,
        "peak": _peak(),
        "decode_ms": 1e3 * min(decodes[1:] or decodes),
        "step_bytes": step_bytes,
        "tokens": len(first.token_ids),
    }


def child_crisp(a: argparse.Namespace) -> dict:
    import crispasr

    from dictation.bench.measure import synth_audio

    audio = synth_audio(a.seconds)
    t0 = time.perf_counter()
    session = crispasr.Session(a.model, n_threads=a.threads, backend="qwen3")
    load_s = time.perf_counter() - t0
    resident = _rss()
    session.set_max_new_tokens(a.tokens)
    session.transcribe(audio, language="en")
    whole_s = time.time() - a.launched
    in_use = _rss()
    times: dict[int, list[float]] = {2: [], a.tokens: []}
    for _ in range(a.warm_runs):
        for n in (2, a.tokens):
            session.set_max_new_tokens(n)
            t = time.perf_counter()
            session.transcribe(audio, language="en")
            times[n].append(time.perf_counter() - t)
    decode = (min(times[a.tokens]) - min(times[2])) / (a.tokens - 2)
    return {
        "load_s": load_s,
        "whole_s": whole_s,
        "resident": resident,
        "in_use": in_use,
        "peak": _peak(),
        "decode_ms": 1e3 * decode,
        "step_bytes": gguf_step_bytes(Path(a.model)),
    }


def gguf_step_bytes(path: Path) -> int:
    """Bytes of a GGUF file's text-decoder blocks and output head (what one decode step reads)."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    names = {t.name: int(t.n_bytes) for t in reader.tensors}
    head = names.get("output.weight", names.get("token_embd.weight", 0))
    return head + sum(n for name, n in names.items() if name.startswith("blk."))


# --- the parent -------------------------------------------------------------------------------------------


def bandwidth(threads: int) -> float:
    """Bytes per second of a large copy (read + written), best of 5."""
    import torch

    torch.set_num_threads(threads)
    src = torch.ones(64 * 2**20)  # 256 MiB
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t)
    return 2 * src.numel() * src.element_size() / best


def crisp_problem(path: Path) -> str | None:
    """Why CrispASR cannot run ``path`` (one line), or None."""
    import gguf

    names = {t.name for t in gguf.GGUFReader(str(path)).tensors}
    missing = [n for n in CRISP_NEEDS if n not in names]
    if "output.weight" not in names:
        missing.append("output.weight")
    if missing:
        return f"{path}: CrispASR needs {', '.join(missing)}, which this file lacks"
    try:
        import crispasr  # noqa: F401
    except ImportError:
        return "crispasr is not installed (pip install crispasr==0.8.45)"
    return None


def spawn(kind: str, model: Path, variant: str, a: argparse.Namespace) -> dict:
    cmd = [sys.executable, __file__, "--child", kind, "--model", str(model), "--variant", variant]
    cmd += ["--threads", str(a.threads), "--tokens", str(a.tokens), "--seconds", str(a.seconds)]
    cmd += ["--warm-runs", str(a.warm_runs), "--launched", repr(time.time())]
    env = {**os.environ, "OMP_NUM_THREADS": str(a.threads)}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("{"):
            print(f"  {kind} {variant}: {line}", flush=True)  # each run as it ends: a long run shows progress
            return json.loads(line)
    tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
    raise RuntimeError(f"{kind} {variant} failed (exit {done.returncode}): {tail[0]}")


def prepare(a: argparse.Namespace) -> tuple[dict, dict]:
    """(ours: variant -> folder, crisp: variant -> GGUF path or the reason it cannot run)."""
    from dictation.bench.checkpoints import build_checkpoint, prequantized_folder

    root = Path(a.workdir)
    src = build_checkpoint(a.size, root)
    ours = {v: (prequantized_folder(src, root, v, 128)[0] if v == "int8" else src) for v in a.variants}
    given = dict(item.split("=", 1) for item in a.crisp_gguf)
    crisp = {}
    for v in a.variants:
        path = Path(given[v]) if v in given else root / f"{src.name}-{GGUF_TYPES[v]}.gguf"
        if not path.exists():
            cmd = [sys.executable, "-m", "dictation", "convert", "--model", str(src), "--to", "gguf"]
            subprocess.run([*cmd, "--type", GGUF_TYPES[v], "--out", str(path)], check=True, cwd=REPO_ROOT)
        crisp[v] = crisp_problem(path) or path
    return ours, crisp


def verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("met" if ok else "NOT met")


def targets(ours: dict, crisp: dict) -> list[tuple[str, str]]:
    """The targets (benchmarks/README.md) on the medians (``ours[variant]``, ``crisp[variant]``; a contender
    missing is absent): (what was compared, "met" / "NOT met" / "n/a")."""
    o8, c8 = ours.get("int8"), crisp.get("int8")
    rows = []
    if o8 and c8:
        ratio = o8["decode_ms"] / c8["decode_ms"]
        rows.append((f"int8 decode {ratio:.2f}x CrispASR Q8_0's (target <= {DECODE_RATIO})", ratio <= DECODE_RATIO))
    else:
        rows.append((f"int8 decode <= {DECODE_RATIO}x CrispASR Q8_0's", None))
    for v, name in (("int8", "Q8_0"), ("fp32", "F16")):
        if ours.get(v) and crisp.get(v):
            o, c = ours[v]["peak"] / 2**20, crisp[v]["peak"] / 2**20
            rows.append((f"{v} peak RSS {o:.0f} MiB, CrispASR {name} {c:.0f} MiB (target: no higher)", o <= c))
    if o8:
        resident, load = o8["in_use"], o8["load_s"]
        text = f"int8 resident after the first transcription {resident / 1e9:.2f} GB (target <= 1.5 GB)"
        rows.append((text, resident <= APP_RESIDENT))
        rows.append((f"prepared int8 loads in {load:.2f} s (target <= {PREPARED_LOAD_S:g} s)", load <= PREPARED_LOAD_S))
    if o8 and c8:
        o, c = o8["whole_s"], c8["whole_s"]
        rows.append((f"whole transcribe process {o:.1f} s, CrispASR {c:.1f} s (target: no longer)", o <= c))
    return [(text, verdict(ok)) for text, ok in rows]


def median(runs: list[dict]) -> dict:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]} if runs else {}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", default="/tmp/dictation_cpu_engines", help="checkpoints, prepared folders, GGUFs")
    p.add_argument("--size", default="0.6B", choices=["tiny", "0.6B", "1.7B"])
    p.add_argument("--variants", nargs="+", default=["int8", "fp32"], choices=list(GGUF_TYPES))
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--tokens", type=int, default=24)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3, help="rounds of processes (the median is printed)")
    p.add_argument("--warm-runs", type=int, default=2, help="warm runs per process the decode time is taken from")
    p.add_argument(
        "--crisp-gguf", action="append", default=[], metavar="VARIANT=PATH", help="run CrispASR on this GGUF instead"
    )
    p.add_argument("--json", default=None)
    p.add_argument("--child", choices=["ours", "crisp"], help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--variant", help=argparse.SUPPRESS)
    p.add_argument("--launched", type=float, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        print(json.dumps((child_ours if a.child == "ours" else child_crisp)(a)))
        return 0
    ours_paths, crisp_paths = prepare(a)
    for v, what in crisp_paths.items():
        if not isinstance(what, Path):
            print(f"CrispASR {GGUF_TYPES[v]}: not run: {what}")
    bw = bandwidth(a.threads)
    load = os.getloadavg()
    runs: dict[tuple[str, str], list[dict]] = {}
    for _ in range(a.repeats):  # interleaved: a busy machine slows both alike
        for v in a.variants:
            runs.setdefault(("ours", v), []).append(spawn("ours", ours_paths[v], v, a))
            if isinstance(crisp_paths[v], Path):
                runs.setdefault(("crisp", v), []).append(spawn("crisp", crisp_paths[v], v, a))
    med = {key: median(r) for key, r in runs.items()}
    ours = {v: m for (k, v), m in med.items() if k == "ours"}
    crisp = {v: m for (k, v), m in med.items() if k == "crisp"}
    print(f"\n{a.size}, {a.seconds:g}-s clip, {a.tokens} tokens, {a.threads} threads, median of {a.repeats}; ")
    loads = " ".join(f"{x:.2f}" for x in load)
    print(f"memory bandwidth {bw / 1e9:.1f} GB/s (copy); load average before {loads}\n")
    print(
        "| engine | decode ms/token | CPU floor ms/token | load s | whole process s "
        "| resident after load MiB | after the first transcription MiB | peak RSS MiB |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for (kind, v), m in sorted(med.items()):
        name = f"ours {v}" if kind == "ours" else f"CrispASR {GGUF_TYPES[v]}"
        floor = 1e3 * m["step_bytes"] / bw
        print(
            f"| {name} | {m['decode_ms']:.1f} | {floor:.1f} ({m['step_bytes'] / 2**20:.0f} MiB) | {m['load_s']:.2f} "
            f"| {m['whole_s']:.1f} | {m['resident'] / 2**20:.0f} | {m['in_use'] / 2**20:.0f} "
            f"| {m['peak'] / 2**20:.0f} |"
        )
    print()
    for text, ok in targets(ours, crisp):
        print(f"- {text}: {ok}")
    print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if a.json:
        Path(a.json).write_text(json.dumps({f"{k} {v}": r for (k, v), r in runs.items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
