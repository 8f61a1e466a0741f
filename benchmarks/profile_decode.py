"""Where one decode step's time goes, for each kind of decode step.

    python benchmarks/profile_decode.py --sizes 1.7B 0.6B --device cuda --steps unfused fused compiled

Per model and step kind (``unfused``: the torch ops, the path before the fused kernels; ``fused``:
our Triton kernels, CUDA's default; ``gemv``: those plus our GEMV with the norms, SiLU and residual
adds folded in; ``compiled``: the step compiled by torch.compile), on a random
checkpoint (or ``--model``) with the cache filled to ``--position`` (180: a 10-s clip's prompt and
text): the warm-up's seconds (kernel compiles, the graph capture), the decode time per token over
``--tokens`` steps as decoding runs them (captured on CUDA), the bandwidth floor, the kernels one
step launches (torch's profiler, one uncaptured step: GPU kernels on CUDA, operators on the CPU)
and the ones that take the most time. What the bench's one row per step does not show.

``--splits 0 2 4 8`` repeats each step with the fused decode attention split into that many
programs per query head (0: the automatic choice, `triton_fused.attention_splits`), to see whether
splitting earlier pays on a long context (e.g. ``--position 450``, a 30-s clip).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from dictation.asr import AsrEngine, EngineOptions  # noqa: E402
from dictation.asr.decode import greedy as generate_mod  # noqa: E402
from dictation.asr.nn import graphs  # noqa: E402
from dictation.asr.nn.kernels import fused  # noqa: E402
from dictation.bench import checkpoints  # noqa: E402
from dictation.bench.measure import gpu_bandwidth, kv_cache_bytes  # noqa: E402
from dictation.bench.ours import decode_weight_bytes  # noqa: E402

STEPS = ("unfused", "fused", "gemv", "compiled")


def load(folder: Path, args: argparse.Namespace, step: str) -> tuple[AsrEngine, float]:
    engine = AsrEngine(EngineOptions(model=str(folder), device=args.device, dtype=args.dtype, variant=args.variant))
    engine.prepare()
    model = engine.model
    model.decoder.kernels = False if step == "unfused" else None
    model.decoder.gemv = step == "gemv"
    model.compile_step = step == "compiled"
    t0 = time.perf_counter()
    engine.warm_up()
    return engine, time.perf_counter() - t0


def profile_step(model, position: int) -> list[tuple[str, int, float]]:
    """(name, calls, microseconds) per kernel (CUDA) or operator (CPU) of one uncaptured step: the step
    decoding runs (decode/greedy.py: the static step on CUDA or where asked, else the plain step, which
    on the CPU attends over the filled part of the cache only)."""
    from torch.profiler import ProfilerActivity, profile

    cuda = model.device.type == "cuda"
    token = torch.zeros(1, dtype=torch.long, device=model.device)
    static = generate_mod._graph_mode(model)[0] is not None
    graph = graphs.DecodeGraph(model, token, position, capture=False) if static else None

    def step() -> None:
        if graph is None:
            model.step(token, position)
        else:
            graph.load(token, position)
            graph._step(model)

    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
    with torch.inference_mode():
        step()  # anything lazy happens before the profile
        with profile(activities=activities) as prof:
            step()
            if cuda:
                torch.cuda.synchronize(model.device)
    if graph is not None:
        graph.close()
    table: dict[str, list[float]] = defaultdict(list)
    for event in prof.events():
        kind = str(getattr(event, "device_type", "")).split(".")[-1]
        if cuda and kind != "CUDA":
            continue
        if not cuda and (event.cpu_parent is not None and event.cpu_parent.name.startswith("aten::")):
            continue  # the CPU: top-level operators only
        time_us = event.device_time_total if cuda else event.cpu_time_total
        table[event.name].append(time_us)
    return sorted(((n, len(t), sum(t)) for n, t in table.items()), key=lambda row: -row[2])


def run(folder: Path, label: str, args: argparse.Namespace) -> None:
    for step in args.steps:
        for splits in args.splits or [None]:
            fused.ATTENTION_SPLITS = splits or None  # part of the captured step's key: recaptured per value
            try:
                run_step(folder, label if splits is None else f"{label} splits={splits or 'auto'}", args, step)
            finally:
                fused.ATTENTION_SPLITS = None


def run_step(folder: Path, label: str, args: argparse.Namespace, step: str) -> None:
    engine, warm_up_s = load(folder, args, step)
    model = engine.model
    device = model.device
    embeds = torch.randn(1, args.position, model.cfg.text.hidden_size, generator=torch.Generator().manual_seed(0))
    embeds = (embeds * 0.02).to(device=device, dtype=model.dtype)
    times = []
    for _ in range(args.repeats):
        gen = generate_mod.greedy(model, embeds, max_new_tokens=args.tokens, eos_ids=())
        times.append(gen.decode_s * 1e3 / (args.tokens - 1))
    ms = statistics.median(times)
    used = ""
    if step == "compiled" and not model.compiled_step:
        used = " (not compiled: the default step ran, see the log)"
    elif step in ("fused", "gemv") and not model.decoder.uses_kernels(embeds):
        used = " (fused kernels unavailable: the torch ops ran, see the log)"
    elif step == "gemv" and not model.decoder.uses_gemv(embeds):
        used = " (the GEMV option did not apply: the fused step ran, see the log)"
    floor = ""
    bandwidth = gpu_bandwidth(torch.cuda.get_device_name(device)) if device.type == "cuda" else None
    if bandwidth:
        per_token = decode_weight_bytes(model) + kv_cache_bytes(
            model.cfg, model.dtype.itemsize, args.position + args.tokens / 2
        )
        floor = f" (floor {per_token / bandwidth[1] * 1e3:.3f} ms on {bandwidth[0]})"
    rows = profile_step(model, args.position + args.tokens)
    layers = model.cfg.text.num_hidden_layers
    calls = sum(n for _, n, _ in rows)
    busy = sum(t for _, _, t in rows) / 1e3
    what = "GPU kernels" if device.type == "cuda" else "operators"
    print(
        f"[{label} {engine.variant} {step}]{used} warm-up {warm_up_s:.2f} s · decode {ms:.3f} ms/token{floor} · "
        f"{calls} {what} per step ({calls / layers:.1f} per layer), {busy:.3f} ms in them"
    )
    for name, n, total in rows[: args.top]:
        print(f"    {total / 1e3:8.3f} ms {n:5d}x  {name[:110]}")
    engine.unload()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", nargs="+", default=["1.7B"], choices=checkpoints.SIZES)
    p.add_argument("--model", default=None, help="a model folder instead of random checkpoints")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--variant", default=None, help="bf16, int8, int4, ... (default: the dtype's own)")
    p.add_argument("--steps", nargs="+", default=["unfused", "fused"], choices=STEPS)
    p.add_argument("--position", type=int, default=180, help="prompt positions in the cache (10-s clip: ~180)")
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--top", type=int, default=12, help="kernels listed per step")
    p.add_argument(
        "--splits",
        type=int,
        nargs="+",
        default=None,
        help="programs per query head of the fused decode attention, one run each (0: automatic)",
    )
    p.add_argument("--workdir", type=Path, default=None, help="where random checkpoints are written and reused")
    args = p.parse_args(argv)
    if args.model:
        run(Path(args.model), Path(args.model).name, args)
        return 0
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="profile_decode_"))
    for size in args.sizes:
        run(checkpoints.build_checkpoint(size, workdir), size, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
