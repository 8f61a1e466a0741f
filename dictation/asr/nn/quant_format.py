"""How the decoder's linear layers are stored as int8 / int4: the format and the rounding.

Storage format (device independent; what a pre-quantized folder holds, under the checkpoint's own
tensor names, e.g. ``thinker.model.layers.0.self_attn.q_proj.*``):

- int8, symmetric per output channel: ``<name>.weight`` int8 ``[out, in]`` in -127..127 and
  ``<name>.weight_scale`` float32 ``[out]``; ``w = weight * weight_scale[:, None]``,
  ``weight_scale = absmax(row) / 127`` (1 for an all-zero row).
- int4, asymmetric, groupwise along ``in``: ``<name>.qweight`` uint8 ``[out, in / 2]``, two 4-bit
  values q in 0..15 per byte, the HIGH nibble holding the even column (``byte = q[2j] << 4 | q[2j+1]``,
  the order torch's CUDA int4 packer reads); ``<name>.scales`` and ``<name>.zeros`` float32
  ``[out, in / group]``; ``w = q * scales + zeros`` per group (``zeros`` is the value q = 0 stands
  for, ``scales`` the step; 1 for a constant group). The group size is
  ``pick_group_size(in_features, group_size)`` with ``group_size`` from ``quantization_config``.
  Scales and zeros are float32 rather than bf16 so that dequantization is exact on every device; they
  cost 0.5 bit per weight at group 128. How they are chosen (``INT4_METHOD``, recorded as
  ``int4_method``, which reading ignores): "mse" picks per group the grid with the least squared
  error among a few clipped ranges and refits it by least squares (:func:`_mse_grid`); "minmax",
  what folders written before had, spans the group's range (``zeros`` = minimum, ``scales`` =
  (max - min) / 15). Both are round-to-nearest without calibration data. On Gaussian weights the
  relative error ``|w' - w| / |w|`` is 0.0998 for minmax at group 128 (0.0896 at 64, 0.0782 at 32)
  and 0.0936 for mse (0.0846, 0.0733); int8 per channel gives 0.0083.
"""

from __future__ import annotations

import torch

VARIANTS = ("bf16", "fp16", "fp32", "int8", "int4")
QUANTIZED = ("int8", "int4")
DEFAULT_GROUP_SIZE = 128
GROUP_SIZES = (256, 128, 64, 32)  # what the int4 kernels accept; smaller ones are tried for narrow layers
QUANT_METHOD = "dictation"
FORMAT_VERSION = 1
# How int4 scales and zeros are chosen (the stored format is the same for both, see the docstring):
# "mse" (default): per group, the grid with the smallest squared error among a few clipped ranges,
# refined by least squares; "minmax": the group's full range (what format 1 folders written before
# held). On Gaussian weights at group 128 "mse" has 6 % less error (12 % less squared error).
INT4_METHODS = ("mse", "minmax")
INT4_METHOD = "mse"
_MSE_SHRINK = (1.0, 0.9, 0.8)  # the ranges tried, as fractions of the group's own (around its middle)
_MSE_REFITS = 2  # least-squares refits of scale and zero to the chosen integers
_QUANTIZE_ROWS = 1024  # rows quantized at a time (bounds the temporaries)
LAYER_MODULES = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj")
LAYER_MODULES += ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")  # per decoder layer
MODULES_TEXT = "decoder linear layers (q,k,v,o,gate,up,down)"


def pick_group_size(in_features: int, group_size: int = DEFAULT_GROUP_SIZE) -> int:
    """The int4 group size for a layer: ``group_size`` if it divides ``in_features``, else the largest
    smaller one of 128/64/32 that does. Raises ValueError if none does."""
    if group_size not in GROUP_SIZES:
        raise ValueError(f"int4 group size {group_size} is not supported; choose one of {sorted(GROUP_SIZES)}")
    for g in GROUP_SIZES:
        if g <= group_size and in_features % g == 0:
            return g
    raise ValueError(
        f"int4 needs in_features divisible by 32, 64 or 128 (at most the group size {group_size}); "
        f"this layer has in_features {in_features}"
    )


