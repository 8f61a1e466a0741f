"""Weight-only int8 / int4 linear layers for the text decoder, the kernels they run on, and swapping them in.

Only the decoder's linear layers are quantized (``decoder.layers.N.self_attn.{q,k,v,o}_proj`` and
``decoder.layers.N.mlp.{gate,up,down}_proj``). The audio encoder, the embeddings and the output head
stay in floating point: ports that quantized those found that long audio then loops or comes out empty.

The stored format and how weights are rounded to it: ``quant_format.py``; quantizing a loaded model:
``tune/quantize.py``; writing a pre-quantized folder: ``tune/writers.py``.

Kernels (picked per call by device, dtype and number of rows, see ``KERNEL_MAX_ROWS``): torch's
``_weight_int8pack_mm`` and the tinygemm int4 kernels (``_weight_int4pack_mm`` on CUDA,
``_weight_int4pack_mm_for_cpu`` on CPU). Both int4 kernels take
``scales_and_zeros [in / group, out, 2]`` in the activation dtype and compute
``w = (q - 8) * scale + zero``, so the kernel's zero is ``zeros + 8 * scales`` (the group midpoint).
Each kernel is checked once per (device, dtype) against dequantize + matmul on a small problem; one
that is missing falls back to dequantize + ``F.linear``, one that gives wrong numbers raises.

int8 and int4 on CUDA have three candidates each (:func:`cuda_int8_path`, :func:`cuda_int4_path`):
torch's kernel, our Triton kernel (triton_gemv.py) and dequantize + matmul, probed and timed once per
process and GPU. Those probes and timings, and the CPU's, live in ``quant_paths.py`` (facts about the
machine, kept per process); the switches here choose among what they found.

More rows than the kernels take (the prefill) go to dequantize + matmul; on CUDA an int4 layer then
dequantizes in one Triton kernel (kernels/triton_dequant.py: 2.5 bytes of traffic per weight instead
of torch's ~19) where it gives torch's bits (:func:`one_pass_dequantize_usable`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dictation.asr.nn import quant_paths
from dictation.asr.nn.options import DEFAULT_OPTIONS, ModelOptions
from dictation.asr.nn.quant_format import (
    DEFAULT_GROUP_SIZE,
    pick_group_size,
    quantize_int4,
    quantize_int8,
    unpack_int4,
)

# Which kernels a layer may use (at all, which CUDA path, bf16 on the CPU, the one-pass int4 dequantize)
# is its options' choice (options.py: quant_kernels, cuda_int8_path, cuda_int4_path, cpu_bf16_compute,
# one_pass_dequantize), given by the model it belongs to (AsrModel.spread_options); a layer on its
# own runs the defaults.
# Rows (tokens) up to which the kernel beats dequantize + matmul; beyond, the matmul wins (prefill).
# CPU: measured with torch 2.13 on an AVX512-BF16 CPU (bf16 compute); CUDA: a guess, tinygemm is made for
# small batches (not measured).
KERNEL_MAX_ROWS = {("cpu", "int8"): 16, ("cpu", "int4"): 128, ("cuda", "int8"): 32, ("cuda", "int4"): 32}
KERNEL_MAX_ROWS_DEFAULT = 32
# Output rows per piece when an int8 layer on the CPU multiplies many rows through its widened weight.
DEQUANTIZE_PIECE_ROWS = 1024
CUDA_PATHS = quant_paths.CUDA_PATHS
CUDA_INT8_PATHS = CUDA_PATHS
_PROBE_TOLERANCE = quant_paths.PROBE_TOLERANCE


# --- which kernel (quant_paths.py), with this module's switches ------------------------------------------


def cpu_computes_in_bf16(options: ModelOptions = DEFAULT_OPTIONS) -> bool:
    """Whether quantized layers on the CPU compute in bf16 (:func:`quant_paths.cpu_computes_in_bf16`);
    ``options.cpu_bf16_compute`` overrides."""
    return quant_paths.cpu_computes_in_bf16(options.cpu_bf16_compute)


def cpu_decodes_in_bf16(kind: str, options: ModelOptions = DEFAULT_OPTIONS) -> bool:
    """Whether ``kind``'s decode-sized calls on a float32 CPU go through the bf16 kernel
    (:func:`quant_paths.cpu_decodes_in_bf16`); ``options.cpu_bf16_compute = False`` turns it off."""
    return quant_paths.cpu_decodes_in_bf16(_LAYER_TYPES[kind], options.cpu_bf16_compute)


def cuda_int8_path(device: torch.device, dtype: torch.dtype, options: ModelOptions = DEFAULT_OPTIONS) -> str:
    """How int8 layers on ``device`` (CUDA) multiply one to a few rows in ``dtype``: "triton",
    "torch" or "dequantize" (:func:`quant_paths.cuda_path`; ``options.cuda_int8_path`` forces one)."""
    return quant_paths.cuda_path(Int8Linear, device, dtype, options.cuda_int8_path, options.quant_kernels)


def cuda_int4_path(device: torch.device, dtype: torch.dtype, options: ModelOptions = DEFAULT_OPTIONS) -> str:
    """The same for int4 layers (``options.cuda_int4_path`` forces one)."""
    return quant_paths.cuda_path(Int4Linear, device, dtype, options.cuda_int4_path, options.quant_kernels)


def one_pass_dequantize_usable(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether the one-pass int4 dequantize runs on (device, dtype) and gives torch's bits
    (:func:`quant_paths.one_pass_dequantize_usable`)."""
    return quant_paths.one_pass_dequantize_usable(Int4Linear, device, dtype)


