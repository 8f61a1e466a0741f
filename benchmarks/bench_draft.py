"""End-of-speech-to-text time with and without a draft (draft verification).

    python benchmarks/bench_draft.py --model /tmp/bench_ckpt/qwen3-asr-0.6B-random --seconds 25 --tokens 32 64

Random weights give no meaningful partial transcript, so the draft is simulated: the final ids with
their last ``--changed`` fraction replaced by other ids (what a partial transcript of the audio
without its last words would give: a right start, then a wrong or missing end). The model's budget
is forced with ``max_new_tokens`` (random weights practically never emit EOS).

Two paths are timed from the moment the recording ends: ``transcribe`` (whole clip: mel, encoder,
prefill, decode) and ``stream`` (``engine.stream`` fed during the recording in 100-ms chunks, not
timed; then ``finish()``: last window, prompt tail, decode). Each with and without the draft; the
token ids are checked to be identical. Median of ``--repeats``.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dictation.asr import AsrEngine, EngineOptions  # noqa: E402
from dictation.bench.measure import synth_audio  # noqa: E402

SR = 16000


def simulated_draft(final: list[int], changed: float) -> list[int]:
    keep = len(final) - max(1, round(changed * len(final)))
    return final[:keep] + [(t + 1) % 151000 for t in final[keep:]]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--seconds", type=float, default=25.0)
    p.add_argument("--tokens", type=int, nargs="+", default=[32, 64])
    p.add_argument("--changed", type=float, default=0.15, help="fraction of the draft's end that is wrong")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--paths", nargs="+", default=["transcribe", "stream"], choices=["transcribe", "stream"])
    args = p.parse_args()
    logging.getLogger("dictation.asr").setLevel(logging.ERROR)  # every run hits the forced budget

    engine = AsrEngine(EngineOptions(model=args.model, device=args.device, dtype=args.dtype))
    engine.prepare()
    audio = synth_audio(args.seconds)
    print(f"{engine.model_label}, {args.seconds:.0f}-s clip, draft: final ids, last {args.changed:.0%} changed")
    print(f"median of {args.repeats}, end of speech to text")
    engine.transcribe(synth_audio(2.0), max_new_tokens=4, draft_ids=[1, 2, 3])  # warm-up

    def run(path: str, n: int, draft: list[int] | None):
        if path == "transcribe":
            t0 = time.perf_counter()
            result = engine.transcribe(audio, max_new_tokens=n, draft_ids=draft)
            return time.perf_counter() - t0, result
        stream = engine.stream(max_new_tokens=n)
        for i in range(0, len(audio), SR // 10):
            stream.feed(audio[i : i + SR // 10])
        t0 = time.perf_counter()
        result = stream.finish(draft_ids=draft)
        return time.perf_counter() - t0, result

    for n in args.tokens:
        final = engine.transcribe(audio, max_new_tokens=n).token_ids
        assert len(final) == n, f"the model stopped after {len(final)} tokens; pick fewer --tokens"
        draft = simulated_draft(final, args.changed)
        for path in args.paths:
            times: dict[str, list[float]] = {"plain": [], "draft": []}
            decode: dict[str, list[float]] = {"plain": [], "draft": []}
            for _ in range(args.repeats):
                for kind, d in (("plain", None), ("draft", draft)):
                    seconds, result = run(path, n, d)
                    assert result.token_ids == final, f"{path} with {kind} differs from plain greedy"
                    times[kind].append(seconds)
                    decode[kind].append(result.timings["decode_s"])
            t = result.timings
            plain, drafted = statistics.median(times["plain"]), statistics.median(times["draft"])
            dec_plain, dec_draft = statistics.median(decode["plain"]), statistics.median(decode["draft"])
            print(
                f"{n:3d} tokens {path:10s}: plain {plain * 1000:7.0f} ms (decode {dec_plain * 1000:6.0f})"
                f" | draft {drafted * 1000:7.0f} ms (decode {dec_draft * 1000:6.0f};"
                f" accepted {t['draft_accepted']:.0f}/{t['draft_tokens']:.0f} in {t['draft_passes']:.0f} pass)"
                f" | speedup {plain / drafted:4.2f}x | ids identical"
            )


if __name__ == "__main__":
    main()
