/* The CPU decode step of an int8 decoder, one call for all layers (docs/engine.md, "The native
 * CPU step").
 *
 * Why C: a decode step on the CPU reads every weight once, so its time is the bytes it reads over
 * the memory bandwidth, plus whatever else it does. Through torch, an int8 step spends its time in
 * torch's weight-only int8 kernel (bound by its own arithmetic, about half the bandwidth of two
 * cores) and in ~90 small operators a layer. Here one OpenMP region runs every layer: the int8
 * matrix-vector products stream their rows, and the norms, RoPE, the cache write, attention and
 * SiLU are a few loops between them.
 *
 * Compiled on the user's machine at first use (native_step.py) with -O3 -march=native, loaded with
 * ctypes and run on torch's own OpenMP runtime (linked by soname, so the two share one thread pool).
 *
 * Numerics: weight-only int8 with one float32 scale per output row, as Int8Linear; activations,
 * the residual stream and every sum in float32. The KV cache keeps the model's dtype (bf16 or
 * float32): what this writes is what the torch path would store, rounded to nearest even.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <omp.h>

typedef struct {
    const int8_t *wqkv; /* [(heads + 2 kv_heads) * head_dim, hidden] q, k, v rows stacked */
    const float *sqkv;
    const int8_t *wo; /* [hidden, heads * head_dim] */
    const float *so;
    const int8_t *wgu; /* [2 * inter, hidden] gate rows, then up rows */
    const float *sgu;
    const int8_t *wd; /* [hidden, inter] */
    const float *sd;
    const float *ln1, *ln2, *qn, *kn; /* norm weights, float32 */
    void *kc, *vc;                    /* this layer's cache, [kv_heads, max_len, head_dim] */
} Layer;

typedef struct {
    int hidden, inter, heads, kv_heads, head_dim, max_len, cache_bf16;
    float eps;
} Dims;

static inline float bf16_to_f32(uint16_t v) {
    uint32_t u = (uint32_t)v << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* NaN stays NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* What the torch path stores, read back: the cache's rounding of v. */
static inline float cache_put(void *c, int bf16, size_t i, float v) {
    if (bf16) {
        uint16_t b = f32_to_bf16(v);
        ((uint16_t *)c)[i] = b;
        return bf16_to_f32(b);
    }
    ((float *)c)[i] = v;
    return v;
}

/* RMSNorm as the reference orders it: x * rsqrt(mean(x^2) + eps), then times the weight. */
static void rms_norm(const float *x, const float *w, float *y, int n, float eps) {
    float ss = 0.0f;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    float r = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = 0; i < n; i++) y[i] = w[i] * (x[i] * r);
}

