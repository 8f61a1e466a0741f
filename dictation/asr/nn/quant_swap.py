"""Which of a model's linear layers are quantized (the text decoder's, ``quant_format.LAYER_MODULES``)
and swapping quantized layers (``quantized.py``) in for them: empty ones to load a pre-quantized folder
into here, quantized copies of loaded weights in ``tune/quantize.py``."""

from __future__ import annotations

from torch import nn

from dictation.asr.nn.quant_format import DEFAULT_GROUP_SIZE, LAYER_MODULES, QUANTIZED
from dictation.asr.nn.quantized import Int4Linear, Int8Linear


def quantizable_names(num_layers: int) -> list[str]:
    """Module names of the decoder's linear layers, in order."""
    return [f"decoder.layers.{i}.{m}" for i in range(num_layers) for m in LAYER_MODULES]


def quantizable_linears(model: nn.Module) -> dict[str, nn.Linear]:
    """The decoder's linear layers that quantization replaces, by module name (still nn.Linear only)."""
    modules = dict(model.named_modules())
    out = {}
    for name in quantizable_names(len(model.decoder.layers)):
        module = modules.get(name)
        if isinstance(module, nn.Linear):
            out[name] = module
    return out


def set_module(model: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, leaf = name.rpartition(".")
    setattr(model.get_submodule(parent), leaf, module)


def check_variant(variant: str) -> None:
    if variant not in QUANTIZED:
        raise ValueError(f"variant {variant!r} is not a quantized variant; choose one of {', '.join(QUANTIZED)}")


def empty_quantized(model: nn.Module, variant: str, *, group_size: int = DEFAULT_GROUP_SIZE) -> list[str]:
    """Swap the decoder's linear layers for empty quantized ones of the right shapes, on each layer's
    device (meta when building a model to load a pre-quantized folder into)."""
    check_variant(variant)
    linears = quantizable_linears(model)
    for name, linear in linears.items():
        device = linear.weight.device
        if variant == "int8":
            new = Int8Linear(linear.in_features, linear.out_features, device=device)
        else:
            new = Int4Linear(linear.in_features, linear.out_features, device=device, group_size=group_size)
        set_module(model, name, new)
    return list(linears)
