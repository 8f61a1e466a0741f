"""What the vocabulary context does to the ids, ours next to the official implementation, on tiny checkpoints.

    python benchmarks/context_effect.py [--max-new-tokens 24]

The context is the one the app gives the engine (`dictation.vocabulary.model_context` through
`Takes.language_context`): a user's own text and three words learned from corrections. For each tiny
random checkpoint and clip of the parity tests (tests/asr/test_vocabulary_parity.py) it prints the prompt
length without and with the context, whether our prompt ids and greedy ids equal the official qwen-asr
package's (the oracle of tests/oracle/), how many output ids the context changed, and how far it moved the
first step's logits in each implementation. Random weights say nothing about accuracy: this shows that the
context is passed and acts exactly as in the official implementation.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dictation.asr import AsrEngine, EngineOptions  # noqa: E402
from dictation.asr.nn.features import n_audio_tokens  # noqa: E402
from tests.asr.test_parity import checkpoint, clip, strip_eos  # noqa: E402
from tests.asr.test_vocabulary_parity import app_context  # noqa: E402
from tests.oracle.official import oracle_for  # noqa: E402

CASES = (("untied", "medium"), ("untied", "long"), ("hf", "long"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-new-tokens", type=int, default=24)
    args = parser.parse_args()
    budget = args.max_new_tokens
    context = app_context()
    print(f"context ({len(context)} characters): {context!r}\n")
    print("| checkpoint | clip | prompt ids bare → with | prompt = official | greedy = official (bare, with) "
          "| output ids changed | first logits moved, ours / official |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    root = Path(tempfile.mkdtemp(prefix="context-effect-"))
    for kind, name in CASES:
        ours_dir, twin = checkpoint(root, kind)
        engine = AsrEngine(EngineOptions(model=str(ours_dir), device="cpu", dtype="fp32"))
        engine.prepare()
        oracle = oracle_for(twin)
        audio = clip(name)
        n = n_audio_tokens(len(audio) // 160)
        prompt_bare, prompt_with = engine.prompt.prompt_ids(n, context=""), engine.prompt.prompt_ids(n, context=context)
        prompt_same = prompt_bare == oracle.prompt_ids(audio, "") and prompt_with == oracle.prompt_ids(audio, context)
        bare = engine.pipeline.run(audio, None, "", budget, keep_first_logits=True)
        with_ = engine.pipeline.run(audio, None, context, budget, keep_first_logits=True)
        ref_bare = strip_eos(oracle.greedy_ids(audio, "", None, budget))
        ref_with = strip_eos(oracle.greedy_ids(audio, context, None, budget))
        changed = sum(a != b for a, b in zip(bare.ids, with_.ids, strict=False)) + abs(len(bare.ids) - len(with_.ids))
        moved = float((with_.first_logits - bare.first_logits).abs().max())
        ref_moved = float(
            (oracle.first_step_logits(audio, context, None) - oracle.first_step_logits(audio, "", None)).abs().max()
        )
        print(
            f"| {kind} | {name} ({len(audio) / 16000:.1f} s) | {len(prompt_bare)} → {len(prompt_with)} "
            f"| {'yes' if prompt_same else 'NO'} | {'yes' if bare.ids == ref_bare else 'NO'}, "
            f"{'yes' if with_.ids == ref_with else 'NO'} | {changed} of {max(len(bare.ids), len(with_.ids))} "
            f"| {moved:.3f} / {ref_moved:.3f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