def _kernel_available(kind: str, device: torch.device, dtype: torch.dtype) -> bool:
    return quant_paths.kernel_available(_LAYER_TYPES[kind], device, dtype)


def _probe(kind: str, device: torch.device, dtype: torch.dtype, path: str = "torch") -> bool:
    return quant_paths.probe(_LAYER_TYPES[kind], device, dtype, path)


def _bf16_decode_wins(kind: str) -> bool:
    return quant_paths.bf16_decode_wins(_LAYER_TYPES[kind])


# --- modules ----------------------------------------------------------------------------------------------


class _QuantLinear(nn.Module):
    """Shared plumbing: float32 buffers that never follow a dtype cast, and a per-device kernel cache."""

    _FLOAT32_BUFFERS: tuple[str, ...] = ()
    kind = ""

    _TENSORS: tuple[str, ...] = ()  # the stored buffers, each [out_features, ...]

    def __init__(self, in_features: int, out_features: int, bias: bool | None) -> None:
        super().__init__()
        if bias not in (None, False):
            raise ValueError(f"{type(self).__name__} has no bias (the decoder's linear layers have none)")
        self.in_features, self.out_features = in_features, out_features
        self._cache: dict[tuple, tuple[torch.Tensor, ...]] = {}
        self.options = DEFAULT_OPTIONS  # the model's, once it is in one (AsrModel.spread_options)
        # Bumped whenever the kernel layouts are dropped: a fused projection built from this layer
        # (decoder.py) sees that its copy is out of date.
        self.version = 0

    def _apply(self, fn, recurse: bool = True):
        before = {name: self._buffers[name] for name in self._FLOAT32_BUFFERS}
        super()._apply(fn, recurse)
        for name, old in before.items():
            new = self._buffers[name]
            if new is not None and new.dtype != old.dtype:  # a dtype cast: move only, stay float32
                self._buffers[name] = old.to(device=new.device)
        self.clear_cache()
        return self

    def _load_from_state_dict(self, *args, **kwargs) -> None:
        self.clear_cache()
        super()._load_from_state_dict(*args, **kwargs)

    def weight_device(self) -> torch.device:
        """The device of the stored tensors."""
        return getattr(self, self._TENSORS[0]).device

    def clear_cache(self) -> None:
        """Drop the kernel layouts (rebuilt at the next call); needed after changing buffers in place."""
        self._cache.clear()
        self.version += 1

    def fusable_with(self, other: nn.Module) -> bool:
        """Whether ``other``'s rows can be stacked under this layer's into one layer (see :func:`fuse_rows`)."""
        return (
            type(other) is type(self)
            and other.in_features == self.in_features
            and getattr(other, "group_size", None) == getattr(self, "group_size", None)
            and all(getattr(other, n).device == getattr(self, n).device for n in self._TENSORS)
            and all(getattr(self, n).device.type != "meta" for n in self._TENSORS)
        )

    def dequantize(self) -> torch.Tensor:
        raise NotImplementedError

    def load_float(self, weight: torch.Tensor) -> None:
        """Quantize the float ``weight [out, in]`` into this layer's own buffers, as ``from_weight``
        would (loading a float folder as int8/int4 without a float copy: checkpoints/safetensors.py)."""
        with torch.inference_mode(False), torch.no_grad():
            fresh = self.from_weight(weight.to(getattr(self, self._TENSORS[0]).device), **self._quant_kwargs())
            for name in self._TENSORS:
                getattr(self, name).copy_(getattr(fresh, name))
        self.clear_cache()

    def _quant_kwargs(self) -> dict:
        return {}

    def _dequantized(self, dtype: torch.dtype) -> torch.Tensor:
        return self.dequantize().to(dtype)

    def _kernel_fits(self, device: torch.device, dtype: torch.dtype) -> bool:
        raise NotImplementedError

    def _torch_kernel(self, x2d: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """torch's packed kernel (what :func:`_probe` checks); ``_kernel`` may pick another."""
        raise NotImplementedError

    def _plan(self, x: torch.Tensor, rows: int) -> tuple[torch.dtype, bool]:
        """(compute dtype, use the kernel) for this call."""
        device, dtype = x.device, x.dtype
        limit = KERNEL_MAX_ROWS.get((device.type, self.kind), KERNEL_MAX_ROWS_DEFAULT)
        options = self.options
        if device.type == "cpu" and cpu_computes_in_bf16(options):
            dtype = torch.bfloat16
        elif (  # a decode-sized call on a float32 CPU; a prefill stays in the activation dtype
            device.type == "cpu"
            and rows <= limit
            and options.quant_kernels
            and cpu_decodes_in_bf16(self.kind, options)
            and self._kernel_fits(device, torch.bfloat16)
        ):
            return torch.bfloat16, True
        if device.type == "cpu" and dtype != torch.bfloat16:
            limit = 1  # the float32 kernels only win for a single row
        use = (
            options.quant_kernels
            and rows <= limit
            and self._kernel_fits(device, dtype)
            and self._kernel_ready(device, dtype, rows)
        )
        return dtype, use

    def _cuda_path(self, device: torch.device, dtype: torch.dtype) -> str:
        raise NotImplementedError

    def _kernel_ready(self, device: torch.device, dtype: torch.dtype, rows: int) -> bool:
        if device.type != "cuda":
            return _kernel_available(self.kind, device, dtype)
        from dictation.asr.nn.kernels.triton_gemv import MAX_ROWS

        path = self._cuda_path(device, dtype)
        return path == "torch" or (path == "triton" and rows <= MAX_ROWS)

    def _kernel(self, x2d: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        if x2d.device.type == "cuda" and self._cuda_path(x2d.device, dtype) == "triton":
            return self._triton_kernel(x2d, dtype)
        return self._torch_kernel(x2d, dtype)

    def _triton_kernel(self, x2d: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(f"input has {x.shape[-1]} features, expected {self.in_features}")
        x2d = x.reshape(-1, self.in_features)
        dtype, use_kernel = self._plan(x, x2d.shape[0])
        xc = x2d.to(dtype)
        if use_kernel:
            try:
                y = self._kernel(xc.contiguous(), dtype)
            except RuntimeError as exc:
                raise RuntimeError(
                    f"the {self.kind} kernel failed for {self} on {x.device} ({dtype}, input {tuple(x2d.shape)}): {exc}"
                ) from exc
        else:
            y = self._dequantize_matmul(xc)
        return y.to(x.dtype).view(*x.shape[:-1], self.out_features)

    def _dequantize_matmul(self, x2d: torch.Tensor) -> torch.Tensor:  # the prefill, and any call without a kernel
        return F.linear(x2d, self._dequantized(x2d.dtype))


class Int8Linear(_QuantLinear):
    """Weight-only int8 linear layer (symmetric, one scale per output channel), no bias."""

    _FLOAT32_BUFFERS = ("weight_scale",)
    _TENSORS = ("weight", "weight_scale")
    kind = "int8"

    def __init__(self, in_features: int, out_features: int, bias: bool | None = None, device=None) -> None:
        super().__init__(in_features, out_features, bias)
        self.register_buffer("weight", torch.zeros(out_features, in_features, dtype=torch.int8, device=device))
        self.register_buffer("weight_scale", torch.ones(out_features, dtype=torch.float32, device=device))

    @classmethod
    def from_weight(cls, weight: torch.Tensor, compute_dtype: torch.dtype | None = None) -> Int8Linear:
        """Quantize ``weight [out, in]`` (any float dtype; the math is float32) on its device.
        ``compute_dtype``: the activation dtype, to prepare the kernel layout now rather than at the first call."""
        q, scale = quantize_int8(weight)
        module = cls(weight.shape[1], weight.shape[0], device="meta")
        module.weight, module.weight_scale = q, scale
        if compute_dtype is not None:
            module.prepare(compute_dtype)
        return module

    def dequantize(self) -> torch.Tensor:
        return self.weight.float() * self.weight_scale[:, None]

    def _dequantized(self, dtype: torch.dtype) -> torch.Tensor:
        return self.weight.to(dtype) * self.weight_scale.to(dtype)[:, None]

    def _dequantize_matmul(self, x2d: torch.Tensor) -> torch.Tensor:
        # Scaling the output is cheaper than scaling the weight and the same up to rounding. On the CPU in
        # pieces of output rows: the widened weight of a fused gate/up layer is 25 MB for the 0.6B in
        # float32, a piece of it 4 MB, which keeps the prefill's peak memory down (same numbers: each
        # output is one row of the weight's products).
        scale = self.weight_scale.to(x2d.dtype)
        rows = self.out_features
        if x2d.device.type != "cpu" or rows <= DEQUANTIZE_PIECE_ROWS:
            return F.linear(x2d, self.weight.to(x2d.dtype)) * scale
        out = torch.empty(x2d.shape[0], rows, dtype=x2d.dtype)
        for start in range(0, rows, DEQUANTIZE_PIECE_ROWS):
            stop = min(rows, start + DEQUANTIZE_PIECE_ROWS)
            torch.mul(F.linear(x2d, self.weight[start:stop].to(x2d.dtype)), scale[start:stop], out=out[:, start:stop])
        return out

    def prepare(self, dtype: torch.dtype) -> None:
        """Build the kernel's inputs for ``dtype`` on the module's device (done lazily otherwise)."""
        self._scales_for(dtype)

    def _scales_for(self, dtype: torch.dtype) -> torch.Tensor:
        key = (self.weight.device, dtype)
        if key not in self._cache:
            self._cache[key] = (self.weight_scale.to(dtype).contiguous(),)
        return self._cache[key][0]

    def _kernel_fits(self, device: torch.device, dtype: torch.dtype) -> bool:
        # torch's CPU bf16 kernel crashes or gives garbage when in_features is not a multiple of 16.
        return self.in_features % 32 == 0 and self.out_features % 16 == 0

    def _cuda_path(self, device: torch.device, dtype: torch.dtype) -> str:
        return cuda_int8_path(device, dtype, self.options)

    def _torch_kernel(self, x2d: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return torch._weight_int8pack_mm(x2d, self.weight, self._scales_for(dtype))

    def _triton_kernel(self, x2d: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        from dictation.asr.nn.kernels.triton_gemv import int8_matmul

        return int8_matmul(x2d, self.weight, self.weight_scale)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias=False, int8 per-channel"


class Int4Linear(_QuantLinear):
    """Weight-only int4 linear layer (asymmetric, groupwise along in_features), no bias."""

    _FLOAT32_BUFFERS = ("scales", "zeros")
    _TENSORS = ("qweight", "scales", "zeros")
    kind = "int4"

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool | None = None,
        device=None,
        *,
        group_size: int = DEFAULT_GROUP_SIZE,
    ) -> None:
        super().__init__(in_features, out_features, bias)
        self.group_size = pick_group_size(in_features, group_size)
        n_groups = in_features // self.group_size
        self.register_buffer("qweight", torch.zeros(out_features, in_features // 2, dtype=torch.uint8, device=device))
        self.register_buffer("scales", torch.ones(out_features, n_groups, dtype=torch.float32, device=device))
        self.register_buffer("zeros", torch.zeros(out_features, n_groups, dtype=torch.float32, device=device))

    @classmethod
    def from_weight(
        cls,
        weight: torch.Tensor,
        compute_dtype: torch.dtype | None = None,
        *,
        group_size: int = DEFAULT_GROUP_SIZE,
    ) -> Int4Linear:
        """Quantize ``weight [out, in]`` (any float dtype; the math is float32) on its device, with
        ``pick_group_size(in, group_size)``. ``compute_dtype``: prepare the kernel layout now."""
        module = cls(weight.shape[1], weight.shape[0], device="meta", group_size=group_size)
        module.qweight, module.scales, module.zeros = quantize_int4(weight, module.group_size)
        if compute_dtype is not None:
            module.prepare(compute_dtype)
        return module

    def _quant_kwargs(self) -> dict:
        return {"group_size": self.group_size}

    def dequantize(self) -> torch.Tensor:
        return self._dequantized(torch.float32)

    def _dequantized(self, dtype: torch.dtype) -> torch.Tensor:
        if self.qweight.device.type in self.options.one_pass_dequantize:
            from dictation.asr.nn.kernels import triton_dequant

            if dtype in triton_dequant.DTYPES and one_pass_dequantize_usable(self.qweight.device, dtype):
                scale, mid = self._half_scales(dtype)
                return triton_dequant.int4_dequantize(self.qweight, scale, mid, self.group_size)
        return self.torch_dequantized(dtype)

    def torch_dequantized(self, dtype: torch.dtype) -> torch.Tensor:
        """The weight in ``dtype`` by torch operations (what :meth:`_dequantized` gives on any device)."""
        q = unpack_int4(self.qweight).view(self.out_features, -1, self.group_size).to(dtype)
        if dtype == torch.float32:
            w = q * self.scales[..., None] + self.zeros[..., None]
        else:
            # Around the group midpoint, as the kernels do: in bf16/fp16 the terms are then small
            # (|q - 8| <= 8) and the rounding error about 3x smaller than with q * scale + min.
            scale, mid = self._half_scales(dtype)
            w = (q - 8) * scale[..., None] + mid[..., None]
        return w.view(self.out_features, self.in_features)

    def _half_scales(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        key = ("scales", self.scales.device, dtype)
        if key not in self._cache:
            mid = self.zeros + 8 * self.scales
            self._cache[key] = (self.scales.to(dtype), mid.to(dtype))
        return self._cache[key]

    def prepare(self, dtype: torch.dtype) -> None:
        """Build torch's kernel layout for ``dtype`` on the module's device (done lazily otherwise); a
        no-op where that kernel does not apply."""
        device = self.qweight.device
        if (
            self.options.quant_kernels
            and self._kernel_fits(device, dtype)
            and (device.type != "cuda" or dtype == torch.bfloat16)
        ):
            self._packed_for(dtype)

    def _inner_k_tiles(self) -> int:
        return next(t for t in (8, 4, 2) if self.in_features % (16 * t) == 0)

    def _kernel_fits(self, device: torch.device, dtype: torch.dtype) -> bool:
        if device.type == "cpu":
            return self.out_features % 16 == 0 and self.in_features % 32 == 0
        if device.type == "cuda":  # tinygemm: n tiles of 8, k tiles of 16 (x 2 at least), bf16 only (its probe)
            return self.out_features % 8 == 0 and self.in_features % 32 == 0
        return False

    def _packed_for(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """torch's packed weights (one copy for every dtype: they do not depend on it) and the
        ``scales_and_zeros`` in ``dtype``, each cached once."""
        device = self.qweight.device
        packed_key, key = ("packed", device), (device, dtype)
        with torch.inference_mode(False), torch.no_grad():
            if packed_key not in self._cache:
                if device.type == "cuda":
                    packed = torch._convert_weight_to_int4pack(self.qweight.contiguous(), self._inner_k_tiles())
                else:
                    packed = torch._convert_weight_to_int4pack_for_cpu(unpack_int4(self.qweight).to(torch.int32), 1)
                self._cache[packed_key] = (packed,)
            if key not in self._cache:
                # The kernels compute (q - 8) * scale + zero: their zero is the group midpoint.
                zero = self.zeros + 8 * self.scales
                self._cache[key] = (torch.stack((self.scales, zero), dim=-1).transpose(0, 1).contiguous().to(dtype),)
        return self._cache[packed_key][0], self._cache[key][0]

    def _cuda_path(self, device: torch.device, dtype: torch.dtype) -> str:
        return cuda_int4_path(device, dtype, self.options)

    def _torch_kernel(self, x2d: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        packed, sz = self._packed_for(dtype)
        if x2d.device.type == "cuda":
            return torch._weight_int4pack_mm(x2d, packed, self.group_size, sz)
        return torch._weight_int4pack_mm_for_cpu(x2d, packed, self.group_size, sz)

    def _triton_kernel(self, x2d: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        from dictation.asr.nn.kernels.triton_gemv import int4_matmul

        return int4_matmul(x2d, self.qweight, self.scales, self.zeros)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bias=False, "
            f"int4 group_size={self.group_size}"
        )


QUANT_MODULES = (Int8Linear, Int4Linear)
_LAYER_TYPES = {m.kind: m for m in QUANT_MODULES}
