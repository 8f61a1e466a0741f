"""Does a personal adapter generalise across voices and speaking rates, or only memorise its clips?

    PYTHONPATH=. python benchmarks/generalise.py                      # about 10 min on 2 busy cores
    PYTHONPATH=. python benchmarks/generalise.py --labels shuffled    # the control: clips and texts mismatched
    PYTHONPATH=. python benchmarks/generalise.py --base hearing [--adapter-seeds 0 1 2] [--threads 2]
    PYTHONPATH=. python benchmarks/generalise.py --base hearing --build [--seed 1] [--base-steps 500]

A made-up vocabulary (five invented names) is said in every ordered pair ("Zorvath Quenlix.") by
espeak-ng in one voice and rate (``--train-voice``, ``--train-rate``); an adapter is trained on those
clips through the trainer the command line and the app's Personalise run (``tune.train.train_adapter``,
float base, every decoder projection). The same sentences said in a voice or a rate never trained on
are then transcribed through the engine (``AsrEngine``) without and with the adapter, and scored as
the app scores held-out dictations (``dictation.training.score``). Printed per held-out condition:

* the CER of the base model and of the base with the adapter;
* the adapter's CER against the references rotated by one clip: an adapter that says the vocabulary
  but ignores the audio scores the same against the right and the rotated references, so only the gap
  between the two shows that it hears the words.

The model is the tiny random checkpoint of the tests (``tests/oracle/checkpoints.py``) made able to
say the vocabulary: its head lets the tokens of the training texts, ``<asr_text>`` and ``<|im_end|>``
win (``extra_active``), and its q/k norm gain is 1, as for ``tests/test_cli_train.py``. On the default
tiny checkpoint the head lets only 3000 random tokens win; measured there (the head adapted too, 150
steps at 2e-2): the loss stopped at 2.9 and the output was token soup on the training clips as well.
Results: benchmarks/results/generalise-2026-12-02.md.

``--base hearing``: the same question on a base that hears (``tests/oracle/hearing.py``: the tiny model
trained end to end on ordinary words in six voices and three rates), as ``tests/asr/test_generalise.py``
asks it: six made-up words said in two voices at two rates, an adapter with the right labels and one
with garbled labels (each clip labelled with another of the words), and the CERs on the same words
at rates, in voices and in accents never trained on; once per adapter seed of ``--adapter-seeds``,
with ``--threads`` torch threads. The base is the stored one of the tests
(``tests/data/hearing-base.safetensors``), or with ``--build`` one trained here (at most
``--base-steps``, stopped once it hears, seeded). Results: benchmarks/results/generalise-2026-12-02b.md
(built bases), benchmarks/results/generalise-2026-12-02c.md (the stored base).
"""

from __future__ import annotations

import argparse
import itertools
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

WORDS = ("Zorvath", "Quenlix", "Mirabon", "Tesselka", "Obrund")
HELD_OUT = {"rate": ("en-us+m3", 190), "voice": ("en-us+f3", 140)}


def speak(text: str, voice: str, rate: int, folder: Path) -> np.ndarray:
    """``text`` said by espeak-ng, 16 kHz mono float32, the silence before and after cut off."""
    from dictation.audio.wav import load_audio_16k

    path = folder / f"{voice}-{rate}-{text.replace(' ', '_')}.wav"
    if not path.exists():
        subprocess.run(["espeak-ng", "-v", voice, "-s", str(rate), "-w", str(path), text], check=True, timeout=60)
    x = load_audio_16k(path)
    spoken = np.flatnonzero(np.abs(x) > 0.01)
    return x[spoken[0] : spoken[-1] + 1]


