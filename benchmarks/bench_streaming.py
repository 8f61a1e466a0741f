"""Latency after the last sample: streaming (``engine.stream``) vs whole-clip ``engine.transcribe``.

    python benchmarks/bench_streaming.py --model /tmp/bench_ckpt/qwen3-asr-0.6B-random --seconds 10 30

Two clips per length: ``synth`` (the bench signal; its loudest frame comes late, so the windows
encoded early get a lower floor than the final one and are all redone at finish: the worst case)
and ``loud-start`` (the same with its first second the loudest: nothing is redone, the best case).

The stream is fed in 100-ms chunks (as a recorder would; the feed work is timed separately, it
happens while the user speaks), then ``finish()`` is timed. Both paths get the same token budget;
their token ids are checked to be identical.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dictation.asr import AsrEngine, EngineOptions  # noqa: E402
from dictation.bench.measure import synth_audio  # noqa: E402

SR = 16000


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--seconds", type=float, nargs="+", default=[10.0, 30.0])
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()

    engine = AsrEngine(EngineOptions(model=args.model, device=args.device, dtype=args.dtype))
    engine.prepare()
    print(f"{engine.model_label}, {args.tokens} tokens, median of {args.repeats}")
    engine.transcribe(synth_audio(2.0), max_new_tokens=2)  # warm-up
    for seconds, kind in ((s, k) for s in args.seconds for k in ("synth", "loud-start")):
        audio = synth_audio(seconds)
        if kind == "loud-start":
            audio = audio * 0.5
            audio[:SR] = synth_audio(1.0, seed=7) * 1.8
        whole_s, finish_s, feed_s = [], [], []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            whole = engine.transcribe(audio, max_new_tokens=args.tokens)
            whole_s.append(time.perf_counter() - t0)
            stream = engine.stream(max_new_tokens=args.tokens)
            t0 = time.perf_counter()
            for i in range(0, len(audio), SR // 10):
                stream.feed(audio[i : i + SR // 10])
            feed_s.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            got = stream.finish()
            finish_s.append(time.perf_counter() - t0)
            assert got.token_ids == whole.token_ids, "streaming differs from the whole clip"
        t = got.timings
        print(
            f"{seconds:4.0f} s {kind:10s}: whole transcribe {statistics.median(whole_s):6.3f} s | "
            f"stream finish {statistics.median(finish_s):6.3f} s "
            f"(windows: during feed {t['stream_windows']:.0f}, at finish {t['finish_windows']:.0f}, "
            f"redone {t['reencoded_windows']:.0f}; "
            f"finish: enc {t['encoder_s']:.3f} prefill {t['prefill_s']:.3f} "
            f"({t['finish_prefill_tokens']:.0f} of {t['prompt_tokens']:.0f} positions) decode {t['decode_s']:.3f}) | "
            f"feed work total {statistics.median(feed_s):6.3f} s | tokens {len(whole.token_ids)} identical"
        )


if __name__ == "__main__":
    main()
