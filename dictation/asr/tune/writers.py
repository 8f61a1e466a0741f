"""The model folders the command line writes: ``dictation quantize`` (a pre-quantized copy) and
``dictation merge-lora`` (a copy with adapters merged). Both write to a temporary folder renamed at
the end, so an interrupted run leaves nothing at the destination.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from safetensors import safe_open

from dictation.asr.errors import AdapterError
from dictation.asr.nn.quant_format import (
    DEFAULT_GROUP_SIZE,
    GROUP_SIZES,
    QUANT_METHOD,
    QUANTIZED,
    pick_group_size,
    quantize_int4,
    quantize_int8,
)
from dictation.asr.nn.quant_swap import quantizable_linears, quantizable_names
from dictation.asr.tune.adapters import AdapterState, _param, changed_params, load_adapters
from dictation.asr.tune.quantize import quantization_config


def write_quantized_folder(
    src_model,
    out_dir,
    variant: str,
    *,
    group_size: int = DEFAULT_GROUP_SIZE,
    on_progress: Callable[[int, int], None] | None = None,
) -> Path:
    """Write a pre-quantized copy of the model folder ``src_model`` (a path or cached repo id) to ``out_dir``.

    ``out_dir/model.safetensors`` holds the checkpoint's own tensor names in the source layout: each
    decoder linear layer as its quantized tensors (module docstring), every other tensor exactly as
    stored (e.g. bf16). Every other file of the source folder is copied (tokenizer, preprocessor config,
    chat template, ...), and config.json gains ``quantization_config``. Tensors are read one at a time
    (memory: the output plus one layer), checked as strictly as ``load_model`` checks them, and
    quantized in float32 on the CPU, so the result equals ``quantize_model`` on the model loaded in
    float32, bit for bit. Written to a temporary folder that is renamed at the end: an interrupted run
    leaves nothing at ``out_dir``. ``on_progress(done, total)`` is called per tensor. Returns ``out_dir``.
    """
    from safetensors import safe_open

    from dictation.asr.checkpoints.hub import resolve_model
    from dictation.asr.checkpoints.locate import check_sizes, checkpoint_name, locate
    from dictation.asr.checkpoints.safetensors import FLOAT_DTYPES, check_new_folder, match_tensors, write_model_folder
    from dictation.asr.config import AsrConfig
    from dictation.asr.errors import ModelError, WeightsError
    from dictation.asr.nn.model import AsrModel

    if variant not in QUANTIZED:
        raise ModelError(f"{src_model}: cannot quantize to {variant!r}; choose one of {', '.join(QUANTIZED)}")
    src = resolve_model(src_model)
    out = Path(out_dir).expanduser().absolute()
    check_new_folder(out)
    config_path = src / "config.json"
    cfg = AsrConfig.from_file(config_path)
    if cfg.quantization is not None:
        raise ModelError(
            f"{config_path}: this model is already quantized ({cfg.quantization['variant']}); "
            "quantize from a bf16/fp16/fp32 model folder"
        )
    try:
        pick_group_size(max(GROUP_SIZES), group_size)
    except ValueError as exc:
        raise ModelError(str(exc)) from None
    raw_config = json.loads(config_path.read_text(encoding="utf-8"))

    files = locate(src)
    check_sizes(files, files.headers(), cfg)  # before the model is built: its size follows from the config
    with torch.device("meta"):
        meta = AsrModel(cfg)
    expected = meta.state_dict()
    wanted, _ignored = match_tensors(files, cfg, expected, tied=meta.lm_head is None)
    quantized = {f"{name}.weight": name for name in quantizable_names(cfg.text.num_hidden_layers)}
    linears = quantizable_linears(meta)
    group_sizes = {name: pick_group_size(lin.in_features, group_size) for name, lin in linears.items()}

    tensors: dict[str, torch.Tensor] = {}
    by_file: dict[Path, list[str]] = {}
    for ckpt_name in wanted:
        by_file.setdefault(files.tensor_files[ckpt_name], []).append(ckpt_name)
    total, done = len(wanted), 0
    for path, names in by_file.items():
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for ckpt_name in names:
                ours = wanted[ckpt_name]
                target = expected[ours]
                shape = tuple(f.get_slice(ckpt_name).get_shape())
                if shape != tuple(target.shape):
                    raise WeightsError(f"{path}: tensor {ckpt_name} has shape {shape}, expected {tuple(target.shape)}")
                tensor = f.get_tensor(ckpt_name)
                if tensor.dtype not in FLOAT_DTYPES:
                    raise WeightsError(
                        f"{path}: tensor {ckpt_name} is {tensor.dtype}; only bf16/fp16/fp32 models can be quantized"
                    )
                module = quantized.get(ours)
                if module is None:
                    tensors[ckpt_name] = tensor
                else:
                    base = checkpoint_name(module, cfg.layout)
                    if variant == "int8":
                        q, scale = quantize_int8(tensor)
                        tensors[f"{base}.weight"], tensors[f"{base}.weight_scale"] = q, scale
                    else:
                        qw, scales, zeros = quantize_int4(tensor, group_sizes[module])
                        tensors[f"{base}.qweight"], tensors[f"{base}.scales"] = qw, scales
                        tensors[f"{base}.zeros"] = zeros
                    del tensor
                done += 1
                if on_progress is not None:
                    on_progress(done, total)

    raw_config["quantization_config"] = quantization_config(variant, group_size)
    meta_info = {"format": "pt", "quant_method": QUANT_METHOD, "variant": variant}
    write_model_folder(src, out, raw_config, tensors, meta_info)
    return out


def write_merged_folder(base: str | os.PathLike, specs: Sequence[str], out: str | os.PathLike) -> Path:
    """Merge ``specs`` (``DIR[:weight]``) into the model ``base`` and write a standalone folder at ``out``:
    the base's files, its layout and dtypes, with the merged tensors in one ``model.safetensors``.

    Merging is in float32 (the model is loaded in float32 on the CPU); every tensor the adapters
    leave alone is copied bit for bit. Raises AdapterError / ModelError naming the problem.
    """

    from dictation.asr.checkpoints.hub import resolve_model
    from dictation.asr.checkpoints.locate import checkpoint_name, locate, our_name
    from dictation.asr.checkpoints.safetensors import check_new_folder, load_model, write_model_folder
    from dictation.asr.config import AsrConfig

    folder = resolve_model(base)
    out = Path(out).expanduser()
    check_new_folder(out, AdapterError)
    cfg = AsrConfig.from_file(folder / "config.json")
    if cfg.quantization:
        raise AdapterError(
            f"{folder}: a quantized model; merge into the floating-point model, then quantize the result"
        )
    model = load_model(folder, cfg, torch.device("cpu"), torch.float32)
    adapters = load_adapters(specs, model)
    state = AdapterState(model)
    state.apply(adapters)
    changed = set(changed_params(adapters))
    files = locate(folder)
    tensors: dict[str, torch.Tensor] = {}
    for path in files.files:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for name in [n for n, p in files.tensor_files.items() if p == path]:
                source = f.get_tensor(name)
                ours = our_name(name, cfg.layout)
                if ours in changed and _param(model, ours) is not None:
                    tensors[name] = _param(model, ours).detach().to(source.dtype).contiguous()
                else:
                    tensors[name] = source
    if state.untied:  # a head adapter on a tied model: the merged head is stored and the tie is dropped
        head = checkpoint_name("lm_head.weight", cfg.layout)
        dtype = tensors[checkpoint_name("decoder.embed_tokens.weight", cfg.layout)].dtype
        tensors[head] = model.lm_head.weight.detach().to(dtype).contiguous()
    raw = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    if state.untied:
        _untie_config(raw)
    metadata = {"format": "pt", "merged_adapters": json.dumps([a.label for a in adapters])}
    return write_model_folder(folder, out, raw, tensors, metadata)


def _untie_config(raw: dict) -> None:
    if "tie_word_embeddings" in raw:
        raw["tie_word_embeddings"] = False
    inner = raw.get("thinker_config", raw)
    text = inner.get("text_config")
    if isinstance(text, dict):
        text["tie_word_embeddings"] = False