#if defined(__AVX512F__)
#include <immintrin.h>
#define LANES 16
typedef __m512 vec;
static inline vec vzero(void) { return _mm512_setzero_ps(); }
static inline vec vload(const float *x) { return _mm512_loadu_ps(x); }
/* 16 int8 weights widened to float32 (vpmovsxbd from memory, then vcvtdq2ps). */
static inline vec vwiden(const int8_t *w) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)w)));
}
static inline vec vfma(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
static inline float vsum(vec a) { return _mm512_reduce_add_ps(a); }
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define LANES 8
typedef __m256 vec;
static inline vec vzero(void) { return _mm256_setzero_ps(); }
static inline vec vload(const float *x) { return _mm256_loadu_ps(x); }
static inline vec vwiden(const int8_t *w) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)w)));
}
static inline vec vfma(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
static inline float vsum(vec a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#endif

/* Dot products of `rows` (1 to 4) consecutive int8 rows of length k with x: acc[j]. */
static inline void dot_rows(const int8_t *w, const float *x, int k, int rows, float *acc) {
    int i = 0;
    for (int j = 0; j < rows; j++) acc[j] = 0.0f;
#ifdef LANES
    if (rows == 4) {
        const int8_t *w0 = w, *w1 = w + k, *w2 = w1 + k, *w3 = w2 + k;
        vec a0 = vzero(), a1 = vzero(), a2 = vzero(), a3 = vzero();
        vec b0 = vzero(), b1 = vzero(), b2 = vzero(), b3 = vzero();
        /* The next block of four rows (the 4 k bytes after these) is fetched while these are read:
         * one thread's reads alone do not keep enough lines in flight to reach the bandwidth. */
        const char *next = (const char *)(w + 4 * (size_t)k);
        int lines = 4 * k / 64, step = 2 * LANES, per = (lines * step + k - 1) / k, line = 0;
        for (; i + 2 * LANES <= k; i += 2 * LANES) {
            for (int p = 0; p < per && line < lines; p++, line++) _mm_prefetch(next + 64 * (size_t)line, _MM_HINT_T1);
            vec x0 = vload(x + i), x1 = vload(x + i + LANES);
            a0 = vfma(vwiden(w0 + i), x0, a0);
            a1 = vfma(vwiden(w1 + i), x0, a1);
            a2 = vfma(vwiden(w2 + i), x0, a2);
            a3 = vfma(vwiden(w3 + i), x0, a3);
            b0 = vfma(vwiden(w0 + i + LANES), x1, b0);
            b1 = vfma(vwiden(w1 + i + LANES), x1, b1);
            b2 = vfma(vwiden(w2 + i + LANES), x1, b2);
            b3 = vfma(vwiden(w3 + i + LANES), x1, b3);
        }
        acc[0] = vsum(a0) + vsum(b0), acc[1] = vsum(a1) + vsum(b1);
        acc[2] = vsum(a2) + vsum(b2), acc[3] = vsum(a3) + vsum(b3);
    } else {
        for (int j = 0; j < rows; j++) {
            vec a = vzero();
            int t = 0;
            for (; t + LANES <= k; t += LANES) a = vfma(vwiden(w + (size_t)j * k + t), vload(x + t), a);
            acc[j] = vsum(a);
        }
        i = k - k % LANES;
    }
#endif
    for (int j = 0; j < rows; j++) { /* the tail, and everything without vector instructions */
        const int8_t *wr = w + (size_t)j * k;
        float a = 0.0f;
        for (int t = i; t < k; t++) a += (float)wr[t] * x[t];
        acc[j] += a;
    }
}

/* y[r] = scale[r] * (w[r] . x) (+ res[r]) for r < n, shared out among the team's threads in
 * contiguous blocks of rows (each thread streams its own part of w). Four rows at a time share the
 * loads of x. Inside a parallel region; ends with the team's barrier. y may be res. */
static void gemv(const int8_t *w, const float *scale, const float *x, float *y, int n, int k, const float *res) {
    int blocks = (n + 3) / 4;
#pragma omp for schedule(static)
    for (int b = 0; b < blocks; b++) {
        int r = b * 4, rows = n - r < 4 ? n - r : 4;
        float acc[4];
        dot_rows(w + (size_t)r * k, x, k, rows, acc);
        for (int j = 0; j < rows; j++) {
            float v = acc[j] * scale[r + j];
            y[r + j] = res ? res[r + j] + v : v;
        }
    }
}

/* NeoX split-half RoPE in place: x' = x * cos + rotate_half(x) * sin. */
static void rope(float *x, const float *cos_row, const float *sin_row, int hd) {
    int half = hd / 2;
    for (int i = 0; i < half; i++) {
        float a = x[i], b = x[i + half];
        x[i] = a * cos_row[i] - b * sin_row[i];
        x[i + half] = b * cos_row[i + half] + a * sin_row[i + half];
    }
}

/* Scratch floats decoder_step needs (the caller allocates them). */
size_t scratch_floats(const Dims *d) {
    size_t qkv = (size_t)(d->heads + 2 * d->kv_heads) * d->head_dim;
    return (size_t)d->hidden + qkv + (size_t)d->heads * d->head_dim + 3 * (size_t)d->inter +
           (size_t)d->heads * d->max_len;
}

/* One token through every layer: h [hidden] (float32, the residual stream) in place, at position
 * pos (< max_len) with cos/sin its RoPE rows [head_dim]. Writes k/v at pos in each layer's cache
 * and attends over 0 .. pos. */
void decoder_step(const Layer *layers, int n_layers, const Dims *d, float *h, const float *cos_row,
                  const float *sin_row, int pos, float *scratch) {
    const int H = d->hidden, I = d->inter, nq = d->heads, nkv = d->kv_heads, hd = d->head_dim;
    const int group = nq / nkv, bf16 = d->cache_bf16, L = d->max_len;
    const int nqkv = (nq + 2 * nkv) * hd;
    const float eps = d->eps, scale = 1.0f / sqrtf((float)hd);
    float *xn = scratch, *qkv = xn + H, *att = qkv + nqkv, *gu = att + nq * hd, *act = gu + 2 * I;
    float *scores = act + I;

#pragma omp parallel
    for (int l = 0; l < n_layers; l++) {
        const Layer *ly = &layers[l];
#pragma omp single
        rms_norm(h, ly->ln1, xn, H, eps);
        gemv(ly->wqkv, ly->sqkv, xn, qkv, nqkv, H, NULL);
        /* q and k heads: norm, RoPE; k (and v) into the cache at pos. */
#pragma omp for schedule(static)
        for (int j = 0; j < nq + 2 * nkv; j++) {
            float *v = qkv + (size_t)j * hd;
            if (j < nq + nkv) {
                rms_norm(v, j < nq ? ly->qn : ly->kn, v, hd, eps);
                rope(v, cos_row, sin_row, hd);
            }
            if (j >= nq) {
                int kvh = j < nq + nkv ? j - nq : j - nq - nkv;
                void *c = j < nq + nkv ? ly->kc : ly->vc;
                size_t at = ((size_t)kvh * L + pos) * hd;
                for (int i = 0; i < hd; i++) v[i] = cache_put(c, bf16, at + i, v[i]);
            }
        }
        /* Attention of each query head over positions 0 .. pos of its kv head. */
#pragma omp for schedule(static)
        for (int j = 0; j < nq; j++) {
            const float *q = qkv + (size_t)j * hd;
            size_t base = (size_t)(j / group) * L * hd;
            float *s = scores + (size_t)j * L, top = -INFINITY, sum = 0.0f;
            for (int p = 0; p <= pos; p++) {
                float a = 0.0f;
                size_t at = base + (size_t)p * hd;
                if (bf16) {
                    const uint16_t *kk = (const uint16_t *)ly->kc + at;
#pragma omp simd reduction(+ : a)
                    for (int i = 0; i < hd; i++) a += q[i] * bf16_to_f32(kk[i]);
                } else {
                    const float *kk = (const float *)ly->kc + at;
#pragma omp simd reduction(+ : a)
                    for (int i = 0; i < hd; i++) a += q[i] * kk[i];
                }
                s[p] = a * scale;
                top = s[p] > top ? s[p] : top;
            }
            for (int p = 0; p <= pos; p++) sum += (s[p] = expf(s[p] - top));
            float *o = att + (size_t)j * hd;
            for (int i = 0; i < hd; i++) o[i] = 0.0f;
            for (int p = 0; p <= pos; p++) {
                float wgt = s[p] / sum;
                size_t at = base + (size_t)p * hd;
                if (bf16) {
                    const uint16_t *vv = (const uint16_t *)ly->vc + at;
#pragma omp simd
                    for (int i = 0; i < hd; i++) o[i] += wgt * bf16_to_f32(vv[i]);
                } else {
                    const float *vv = (const float *)ly->vc + at;
#pragma omp simd
                    for (int i = 0; i < hd; i++) o[i] += wgt * vv[i];
                }
            }
        }
        gemv(ly->wo, ly->so, att, h, H, nq * hd, h);
#pragma omp single
        rms_norm(h, ly->ln2, xn, H, eps);
        gemv(ly->wgu, ly->sgu, xn, gu, 2 * I, H, NULL);
#pragma omp for schedule(static)
        for (int i = 0; i < I; i++) {
            float g = gu[i];
            act[i] = g / (1.0f + expf(-g)) * gu[I + i];
        }
        gemv(ly->wd, ly->sd, act, h, H, I, h);
    }
}

/* y = w . x for one matrix: the int8 output head (nn/int8_table.py) and the tests. */
void int8_gemv(const int8_t *w, const float *scale, const float *x, float *y, int n, int k) {
#pragma omp parallel
    gemv(w, scale, x, y, n, k, NULL);
}

/* The threads a parallel region here gets: torch.get_num_threads() when the library shares torch's
 * OpenMP runtime (the tests check it). */
int omp_threads(void) { return omp_get_max_threads(); }
