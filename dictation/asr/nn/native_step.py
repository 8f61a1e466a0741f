"""The native CPU decode step of an int8 decoder (docs/engine.md, "The native CPU step").

A decode step on the CPU reads every weight once; through torch an int8 step is bound by torch's
weight-only int8 kernel (its arithmetic, not the memory) and ~90 small operators a layer. The C
source beside this module (``native/decode_step.c``) runs all layers in one OpenMP region: int8
matrix-vector products that stream their rows, and the norms, RoPE, the cache write, attention and
SiLU as loops between them. The output head stays the model's (the int8 table, nn/int8_table.py).

The library is compiled on this machine at its first use (about a second with gcc; ``-march=native``)
into the user's cache folder, keyed by the source, the compiler and the CPU, and loaded with ctypes.
It links OpenMP by soname, so it runs on the runtime torch has already loaded and shares its
threads and ``torch.set_num_threads``. Without a C compiler, or where the build fails, the step
stays torch's (logged once).

Numerics: weight-only int8 with a float32 scale per output row, as ``Int8Linear``; activations, the
residual stream and every sum in float32 (the torch step rounds them to bf16 between operators).
The KV cache keeps the model's dtype, written rounded to nearest even as torch stores it, so the
prefill, draft checks and this step share one cache.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

from dictation import spawn
from dictation.asr.nn import quantized

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("native") / "decode_step.c"
FLAGS = ("-O3", "-march=native", "-fPIC", "-shared", "-fopenmp", "-fno-math-errno")


class _Layer(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_void_p)
        for name in ("wqkv", "sqkv", "wo", "so", "wgu", "sgu", "wd", "sd", "ln1", "ln2", "qn", "kn", "kc", "vc")
    ]


class _Dims(ctypes.Structure):
    _fields_ = [
        *((name, ctypes.c_int) for name in ("hidden", "inter", "heads", "kv_heads", "head_dim", "max_len")),
        ("cache_bf16", ctypes.c_int),
        ("eps", ctypes.c_float),
    ]


_lock = threading.Lock()
_library: ctypes.CDLL | None = None
_failed: str | None = None


def cache_folder() -> Path:
    """Where compiled libraries are kept: ``$XDG_CACHE_HOME/dictation/native`` (0700)."""
    import platformdirs

    app = Path(platformdirs.user_cache_dir("dictation", appauthor=False))
    app.parent.mkdir(parents=True, exist_ok=True)
    folder = app / "native"
    for part in (app, folder):  # the app's cache folder too, where this is the first to make it
        part.mkdir(mode=0o700, exist_ok=True)
    os.chmod(folder, 0o700)  # whatever the umask took off, or an older folder left open
    return folder


def compiler() -> str | None:
    """The C compiler to build with: ``$CC``, else gcc or cc on the PATH."""
    return os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")


def _cpu_key() -> str:
    """What ``-march=native`` depends on: the CPU's model and flags (a cache folder shared between
    machines then never hands one a library built for another's instructions)."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return platform.processor() or platform.machine()
    lines = [line for line in text.splitlines() if line.startswith(("model name", "flags"))]
    return "\n".join(sorted(set(lines)))


def library_path(cc: str) -> Path:
    digest = hashlib.sha256()
    for part in (SOURCE.read_bytes(), cc.encode(), " ".join(FLAGS).encode(), _cpu_key().encode()):
        digest.update(part)
        digest.update(b"\0")
    return cache_folder() / f"decode_step-{digest.hexdigest()[:16]}.so"


