"""llama.cpp's own converter (``convert_hf_to_gguf.py`` with its ``gguf-py``), run on our tiny checkpoints.

The converter is plain Python inside PyPI's ``llama-cpp-python`` sdist (``vendor/llama.cpp``); a test extra
cannot install a script from inside an sdist, so ``llama_cpp_tree()`` fetches the sdist once with pip
(``pip download --no-binary :all: --no-deps``, about two minutes: pip prepares the sdist's metadata) and
keeps only the converter's files under a cache folder, ``$DICTATION_TEST_CACHE`` or
``.pytest_cache/d/dictation-tests`` in the checkout (reused by later runs; CI reaches PyPI).
``$DICTATION_LLAMA_CPP`` may name a llama.cpp source tree instead. The converter needs torch, numpy,
transformers and sentencepiece (the test extra).

``gguf_entries(path)`` reads a GGUF file's metadata as (value type, raw value bytes) per key and its
tensor table with the raw tensor bytes, so two files compare exactly (types included) without gguf-py's
reader, which takes ~7 s per file to index a Qwen vocabulary.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import numpy as np

from dictation.asr.checkpoints.gguf.reader import SUPPORTED_TYPES, read_gguf_file
from tests import KEPT, lanes

LLAMA_CPP_PYTHON = "0.3.36"  # its vendor/llama.cpp registers Qwen3ASRForConditionalGeneration
_KEEP = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/", "LICENSE")


def cache_root() -> Path:
    """``$DICTATION_TEST_CACHE``, or a folder in this checkout's pytest cache (kept between runs; never
    the user's own ~/.cache: the tests run with a home of their own, tests/conftest.py)."""
    return Path(os.environ.get("DICTATION_TEST_CACHE") or KEPT / "dictation-tests")


def llama_cpp_tree() -> Path:
    """A llama.cpp tree holding ``convert_hf_to_gguf.py``, ``conversion/`` and ``gguf-py/``."""
    given = os.environ.get("DICTATION_LLAMA_CPP")
    if given:
        return Path(given)
    tree = cache_root() / f"llama-cpp-python-{LLAMA_CPP_PYTHON}" / "llama.cpp"
    if (tree / "convert_hf_to_gguf.py").is_file():
        return tree
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-binary", ":all:", "--no-deps"]
        cmd += ["-d", tmp, f"llama-cpp-python=={LLAMA_CPP_PYTHON}"]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"pip download llama-cpp-python=={LLAMA_CPP_PYTHON} failed:\n{proc.stderr[-2000:]}")
        (sdist,) = Path(tmp).glob("llama_cpp_python-*.tar.gz")
        staging = Path(tmp) / "tree"
        with tarfile.open(sdist) as tar:
            for member in tar.getmembers():
                parts = member.name.split("/vendor/llama.cpp/", 1)
                if len(parts) == 2 and member.isfile() and parts[1].startswith(_KEEP):
                    member.name = parts[1]
                    tar.extract(member, staging, filter="data")
        tree.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tree, ignore_errors=True)
        shutil.move(str(staging), tree)
    return tree


_DRIVER = """
import os, runpy, sys
script, jobs = sys.argv[1], sys.argv[2:]
sys.path.insert(0, os.path.dirname(script))
for job in jobs:
    model, out, outtype, mmproj = job.split("|")
    sys.argv = [script, model, "--outfile", out, "--outtype", outtype] + (["--mmproj"] if mmproj else [])
    runpy.run_path(script, run_name="__main__")
"""


def run_converter(tree: Path, jobs: list[tuple[Path, Path, str, bool]]) -> None:
    """``convert_hf_to_gguf.py MODEL --outfile OUT --outtype T [--mmproj]`` for each (MODEL, OUT, T, mmproj), in
    one process (torch and transformers are imported once)."""
    args = [f"{model}|{out}|{outtype}|{'1' if mmproj else ''}" for model, out, outtype, mmproj in jobs]
    cmd = [sys.executable, "-c", _DRIVER, str(tree / "convert_hf_to_gguf.py"), *args]
    with lanes.one_big_child_at_a_time():
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"llama.cpp's converter failed:\n{proc.stderr[-3000:]}")


_SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # GGUF value type -> bytes
_STRING, _ARRAY = 8, 9


def _skip_value(buf: bytes, pos: int, vtype: int) -> int:
    if vtype == _STRING:
        return pos + 8 + struct.unpack_from("<Q", buf, pos)[0]
    if vtype == _ARRAY:
        item, count = struct.unpack_from("<IQ", buf, pos)
        pos += 12
        if item in _SCALAR:
            return pos + _SCALAR[item] * count
        for _ in range(count):
            pos = _skip_value(buf, pos, item)
        return pos
    return pos + _SCALAR[vtype]


def gguf_entries(path: Path) -> tuple[dict[str, tuple[int, bytes]], dict[str, tuple[tuple[int, ...], str, bytes]]]:
    """(metadata key -> (value type, raw value bytes), tensor name -> (shape, type name, raw bytes))."""
    buf = Path(path).read_bytes()
    n_kv = struct.unpack_from("<Q", buf, 16)[0]
    pos, meta = 24, {}
    for _ in range(n_kv):
        n = struct.unpack_from("<Q", buf, pos)[0]
        key = buf[pos + 8 : pos + 8 + n].decode("utf-8")
        vtype = struct.unpack_from("<I", buf, pos + 8 + n)[0]
        start = pos + 12 + n
        pos = _skip_value(buf, start, vtype)
        meta[key] = (vtype, buf[start:pos])
    parsed = read_gguf_file(path)
    tensors = {}
    for name, t in parsed.tensors.items():
        raw = np.asarray(parsed.raw(t, SUPPORTED_TYPES[t.ggml_type])).tobytes()
        tensors[name] = (t.shape, t.type_name, raw)
    return meta, tensors
