"""Applying PEFT LoRA adapters to a loaded model (reading and checking them: ``tune/adapter_files.py``).

Several adapters can be active at once, each with a weight ``w``. Adapter ``i`` turns a weight
``W`` into ``W + w * (L_i(W) - W)``, where ``L_i`` is what PEFT's merge computes:

- LoRA: ``L(W) = W + scaling * B @ A``;
- DoRA: ``L(W) = m / ||W + scaling * B @ A||_row * (W + scaling * B @ A)`` (``m`` the magnitude);
- modules_to_save: ``L(W) = saved``.

So ``w = 1`` is exactly PEFT's merge, ``w = 0`` leaves the model as it was, and adapters stack
in the order given, each on the result of the ones before (for plain LoRA the order does not
matter; for DoRA and saved modules it does, as with sequential merges).

Where the weight is floating point, the adapters are merged into it, computed in float32 and
stored back in the model's dtype; the original tensors of every changed parameter are kept in
host memory, so removing or changing adapters restores them without reading the checkpoint
again. Where the weight is integer (a quantized decoder layer), the adapters run unmerged
next to it (:class:`LoraLinear`), and DoRA's row norms use the dequantized weight.

A head adapter on a model whose head is tied to the embeddings unties them first (PEFT adapts the
head alone), and ties them again when the adapter is removed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from safetensors import safe_open
from torch import nn

from dictation.asr.errors import AdapterError
from dictation.asr.nn.model import AsrModel
from dictation.asr.tune.adapter_files import AdapterInfo, LoraLayer, check_shapes, parse_adapter_spec, read_adapter


@dataclass
class LoadedAdapter:
    """An adapter's tensors in float32 on the CPU, with the weight it is applied at."""

    info: AdapterInfo
    weight: float
    a: dict[str, torch.Tensor] = field(default_factory=dict)  # module -> [r, in]
    b: dict[str, torch.Tensor] = field(default_factory=dict)  # module -> [out, r]
    magnitude: dict[str, torch.Tensor] = field(default_factory=dict)  # module -> [out] (DoRA)
    saved: dict[str, torch.Tensor] = field(default_factory=dict)  # our parameter name -> tensor

    @property
    def label(self) -> str:
        return self.info.folder.name if self.weight == 1.0 else f"{self.info.folder.name}:{self.weight:g}"

    def layer(self, module: str) -> LoraLayer:
        return next(layer for layer in self.info.layers if layer.module == module)


def load_adapters(specs: Sequence[str], model: AsrModel) -> list[LoadedAdapter]:
    """Read, check against ``model`` and load every ``DIR[:weight]`` in ``specs``.

    Raises AdapterError naming the adapter and the first problem; nothing is applied here.
    """
    return [load_adapter(info, weight, model) for info, weight in read_specs(specs)]


def read_specs(specs: Sequence[str]) -> list[tuple[AdapterInfo, float]]:
    """Every ``DIR[:weight]`` in ``specs`` read and validated on its own, without the model or torch
    work (quick: worth doing before a model loads). Raises AdapterError naming the first bad one."""
    out = []
    for spec in specs:
        path, weight = parse_adapter_spec(spec)
        out.append((read_adapter(path), weight))
    return out


def load_adapter(info: AdapterInfo, weight: float, model: AsrModel) -> LoadedAdapter:
    """One read adapter, checked against ``model`` and its tensors loaded (AdapterError if it does not fit)."""
    check_shapes(info, lambda name: _shape_of(model, name), "the loaded model")
    return _read_tensors(info, weight)


def _shape_of(model: AsrModel, name: str) -> tuple[int, ...] | None:
    """The shape of our parameter ``name`` in ``model``; a linear layer (plain, quantized or already
    wrapped) answers [out_features, in_features] for its weight."""
    if name == "lm_head.weight" and model.lm_head is None:
        return tuple(model.decoder.embed_tokens.weight.shape)
    module_name, _, attr = name.rpartition(".")
    try:
        module = model.get_submodule(module_name)
    except AttributeError:
        return None
    if attr == "weight" and hasattr(module, "in_features") and hasattr(module, "out_features"):
        return (module.out_features, module.in_features)
    tensor = getattr(module, attr, None)
    return tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else None


def _read_tensors(info: AdapterInfo, weight: float) -> LoadedAdapter:
    adapter = LoadedAdapter(info, weight)
    try:
        with safe_open(str(info.weights_file), framework="pt", device="cpu") as f:
            for layer in info.layers:
                adapter.a[layer.module] = _finite(f.get_tensor(layer.lora_a), info, layer.lora_a)
                adapter.b[layer.module] = _finite(f.get_tensor(layer.lora_b), info, layer.lora_b)
                if layer.magnitude is not None:
                    adapter.magnitude[layer.module] = _finite(f.get_tensor(layer.magnitude), info, layer.magnitude)
            for saved in info.saved:
                adapter.saved[saved.param] = _finite(f.get_tensor(saved.tensor), info, saved.tensor)
    except AdapterError:
        raise
    except Exception as exc:  # safetensors raises its own error types for damaged data
        raise AdapterError(f"{info.weights_file}: unreadable ({exc})") from None
    return adapter


