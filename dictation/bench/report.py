"""The benchmark's tables (plain text; the JSON has every number)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

RANDOM_AGREEMENT_NOTE = (
    "agreement: random weights give near-uniform logits, so on these checkpoints the agreement figures are only "
    "a sanity check (the reference must agree with itself: 1.00); use --model with a real model for meaningful ones"
)

STAGE_LABELS = {
    "mel_ms": "mel (ms)",
    "encoder_ms": "encoder (ms)",
    "prefill_ms": "prefill (ms)",
    "decode_ms_per_token": "decode (ms/token)",
    "e2e_ms": "end-to-end (ms)",
}
RELEASE_LABELS = {
    "release_ms": "release→text, streamed (ms)",
    "release_preview_ms": "  + last preview as draft",
    "release_draft_ms": "  + draft 85% right",
    "release_best_ms": "  + first window loudest",
}
GIB = 1024**3
LABEL_WIDTH = 26
COLUMN_WIDTH = 14


def _fmt(value: float | None, digits: int = 1) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def _digits(stage: str, value: float | None) -> int:
    if value is None:
        return 1
    return 2 if stage in ("mel_ms", "decode_ms_per_token") or abs(value) < 10 else 1


def _ratio(official: float | None, ours: float | None) -> float | None:
    if official is None or ours is None or ours <= 0:
        return None
    return official / ours


def _gb(n: int | None) -> float | None:
    return n / 1e9 if n is not None else None


def print_size_table(res: dict[str, Any], meta: dict[str, Any], out: Callable[[str], None] = print) -> None:
    """One table per model: a column per variant of ours (and the official implementation), rows for
    load, weights, then per clip the stages, peak memory and agreement with the reference variant."""
    variants = list(res["ours"])
    official = res["official"]
    base = res["base_variant"]
    columns: list[tuple[str, str | None]] = [(f"ours {v}", v) for v in variants]
    if official:
        columns.append((official["label"], None))
    with_ratio = official is not None and base in res["ours"]

    def info(key: str | None) -> dict[str, Any]:
        return res["ours"][key] if key is not None else official

    widths = [max(COLUMN_WIDTH, len(c) + 1) for c, _ in columns]  # e.g. "ours bf16/compiled"

    def row(label: str, values: list[Any], digits: Callable[[Any], int] | int = 2, ratio: Any = "") -> None:
        cells = "".join(
            f"{_fmt(v, digits(v) if callable(digits) else digits):>{w}}" if not isinstance(v, str) else f"{v:>{w}}"
            for v, w in zip(values, widths, strict=True)
        )
        tail = f"{_fmt(ratio, 2):>15}" if with_ratio and ratio != "" else ""
        out(f"{label:<{LABEL_WIDTH + 8}}{cells}{tail}")

    weights_kind = "random weights" if res["random_weights"] else res["checkpoint"]
    name = f"Qwen3-ASR-{res['size']}" if res["random_weights"] else res["size"]
    reference = res.get("reference_variant")
    out("")
    out(
        f"{name} ({weights_kind}) · {meta['device']} · {meta['tokens']} generated tokens · median of "
        f"{meta['repeats']}" + (f" · agreement vs ours {reference}" if reference else "")
    )
    header = f"{'':<{LABEL_WIDTH + 8}}" + "".join(f"{c:>{w}}" for (c, _), w in zip(columns, widths, strict=True))
    if with_ratio:
        header += f"{'official/ours':>15}"
    out(header)
    out("-" * len(header))
    loads = [info(k)["load_s"] for _, k in columns]
    row("load (s)", loads, ratio=_ratio(official["load_s"], res["ours"][base]["load_s"]) if with_ratio else "")
    pre = [(info(k).get("prequantized") or {}).get("load_s") for _, k in columns]
    if any(v is not None for v in pre):
        row("load, pre-quantized (s)", pre)
    weights = [_gb(info(k).get("weight_bytes")) for _, k in columns]
    row(
        "weights (GB)",
        weights,
        digits=3,
        ratio=_ratio(weights[-1], weights[variants.index(base)]) if with_ratio else "",
    )
    caches = [_gb(info(k).get("kernel_cache_bytes")) if k is not None else None for _, k in columns]
    if any(v for v in caches):
        row("+ kernel layouts (GB)", caches, digits=3)
    warm_ups = [info(k).get("warm_up_s") for _, k in columns]
    if any(v is not None for v in warm_ups):
        row("warm-up (s)", warm_ups)
    kernels = [(info(k).get("decode_kernels") or {}) if k is not None else {} for _, k in columns]
    if any(kernels):
        row("decode kernels / layer", [kc.get("per_layer") for kc in kernels], digits=1)
        row("  step", [kc.get("path", "-") for kc in kernels])
    mem_label = "peak mem (GiB)" if meta["device_type"] == "cuda" else "peak RSS growth (GiB)"
    for clip in res["clips"]:
        seconds = clip["seconds"]
        stats = [clip["ours"][k] if k is not None else clip["official"] for _, k in columns]
        ratios = clip.get("ratio") or {}
        lines: list[tuple[str, list[Any], Any, Any]] = []
        for stage in STAGE_LABELS:
            values = [s[stage] for s in stats]
            lines.append((STAGE_LABELS[stage], values, lambda v, st=stage: _digits(st, v), ratios.get(stage, "")))
        # Seconds of compute per second of audio, end to end (< 1: faster than real time).
        rtf = [s["e2e_ms"] / (1000 * seconds) if s.get("e2e_ms") is not None else None for s in stats]
        lines.append(("real-time factor", rtf, 3, ""))
        peaks = [
            s["peak_over_baseline_bytes"] / GIB if s["peak_over_baseline_bytes"] is not None else None for s in stats
        ]
        releases = [s.get("release") for s in stats]
        if any(releases):
            # What the user waits for after releasing the key. The official implementation starts then
            # (its end-to-end); ours has encoded and prefilled the completed windows meanwhile.
            for key, label in RELEASE_LABELS.items():
                values = [
                    r[key] if r else (s["e2e_ms"] if k is None else None)
                    for r, s, (_, k) in zip(releases, stats, columns, strict=True)
                ]
                lines.append((label, values, lambda v: _digits("e2e_ms", v), ratios.get(key, "")))
            for key, label, digits in (
                ("speech_work_ms", "work during speech (ms)", 1),
                ("windows_redone", "windows redone at release", 0),
                ("preview_accepted", "preview ids accepted", 0),
                ("streamed_same_ids", "streamed ids = whole clip", 2),
            ):
                lines.append((label, [r[key] if r else None for r in releases], digits, ""))
        lines.append((mem_label, peaks, 2, ratios.get("peak_over_baseline_bytes", "")))
        floors = [s.get("floor_ms_per_token") for s in stats]
        if any(f is not None for f in floors):
            lines.append(("decode floor (ms/token)", floors, 3, ""))
            multiples = [s["decode_ms_per_token"] / f if f else None for s, f in zip(stats, floors, strict=True)]
            lines.append(("decode / floor (x)", multiples, 1, ""))
        if reference:
            agreement = [s.get("agreement") or {} for s in stats]
            lines.append(("same greedy ids", [a.get("greedy_same_ids") for a in agreement], 2, ""))
            lines.append(("teacher-forced top-1", [a.get("teacher_forced_top1") for a in agreement], 2, ""))
            lines.append(("first-logit cosine", [a.get("first_logits_cosine") for a in agreement], 4, ""))
        for n, (label, values, digits, ratio) in enumerate(lines):
            lead = f"{seconds:>5g}s  " if n == 0 else " " * 8
            row(f"{lead}{label}", values, digits=digits, ratio=ratio)
        if "tokens_agree" in clip:
            out(
                f"{'':8}{'same tokens (official)':<{LABEL_WIDTH}}{clip['tokens_agree']:>{COLUMN_WIDTH}}"
                f"   (leading ids equal to ours {base}; informational)"
            )
    for label, key in columns:
        for note in info(key).get("notes", []):
            out(f"  note ({label}): {note}")
    if res.get("reference_only"):
        out(f"  note: ours {reference} was loaded for the agreement figures only (not timed)")


def print_summary(results: list[dict[str, Any]], meta: dict[str, Any], out: Callable[[str], None] = print) -> None:
    """The notes after all tables: machine load, bandwidth floor, how to read the figures."""

    loadavg = meta.get("loadavg_end")
    cpus = meta.get("cpu_count") or os.cpu_count() or 1
    if loadavg is not None:
        # The load-average window that best covers the run (the bench itself keeps ~all cores busy).
        wall = meta.get("wall_s") or 0
        index, minutes = (0, 1) if wall <= 90 else (1, 5) if wall <= 600 else (2, 15)
        if loadavg[index] > cpus + 0.5:
            out(
                f"WARNING: the machine was busy ({minutes}-min load average {loadavg[index]:.1f} on {cpus} CPUs): "
                "other processes competed for the cores, CPU timings are unreliable (try --interleave)"
            )
    out("")
    if meta["device_type"] == "cuda":
        if meta.get("bandwidth_bytes_per_s"):
            out(
                "bandwidth floor: decoder bytes per token (weights read once, quantized ones as stored, + KV cache "
                f"at mid-generation) / {meta['bandwidth_bytes_per_s'] / 1e12:.2f} TB/s ({meta['bandwidth_gpu']})"
            )
        else:
            out(f"bandwidth floor: unknown (no bandwidth figure for {meta['device']!r})")
    else:
        out("bandwidth floor: only computed on a CUDA GPU")
    out(
        "weights: parameters and buffers the model holds (engine.weight_bytes); kernel layouts: what the int8/int4 "
        "kernels build beside them on first use"
    )
    out(
        "warm-up: engine.warm_up() after loading (kernel compiles and set-up, the CUDA graph capture; the compiled "
        "step's compile). decode kernels / layer: what one decode step dispatches per decoder layer, counted as it "
        "runs (dictation.bench.kernel_count): operations that compute (no views, allocations or no-op casts), each "
        "fused kernel one; "
        + (
            "on CUDA about one kernel launch each (a CUDA graph replays the same)"
            if meta["device_type"] == "cuda"
            else "on the CPU one operator call each"
        )
        + "; for the compiled step the kernels Inductor generated plus its library calls (matrix products), "
        "per layer. step: plain (per-call shapes), static (static shapes, torch ops), fused (our Triton kernels), "
        "compiled (torch.compile)."
    )
    if any(r["random_weights"] and r.get("reference_variant") for r in results):
        out(RANDOM_AGREEMENT_NOTE)
    if any(r["official"] and r["base_variant"] in r["ours"] for r in results):
        out("official/ours > 1: ours is faster (or smaller), compared with ours in the same dtype.")
    if any(
        clip["ours"] and any(v.get("release") for v in clip["ours"].values()) for r in results for clip in r["clips"]
    ):
        their = (
            "the official column repeats its end-to-end, as it can only start at release. "
            if any(r["official"] for r in results)
            else ""
        )
        out(
            "release→text: ours fed the clip in 100-ms chunks as it played (completed 8-s windows encoded and "
            f"prefilled meanwhile: 'work during speech'), then finish() timed; {their}'+ draft 85% right': the "
            "final ids with the last 15% wrong, what a preview 1 s before the end gives on real speech; windows "
            "encoded before the clip's loudest frame are redone at release when its floor changes them ('windows "
            "redone'); '+ first window loudest' is the case where none is. In fp32 every path's ids equal a "
            "whole-clip transcribe; in bf16 and int8/int4 the rounding depends on the chunking ('streamed ids = "
            "whole clip': the share of runs where they did)."
        )
    if meta.get("official_missing"):
        out(f"official implementation: not measured ({meta['official_missing']})")
    out(f"Total wall time {meta['wall_s']:.0f} s.")
