"""The Triton kernels of triton_fused.py (see there for what each computes and why).

A module of its own, imported at the first use: importing triton takes about a second, and kernels
that call each other (``norm_rope``) must be module globals for Triton's interpreter to find them.
Every cast to the activation dtype below is a rounding the torch code makes at the same point.
Row counts and start positions are not specialized on (``do_not_specialize``): a prompt of another
length must not compile the kernel again (about a second each, at the user's first dictation).
"""

import triton
import triton.language as tl


@triton.jit(do_not_specialize=["M"])
def rms_norm_rows(x_ptr, delta_ptr, w_ptr, h_ptr, y_ptr, M, N, stride_x, stride_d, eps, HAS_DELTA: tl.constexpr,
                  ROWS: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
    # ROWS rows per program: h = x + delta (rounded), y = weight * (h * rsqrt(mean(h^2) + eps)).to(dtype).
    # h and y are [M, N] contiguous.
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]
    cols = tl.arange(0, BLOCK)[None, :]
    ok = (rows < M) & (cols < N)
    dtype = h_ptr.dtype.element_ty
    x = tl.load(x_ptr + rows * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
    if HAS_DELTA:
        d = tl.load(delta_ptr + rows * stride_d + cols, mask=ok, other=0.0).to(tl.float32)
        x = (x + d).to(dtype).to(tl.float32)
    tl.store(h_ptr + rows * N + cols, x.to(dtype), mask=ok)
    rstd = tl.rsqrt(tl.sum(x * x, axis=1) / N + eps)[:, None]
    y = (x * rstd).to(dtype).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
    tl.store(y_ptr + rows * N + cols, (w * y).to(dtype), mask=ok)


@triton.jit
def norm_rope(x_ptr, w_ptr, cos, sin, eps, NH: tl.constexpr, NH_P2: tl.constexpr, HD: tl.constexpr):
    # NH consecutive head vectors at x_ptr: per head RMSNorm (float32, cast, times the weight), then
    # RoPE with the position's cos/sin [1, HD], in their dtype. Returns [NH_P2, HD] (rows >= NH: 0).
    dtype = cos.dtype
    h = tl.arange(0, NH_P2)[:, None]
    d = tl.arange(0, HD)[None, :]
    ok = (h < NH) & (d < HD)
    partner = (d + HD // 2) % HD  # rotate_half reads the other half
    x = tl.load(x_ptr + h * HD + d, mask=ok, other=0.0).to(tl.float32)
    xp = tl.load(x_ptr + h * HD + partner, mask=ok, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=1) / HD + eps)[:, None]
    y = tl.load(w_ptr + d).to(tl.float32) * (x * rstd).to(dtype).to(tl.float32)
    yp = tl.load(w_ptr + partner).to(tl.float32) * (xp * rstd).to(dtype).to(tl.float32)
    y = y.to(dtype).to(tl.float32)
    yp = yp.to(dtype).to(tl.float32)
    rotated = tl.where(d < HD // 2, -yp, yp)
    a = (y * cos.to(tl.float32)).to(dtype).to(tl.float32)
    b = (rotated * sin.to(tl.float32)).to(dtype).to(tl.float32)
    return (a + b).to(dtype)


@triton.jit(do_not_specialize=["S", "start"])
def rope_rows(q_ptr, k_ptr, v_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, q_out_ptr, kc_ptr, vc_ptr, S, start, stride_q,
              stride_k, stride_v, stride_cache, eps, HEADS: tl.constexpr, HEADS_P2: tl.constexpr, KV: tl.constexpr,
              KV_P2: tl.constexpr, HD: tl.constexpr):  # fmt: skip
    # One program per row (position start + row): its query heads normed and rotated into
    # q_out [HEADS, S, HD], its kv heads' k (normed, rotated) and v into the cache [KV, max_len, HD].
    # cos/sin: the rows' table rows [S, HD].
    row = tl.program_id(0)
    d = tl.arange(0, HD)[None, :]
    cos = tl.load(cos_ptr + row * HD + d)
    sin = tl.load(sin_ptr + row * HD + d)
    h = tl.arange(0, HEADS_P2)[:, None]
    q = norm_rope(q_ptr + row * stride_q, qw_ptr, cos, sin, eps, HEADS, HEADS_P2, HD)
    tl.store(q_out_ptr + (h * S + row) * HD + d, q, mask=(h < HEADS) & (d < HD))
    g = tl.arange(0, KV_P2)[:, None]
    ok = (g < KV) & (d < HD)
    k = norm_rope(k_ptr + row * stride_k, kw_ptr, cos, sin, eps, KV, KV_P2, HD)
    at = g * stride_cache + (start + row) * HD + d
    tl.store(kc_ptr + at, k, mask=ok)
    tl.store(vc_ptr + at, tl.load(v_ptr + row * stride_v + g * HD + d, mask=ok, other=0.0), mask=ok)


@triton.jit
def decode_attention(q_ptr, k_ptr, v_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, kc_ptr, vc_ptr, pos_ptr, o_ptr, acc_ptr,
                     ml_ptr, stride_cache, eps, scale, GROUP: tl.constexpr, GROUP_P2: tl.constexpr,
                     HD: tl.constexpr, SPLITS: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
    # Program (kv head, split), for the GROUP query heads of that kv head. The token at the device
    # position `pos`: its q and k are normed and rotated here; positions < pos are read from the
    # cache, `pos` itself taken from registers (split 0 writes it into the cache; no program reads it
    # from there). The filled length pos + 1 is cut into SPLITS ranges of whole blocks; each split
    # keeps a running max, sum and weighted v per query head (online softmax, float32).
    kv = tl.program_id(0)
    split = tl.program_id(1)
    d = tl.arange(0, HD)[None, :]
    g = tl.arange(0, GROUP_P2)[:, None]
    g_ok = (g < GROUP) & (d < HD)
    pos = tl.load(pos_ptr)
    cos = tl.load(cos_ptr + pos * HD + d)
    sin = tl.load(sin_ptr + pos * HD + d)
    q = norm_rope(q_ptr + kv * GROUP * HD, qw_ptr, cos, sin, eps, GROUP, GROUP_P2, HD).to(tl.float32)
    k_new = norm_rope(k_ptr + kv * HD, kw_ptr, cos, sin, eps, 1, 1, HD)  # [1, HD]
    v_new = tl.load(v_ptr + kv * HD + d)
    kc = kc_ptr + kv * stride_cache
    vc = vc_ptr + kv * stride_cache
    if split == 0:
        tl.store(kc + pos * HD + d, k_new)
        tl.store(vc + pos * HD + d, v_new)
    length = pos + 1
    per = tl.cdiv(tl.cdiv(length, SPLITS), BLOCK) * BLOCK
    lo = split * per
    hi = tl.minimum(lo + per, length)
    q3 = q[:, None, :]  # [G, 1, HD]
    k_new3 = k_new.to(tl.float32)[:, None, :]  # [1, 1, HD]
    v_new3 = v_new.to(tl.float32)[:, None, :]
    m = tl.full([GROUP_P2], -1e30, tl.float32)  # running max (finite: empty splits stay NaN-free)
    total = tl.zeros([GROUP_P2], tl.float32)  # running sum of exp
    acc = tl.zeros([GROUP_P2, HD], tl.float32)
    for first in range(lo, hi, BLOCK):
        p = first + tl.arange(0, BLOCK)
        cached = (p < pos)[:, None]
        here = (p == pos)[None, :, None]
        tile = p[:, None] * HD + d
        k = tl.load(kc + tile, mask=cached, other=0.0).to(tl.float32)[None, :, :]
        k = tl.where(here, k_new3, k)  # [1, BLOCK, HD]
        s = tl.sum(q3 * k, axis=2) * scale  # [G, BLOCK]
        s = tl.where((p < hi)[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp(m - m_new)
        w = tl.exp(s - m_new[:, None])
        v = tl.load(vc + tile, mask=cached, other=0.0).to(tl.float32)[None, :, :]
        v = tl.where(here, v_new3, v)
        total = total * alpha + tl.sum(w, axis=1)
        acc = acc * alpha[:, None] + tl.sum(w[:, :, None] * v, axis=1)
        m = m_new
    if SPLITS == 1:
        tl.store(o_ptr + (kv * GROUP + g) * HD + d, (acc / total[:, None]).to(o_ptr.dtype.element_ty), mask=g_ok)
    else:
        part = (kv * GROUP + g) * SPLITS + split  # [G, 1]
        tl.store(acc_ptr + part * HD + d, acc, mask=g_ok)
        gv = tl.arange(0, GROUP_P2)
        part = (kv * GROUP + gv) * SPLITS + split  # [G]
        tl.store(ml_ptr + part * 2, m, mask=gv < GROUP)
        tl.store(ml_ptr + part * 2 + 1, total, mask=gv < GROUP)


@triton.jit
def combine_splits(acc_ptr, ml_ptr, o_ptr, SPLITS: tl.constexpr, SPLITS_P2: tl.constexpr, HD: tl.constexpr):
    # One query head: the splits' partial softmax sums rescaled to their common maximum.
    head = tl.program_id(0)
    s = tl.arange(0, SPLITS_P2)
    ok = s < SPLITS
    part = head * SPLITS + s
    m = tl.load(ml_ptr + part * 2, mask=ok, other=-1e30)
    total = tl.load(ml_ptr + part * 2 + 1, mask=ok, other=0.0)
    w = tl.exp(m - tl.max(m, axis=0))
    d = tl.arange(0, HD)
    acc = tl.load(acc_ptr + part[:, None] * HD + d[None, :], mask=ok[:, None], other=0.0)
    out = tl.sum(w[:, None] * acc, axis=0) / tl.sum(w * total, axis=0)
    tl.store(o_ptr + head * HD + d, out.to(o_ptr.dtype.element_ty))


@triton.jit(do_not_specialize=["M"])
def silu_mul_rows(g_ptr, u_ptr, o_ptr, M, N, stride_g, stride_u, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    # silu(gate) rounded to the dtype (as F.silu), times up, rounded again; out [M, N] contiguous.
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)[None, :]
    ok = (rows < M) & (cols < N)
    dtype = o_ptr.dtype.element_ty
    g = tl.load(g_ptr + rows * stride_g + cols, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + rows * stride_u + cols, mask=ok, other=0.0).to(tl.float32)
    s = (g / (1.0 + tl.exp(-g))).to(dtype).to(tl.float32)
    tl.store(o_ptr + rows * N + cols, (s * u).to(dtype), mask=ok)


@triton.jit
def gemv_rows(x_ptr, w_ptr, y_ptr, res_ptr, nw_ptr, N, K, eps, PROLOGUE: tl.constexpr, RESIDUAL: tl.constexpr,
              BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):  # fmt: skip
    # One row: y[n] = sum_k w[n, k] * a[k] for BLOCK_N outputs, a = x (PROLOGUE 0), RMSNorm(x) * nw
    # (1: computed here from the whole x, rounded as decoder.RMSNorm rounds) or silu(x[:K]) * x[K:]
    # (2, rounded as F.silu(gate) * up). RESIDUAL: y = res + y, rounded after each, as h + linear(..).
    dtype = y_ptr.dtype.element_ty
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    rstd = 0.0
    if PROLOGUE == 1:
        squares = tl.zeros([BLOCK_K], tl.float32)
        for start in range(0, K, BLOCK_K):
            cols = start + tl.arange(0, BLOCK_K)
            x = tl.load(x_ptr + cols, mask=cols < K, other=0.0).to(tl.float32)
            squares += x * x
        rstd = tl.rsqrt(tl.sum(squares, axis=0) / K + eps)
    acc = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    for start in range(0, K, BLOCK_K):
        cols = start + tl.arange(0, BLOCK_K)
        col_ok = cols < K
        a = tl.load(x_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
        if PROLOGUE == 1:
            nw = tl.load(nw_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
            a = (nw * (a * rstd).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
        if PROLOGUE == 2:
            up = tl.load(x_ptr + K + cols, mask=col_ok, other=0.0).to(tl.float32)
            a = ((a / (1.0 + tl.exp(-a))).to(dtype).to(tl.float32) * up).to(dtype).to(tl.float32)
        w = tl.load(w_ptr + rows[:, None] * K + cols[None, :], mask=row_ok[:, None] & col_ok[None, :], other=0.0)
        acc += w.to(tl.float32) * a[None, :]
    y = tl.sum(acc, axis=1).to(dtype)
    if RESIDUAL:
        y = (y.to(tl.float32) + tl.load(res_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)).to(dtype)
    tl.store(y_ptr + rows, y, mask=row_ok)