def _finite(tensor: torch.Tensor, info: AdapterInfo, name: str) -> torch.Tensor:
    tensor = tensor.float()
    if not torch.isfinite(tensor).all():
        raise AdapterError(f"{info.weights_file}: tensor {name} holds NaN or infinite values")
    return tensor


# --- the math --------------------------------------------------------------------------------------


def lora_delta(adapter: LoadedAdapter, module: str) -> torch.Tensor:
    """``scaling * B @ A`` in float32 on the CPU."""
    return adapter.layer(module).scaling * (adapter.b[module] @ adapter.a[module])


def apply_one(w: torch.Tensor, adapter: LoadedAdapter, param: str) -> torch.Tensor:
    """``w`` (float32) after ``adapter`` at its weight (see the module docstring)."""
    if param in adapter.saved:
        target = adapter.saved[param].to(w.device)
    else:
        module = param.rsplit(".", 1)[0]
        target = w + lora_delta(adapter, module).to(w.device)
        if module in adapter.magnitude:
            norm = torch.linalg.norm(target, dim=1)
            target = (adapter.magnitude[module].to(w.device) / norm)[:, None] * target
    if adapter.weight == 1.0:
        return target
    return w + adapter.weight * (target - w)


def changed_params(adapters: Sequence[LoadedAdapter]) -> list[str]:
    """Every parameter the adapters change, in a stable order."""
    names = set()
    for adapter in adapters:
        names.update(f"{layer.module}.weight" for layer in adapter.info.layers)
        names.update(adapter.saved)
    return sorted(names)