def checkpoint(root: Path, lines: list[str]) -> Path:
    """The tiny checkpoint whose head can say ``lines`` (module docstring)."""
    from dictation.asr.text.prompt import PromptBuilder
    from tests.oracle.checkpoints import cached_checkpoint

    prompt = PromptBuilder.from_folder(cached_checkpoint(root, tie_word_embeddings=False))
    active = sorted({t for line in lines for t in prompt.encode(line)} | {prompt.special.im_end})
    return cached_checkpoint(root, tie_word_embeddings=False, extra_active=tuple(active), qk_norm_gain=1.0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--steps", type=int, default=None, help="adapter steps (default 100; --base hearing: ADAPTER_STEPS)"
    )
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--train-voice", default="en-us+m3")
    ap.add_argument("--train-rate", type=int, default=140)
    ap.add_argument("--labels", choices=("right", "shuffled"), default="right")
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--workdir", type=Path, default=None, help="keep the checkpoint and clips here")
    ap.add_argument("--base", choices=("random", "hearing"), default="random")
    ap.add_argument("--build", action="store_true", help="--base hearing: train the base here, not the stored one")
    ap.add_argument("--seed", type=int, default=0, help="--base hearing --build: the base's seed")
    ap.add_argument("--base-steps", type=int, default=1000, help="--base hearing --build: the base's most steps")
    ap.add_argument("--adapter-seeds", type=int, nargs="+", default=[0], help="--base hearing: the adapters' seeds")
    ap.add_argument("--threads", type=int, default=1, help="--base hearing: torch threads")
    args = ap.parse_args(argv)
    if args.base == "hearing":
        return hearing(args)
    args.steps = args.steps or 100

    from dictation.asr import AsrEngine, EngineOptions
    from dictation.asr.tune.data import Example, target_text
    from dictation.asr.tune.train import TrainOptions, train_adapter
    from dictation.training import score

    work = args.workdir or Path(tempfile.mkdtemp(prefix="generalise-"))
    (work / "clips").mkdir(parents=True, exist_ok=True)
    texts = [f"{a} {b}." for a, b in itertools.permutations(WORDS, 2)]
    ckpt = checkpoint(work, [target_text(t, "English") for t in texts])
    labels = list(texts)
    if args.labels == "shuffled":
        random.Random(0).shuffle(labels)
    clips = [speak(t, args.train_voice, args.train_rate, work / "clips") for t in texts]
    examples = [Example(c, target_text(label, "English"), t) for c, label, t in zip(clips, labels, texts, strict=True)]
    options = TrainOptions(steps=args.steps, lr=args.lr, bits=16, layers=None)
    out = Path(tempfile.mkdtemp(prefix="adapter-")) / "adapter"
    t0 = time.perf_counter()
    result = train_adapter(str(ckpt), examples, out, options)
    losses = " ".join(f"{x:.2f}" for x in result.losses[:: max(1, args.steps // 10)])
    print(f"trained {args.steps} steps on {len(texts)} clips ({args.train_voice}, rate {args.train_rate}, "
          f"labels {args.labels}) in {time.perf_counter() - t0:.0f} s; loss every tenth: {losses}; "
          f"last {result.losses[-1]:.2f}")  # fmt: skip

    def engine(*adapters: str) -> AsrEngine:
        e = AsrEngine(EngineOptions(model=str(ckpt), device="cpu", dtype="fp32", adapters=adapters,
                                    max_new_tokens=args.max_new_tokens))  # fmt: skip
        e.prepare()
        return e

    base, adapted = engine(), engine(str(out))
    rotated = texts[1:] + texts[:1]
    for name, (voice, rate) in HELD_OUT.items():
        held = [speak(t, voice, rate, work / "clips") for t in texts]
        said_base = [base.transcribe(c, language="English").text for c in held]
        said = [adapted.transcribe(c, language="English").text for c in held]
        print(f"held out, other {name} ({voice}, rate {rate}), {len(texts)} clips: CER base "
              f"{score(texts, said_base).cer:.3f}, adapted {score(texts, said).cer:.3f}, adapted against "
              f"rotated references {score(rotated, said).cer:.3f}; e.g. {texts[0]!r} -> {said[0]!r}")  # fmt: skip
    return 0


def hearing(args) -> int:
    import torch

    from tests.oracle.hearing import (
        ADAPTER_STEPS,
        HELD_OUT,
        NEW_WORDS,
        TRAIN,
        cached_base,
        cached_hearing_checkpoint,
        generalise_table,
        sentence,
    )

    torch.set_num_threads(args.threads)
    args.steps = args.steps or ADAPTER_STEPS
    work = args.workdir or Path(tempfile.mkdtemp(prefix="generalise-"))
    t0 = time.perf_counter()
    if args.build:
        say = tuple(sentence(w) for w in NEW_WORDS)
        model = cached_hearing_checkpoint(work, say=say, steps=args.base_steps, seed=args.seed, log=print)
    else:
        model = cached_base(work)
    print(f"base {model} ready in {time.perf_counter() - t0:.0f} s: {(model / 'hearing.json').read_text()[:90]!r}")
    print(f"trained on {TRAIN}, {args.steps} steps, {args.threads} threads")
    for seed in args.adapter_seeds:
        t0 = time.perf_counter()
        table = generalise_table(
            model,
            NEW_WORDS,
            TRAIN,
            HELD_OUT,
            work / "hearing-clips",
            Path(tempfile.mkdtemp()),
            steps=args.steps,
            seed=seed,
        )
        print(f"adapter seed {seed}: trained and scored in {time.perf_counter() - t0:.0f} s")
        for name, row in table.items():
            print(f"  held out {name} {HELD_OUT.get(name, '(every clip above)')}: {row}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
