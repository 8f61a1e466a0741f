"""Quantized layers sharing their rows: the fused q/k/v and gate/up layers the decoder builds from
its int8 / int4 projections (decoder.py), loaded straight into the fused layout, and what their kernel
layouts hold besides the weights."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from dictation.asr.heap import Arena
from dictation.asr.nn.quantized import QUANT_MODULES, Int4Linear, Int8Linear, _QuantLinear


def fuse_rows(layers: Sequence[_QuantLinear]) -> _QuantLinear:
    """One layer computing ``cat([layer(x) for layer in layers], -1)`` in one kernel call: every
    stored tensor concatenated along the output rows (int4 groups run along the inputs, so rows stack
    freely), and each of ``layers`` given views of those rows in place of its own tensors, so the
    weights are held once. The fused layer is not a submodule of anything: the model keeps its
    per-layer names (state_dict, quantization, adapters) and decoder.py decides when to rebuild it.
    All ``layers`` must be ``fusable_with`` the first."""
    first = layers[0]
    if not all(first.fusable_with(layer) for layer in layers):
        raise ValueError("only layers of one kind, input width, group size and device can be fused")
    out_features = sum(layer.out_features for layer in layers)
    if isinstance(first, Int4Linear):
        fused = Int4Linear(first.in_features, out_features, device="meta", group_size=first.group_size)
    else:
        fused = Int8Linear(first.in_features, out_features, device="meta")
    with torch.inference_mode(False), torch.no_grad():
        for name in first._TENSORS:
            parts = [getattr(layer, name) for layer in layers]
            whole = stacked_rows(parts)  # loaded in place (allocate_rows): adopted, not copied
            if whole is None:
                whole = torch.cat(parts)
            setattr(fused, name, whole)
            start = 0
            for layer in layers:
                setattr(layer, name, whole[start : start + layer.out_features])
                start += layer.out_features
    for layer in layers:
        layer.clear_cache()  # their kernel layouts are not needed while the fused layer serves them
    fused.options = first.options  # the model's choices, as its members have them
    return fused


def stacked_rows(parts: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """``torch.cat(parts)`` without copying, if ``parts`` are consecutive contiguous row blocks of one
    storage that holds nothing else (:func:`allocate_rows`, decoder.allocate_fused); else None."""
    storage, offset = parts[0].untyped_storage(), 0
    for t in parts:
        if t.untyped_storage().data_ptr() != storage.data_ptr() or t.storage_offset() != offset:
            return None
        offset += t.numel() if t.is_contiguous() else -1
    if storage.device.type == "meta" or offset * parts[0].element_size() != storage.nbytes():
        return None
    shape = (sum(t.shape[0] for t in parts), *parts[0].shape[1:])
    return parts[0].detach().as_strided(shape, parts[0].stride(), 0)


def allocate_rows(layers: Sequence[_QuantLinear], arena: Arena | None = None) -> bool:
    """Give fusable ``layers`` one uninitialised tensor per stored tensor, each layer its consecutive
    rows, so that loading writes straight into the layout :func:`fuse_rows` adopts (no copy); the
    integer ones from ``arena`` if given (heap.Arena). False if the layers are not fusable."""
    if not all(layers[0].fusable_with(layer) for layer in layers):
        return False
    with torch.inference_mode(False), torch.no_grad():
        for name in layers[0]._TENSORS:
            parts = [getattr(layer, name) for layer in layers]
            shape = (sum(t.shape[0] for t in parts), *parts[0].shape[1:])
            dtype = parts[0].dtype
            if arena is not None and not dtype.is_floating_point:
                whole = arena.take(shape, dtype)
            else:
                whole = torch.empty(shape, dtype=dtype, device=parts[0].device)
            for layer, block in zip(layers, whole.split([t.shape[0] for t in parts]), strict=True):
                layer._buffers[name] = block
    for layer in layers:
        layer.clear_cache()
    return True


def integer_bytes(layers: Sequence[_QuantLinear]) -> int:
    """Bytes an arena needs for the integer tensors of ``layers``, placed one at a time or fused (a fused
    tensor's padding is at most its members')."""
    return sum(
        Arena.bytes_for(tuple(t.shape), t.dtype)
        for layer in layers
        for t in (getattr(layer, name) for name in layer._TENSORS)
        if not t.dtype.is_floating_point
    )


def place_in_arena(layer: _QuantLinear, arena: Arena) -> None:
    """Give one layer's integer tensors uninitialised storage from ``arena`` (loading fills them)."""
    with torch.inference_mode(False), torch.no_grad():
        for name in layer._TENSORS:
            t = getattr(layer, name)
            if not t.dtype.is_floating_point:
                layer._buffers[name] = arena.take(tuple(t.shape), t.dtype)
    layer.clear_cache()


def kernel_cache_bytes(model: nn.Module) -> int:
    """Bytes the quantized layers hold besides their weights (kernel layouts, cast scales), including
    those of the fused q/k/v and gate/up layers the decoder builds (decoder.py), which are not submodules."""
    layers = [m for m in model.modules() if isinstance(m, QUANT_MODULES)]
    fused_layers = getattr(getattr(model, "decoder", None), "fused_layers", None)
    if fused_layers is not None:
        layers += fused_layers()
    seen: set[int] = set()
    total = 0
    for layer in layers:
        for tensors in layer._cache.values():
            for t in tensors:
                if id(t) not in seen:
                    seen.add(id(t))
                    total += t.numel() * t.element_size()
    return total