def _check_weight(weight: torch.Tensor) -> torch.Tensor:
    if weight.dim() != 2 or not weight.is_floating_point():
        raise ValueError(f"expected a 2-D floating weight, got {tuple(weight.shape)} {weight.dtype}")
    w = weight.detach().float()
    if not bool(torch.isfinite(w).all()):
        raise ValueError("cannot quantize a weight that holds NaN or infinity")
    return w


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[out, in]`` float -> (int8 ``[out, in]``, float32 scale ``[out]``), computed in float32."""
    w = _check_weight(weight)
    absmax = w.abs().amax(dim=1)
    scale = torch.where(absmax > 0, absmax / 127, torch.ones_like(absmax))
    q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scale


def quantize_int4(
    weight: torch.Tensor, group_size: int, method: str | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``[out, in]`` float -> (qweight uint8 ``[out, in/2]``, scales, zeros float32 ``[out, in/group]``),
    with ``method`` one of ``INT4_METHODS`` (default ``INT4_METHOD``); computed in float32."""
    method = INT4_METHOD if method is None else method
    if method not in INT4_METHODS:
        raise ValueError(f"int4 method {method!r} is not one of {', '.join(INT4_METHODS)}")
    w = _check_weight(weight)
    out_f, in_f = w.shape
    if in_f % group_size:
        raise ValueError(f"in_features {in_f} is not divisible by the group size {group_size}")
    qs, scale_parts, zero_parts = [], [], []
    for start in range(0, out_f, _QUANTIZE_ROWS):
        groups = w[start : start + _QUANTIZE_ROWS].reshape(-1, in_f // group_size, group_size)
        scales, zeros = _minmax_grid(groups) if method == "minmax" else _mse_grid(groups)
        qs.append(_round_to_grid(groups, scales, zeros).to(torch.uint8).view(-1, in_f))
        scale_parts.append(scales)
        zero_parts.append(zeros)
    return pack_int4(torch.cat(qs)), torch.cat(scale_parts), torch.cat(zero_parts)


def _round_to_grid(groups: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor) -> torch.Tensor:
    return torch.round((groups - zeros[..., None]) / scales[..., None]).clamp_(0, 15)


def _minmax_grid(groups: torch.Tensor, shrink: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(scales, zeros) spanning each group's range, or ``shrink`` times it around its middle; scale 1
    for a constant group."""
    lo, hi = groups.amin(dim=-1), groups.amax(dim=-1)
    if shrink != 1.0:
        middle, half = (hi + lo) / 2, (hi - lo) * (shrink / 2)
        lo, hi = middle - half, middle + half
    span = hi - lo
    return torch.where(span > 0, span / 15, torch.ones_like(span)), lo


def _mse_grid(groups: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(scales, zeros) per group with little squared error and no calibration data: the best of a few
    clipped ranges (clipping the extremes of a group makes the steps finer for everything else), then
    ``_MSE_REFITS`` rounds of fitting scale and zero to the chosen integers by least squares and
    rounding again, each kept only where it lowers the group's error. Errors come from per-group sums
    (of q, q*q, q*w, w, w*w), so no candidate's dequantized weights are ever formed; the groups are
    centred first, so that those sums do not cancel for a group far from 0 (float32)."""
    n = groups.shape[-1]
    centre = groups.mean(dim=-1)
    groups = groups - centre[..., None]  # the grid is found for these, then moved back
    w_sum, w_sq = groups.sum(dim=-1), torch.linalg.vecdot(groups, groups)

    def stats(s: torch.Tensor, z: torch.Tensor):
        q = _round_to_grid(groups, s, z)
        q_sum, q_sq, qw = q.sum(dim=-1), torch.linalg.vecdot(q, q), torch.linalg.vecdot(q, groups)
        # sum((q s + z - w)^2), expanded
        err = s * s * q_sq + 2 * s * z * q_sum - 2 * s * qw + n * z * z - 2 * z * w_sum + w_sq
        return err, (q_sum, q_sq, qw)

    best_s = best_z = best_e = best_sums = None
    for shrink in _MSE_SHRINK:
        s, z = _minmax_grid(groups, shrink)
        e, sums = stats(s, z)
        if best_e is None:
            best_s, best_z, best_e, best_sums = s, z, e, sums
            continue
        better = e < best_e
        best_s, best_z, best_e = _pick(better, (s, z, e), (best_s, best_z, best_e))
        best_sums = _pick(better, sums, best_sums)
    for _ in range(_MSE_REFITS):
        q_sum, q_sq, qw = best_sums
        var = q_sq - q_sum * q_sum / n
        cov = qw - q_sum * w_sum / n
        fit = (var > 0) & (cov > 0)  # all integers equal (a constant group): nothing to fit (sums of
        # small integers are exact in float32, so var is exactly 0 then)
        s = torch.where(fit, cov / torch.where(fit, var, torch.ones_like(var)), best_s)
        z = torch.where(fit, (w_sum - s * q_sum) / n, best_z)
        e, sums = stats(s, z)
        better = fit & (e < best_e)
        best_s, best_z, best_e = _pick(better, (s, z, e), (best_s, best_z, best_e))
        best_sums = _pick(better, sums, best_sums)
    return best_s, best_z + centre


def _pick(
    where: torch.Tensor, new: tuple[torch.Tensor, ...], old: tuple[torch.Tensor, ...]
) -> tuple[torch.Tensor, ...]:
    return tuple(torch.where(where, a, b) for a, b in zip(new, old, strict=True))


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """uint8 values 0..15 ``[out, in]`` -> ``[out, in/2]``, even column in the high nibble."""
    return (q[:, 0::2] << 4) | q[:, 1::2]


def unpack_int4(qweight: torch.Tensor) -> torch.Tensor:
    """``[out, in/2]`` uint8 -> ``[out, in]`` uint8 values 0..15 (inverse of :func:`pack_int4`)."""
    return torch.stack((qweight >> 4, qweight & 0xF), dim=-1).view(qweight.shape[0], -1)