def merged_weights(adapters: Sequence[LoadedAdapter], originals: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Parameter name -> float32 tensor after every adapter in turn, for each parameter in ``originals``
    (its weight before the adapters, any float dtype)."""
    out = {}
    for param in sorted(originals):
        w = originals[param].float()
        for adapter in adapters:
            if param in adapter.saved or (param.endswith(".weight") and param[:-7] in adapter.a):
                w = apply_one(w, adapter, param)
        out[param] = w
    return out


# --- unmerged adapters next to an integer layer ---------------------------------------------------


class LoraLinear(nn.Module):
    """``base(x)`` plus one adapter, unmerged; ``base`` may be another LoraLinear (stacking).

    For ``y = base(x)`` (a layer without bias) and ``L(W) = r * (W + D)`` with ``r`` the DoRA row
    ratio (1 for LoRA) and ``D = scaling B A``: ``y + w * ((r - 1) * y + r * D x)``.

    A projection group with such a layer runs member by member (no fused matmul, decoder.py), and
    the decode step is not captured as a CUDA graph while one is in the model.
    """

    unmerged_adapter = True

    def __init__(self, base: nn.Module, adapter: LoadedAdapter, module: str, dtype: torch.dtype) -> None:
        super().__init__()
        self.base = base
        device = _device_of(base)
        self.weight_factor = adapter.weight
        self.scaling = adapter.layer(module).scaling
        self.register_buffer("lora_a", adapter.a[module].to(device, dtype))
        self.register_buffer("lora_b", adapter.b[module].to(device, dtype))
        ratio = None
        if module in adapter.magnitude:
            dense = dense_weight(base)
            norm = torch.linalg.norm(dense + lora_delta(adapter, module).to(dense.device), dim=1)
            ratio = (adapter.magnitude[module].to(dense.device) / norm).to(device, dtype)
        self.register_buffer("ratio", ratio)
        self.in_features, self.out_features = self.lora_a.shape[1], self.lora_b.shape[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        d = F.linear(F.linear(x, self.lora_a), self.lora_b) * self.scaling
        if self.ratio is None:
            return y + self.weight_factor * d
        return y + self.weight_factor * ((self.ratio - 1) * y + self.ratio * d)

    def dense(self) -> torch.Tensor:
        """The weight this layer computes with, float32 (for DoRA norms of adapters stacked on it)."""
        w = dense_weight(self.base)
        target = w + self.scaling * (self.lora_b.float() @ self.lora_a.float())
        if self.ratio is not None:
            target = self.ratio.float()[:, None] * target
        return w + self.weight_factor * (target - w)


def dense_weight(module: nn.Module) -> torch.Tensor:
    if isinstance(module, LoraLinear):
        return module.dense()
    if hasattr(module, "dequantize"):
        return module.dequantize().float()
    return module.weight.float()


def _device_of(module: nn.Module) -> torch.device:
    for tensor in module.buffers():
        return tensor.device
    return next(module.parameters()).device


# --- keeping track of what is applied -------------------------------------------------------------


class AdapterState:
    """The adapters applied to one model, and what is needed to take them off again.

    ``float_originals`` (parameter -> float weight in host memory) and ``requantize(module name,
    float32 weight)`` serve quantized models: an integer layer whose float weight was kept is
    re-merged in float32 and re-quantized, exactly as at load time, instead of running unmerged.
    """

    def __init__(self, model: AsrModel, float_originals: dict[str, torch.Tensor] | None = None, requantize=None):
        self.model = model
        self.float_originals = float_originals or {}
        self.requantize = requantize
        self.originals: dict[str, torch.Tensor] = {}  # parameter -> original tensor (host memory)
        self.untied = False  # we created lm_head for a head adapter on a tied model
        self.wrapped: list[str] = []  # modules wrapped in LoraLinear
        self.requantized: list[str] = []  # parameters of integer layers re-quantized from merged weights
        self.applied: list[LoadedAdapter] = []

    @property
    def labels(self) -> list[str]:
        return [adapter.label for adapter in self.applied]

    def clear(self) -> None:
        """Put the model back exactly as it was loaded."""
        model = self.model
        for name in self.wrapped:
            parent, attr = _parent(model, name)
            layer = getattr(parent, attr)
            while isinstance(layer, LoraLinear):
                layer = layer.base
            setattr(parent, attr, layer)
        self.wrapped = []
        for name in self.requantized:
            self.requantize(name.rsplit(".", 1)[0], self.float_originals[name].float())
        self.requantized = []
        if self.untied:
            model.lm_head = None
            self.untied = False
            self.originals.pop("lm_head.weight", None)
        with torch.no_grad():
            for name, tensor in self.originals.items():
                param = _param(model, name)
                if param is not None:
                    param.copy_(tensor.to(param.device))
        self.originals = {}
        self.applied = []
        model.sync_weights()  # fuse the restored layers again

    def apply(self, adapters: Sequence[LoadedAdapter]) -> None:
        """Replace whatever is applied by ``adapters`` (which ``load_adapters`` checked)."""
        self.clear()
        if not adapters:
            return
        model = self.model
        params = changed_params(adapters)
        if "lm_head.weight" in params and model.lm_head is None:
            self._untie()
        merge_from: dict[str, torch.Tensor] = {}
        unmerged: list[str] = []
        for name in params:
            param = _param(model, name)
            if param is not None and param.is_floating_point():
                merge_from[name] = param.detach()
            elif name in self.float_originals and self.requantize is not None:
                merge_from[name] = self.float_originals[name]
            elif any(name in adapter.saved for adapter in adapters):
                folder = next(adapter.info.folder for adapter in adapters if name in adapter.saved)
                raise AdapterError(
                    f"{folder}: replaces {name}, which is quantized in this model; "
                    "use a floating-point variant with this adapter"
                )
            else:
                unmerged.append(name)
        merged = merged_weights(adapters, merge_from)
        with torch.no_grad():
            for name, w in merged.items():
                param = _param(model, name)
                if param is not None and param.is_floating_point():
                    if name not in self.originals:
                        self.originals[name] = param.detach().to("cpu", copy=True)
                    param.copy_(w.to(param.device, param.dtype))
                else:
                    self.requantize(name.rsplit(".", 1)[0], w)
                    self.requantized.append(name)
        for name in unmerged:
            module_name = name.rsplit(".", 1)[0]
            parent, attr = _parent(model, module_name)
            layer = getattr(parent, attr)
            for adapter in adapters:
                if module_name in adapter.a:
                    layer = LoraLinear(layer, adapter, module_name, model.dtype)
            setattr(parent, attr, layer)
            self.wrapped.append(module_name)
        self.applied = list(adapters)
        model.sync_weights()  # re-quantized layers fused again; wrapped groups run member by member

    def _untie(self) -> None:
        model = self.model
        embed = model.decoder.embed_tokens.weight
        head = nn.Linear(embed.shape[1], embed.shape[0], bias=False, device=embed.device, dtype=embed.dtype)
        with torch.no_grad():
            head.weight.copy_(embed)
        head.requires_grad_(False)
        model.lm_head = head
        self.untied = True


def _parent(model: nn.Module, name: str) -> tuple[nn.Module, str]:
    parent_name, _, attr = name.rpartition(".")
    return (model.get_submodule(parent_name) if parent_name else model), attr


def _param(model: nn.Module, name: str) -> torch.Tensor | None:
    module_name, _, attr = name.rpartition(".")
    try:
        module = model.get_submodule(module_name)
    except AttributeError:
        return None
    tensor = getattr(module, attr, None)
    return tensor if isinstance(tensor, torch.Tensor) else None
