"""Diagnosis of the bf16 decode step on a GPU, for benchmarks/gpu_check.sh.

On the tiny test checkpoint in bf16, for the clips of the gpu tests:

- the three ways to decode (``graph``: the captured static step; ``static``: the same step uncaptured;
  ``plain``: the plain step, projections apart) and where their ids part;
- at the first id where ``graph`` and ``plain`` part: the plain step's logits there (teacher-forced
  along the graph's ids): its top 3, the graph's pick's logit, the gap relative to the largest |logit|
  and in bf16 rounding steps at that logit (a near tie is a gap of a step or two);
- whether the static step's logits are bitwise equal run on the default stream and on the capture
  stream (where a graph's warm-up runs), and which kernels one static step and one plain step launch
  (attention kernels, matrix products, counts);
- the seconds the 21-minute test's parts take (its synthetic audio, the transcription).

Lines starting with ``SUMMARY`` go into the check's summary. On the CPU (the check's dry run) the
static step runs uncaptured and the stream and kernel parts are skipped.

    python benchmarks/gpu_diagnose.py --device cuda --out diagnosis.txt
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import torch  # noqa: E402

from dictation.asr import AsrEngine, EngineOptions  # noqa: E402
from tests.asr.test_fast_paths import BF16_PICK_TOLERANCE, decode, pick_gaps, prompt_embeds  # noqa: E402
from tests.oracle import synth_audio  # noqa: E402
from tests.oracle.checkpoints import cached_checkpoint  # noqa: E402

CLIPS = [(2.5, 1), (4.0, 2), (6.5, 3), (0.62, 11), (4.3, 12), (19.5, 13)]
TOKENS = 24

lines: list[str] = []


def say(text: str = "") -> None:
    print(text, flush=True)
    lines.append(text)


@contextmanager
def mode(engine: AsrEngine, how: str, cuda: bool):
    model = engine.model
    saved = model.options
    static = False if how == "plain" else (None if cuda else True)
    model.options = replace(saved, capture_step=how == "graph", static_step=static, fuse_projections=how != "plain")
    try:
        yield
    finally:
        model.options = saved


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def bf16_step(value: float) -> float:
    """The spacing of bf16 numbers at ``value`` (8 significant bits)."""
    return 2.0 ** (math.floor(math.log2(abs(value))) - 7) if value else 0.0


def plain_logits_along(engine: AsrEngine, embeds: torch.Tensor, ids: list[int]) -> list[torch.Tensor]:
    model = engine.model
    engine.pipeline.cache_owner = None
    rows = []
    with torch.inference_mode():
        logits = model.prefill(embeds, len(ids))
        position = embeds.shape[1]
        for i, tid in enumerate(ids):
            rows.append(logits.float().cpu())
            if i + 1 < len(ids):
                logits = model.step(torch.tensor([tid], device=model.device), position)
                position += 1
    return rows


def compare_ways(engine: AsrEngine, cuda: bool) -> None:
    say("== bf16: graph (captured static step) / static (uncaptured) / plain step, 24 tokens per clip")
    same_static, parted, worst = 0, [], 0.0
    for seconds, seed in CLIPS:
        embeds = prompt_embeds(engine, synth_audio(seconds, seed=seed))
        got = {}
        for how in ("graph", "static", "plain"):
            with mode(engine, how, cuda):
                got[how] = decode(engine, embeds, max_new_tokens=TOKENS).token_ids
                if how == "graph" and cuda:
                    graph = engine.model.decode_graph
                    captured = graph is not None and graph.graph is not None and not engine.model.graph_failed
        same_static += got["graph"] == got["static"]
        with mode(engine, "plain", cuda):
            gaps = pick_gaps(engine, embeds, got["graph"])
            worst = max(worst, max(gaps))
            k = first_difference(got["graph"], got["plain"])
            text = f"clip {seconds:g} s seed {seed}: graph == static: {got['graph'] == got['static']}"
            if cuda:
                text += f" (captured, first replay bit-exact: {captured})"
            text += f"; graph vs plain part at id {k}; largest relative gap of a graph pick {max(gaps):.4f}"
            say(text)
            if k is not None and k < len(got["graph"]):
                parted.append(k)
                row = plain_logits_along(engine, embeds, got["graph"][: k + 1])[k]
                top = row.topk(3)
                pick = got["graph"][k]
                peak = float(row.abs().max())
                gap = float(top.values[0] - row[pick])
                say(
                    f"    plain step's logits at id {k}: top 3 {[round(v, 4) for v in top.values.tolist()]} "
                    f"ids {top.indices.tolist()}; graph picked {pick} with {float(row[pick]):.4f}; "
                    f"gap {gap:.4f} = {gap / peak:.4f} of max|logit| {peak:.3f} = "
                    f"{gap / bf16_step(float(top.values[0])):.1f} bf16 steps at the top logit"
                )
                say(f"    graph {got['graph'][: k + 3]} / plain {got['plain'][: k + 3]}")
    say(
        f"SUMMARY bf16 step: graph == static on {same_static}/{len(CLIPS)} clips; graph vs plain parted on "
        f"{len(parted)} clips; largest relative gap of a graph pick under the plain step {worst:.4f} "
        f"(tolerance {BF16_PICK_TOLERANCE:.4f})"
    )


def kernels_of(fn) -> Counter:
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return Counter(e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def short(name: str) -> str:
    return name if len(name) <= 90 else name[:87] + "..."


def streams_and_kernels(engine: AsrEngine) -> None:
    from dictation.asr.nn.graphs import capture_stream

    model = engine.model
    embeds = prompt_embeds(engine, synth_audio(4.0, seed=2))
    say("== one static step on the default stream and on the capture stream (bitwise), and the kernels")
    with torch.inference_mode():
        engine.pipeline.cache_owner = None
        logits = model.prefill(embeds, TOKENS)
        token = logits.argmax().view(1)
        position = torch.tensor([embeds.shape[1]], device=model.device)
        default = model.static_step(token, position).clone()
        stream = capture_stream(model.device)
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            side = model.static_step(token, position).clone()
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        say(f"static step logits, default vs capture stream: bitwise equal {torch.equal(default, side)}")
        static = kernels_of(lambda: model.static_step(token, position))
        with mode(engine, "plain", True):
            plain = kernels_of(lambda: model.step(token, embeds.shape[1]))
    for label, counts in (("static step", static), ("plain step", plain)):
        say(f"{label}: {sum(counts.values())} kernels, {len(counts)} distinct; the most frequent:")
        for name, n in counts.most_common(12):
            say(f"    {n:4d}  {short(name)}")
    marks = ("flash", "fmha", "attention", "efficient")
    attention = {
        label: sorted({short(n) for n in counts if any(k in n.lower() for k in marks)}) or ["none found"]
        for label, counts in (("static", static), ("plain", plain))
    }
    say(f"SUMMARY attention kernels: static {attention['static']}; plain {attention['plain']}")


def twenty_one_minutes(engine: AsrEngine, seconds: float) -> None:
    t0 = time.perf_counter()
    audio = synth_audio(seconds, 3)
    t1 = time.perf_counter()
    result = engine.transcribe_with_progress(audio, max_new_tokens=8)
    t2 = time.perf_counter()
    say(
        f"SUMMARY the 21-minute test's parts on {seconds:g} s: synthetic audio {t1 - t0:.1f} s, "
        f"transcription {t2 - t1:.1f} s ({result.chunks} passes, {len(result.token_ids)} ids)"
    )


def main() -> int:
    p = argparse.ArgumentParser(prog="gpu_diagnose.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    cuda = args.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        say("SUMMARY diagnosis: no CUDA GPU here")
        return 1
    if cuda:  # as the tests run: no TF32 anywhere
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        with tempfile.TemporaryDirectory(prefix="gpu_diagnose_") as root:
            folder = cached_checkpoint(Path(root), tie_word_embeddings=False)
            engine = AsrEngine(EngineOptions(model=str(folder), device=args.device, dtype="bf16"))
            engine.prepare()
            say(f"device: {torch.cuda.get_device_name() if cuda else 'cpu'}, torch {torch.__version__}")
            compare_ways(engine, cuda)
            if cuda:
                streams_and_kernels(engine)
            twenty_one_minutes(engine, 21 * 60.0 if cuda else 60.0)  # the CPU: the code, not the time
    finally:
        if args.out is not None:
            args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
