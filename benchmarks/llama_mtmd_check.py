"""Our llama.cpp pair in llama.cpp's own runtime: `llama-mtmd-cli` against our engine, token for token.

CI compares our pair with what llama.cpp's converter writes, key by key and byte by byte
(tests/asr/test_gguf_llama.py). Running `llama-mtmd-cli` needs llama.cpp built (about 15 minutes on 2 idle
cores), so it is this check, run by hand (docs/engine.md, "GGUF"):

    cd "$(python -c 'from tests.oracle.llama_cpp import cache_root; print(cache_root())')"  # or any folder
    pip download --no-binary :all: --no-deps llama-cpp-python==0.3.36 && tar xzf llama_cpp_python-0.3.36.tar.gz
    cd llama_cpp_python-0.3.36/vendor/llama.cpp
    cmake -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF
    cmake --build build --target llama-mtmd-cli
    python benchmarks/llama_mtmd_check.py --cli .../build/bin/llama-mtmd-cli

For each tiny random model (untied and tied) and type (F32, F16, Q8_0, Q4_K) it converts the pair, runs our
engine and `llama-mtmd-cli` greedily on the same clips and prints the two outputs and whether they agree.

What llama.cpp computes differently from the official model (docs/engine.md, "Windows"), and what this check
does about it:
- it keeps ``n // 160 + 1`` mel frames where the official feature extractor keeps ``n // 160``, and pads each
  800-frame window to whole 100-frame chunks, 13 audio tokens per started chunk: a clip of ``100 k - 1``
  official frames has the same number of audio tokens in both (the "aligned" clips below); other lengths
  give llama.cpp more audio tokens than the model was trained with (the "unaligned" clip);
- `llama-mtmd-cli` formats the prompt with the file's ChatML template, which has no system turn when there
  is no system prompt: the check gives it a template (``--jinja --chat-template``) that writes the official
  prompt's empty system turn; and it needs a text prompt beside the audio (without one it waits for a chat
  on its input): the prompt is one space, which the template trims away. So the prompts are the same token
  for token.
Even on aligned clips the last chunk differs by one mel frame (llama.cpp's extra frame where the official
model pads with zeros), and the tiny random model's top two logits lie only ~0.3 apart, so a later token may
part; ggml also quantizes the activations at Q8_0/Q4_K. What the check demands: at F32 and F16 every aligned
clip's first token is ours (a tensor read wrongly changes it at once); it prints how many tokens agree.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SAMPLE_RATE = 16_000
HOP = 160
MAX_NEW = 12
TYPES = ("F32", "F16", "Q8_0", "Q4_K")
EXACT = ("F32", "F16")
# The official prompt (docs/model.md §5): the system turn with the (empty) context, the user turn with the audio.
OFFICIAL_TEMPLATE = (
    "{%- if messages[0]['role'] != 'system' -%}{{- '<|im_start|>system\\n<|im_end|>\\n' -}}{%- endif -%}"
    "{%- for m in messages -%}{{- '<|im_start|>' + m['role'] + '\\n' + (m['content'] | trim) + '<|im_end|>\\n' -}}"
    "{%- endfor -%}{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def clips() -> dict[str, np.ndarray]:
    """Aligned clips (``100 k - 1`` official frames: the same audio-token count in both) and one unaligned."""
    from tests.oracle import synth_audio

    out = {}
    for seconds, frames, seed in ((1.0, 99, 5), (3.0, 299, 21)):
        x = synth_audio(seconds, seed=seed)
        out[f"aligned {frames} frames"] = x[: frames * HOP + HOP // 2]
    out["unaligned 250 frames"] = synth_audio(2.5, seed=21)
    return out


def write_wav(path: Path, samples: np.ndarray) -> None:
    """32-bit float WAV (IEEE float, format 3): the samples reach llama.cpp exactly as our engine gets them."""
    data = samples.astype("<f4").tobytes()
    header = b"RIFF" + (36 + len(data)).to_bytes(4, "little") + b"WAVEfmt "
    header += (16).to_bytes(4, "little") + (3).to_bytes(2, "little") + (1).to_bytes(2, "little")
    header += SAMPLE_RATE.to_bytes(4, "little") + (SAMPLE_RATE * 4).to_bytes(4, "little")
    header += (4).to_bytes(2, "little") + (32).to_bytes(2, "little") + b"data" + len(data).to_bytes(4, "little")
    path.write_bytes(header + data)


def ours(engine, samples: np.ndarray) -> list[bytes]:
    """Our engine's greedy output as each token's raw bytes, up to the first end-of-generation token."""
    from tests.asr.test_gguf_crispasr import token_bytes

    result = engine.pipeline.run(samples, None, "", MAX_NEW)
    ids = [int(i) for i in result.ids]
    stops = {151643, 151645}  # <|endoftext|>, <|im_end|>: llama.cpp's end-of-generation tokens here
    cut = next((k for k, i in enumerate(ids) if i in stops), len(ids))
    return token_bytes(engine, ids[:cut])


def common_tokens(a: list[bytes], b: bytes) -> tuple[int, int]:
    """(how many of our tokens ``a`` llama.cpp's output ``b`` begins with, how many we have)."""
    done, n = b"", 0
    for piece in a:
        if not b.startswith(done + piece):
            break
        done, n = done + piece, n + 1
    return n, len(a)


def theirs(cli: Path, text: Path, mmproj: Path, wav: Path, template: Path) -> bytes:
    cmd = [str(cli), "-m", str(text), "--mmproj", str(mmproj), "--audio", str(wav), "-p", " "]
    cmd += ["--jinja", "--chat-template", template.read_text(), "--temp", "0", "-n", str(MAX_NEW), "-t", "2"]
    cmd += ["--no-warmup"]
    proc = subprocess.run(cmd, capture_output=True, timeout=600, check=False)
    if proc.returncode != 0:
        said = proc.stderr.decode(errors="replace")[-3000:]
        raise RuntimeError(f"llama-mtmd-cli failed ({proc.returncode}):\n{said}")
    out = proc.stdout.rstrip(b"\n")
    return out[1:] if out.startswith(b"\n") else out  # the line break it prints before the answer


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--cli", type=Path, required=True, help="the llama-mtmd-cli binary")
    parser.add_argument("--types", nargs="+", default=list(TYPES), choices=TYPES)
    args = parser.parse_args()

    from dictation.asr import AsrEngine, EngineOptions
    from dictation.asr.tune.convert import convert
    from tests.oracle.checkpoints import cached_checkpoint

    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        template = root / "official.jinja"
        template.write_text(OFFICIAL_TEMPLATE)
        audio = {}
        for name, samples in clips().items():
            audio[name] = (samples, root / f"{name.replace(' ', '-')}.wav")
            write_wav(audio[name][1], samples)
        for tied in (False, True):
            source = cached_checkpoint(root / "ckpt", tie_word_embeddings=tied, audio_layers=4)
            for kind in args.types:
                pair = root / f"m-{tied}-{kind}.gguf"
                text, mmproj = convert(source, "gguf", pair, type_name=kind, gguf_layout="pair")
                single = convert(source, "gguf", root / f"s-{tied}-{kind}.gguf", type_name=kind)[0]
                engine = AsrEngine(EngineOptions(model=str(single), device="cpu", dtype="fp32"))
                engine.prepare()
                for name, (samples, wav) in audio.items():
                    a, b = ours(engine, samples), theirs(args.cli, text, mmproj, wav, template)
                    agree = common_tokens(a, b)
                    if agree[0] == 0 and kind in EXACT and name.startswith("aligned"):
                        failed += 1
                    model = "tied" if tied else "untied"
                    verdict = "same" if b"".join(a) == b else f"the first {agree[0]} of {agree[1]} tokens agree"
                    print(f"{model:6} {kind:5} {name:22} {verdict}\n  ours:   {b''.join(a)!r}\n  theirs: {b!r}")
    print(
        f"{failed} aligned F32/F16 run(s) differ from the first token"
        if failed
        else "every aligned F32/F16 run begins with our first token"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
