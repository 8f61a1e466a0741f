"""Locating, reading, validating and mapping a checkpoint's safetensors tensors.

Our modules carry the checkpoint's names (docs/architecture.md, principle 5), so loading is a prefix map (the table
is in ``checkpoints/locate.py``, which also finds the files and reads their headers without torch).

Loading is strict: a missing, unexpected or mis-shaped tensor is an error naming the file, the
tensor, and the expected and actual shapes. Pickle checkpoints are refused.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from dictation.asr.checkpoints.locate import (
    INDEX_FILE,
    PICKLE_SUFFIXES,
    CheckpointFiles,
    check_sizes,
    checkpoint_name,
    locate,
)
from dictation.asr.checkpoints.tensor_reader import TensorReader
from dictation.asr.config import AsrConfig
from dictation.asr.errors import ModelError, WeightsError
from dictation.asr.heap import release_freed_memory
from dictation.asr.nn.model import AsrModel

log = logging.getLogger(__name__)

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def load_model(
    folder: Path,
    cfg: AsrConfig,
    device: torch.device,
    dtype: torch.dtype,
    *,
    quantize: str | None = None,
    group_size: int | None = None,
    compact: bool = False,
    mapped: tuple[str, ...] = (),
) -> AsrModel:
    """Build the model without initialising it, then fill every parameter from the checkpoint.

    A pre-quantized folder (``cfg.quantization`` set from config.json's ``quantization_config``) gets
    the decoder's linear layers as empty Int8Linear / Int4Linear first, so their int8 / uint8 / float32
    tensors load as stored; every floating tensor loads into ``dtype``.

    ``quantize`` ("int8" / "int4", a float folder only): the decoder's linear layers are quantized as
    they are read, one stored tensor at a time, from the tensor cast to ``dtype`` (what
    ``quantize_model`` on the model loaded in ``dtype`` gives, bit for bit); no float copy of them is
    ever allocated, so the peak memory of a load-time quantization is the quantized model plus one
    layer (docs/engine.md, "CPU memory").

    ``compact`` (float32 on the CPU): each audio-encoder linear layer and the embedding table / output
    head is held in float16 (nn/compact.py) as soon as its last tensor is read, where float16 holds it
    exactly; their float32 copies never coexist.

    ``mapped``: prefixes of the model's tensor names that may be the file's own pages where held as
    stored (TensorReader.map_run; "" any; by default none: every tensor is a copy).

    Nothing is allocated before config.json's sizes are checked against the files' headers (layer
    counts, then every tensor's shape), and every floating tensor is checked for NaN and infinity on
    the device it lands on (one reduction per tensor, read once at the end).
    """
    files = locate(folder)
    headers = files.headers()
    check_sizes(files, headers, cfg)  # before the model is built: its size follows from the config
    with torch.device("meta"):
        model = AsrModel(cfg)
    quantized: set[str] = set()
    if cfg.quantization is not None:
        from dictation.asr.nn.quant_format import DEFAULT_GROUP_SIZE
        from dictation.asr.nn.quant_swap import empty_quantized

        q = cfg.quantization
        for name in empty_quantized(model, q["variant"], group_size=q.get("group_size") or DEFAULT_GROUP_SIZE):
            quantized.update(f"{name}.{buf}" for buf, _ in model.get_submodule(name).named_buffers())
    wanted, ignored = match_tensors(files, cfg, model.state_dict(), tied=model.lm_head is None)
    shapes = {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}  # meta: nothing allocated
    for ckpt_name, ours in wanted.items():
        if tuple(headers[ckpt_name].shape) != shapes[ours]:
            raise WeightsError(
                f"{files.tensor_files[ckpt_name]}: tensor {ckpt_name} has shape {tuple(headers[ckpt_name].shape)}, "
                f"expected {shapes[ours]}"
            )
    at_load = _quantize_at_load(model, cfg, quantize, group_size)  # weight name -> empty quantized module
    model = allocate(model.to(dtype), device)
    model.eval().requires_grad_(False)
    model.decoder.allocate_fused()  # q/k/v and gate/up load straight into their fused tensors
    expected = {name: tensor for name, tensor in model.state_dict().items()}
    variant = cfg.quantization["variant"] if cfg.quantization else ""
    finite: list[tuple[Path, str, torch.Tensor]] = []  # (file, tensor, a 0-d bool on the device)
    pending = _compactable(model) if compact and device.type == "cpu" and dtype == torch.float32 else {}

    by_file: dict[Path, list[str]] = {}
    for ckpt_name in wanted:
        by_file.setdefault(files.tensor_files[ckpt_name], []).append(ckpt_name)
    stored_as = {ours: ckpt_name for ckpt_name, ours in wanted.items()}
    runs = _shared_runs(expected)
    filled: set[str] = set()  # tensors filled with another one (a fused group mapped at once)
    for path, names in by_file.items():
        with TensorReader(path) as f:
            for ckpt_name in names:
                ours = wanted[ckpt_name]
                if ours in filled:
                    continue
                shape = f.shape(ckpt_name)
                if shape != shapes[ours]:
                    raise WeightsError(f"{path}: tensor {ckpt_name} has shape {shape}, expected {shapes[ours]}")
                held = [] if ours in at_load else _fill_as_stored(model, f, ours, stored_as, expected, runs, mapped)
                for name in held:  # stored as held: mapped (no copy at all), or read into the model's tensor
                    if expected[name].is_floating_point():
                        finite.append((path, stored_as[name], _finite(expected[name], name, pending)))
                    _compact_when_read(model, name, pending, expected, f.dtype(stored_as[name]))
                    filled.add(name)
                if held:
                    continue
                if _table_in_half(ours, pending) and (half := f.read_as_half(ckpt_name)) is not None:
                    table, flag, largest = half
                    pending[ours][3]["max_abs"] = largest
                    if _compacted_from(model, ours, pending, expected, table, stored=f.dtype(ckpt_name)):
                        finite.append((path, ckpt_name, flag))
                        continue
                    del table  # not compacted after all (no float16 product here): read as stored below
                tensor = f.get_tensor(ckpt_name)
                if tensor.dtype not in FLOAT_DTYPES and ours not in quantized:
                    raise WeightsError(
                        f"{path}: tensor {ckpt_name} is {tensor.dtype}; only bf16/fp16/fp32 checkpoints load here"
                        + _unmarked_hint(tensor.dtype, cfg)
                    )
                if ours in at_load:  # quantized now from the weight as the float model would hold it
                    weight = tensor.to(device=device, dtype=dtype)
                    del tensor
                    finite.append((path, ckpt_name, finite_flag(weight)))
                    at_load[ours].load_float(weight)
                    del weight
                    continue
                if ours in pending:
                    flag = _finite(tensor, ours, pending)
                    if _compacted_from(model, ours, pending, expected, tensor):
                        finite.append((path, ckpt_name, flag))
                        continue
                target = expected[ours]
                if ours in quantized and tensor.dtype != target.dtype:
                    raise WeightsError(
                        f"{path}: tensor {ckpt_name} is {tensor.dtype}, expected {target.dtype} "
                        f"in a {variant} quantized folder"
                    )
                target.copy_(tensor)
                stored = tensor.dtype
                del tensor
                if target.is_floating_point():
                    finite.append((path, ckpt_name, flag if ours in pending else finite_flag(target)))
                del target
                _compact_when_read(model, ours, pending, expected, stored)
    check_finite(finite)
    if ignored:
        _log_tied_head(files.tensor_files[ignored[0]], ignored[0], model)
    # Non-persistent buffers were left uninitialised by to_empty(); compute them now.
    model.audio_tower.reset_buffers()
    return model


def _fill_as_stored(
    model: AsrModel,
    f: TensorReader,
    name: str,
    stored_as: dict[str, str],
    expected: dict,
    runs: dict,
    mapped: tuple[str, ...],
) -> list[str]:
    """Fill the model's tensor ``name`` from the file where the model holds it exactly as stored (dtype,
    shape, contiguous on the CPU) and return the names filled, or [] for the caller's other ways:
    - a tensor that shares its storage with others (the rows of a fused q/k/v or gate/up tensor,
      TextDecoder.allocate_fused) is mapped with all of them at once when they are stored one after
      the other in the storage's order (what write_model_folder writes);
    - a tensor of its own is mapped (TensorReader.map_run);
    - otherwise it is read straight into the model's tensor (one copy, no intermediate)."""
    target = expected[name]
    if target.device.type != "cpu" or target.dtype != f.dtype(stored_as[name]) or not target.is_contiguous():
        return []
    if tuple(target.shape) != f.shape(stored_as[name]):
        return []
    members = runs.get(name)  # None: it shares its storage in a way a mapping cannot (read into it)
    if members is not None and not all(m.startswith(mapped) for m in members):
        members = None  # to be a copy (EngineOptions.map_weights)
    if members is not None and all(m in stored_as and f.has(stored_as[m]) for m in members):
        flat = f.map_run([stored_as[m] for m in members])
        if flat is not None:
            start = 0
            for m in members:
                part = flat[start : start + expected[m].numel()].view(expected[m].shape)
                module_name, _, attr = m.rpartition(".")
                getattr(model.get_submodule(module_name), attr).data = part  # the same Parameter / buffer
                expected[m] = part
                start += part.numel()
            return members
    return [name] if f.read_into(stored_as[name], target) else []


def _shared_runs(expected: dict[str, torch.Tensor]) -> dict[str, list[str]]:
    """Tensor name -> the names of every tensor in its storage, in the storage's order, where several
    contiguous tensors fill one storage exactly (fused rows); a tensor alone in its storage: itself."""
    by_storage: dict[int, list[str]] = {}
    for name, t in expected.items():
        if t.device.type == "cpu":
            by_storage.setdefault(t.untyped_storage().data_ptr(), []).append(name)
    runs: dict[str, list[str]] = {}
    for names in by_storage.values():
        names.sort(key=lambda n: expected[n].storage_offset())
        offset, whole = 0, expected[names[0]].untyped_storage().nbytes()
        for n in names:
            t = expected[n]
            if not t.is_contiguous() or t.storage_offset() != offset or t.dtype != expected[names[0]].dtype:
                break
            offset += t.numel()
        else:
            if offset * expected[names[0]].element_size() == whole:
                runs.update({n: names for n in names})
    return runs


def _compactable(model: AsrModel) -> dict[str, tuple[str, list[str], set[str], dict]]:
    """Tensor name -> (its module, the module's tensors, those still to read, what is known of its
    weight: "stored" dtype, "max_abs"), for nn/compact.py's modules."""
    from dictation.asr.nn.compact import compactable

    pending: dict[str, tuple[str, list[str], set[str], dict]] = {}
    for module, tensors in compactable(model).items():
        entry = (module, tensors, set(tensors), {})
        pending.update({t: entry for t in tensors})
    return pending


def _finite(tensor: torch.Tensor, name: str, pending: dict) -> torch.Tensor:
    """:func:`finite_flag`, keeping the largest magnitude for a compactable weight (float16's range,
    the float16 head's error bound: nn/compact.py) from the same pass."""
    low, high = torch.aminmax(tensor)
    if name in pending and name.endswith(".weight"):
        pending[name][3]["max_abs"] = max(-float(low), float(high))
    return low.isfinite() & high.isfinite()


def _compact_when_read(model: AsrModel, name: str, pending: dict, expected: dict, stored: torch.dtype) -> None:
    """Once every tensor of ``name``'s module is read, hold the module in float16 (where it can be) and
    drop its float32 tensors from ``expected``, so they are freed now."""
    if name not in pending:
        return
    module, tensors, left, known = pending.pop(name)
    left.discard(name)
    if name.endswith(".weight"):
        known["stored"] = stored
    if left:
        return
    from dictation.asr.nn.compact import compact_module

    if compact_module(model, module, **_exactly_held(known)):
        for n in tensors:
            expected.pop(n, None)
        release_freed_memory()  # the float32 copy just dropped: kept by glibc's heap otherwise


def _exactly_held(known: dict) -> dict:
    """compact_module's arguments from what the read told: a weight stored in 16 bits, of known
    magnitude, is held by float16 exactly when it is within float16's range."""
    if known.get("stored") not in (torch.float16, torch.bfloat16) or "max_abs" not in known:
        return {}
    return {"exact": known["max_abs"] < 65504, "max_abs": known["max_abs"]}


def _table_in_half(name: str, pending: dict) -> bool:
    """Whether ``name`` is the embedding table / output head, its module's last tensor to read, and this
    CPU has the float16 product: it is then read straight into float16, piece by piece."""
    if name not in ("decoder.embed_tokens.weight", "lm_head.weight") or name not in pending:
        return False
    from dictation.asr.nn.compact import half_matmul_usable

    return pending[name][2] == {name} and half_matmul_usable()


def _compacted_from(
    model: AsrModel,
    name: str,
    pending: dict,
    expected: dict,
    tensor: torch.Tensor,
    stored: torch.dtype | None = None,
) -> bool:
    """Compact ``name``'s module straight from the 16-bit ``tensor`` as read, when it is the module's only
    tensor left to read (a table; a layer whose bias came first): its float32 copy is never written.
    ``stored``: the dtype in the file when ``tensor`` is already its float16 copy. True if done."""
    if name not in pending or pending[name][2] != {name} or not name.endswith(".weight"):
        return False
    known = {**pending[name][3], "stored": stored or tensor.dtype}
    if tensor.dtype not in (torch.float16, torch.bfloat16):
        return False
    from dictation.asr.nn.compact import compact_module

    if not compact_module(model, pending[name][0], weight=tensor, **_exactly_held(known)):
        return False
    del pending[name], expected[name]
    release_freed_memory()
    return True


def allocate(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """``model.to_empty(device=device)`` without its ``empty_like`` on meta tensors, whose first call
    imports sympy (torch.fx's symbolic shapes): about a second of every load, for nothing. The
    strides are kept (the encoder's channels-last conv weights)."""
    return model._apply(lambda t: torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=device))


def _quantize_at_load(model: AsrModel, cfg: AsrConfig, variant: str | None, group_size: int | None) -> dict:
    """Swap the (meta) model's quantizable decoder linears for empty quantized ones when ``variant`` asks
    for load-time quantization of a float folder; returns {float weight name: the new module}."""
    if variant is None or cfg.quantization is not None:
        return {}
    from dictation.asr.nn.quant_format import DEFAULT_GROUP_SIZE
    from dictation.asr.nn.quant_swap import empty_quantized

    names = empty_quantized(model, variant, group_size=group_size or DEFAULT_GROUP_SIZE)
    return {f"{name}.weight": model.get_submodule(name) for name in names}


def finite_flag(tensor: torch.Tensor) -> torch.Tensor:
    """A 0-d bool on the tensor's device: no NaN or infinity in it. The minimum and the maximum carry
    both (NaN propagates, -inf is the minimum, inf the maximum): one pass that allocates nothing the
    tensor's size, 30-50x faster than isfinite().all() on the CPU and never overflowing, unlike a
    half-precision sum."""
    if tensor.numel() == 0:
        return torch.ones((), dtype=torch.bool, device=tensor.device)
    low, high = torch.aminmax(tensor)
    return low.isfinite() & high.isfinite()


def check_finite(flags: list[tuple[Path, str, torch.Tensor]]) -> None:
    """Raise WeightsError naming the first tensor that holds NaN or infinity (one device sync for all)."""
    if not flags:
        return
    ok = torch.stack([flag for _, _, flag in flags]).cpu()
    if not bool(ok.all()):
        path, name, _ = flags[int((~ok).nonzero()[0])]
        raise WeightsError(f"{path}: tensor {name} holds NaN or infinite values (a damaged download?)")


_QUANT_SUFFIXES = (".qweight", ".scales", ".zeros", ".weight_scale")


def _unmarked_hint(dtype: torch.dtype, cfg: AsrConfig) -> str:
    if cfg.quantization is None and dtype in (torch.int8, torch.uint8):
        return " (a quantized folder whose config.json lacks quantization_config?)"
    return ""


def match_tensors(
    files: CheckpointFiles, cfg: AsrConfig, expected: dict[str, torch.Tensor], *, tied: bool
) -> tuple[dict[str, str], list[str]]:
    """Pair the checkpoint's tensors with our state-dict names ``expected`` (name -> tensor, for shapes).

    Returns (checkpoint name -> our name, the ignored stored head of a tied model). Raises WeightsError
    naming the file for an unexpected or a missing tensor.
    """
    wanted = {checkpoint_name(name, cfg.layout): name for name in expected}
    unexpected = [n for n in files.tensor_files if n not in wanted]
    tied_head = checkpoint_name("lm_head.weight", cfg.layout)
    ignored = [tied_head] if tied and tied_head in unexpected else []
    unexpected = [n for n in unexpected if n not in ignored]
    if unexpected:
        name = unexpected[0]
        more = f" (and {len(unexpected) - 1} more)" if len(unexpected) > 1 else ""
        hint = f"not a Qwen3-ASR checkpoint in the {cfg.layout!r} layout?"
        if cfg.quantization is None and name.endswith(_QUANT_SUFFIXES):
            hint = "a quantized folder whose config.json lacks quantization_config?"
        raise WeightsError(f"{files.tensor_files[name]}: unexpected tensor {name}{more}; {hint}")
    missing = [n for n in wanted if n not in files.tensor_files]
    if missing:
        name = missing[0]
        shape = tuple(expected[wanted[name]].shape)
        where = files.files[0] if len(files.files) == 1 else files.folder / INDEX_FILE
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise WeightsError(f"{where}: missing tensor {name} (expected shape {shape}){more}")
    return wanted, ignored


def _log_tied_head(path: Path, name: str, model: AsrModel) -> None:
    embed = model.decoder.embed_tokens.weight
    with TensorReader(path) as f:  # compared a piece of rows at a time: the head is as large as the table
        same = f.shape(name) == tuple(embed.shape) and all(
            torch.equal(part.to(device=embed.device, dtype=embed.dtype), embed[start : start + part.shape[0]])
            for start, part in f.row_pieces(name)
        )
    log.info(
        "tie_word_embeddings is true: using embed_tokens as the output head; the stored %s %s it",
        name,
        "equals" if same else "differs from",
    )


WEIGHT_SUFFIXES = (".safetensors", *PICKLE_SUFFIXES)


def check_new_folder(out: Path, error: type[Exception] = ModelError) -> None:
    """Refuse an output path that is a file or a folder that is not empty."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise error(f"{out}: already exists and is not an empty folder; choose a new output folder")


def write_model_folder(
    src: Path, out: Path, config: dict, tensors: dict[str, torch.Tensor], metadata: dict[str, str]
) -> Path:
    """Write a model folder at ``out``: every file of the model folder ``src`` except its weights and
    config.json (tokenizer, preprocessor config, chat template, ...; the Hub cache's symlinks are
    followed), ``config`` as config.json, and ``tensors`` in one ``model.safetensors``.

    Written into a temporary folder next to ``out`` that is renamed at the end, so an error or an
    interruption leaves nothing at ``out``. ``out`` must not exist or be an empty folder. Files and
    folders follow the umask, as other tools' output does (a model folder is not private data).
    """
    import os
    import shutil

    from dictation.asr.checkpoints.output import ST_DTYPES, write_safetensors

    out = Path(out).expanduser().absolute()
    check_new_folder(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.partial-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir()
        for entry in sorted(src.iterdir()):
            if entry.name.startswith(".") or entry.name in ("config.json", INDEX_FILE):
                continue
            if entry.name.endswith(WEIGHT_SUFFIXES):
                continue
            if entry.is_dir():
                shutil.copytree(entry, tmp / entry.name)
            else:
                shutil.copyfile(entry, tmp / entry.name)
        (tmp / "config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", "utf-8")
        # Our writer, not the safetensors package's: each fused group's tensors are written next to each
        # other in the fused order, so a load maps them as one tensor instead of copying them.
        specs = [(n, ST_DTYPES[t.dtype], tuple(t.shape)) for n, t in tensors.items()]
        write_safetensors(tmp / "model.safetensors", specs, tensors.__getitem__, metadata, fused_adjacent=True)
        if out.exists():
            out.rmdir()  # empty (checked above); os.replace cannot replace a folder on Windows
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
