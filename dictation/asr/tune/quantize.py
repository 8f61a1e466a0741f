"""Quantizing a loaded model's decoder layers to int8 / int4 in place (the layers: ``nn/quantized.py``,
the stored format: ``nn/quant_format.py``), and what the weights then cost.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import torch
from torch import nn

from dictation.asr.nn import quant_format
from dictation.asr.nn.quant_format import (
    DEFAULT_GROUP_SIZE,
    FORMAT_VERSION,
    GROUP_SIZES,
    LAYER_MODULES,
    MODULES_TEXT,
    QUANT_METHOD,
    pick_group_size,
)
from dictation.asr.nn.quant_swap import check_variant, quantizable_linears, set_module
from dictation.asr.nn.quantized import (
    QUANT_MODULES,
    Int4Linear,
    Int8Linear,
)

log = logging.getLogger(__name__)


def quantize_model(
    model: nn.Module,
    variant: str,
    *,
    group_size: int = DEFAULT_GROUP_SIZE,
    weights: Mapping[str, torch.Tensor] | None = None,
) -> list[str]:
    """Replace the decoder's linear layers in place by Int8Linear / Int4Linear; returns their names.

    ``weights`` optionally gives, per module name, a float weight to quantize instead of the module's
    own (e.g. LoRA-merged float32 weights). The quantized buffers live on each layer's device.
    """
    check_variant(variant)
    linears = quantizable_linears(model)
    n_expected = len(model.decoder.layers) * len(LAYER_MODULES)
    if len(linears) != n_expected:
        raise ValueError(f"the model's decoder has {n_expected - len(linears)} layers that are already quantized")
    weights = dict(weights or {})
    unknown = sorted(set(weights) - set(linears))
    if unknown:
        raise ValueError(f"weights given for {unknown[0]}, which is not a quantizable decoder linear layer")
    for name, linear in linears.items():  # check everything first: an error leaves the model as it was
        if linear.bias is not None:
            raise ValueError(f"{name} has a bias; only bias-free linear layers are quantized")
        if name in weights and tuple(weights[name].shape) != tuple(linear.weight.shape):
            shape, want = tuple(weights[name].shape), tuple(linear.weight.shape)
            raise ValueError(f"weights[{name!r}] has shape {shape}, expected {want}")
    names = list(linears)
    for name in names:
        linear = linears.pop(name)  # hold no reference: each float weight is freed once replaced
        w = weights.pop(name, None)
        w = linear.weight if w is None else w.to(linear.weight.device)
        new = Int8Linear.from_weight(w) if variant == "int8" else Int4Linear.from_weight(w, group_size=group_size)
        set_module(model, name, new)
        del linear, w
    log.debug("quantized %d decoder linear layers to %s", len(names), variant)
    if hasattr(model, "sync_weights"):
        model.sync_weights()  # fuse the integer layers (and drop any fused float weight)
    return names


def replace_linear(
    model: nn.Module, name: str, variant: str, weight: torch.Tensor, *, group_size: int = DEFAULT_GROUP_SIZE
) -> nn.Module:
    """Put a layer quantized from ``weight`` (float, any device) at module ``name``, in place of what is
    there (an nn.Linear or a quantized layer, e.g. to re-quantize a LoRA-merged weight); returns it.
    The new layer lives on the device of the one it replaces."""
    check_variant(variant)
    old = model.get_submodule(name)
    if not isinstance(old, (nn.Linear, *QUANT_MODULES)):
        raise ValueError(f"{name} is a {type(old).__name__}, not a linear layer")
    shape = (old.out_features, old.in_features)
    if tuple(weight.shape) != shape:
        raise ValueError(f"the weight for {name} has shape {tuple(weight.shape)}, expected {shape}")
    device = next(iter(old.buffers() if isinstance(old, QUANT_MODULES) else old.parameters())).device
    w = weight.detach().to(device)
    new = Int8Linear.from_weight(w) if variant == "int8" else Int4Linear.from_weight(w, group_size=group_size)
    set_module(model, name, new)
    return new


def weight_bytes(model: nn.Module) -> int:
    """Bytes of all parameters and persistent buffers (shared tensors once): what the weights cost."""
    seen: set[int] = set()
    total = 0
    for module in model.modules():
        tensors = list(module._parameters.values())
        tensors += [b for n, b in module._buffers.items() if n not in module._non_persistent_buffers_set]
        for t in tensors:
            if t is None or id(t) in seen:
                continue
            seen.add(id(t))
            total += t.numel() * t.element_size()
        total += getattr(module, "nbytes", 0)  # weights packed outside tensors (nn/compact.HalfLinear)
    return total


def format_bytes(n: int) -> str:
    """``1234567890`` -> ``"1.23 GB"`` (decimal units, as file managers show sizes)."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n} B"


def quantization_config(variant: str, group_size: int = DEFAULT_GROUP_SIZE) -> dict:
    """The ``quantization_config`` entry of a pre-quantized folder's config.json."""
    check_variant(variant)
    cfg = {"quant_method": QUANT_METHOD, "format_version": FORMAT_VERSION, "variant": variant}
    if variant == "int4":
        pick_group_size(max(GROUP_SIZES), group_size)  # validates group_size
        cfg["group_size"] = group_size
        cfg["weights"] = "uint8 qweight [out, in/2] (high nibble = even column), w = q * scales + zeros per group"
        # informational (how scales and zeros were chosen; reading does not depend on it): folders
        # written before it existed hold "minmax"
        cfg["int4_method"] = quant_format.INT4_METHOD
    else:
        cfg["group_size"] = None
        cfg["weights"] = "int8 weight [out, in], w = weight * weight_scale[out] (symmetric per output channel)"
    cfg["modules"] = MODULES_TEXT
    cfg["compute_dtype"] = "the model's float dtype (bf16/fp16/fp32); bf16 kernels on CPUs with bf16 instructions"
    return cfg