def build(cc: str, target: Path, extra: tuple[str, ...] = ()) -> None:
    """Compile the source into ``target`` (written beside it, then renamed: two processes building at
    once each end with a whole file). ``extra``: flags after :data:`FLAGS` (the tests build the AVX2
    and the plain C loops with ``-mno-avx512f`` / ``-mno-avx2``). Raises RuntimeError with the
    compiler's message."""
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        argv = [cc, *FLAGS, *extra, str(SOURCE), "-o", tmp, "-lm"]
        done = spawn.run(argv, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{cc} failed on {SOURCE.name}: {done.stderr.strip()[-2000:]}")
        os.chmod(tmp, 0o600)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def library() -> ctypes.CDLL | None:
    """The compiled step, built at the first call of the process if it is not in the cache; None where
    it cannot be (no compiler, a failed build: :func:`unavailable` says why)."""
    global _library, _failed
    with _lock:
        if _library is not None or _failed is not None:
            return _library
        try:
            if platform.system() != "Linux":
                raise RuntimeError(f"built only on Linux (this is {platform.system()})")
            cc = compiler()
            if cc is None:
                raise RuntimeError("no C compiler (gcc or cc) on the PATH; set CC to use another")
            path = library_path(cc)
            if not path.exists():
                build(cc, path)
            _library = load(path)
        except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
            _failed = str(exc)
            log.info("native CPU decode step unavailable, the torch step runs instead: %s", exc)
        return _library


def load(path: Path) -> ctypes.CDLL:
    """A built library, its functions typed."""
    lib = ctypes.CDLL(str(path))
    lib.decoder_step.restype = None
    pointer, count = ctypes.c_void_p, ctypes.c_int
    # layers, n_layers, dims, h, cos, sin, position, scratch
    lib.decoder_step.argtypes = [
        pointer,
        count,
        ctypes.POINTER(_Dims),
        pointer,
        pointer,
        pointer,
        count,
        pointer,
    ]
    lib.int8_gemv.restype = None
    lib.int8_gemv.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int] * 2
    lib.omp_threads.restype = ctypes.c_int
    lib.omp_threads.argtypes = []
    lib.scratch_floats.restype = ctypes.c_size_t
    lib.scratch_floats.argtypes = [ctypes.POINTER(_Dims)]
    return lib


def unavailable() -> str | None:
    """Why :func:`library` gave None (after it was called), else None."""
    return _failed


def int8_gemv(
    weight: torch.Tensor,
    scale: torch.Tensor,
    x: torch.Tensor,
    out: torch.Tensor | None = None,
    lib: ctypes.CDLL | None = None,
) -> torch.Tensor:
    """``weight [n, k]`` int8 with ``scale [n]`` float32 times ``x [k]`` float32 → ``[n]`` float32 (into
    ``out`` if given), through the library's matrix-vector product: the int8 output head
    (nn/int8_table.py), the tests and the bandwidth check. ``lib``: another build (the tests')."""
    lib = lib or library()
    if lib is None:
        raise RuntimeError(f"the native CPU step is unavailable: {_failed}")
    n, k = weight.shape
    out = torch.empty(n, dtype=torch.float32) if out is None else out
    for t, dtype, shape in (
        (weight, torch.int8, (n, k)),
        (scale, torch.float32, (n,)),
        (x, torch.float32, (k,)),
        (out, torch.float32, (n,)),
    ):
        if t.dtype != dtype or not t.is_contiguous() or t.device.type != "cpu" or tuple(t.shape) != shape:
            raise ValueError(f"int8_gemv needs contiguous CPU {dtype} {shape}, got {t.dtype} {tuple(t.shape)}")
    lib.int8_gemv(weight.data_ptr(), scale.data_ptr(), x.data_ptr(), out.data_ptr(), n, k)
    return out


def _int8_fused(group) -> quantized.Int8Linear | None:
    fusion = group.fusion
    layer = None if fusion is None else fusion.layer
    return layer if type(layer) is quantized.Int8Linear else None


def _plain_int8(layer) -> bool:
    """An Int8Linear whose weight the step can point at as it is (a copy would double it)."""
    return type(layer) is quantized.Int8Linear and layer.weight.is_contiguous()


