"""Writing converted checkpoints: outputs that appear whole or not at all, and a streaming safetensors writer.

Every output is written under a temporary name beside its destination (``.<name>.partial-<pid>``) and
renamed at the end, so an error, a full disk or an interruption leaves nothing at the destination; an
existing destination is refused (never overwritten), also when it appears while the output is written.

``write_safetensors`` writes a ``.safetensors`` file one tensor at a time (the header first, from the
names, dtypes and shapes), so a conversion holds one tensor in memory, not the model. Its bytes are
those the ``safetensors`` package writes for the same tensors and metadata: tensors ordered by dtype as
the library orders them (wider and floating first), then by name, the header as compact JSON padded
with spaces to a multiple of 8, the metadata keys in the order given (the library's order of several keys
varies from run to run). So a file converted to another layout and back is the file it was.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import shutil
import struct
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import torch

from dictation.asr.errors import ModelError

log = logging.getLogger(__name__)

ST_DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}
ST_DTYPES |= {torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8"}
ST_DTYPES |= {torch.bool: "BOOL"}
# The safetensors library writes tensors in descending order of its dtype enum, then by name.
_DTYPE_ORDER = ("U64", "I64", "F64", "F32", "U32", "I32", "BF16", "F16", "U16", "I16")
_DTYPE_ORDER += ("F8_E8M0", "F8_E4M3", "F8_E5M2", "I8", "U8", "F6_E3M2", "F6_E2M3", "F4", "BOOL")


def refuse_existing(path: Path, error: type[Exception] = ModelError) -> None:
    """Raise ``error`` if ``path`` exists (a file, a link or a folder, even an empty one)."""
    if os.path.lexists(path):
        raise error(f"{path}: already exists; choose a new output path (nothing is overwritten)")


def _temporary(path: Path) -> Path:
    return path.with_name(f".{path.name}.partial-{os.getpid()}")


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


@contextlib.contextmanager
def atomic_outputs(
    paths: Sequence[Path], *, folders: bool = False, error: type[Exception] = ModelError
) -> Iterator[list[Path]]:
    """Temporary paths for ``paths`` (files, or empty folders with ``folders``), renamed onto them at the
    end; removed on any error. A destination that exists before or at the end is refused. A full disk
    becomes ``error`` naming the destination."""
    paths = [Path(p).expanduser().absolute() for p in paths]
    for path in paths:
        refuse_existing(path, error)
        path.parent.mkdir(parents=True, exist_ok=True)
    temps = [_temporary(p) for p in paths]
    for tmp in temps:
        _remove(tmp)
        if folders:
            tmp.mkdir()
    done: list[Path] = []
    try:
        yield temps
        for tmp, path in zip(temps, paths, strict=True):
            refuse_existing(path, error)
            os.rename(tmp, path)  # same folder: atomic
            done.append(path)
    except OSError as exc:
        for p in (*temps, *done):
            _remove(p)
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise error(
                f"{paths[0]}: not written, the disk is full ({exc.strerror}); nothing was left behind"
            ) from None
        raise error(f"{paths[0]}: cannot be written ({exc.strerror or exc})") from None
    except BaseException:
        for p in (*temps, *done):
            _remove(p)
        raise


def tensor_bytes(tensor: torch.Tensor) -> memoryview:
    """The tensor's bytes in memory order (little-endian), without a copy when it is contiguous."""
    t = tensor.detach().contiguous().cpu()
    return memoryview(t.reshape(-1).view(torch.uint8).numpy()) if t.numel() else memoryview(b"")


def _fused_members() -> dict[str, int]:
    """The decoder's projections that run fused, each with its place in its group's fused row order."""
    from dictation.asr.nn.decoder import MLP, Attention

    return {name: i for group in (Attention.GROUP, MLP.GROUP) for i, name in enumerate(group)}


def fused_order_key(name: str) -> str:
    """A sort key that puts each fused group's members next to each other, in the fused order, per stored
    tensor: ``...self_attn.{q,k,v}_proj.weight`` become consecutive, and so do their scales. A file written
    in this order lets the loader map each group's rows as one tensor (safetensors._map_run)."""
    members = _fused_members()
    parts = name.split(".")
    for i, part in enumerate(parts):
        if part in members:
            return ".".join([*parts[:i], "\x00fused", *parts[i + 1 :], str(members[part])])
    return name


def write_safetensors(
    path: Path,
    specs: Sequence[tuple[str, str, tuple[int, ...]]],
    produce: Callable[[str], torch.Tensor],
    metadata: dict[str, str] | None = None,
    on_tensor: Callable[[str], None] | None = None,
    fused_adjacent: bool = False,
) -> None:
    """Write ``path`` from ``specs`` (name, safetensors dtype, shape): ``produce(name)`` gives each tensor,
    one at a time, in the file's order; it must have the announced dtype and shape. ``fused_adjacent``:
    within a dtype, names are ordered by :func:`fused_order_key` instead of as the ``safetensors``
    package orders them (any order of the data is valid safetensors; the header gives the offsets)."""
    named = fused_order_key if fused_adjacent else str
    order = sorted(specs, key=lambda s: (_DTYPE_ORDER.index(s[1]), named(s[0])))
    header: dict[str, object] = {}
    if metadata:
        header["__metadata__"] = metadata
    offset = 0
    sizes = {}
    for name, dtype, shape in order:
        n = _numel(shape) * _itemsize(dtype)
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        sizes[name] = n
        offset += n
    raw = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for name, dtype, shape in order:
            tensor = produce(name)
            if ST_DTYPES.get(tensor.dtype) != dtype or tuple(tensor.shape) != tuple(shape):
                raise ValueError(f"{name}: produced {tensor.dtype} {tuple(tensor.shape)}, announced {dtype} {shape}")
            data = tensor_bytes(tensor)
            assert len(data) == sizes[name]
            f.write(data)
            if on_tensor is not None:
                on_tensor(name)


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _itemsize(dtype: str) -> int:
    return {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "BF16": 2, "F16": 2, "I16": 2, "U16": 2}.get(
        dtype, 1
    )
