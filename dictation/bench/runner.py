"""The benchmark itself: contenders (our variants, the official implementation), timed stages, memory,
agreement with a reference variant, and the run over sizes and clips. See benchmarks/README.md.

A contender has ``key``, ``label``, ``notes``, ``weight_bytes`` and ``load() -> seconds``,
``run(audio, n_tokens) -> Run``, ``prompt_ids(audio)``, ``unload()``; ours also has
``teacher_forced(audio, tokens)`` for the agreement figures.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import platform
import shutil
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dictation.bench.checkpoints import build_checkpoint, folder_bytes, prequantized_folder
from dictation.bench.measure import (
    DTYPE_NAMES,
    DTYPES,
    FLOAT_VARIANTS,
    RELEASE,
    STAGES,
    Agreement,
    PeakMemory,
    Run,
    _leading_agreement,
    _loadavg,
    _minus,
    device_name,
    float_decode_weight_bytes,
    free_memory,
    gpu_bandwidth,
    kv_cache_bytes,
    median_run,
    say,
    synth_audio,
    warm_page_cache,
)
from dictation.bench.options import IMPLS
from dictation.bench.ours import OursBench

# --- device helpers ----------------------------------------------------------------------------------


# --- inputs ------------------------------------------------------------------------------------------


# --- measurements -------------------------------------------------------------------------------------


# --- agreement ----------------------------------------------------------------------------------------


# --- running contenders -------------------------------------------------------------------------------


def _load(bench: Any, device: torch.device) -> dict[str, Any]:
    warm_page_cache(bench.folder)
    memory = PeakMemory(device)
    free_memory(device)
    baseline = memory.current()
    memory.reset()
    load_s = bench.load()
    peak = memory.peak()
    warm_up_s = None
    if isinstance(bench, OursBench):
        warm_up_s = bench.warm_up()
        say(f"  [{bench.label}] loaded in {load_s:.2f} s, warmed up in {warm_up_s:.2f} s")
    else:
        say(f"  [{bench.label}] loaded in {load_s:.2f} s")
    return {
        "warm_up_s": warm_up_s,
        "label": bench.label,
        "load_s": load_s,
        "load_peak_bytes": peak,
        "load_peak_over_baseline_bytes": _minus(peak, baseline),
        "baseline_bytes": baseline,
        "memory_kind": memory.kind,
        "weight_bytes": bench.weight_bytes,
        "clips": {},
    }


def _finish(bench: Any, stats: dict[str, Any], runs: list[Run], audio: np.ndarray, args: argparse.Namespace) -> None:
    stats["tokens"] = runs[-1].tokens
    stats["prompt_ids"] = bench.prompt_ids(audio)
    if isinstance(bench, OursBench) and not getattr(args, "no_release", False):
        stats["release"] = bench.release(audio, args.tokens, args.repeats)


def _close(bench: Any, result: dict[str, Any], device: torch.device) -> None:
    if isinstance(bench, OursBench):
        result["decode_kernels"] = bench.decode_kernels()
        result["step"] = bench.step or "default"
        result["variant"] = bench.variant
        result["dtype"] = bench.dtype_name
        result["decode_weight_bytes"] = bench.decode_weight_bytes
        result["kernel_cache_bytes"] = bench.kernel_cache_bytes() if bench.variant not in FLOAT_VARIANTS else None
        if bench.variant == "int8" and device.type == "cuda":
            from dictation.asr.nn.quantized import cuda_int8_path

            path = cuda_int8_path(device, bench.engine.model.dtype)
            result["int8_path"] = path
            bench.notes.append(f"int8: one-row products through the {path} path (the fastest that ran on this GPU)")
    result["notes"] = bench.notes
    bench.unload()
    free_memory(device)


def bench_sequential(
    benches: list[Any], clips: dict[float, np.ndarray], args: argparse.Namespace, device: torch.device, agree: Agreement
) -> dict[str, dict[str, Any]]:
    """One contender at a time: load, time every clip (``warmup`` untimed runs, then ``repeats``),
    measure agreement, unload."""
    results: dict[str, dict[str, Any]] = {}
    for bench in benches:
        result = _load(bench, device)
        memory = PeakMemory(device)
        baseline = result["baseline_bytes"]
        for seconds, audio in clips.items():
            memory.reset()
            t0 = time.perf_counter()
            for _ in range(args.warmup):
                bench.run(audio, args.tokens)
            runs = [bench.run(audio, args.tokens) for _ in range(args.repeats)]
            stats = median_run(runs, args.tokens)
            peak = memory.peak()
            stats["peak_bytes"] = peak
            stats["peak_over_baseline_bytes"] = _minus(peak, baseline)
            _finish(bench, stats, runs, audio, args)
            stats["agreement"] = agree.measure(bench, seconds, audio, stats["tokens"])
            result["clips"][seconds] = stats
            say(
                f"  [{bench.label}] {seconds:g} s clip: e2e {stats['e2e_ms']:.1f} ms "
                f"(wall {time.perf_counter() - t0:.1f} s for {args.warmup + args.repeats} runs)"
            )
        _close(bench, result, device)
        results[bench.key] = result
    return results


def bench_interleaved(
    benches: list[Any], clips: dict[float, np.ndarray], args: argparse.Namespace, device: torch.device, agree: Agreement
) -> dict[str, dict[str, Any]]:
    """Load every contender at once and alternate their runs, so that all see the same machine load
    (for shared CPUs). Needs memory for all models; peak memory is not measured."""
    results: dict[str, dict[str, Any]] = {}
    for bench in benches:
        result = _load(bench, device)
        result["load_peak_bytes"] = result["load_peak_over_baseline_bytes"] = None
        result["memory_kind"] = "not measured (--interleave)"
        results[bench.key] = result
    for seconds, audio in clips.items():
        t0 = time.perf_counter()
        runs: dict[str, list[Run]] = {b.key: [] for b in benches}
        for _ in range(args.warmup):
            for bench in benches:
                bench.run(audio, args.tokens)
        for r in range(args.repeats):
            for bench in benches if r % 2 == 0 else benches[::-1]:
                runs[bench.key].append(bench.run(audio, args.tokens))
        for bench in benches:  # the reference comes first
            stats = median_run(runs[bench.key], args.tokens)
            stats["peak_bytes"] = stats["peak_over_baseline_bytes"] = None
            _finish(bench, stats, runs[bench.key], audio, args)
            stats["agreement"] = agree.measure(bench, seconds, audio, stats["tokens"])
            results[bench.key]["clips"][seconds] = stats
        summary = ", ".join(f"{b.label} {results[b.key]['clips'][seconds]['e2e_ms']:.1f} ms" for b in benches)
        say(f"  {seconds:g} s clip: e2e {summary} (wall {time.perf_counter() - t0:.1f} s)")
    for bench in benches:
        _close(bench, results[bench.key], device)
    return results


def reference_pass(
    bench: OursBench, clips: dict[float, np.ndarray], n_tokens: int, device: torch.device, agree: Agreement
) -> dict[str, Any]:
    """Load the reference variant only for the agreement figures (it is not among the compared ones)."""
    result = _load(bench, device)
    for seconds, audio in clips.items():
        run = bench.run(audio, n_tokens)
        agree.measure(bench, seconds, audio, run.tokens)
    del result["clips"]
    _close(bench, result, device)
    return result


def prequantized_loads(
    benches: list[OursBench], source: Path, root: Path, group_size: int, device: torch.device
) -> dict[str, dict[str, Any]]:
    """For int8/int4: write (or reuse) a pre-quantized folder and time loading it."""
    from dictation.asr import AsrError

    out: dict[str, dict[str, Any]] = {}
    for bench in benches:
        if bench.variant not in ("int8", "int4"):
            continue
        try:
            folder, write_s = prequantized_folder(source, root, bench.variant, group_size, log=say)
        except AsrError as exc:
            say(f"  [{bench.label}] no pre-quantized folder: {exc}")
            out[bench.key] = {"error": str(exc)}
            continue
        warm_page_cache(folder)
        memory = PeakMemory(device)
        free_memory(device)
        baseline = memory.current()
        memory.reset()
        load_s, weight_bytes = bench.load_prequantized(folder)
        peak = memory.peak()
        free_memory(device)
        say(f"  [{bench.label}] pre-quantized folder loaded in {load_s:.2f} s")
        out[bench.key] = {
            "folder": str(folder),
            "write_s": write_s,
            "disk_bytes": folder_bytes(folder),
            "load_s": load_s,
            "weight_bytes": weight_bytes,
            "load_peak_over_baseline_bytes": _minus(peak, baseline),
        }
    return out


# --- one model -----------------------------------------------------------------------------------------


def bench_model(
    label: str,
    folder: Path,
    random_weights: bool,
    args: argparse.Namespace,
    device: torch.device,
    dtype: torch.dtype,
    clips: dict[float, np.ndarray],
    workdir: Path,
    contender: Any,
) -> dict[str, Any]:
    from dictation.asr.config import AsrConfig

    base = DTYPE_NAMES[dtype]
    variants = list(args.variants or [base])
    reference = args.reference_variant or ("bf16" if device.type == "cuda" else "fp32")
    ours_on = "ours" in args.impl
    cfg = AsrConfig.from_file(folder / "config.json")

    def make(variant: str, step: str = "") -> OursBench:  # int8/int4 under --dtype auto: the engine's own choice
        return OursBench(folder, device, variant, args.dtype, args.group_size, step)

    ours: list[OursBench] = []
    if ours_on:  # the reference first: the others are compared with it as they are measured
        order = [reference, *[v for v in variants if v != reference]] if reference in variants else variants
        ours = [make(v) for v in order]
        # Other decode steps of the base float variant, each its own column (after the default ones).
        extra = [make(base, step) for step in getattr(args, "decode_steps", [])]
        ours += extra
        variants = variants + [b.key for b in extra]
    benches: list[Any] = list(ours)
    if contender is not None:  # the official implementation (benchmarks/official_contender.py)
        benches.append(contender.OfficialBench(folder, device, dtype, base))

    agree = Agreement(reference)
    res: dict[str, Any] = {
        "size": label,
        "checkpoint": str(folder),
        "random_weights": random_weights,
        "base_variant": base,
        "variants": variants if ours_on else [],
        "reference_variant": reference if ours_on else None,
        "reference_only": None,
    }
    if ours_on and reference not in variants:
        say(f"  [ours {reference}] reference for the agreement figures (not timed)")
        res["reference_only"] = reference_pass(make(reference), clips, args.tokens, device, agree)
    prequantized = {}
    if ours_on and not args.no_prequantized:
        prequantized = prequantized_loads(ours, folder, workdir, args.group_size, device)
    if args.interleave and len(benches) > 1:
        results = bench_interleaved(benches, clips, args, device, agree)
    else:
        results = bench_sequential(benches, clips, args, device, agree)
    for key, pre in prequantized.items():
        results[key]["prequantized"] = pre

    ours_results = {v: results[v] for v in variants if ours_on}
    official = results.get("official")
    res["ours"] = ours_results
    res["official"] = official
    bandwidth = gpu_bandwidth(device_name(device)) if device.type == "cuda" else None
    res["clips"] = []
    for seconds in args.seconds:
        clip: dict[str, Any] = {"seconds": seconds}
        clip["ours"] = {v: r["clips"][seconds] for v, r in ours_results.items()}
        clip["official"] = official["clips"][seconds] if official else None
        any_stats = next(iter(clip["ours"].values()), None) or clip["official"]
        prompt_len = len(any_stats["prompt_ids"])
        clip["prompt_tokens"] = prompt_len
        clip["audio_tokens"] = prompt_len - 15  # docs/model.md §7.1: N + 15 without context
        context = prompt_len + args.tokens / 2
        for v, stats in clip["ours"].items():
            r = ours_results[v]
            elem = DTYPES[r["dtype"]].itemsize
            stats["decoder_bytes_per_token"] = r["decode_weight_bytes"] + kv_cache_bytes(cfg, elem, context)
        if clip["official"]:
            elem = dtype.itemsize
            clip["official"]["decoder_bytes_per_token"] = float_decode_weight_bytes(cfg, elem) + kv_cache_bytes(
                cfg, elem, context
            )
        for stats in [*clip["ours"].values(), *([clip["official"]] if clip["official"] else [])]:
            per_token = stats["decoder_bytes_per_token"]
            stats["floor_ms_per_token"] = per_token / bandwidth[1] * 1e3 if bandwidth else None
        if clip["official"] and base in clip["ours"]:
            mine, theirs = clip["ours"][base], clip["official"]
            if mine["prompt_ids"] != theirs["prompt_ids"]:
                say(f"WARNING: {label} {seconds:g} s: prompt ids differ between ours and official")
            clip["same_prompt"] = mine["prompt_ids"] == theirs["prompt_ids"]
            agree_n = _leading_agreement(mine["tokens"], theirs["tokens"])
            clip["tokens_agree"] = f"{agree_n}/{args.tokens}"
            clip["ratio"] = {s: _ratio(theirs[s], mine[s]) for s in STAGES}
            if mine.get("release"):  # the official implementation starts at release: its end-to-end
                clip["ratio"].update(
                    {key: _ratio(theirs["e2e_ms"], value) for key, value in mine["release"].items() if key in RELEASE}
                )
            clip["ratio"]["peak_over_baseline_bytes"] = _ratio(
                theirs["peak_over_baseline_bytes"], mine["peak_over_baseline_bytes"]
            )
        for stats in [*clip["ours"].values(), *([clip["official"]] if clip["official"] else [])]:
            stats.pop("prompt_ids", None)
        res["clips"].append(clip)
    for r in results.values():
        del r["clips"]
    if official and base in ours_results:
        res["load_ratio"] = _ratio(official["load_s"], ours_results[base]["load_s"])
    return res


def _ratio(official: float | None, ours: float | None) -> float | None:
    if official is None or ours is None or ours <= 0:
        return None
    return official / ours


# --- main ---------------------------------------------------------------------------------------------


def run(args: argparse.Namespace, official: Any = None) -> int:
    """Run the benchmark for parsed and checked options (dictation.bench.options); returns an exit code.

    ``official``: the official implementation as a contender (``benchmarks/official_contender.py``, which
    ``benchmarks/bench_asr.py`` passes in); the package itself never loads the reference implementation.

    What the run sets for itself (quieter logs and warnings, the thread count, the int4 rounding) is
    put back when it returns: a caller in the same process (the tests) keeps its own settings.
    """
    from dictation.asr.nn import quant_format

    logger = logging.getLogger("dictation")
    level, threads, int4_method = logger.level, torch.get_num_threads(), quant_format.INT4_METHOD
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore")
            logger.setLevel(logging.ERROR)  # e.g. every run hits its token budget
            if args.threads:
                torch.set_num_threads(args.threads)
            # for loads and pre-quantized folders
            quant_format.INT4_METHOD = getattr(args, "int4_method", quant_format.INT4_METHOD)
            return _run(args, official)
    finally:
        logger.setLevel(level)
        torch.set_num_threads(threads)
        quant_format.INT4_METHOD = int4_method


def _run(args: argparse.Namespace, official: Any) -> int:
    from dictation.asr import AsrError
    from dictation.asr.device import resolve_device
    from dictation.asr.nn import quant_format
    from dictation.bench.report import print_size_table, print_summary

    try:
        device = resolve_device(args.device)
    except AsrError as exc:
        say(f"dictation bench: error: {exc}")
        return 1
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    auto_dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    dtype = auto_dtype if args.dtype == "auto" else DTYPES[args.dtype]

    impls = [i for i in IMPLS if i in args.impl]
    official_missing = None
    official_versions: dict[str, str] = {}
    if "official" in impls and official is None:
        impls.remove("official")
        official_missing = "not part of `dictation bench`"
        say(
            "official numbers: run benchmarks/bench_asr.py from a checkout with the test extra installed "
            "(the app never loads the reference implementation)"
        )
    elif "official" in impls:
        official_missing = official.unavailable_reason()
        if official_missing:
            impls.remove("official")
            say(
                f"official numbers missing: transformers 4.57.6 + qwen-asr are not importable ({official_missing}); "
                f"get them with: {official.INSTALL_HINT}"
            )
        else:
            official_versions = official.versions()
    if not impls:
        say("dictation bench: error: nothing to run (only the official implementation was asked for)")
        return 1
    args.impl = impls

    name = device_name(device)
    bandwidth = gpu_bandwidth(name) if device.type == "cuda" else None
    meta: dict[str, Any] = {
        "device": name,
        "device_type": device.type,
        "dtype": DTYPE_NAMES[dtype],
        "variants": list(args.variants or [DTYPE_NAMES[dtype]]),
        "reference_variant": args.reference_variant or ("bf16" if device.type == "cuda" else "fp32"),
        "group_size": args.group_size,
        "int4_method": quant_format.INT4_METHOD,
        "impls": impls,
        "official_missing": official_missing,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": official_versions.get("transformers"),
        "qwen_asr": official_versions.get("qwen-asr"),
        "python": platform.python_version(),
        "tokens": args.tokens,
        "repeats": args.repeats,
        "warmup": args.warmup,
        "seconds": args.seconds,
        "torch_threads": torch.get_num_threads(),
        "bandwidth_gpu": bandwidth[0] if bandwidth else None,
        "bandwidth_bytes_per_s": bandwidth[1] if bandwidth else None,
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "interleave": args.interleave,
        "cpu_count": os.cpu_count(),
        "loadavg_start": _loadavg(),
    }
    versions = f" · transformers {meta['transformers']} · qwen-asr {meta['qwen_asr']}" if official_versions else ""
    say(f"device: {name} · dtype {meta['dtype']} · torch {torch.__version__}{versions}")

    clips = {s: synth_audio(s) for s in args.seconds}
    temp = None
    workdir = args.workdir
    if workdir is None:
        temp = workdir = Path(tempfile.mkdtemp(prefix="dictation_bench_"))
    workdir.mkdir(parents=True, exist_ok=True)
    results: list[dict[str, Any]] = []
    t_start = time.perf_counter()
    try:
        if args.model is not None:
            from dictation.asr.checkpoints.hub import resolve_model

            try:
                folder = resolve_model(args.model)
            except AsrError as exc:
                say(f"dictation bench: error: {exc}")
                return 1
            targets = [(folder.name, folder, False)]
            meta["sizes"] = []
            meta["model"] = str(folder)
        else:
            sizes = args.sizes or (["0.6B", "1.7B"] if device.type == "cuda" else ["0.6B"])
            meta["sizes"] = sizes
            targets = [(size, None, True) for size in sizes]
        for label, folder, random_weights in targets:
            if folder is None:
                folder = build_checkpoint(label, workdir, log=say)
            res = bench_model(
                label,
                folder,
                random_weights,
                args,
                device,
                dtype,
                clips,
                workdir,
                official if "official" in impls else None,
            )
            results.append(res)
            print_size_table(res, meta)
    finally:
        if temp is not None:
            shutil.rmtree(temp, ignore_errors=True)
    meta["wall_s"] = time.perf_counter() - t_start
    meta["loadavg_end"] = _loadavg()
    print_summary(results, meta)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps({"meta": meta, "results": results}, indent=2, default=str) + "\n", encoding="utf-8"
        )
        say(f"wrote {args.json}")
    return 0