def eligible(model) -> bool:
    """Whether ``model``'s decoder can run the native step: on the CPU, every layer's q/k/v and
    gate/up fused int8 and o/down plain int8 (no unmerged adapter), float norms, a bf16 or float32
    cache. Fusions must be current (``AsrModel.sync_weights``)."""
    decoder = model.decoder
    if model.device.type != "cpu" or model.dtype not in (torch.bfloat16, torch.float32):
        return False
    for layer in decoder.layers:
        attn, mlp = layer.self_attn, layer.mlp
        layers = (_int8_fused(attn), attn.o_proj, _int8_fused(mlp), mlp.down_proj)
        if not all(_plain_int8(m) for m in layers):
            return False
    return True


class NativeStep:
    """The step's inputs for one model and one cache: pointers to every layer's int8 weights, scales,
    float32 copies of the norm weights, the cache, and scratch. Valid for one pass (``AsrModel``
    builds one at a pass's first step) while the cache is :attr:`cache_ptrs`."""

    def __init__(self, model, lib: ctypes.CDLL) -> None:
        cfg = model.decoder.cfg
        cache = model.cache
        self.lib = lib
        self.cache_ptrs = (cache.keys.data_ptr(), cache.values.data_ptr())
        self.dims = _Dims(
            cfg.hidden_size,
            cfg.intermediate_size,
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
            cache.max_len,
            int(cache.keys.dtype == torch.bfloat16),
            float(cfg.rms_norm_eps),
        )
        self._keep: list[torch.Tensor] = []  # everything a pointer below points into
        layers = (_Layer * len(model.decoder.layers))()
        for i, layer in enumerate(model.decoder.layers):
            attn, mlp = layer.self_attn, layer.mlp
            keys, values = cache.layer(i)
            tensors = {
                "wqkv": _int8_fused(attn).weight,
                "sqkv": _int8_fused(attn).weight_scale,
                "wo": attn.o_proj.weight,
                "so": attn.o_proj.weight_scale,
                "wgu": _int8_fused(mlp).weight,
                "sgu": _int8_fused(mlp).weight_scale,
                "wd": mlp.down_proj.weight,
                "sd": mlp.down_proj.weight_scale,
                "ln1": layer.input_layernorm.weight,
                "ln2": layer.post_attention_layernorm.weight,
                "qn": attn.q_norm.weight,
                "kn": attn.k_norm.weight,
                "kc": keys,
                "vc": values,
            }
            for name, t in tensors.items():
                if t.dtype == torch.int8 and not t.is_contiguous():
                    raise RuntimeError(f"layer {i}'s {name} is not contiguous (eligible() checks it)")
                if name not in ("kc", "vc") and t.dtype != torch.int8:
                    t = t.detach().float()  # scales as they are (float32), norms in float32
                t = t if t.is_contiguous() else t.contiguous()
                if name in ("kc", "vc") and t.data_ptr() != tensors[name].data_ptr():
                    raise RuntimeError("the KV cache must be contiguous per layer for the native step")
                self._keep.append(t)
                setattr(layers[i], name, t.data_ptr())
        self.layers = layers
        self.scratch = torch.empty(int(lib.scratch_floats(ctypes.byref(self.dims))), dtype=torch.float32)
        self.h = torch.empty(cfg.hidden_size, dtype=torch.float32)

    def run(self, h: torch.Tensor, cos_row: torch.Tensor, sin_row: torch.Tensor, position: int) -> torch.Tensor:
        """``h [hidden]`` (the token's embedding) through every layer at ``position`` → ``[hidden]``
        float32 (before the final norm). ``cos_row``/``sin_row`` float32 ``[head_dim]``."""
        if not 0 <= position < self.dims.max_len:
            raise RuntimeError(f"KV cache overflow: position {position} of {self.dims.max_len}")
        self.h.copy_(h.reshape(-1))
        self.lib.decoder_step(
            ctypes.addressof(self.layers),
            len(self.layers),
            ctypes.byref(self.dims),
            self.h.data_ptr(),
            cos_row.data_ptr(),
            sin_row.data_ptr(),
            position,
            self.scratch.data_ptr(),
        )
        return self.h
