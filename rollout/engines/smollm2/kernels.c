/* The smollm2 engine's CPU kernels: every reduction in one fixed order.
 *
 * Why: a BLAS picks its blocking, and so the order in which a dot product is summed,
 * from the matrix shape, the thread count and the CPU; a row's bits then change with
 * the rows beside it. Here each output value is summed in an order fixed by its own
 * length alone:
 *
 *   dot(x, w) over K: 8 lanes, lane j accumulates k = j, j+8, j+16, ... in increasing k
 *   with fused multiply-add (fmaf: one rounding, the same on every CPU that implements
 *   IEEE 754), then ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)).
 *
 * Blocking (rows x columns computed together), threads (which thread computes which
 * outputs) and SIMD width never change that order. There are two implementations of
 * every kernel, AVX2+FMA intrinsics and portable C, and they give the same bits: the
 * tests run both. Build flags: -ffp-contract=off (the compiler must not fuse or
 * reorder what is written here), never -ffast-math.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#define ROLLOUT_KERNELS_VERSION 1
int rl_version(void) { return ROLLOUT_KERNELS_VERSION; }

/* The portable code is cloned for CPUs with a hardware FMA (fmaf inlined, not a libm
   call); fmaf's result is defined exactly, so every clone gives the same bits. */
#if defined(__x86_64__) && !defined(ROLLOUT_PORTABLE_ONLY)
#define PORTABLE __attribute__((target_clones("fma", "default")))
#else
#define PORTABLE
#endif

int rl_has_avx2(void) {
#if defined(__x86_64__) && !defined(ROLLOUT_PORTABLE_ONLY)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return 0;
#endif
}

static inline float tree8(const float *l) {
  return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}
static inline double tree8d(const double *l) {
  return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

/* ---- exp: Cody-Waite reduction, Cephes' expf polynomial, all in fmaf -------------- */
/* rexp(x) = exp(min(max(x, -87), 88)) to about 1 ulp; the clamp keeps every result a
   normal float (no subnormals, so flush-to-zero settings cannot change a bit). */
#define EXP_LO (-87.0f)
#define EXP_HI (88.0f)
#define LOG2E 1.44269504088896341f
#define LN2_HI 0.693359375f
#define LN2_LO (-2.12194440e-4f)
#define ROUND_MAGIC 12582912.0f /* 1.5 * 2^23: (t + M) - M rounds t to an integer */
#define P0 1.9875691500e-4f
#define P1 1.3981999507e-3f
#define P2 8.3334519073e-3f
#define P3 4.1665795894e-2f
#define P4 1.6666665459e-1f
#define P5 5.0000001201e-1f

static inline float rexp(float x) {
  x = EXP_LO > x ? EXP_LO : x; /* NaN stays NaN, as in the SIMD path */
  x = EXP_HI < x ? EXP_HI : x;
  float n = (x * LOG2E + ROUND_MAGIC) - ROUND_MAGIC;
  float r = fmaf(-n, LN2_HI, x);
  r = fmaf(-n, LN2_LO, r);
  float p = fmaf(fmaf(fmaf(fmaf(fmaf(P0, r, P1), r, P2), r, P3), r, P4), r, P5);
  float y = fmaf(p, r * r, r) + 1.0f;
  int32_t bits = ((int32_t)n + 127) << 23;
  float scale;
  memcpy(&scale, &bits, sizeof scale);
  return y * scale;
}

#if defined(__x86_64__)
#define AVX2 __attribute__((target("avx2,fma")))
AVX2 static inline __m256 rexp8(__m256 x) {
  x = _mm256_max_ps(_mm256_set1_ps(EXP_LO), x); /* max(a, b) = a > b ? a : b */
  x = _mm256_min_ps(_mm256_set1_ps(EXP_HI), x); /* min(a, b) = a < b ? a : b */
  __m256 magic = _mm256_set1_ps(ROUND_MAGIC);
  __m256 n = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(x, _mm256_set1_ps(LOG2E)), magic), magic);
  __m256 nn = _mm256_xor_ps(n, _mm256_set1_ps(-0.0f)); /* -n, as in the scalar path */
  __m256 r = _mm256_fmadd_ps(nn, _mm256_set1_ps(LN2_HI), x);
  r = _mm256_fmadd_ps(nn, _mm256_set1_ps(LN2_LO), r);
  __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(P0), r, _mm256_set1_ps(P1));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(P2));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(P3));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(P4));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(P5));
  __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
  __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(bits));
}

AVX2 static inline float hsum8(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  __m128 s4 = _mm_add_ps(lo, hi);                     /* l0+l4 l1+l5 l2+l6 l3+l7 */
  __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));  /* (l0+l4)+(l2+l6), (l1+l5)+(l3+l7) */
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

AVX2 static inline __m256i tail_mask(int rem) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(rem), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* Lanes past K hold fma(0, 0, l) = l: the same as the scalar path, which skips them. */
AVX2 static inline float dot_avx2(const float *x, const float *w, int K) {
  __m256 acc = _mm256_setzero_ps();
  int k = 0;
  for (; k + 8 <= K; k += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(x + k), _mm256_loadu_ps(w + k), acc);
  if (k < K) {
    __m256i m = tail_mask(K - k);
    acc = _mm256_fmadd_ps(_mm256_maskload_ps(x + k, m), _mm256_maskload_ps(w + k, m), acc);
  }
  return hsum8(acc);
}
#endif

static inline float dot_generic(const float *x, const float *w, int K) {
  float l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int k = 0;
  for (; k + 8 <= K; k += 8)
    for (int j = 0; j < 8; j++) l[j] = fmaf(x[k + j], w[k + j], l[j]);
  for (int j = 0; k + j < K; j++) l[j] = fmaf(x[k + j], w[k + j], l[j]);
  return tree8(l);
}

/* ---- GEMM: y[r, n] = dot(x[r, :], w[n, :]) ---------------------------------------- */
#define MR 4
#define NR 3
#define MC 64 /* rows of x kept in cache while all of w streams past */

#if defined(__x86_64__)
AVX2 static void gemm_block_avx2(const float *x, long ldx, int mr, const float *w, long ldw,
                                 int nr, int K, float *y, long ldy) {
  __m256 acc[MR][NR];
  for (int i = 0; i < MR; i++)
    for (int j = 0; j < NR; j++) acc[i][j] = _mm256_setzero_ps();
  int k = 0;
  if (mr == MR && nr == NR) {
    for (; k + 8 <= K; k += 8) {
      __m256 w0 = _mm256_loadu_ps(w + k), w1 = _mm256_loadu_ps(w + ldw + k),
             w2 = _mm256_loadu_ps(w + 2 * ldw + k);
      for (int i = 0; i < MR; i++) {
        __m256 xv = _mm256_loadu_ps(x + i * ldx + k);
        acc[i][0] = _mm256_fmadd_ps(xv, w0, acc[i][0]);
        acc[i][1] = _mm256_fmadd_ps(xv, w1, acc[i][1]);
        acc[i][2] = _mm256_fmadd_ps(xv, w2, acc[i][2]);
      }
    }
  } else {
    for (; k + 8 <= K; k += 8)
      for (int j = 0; j < nr; j++) {
        __m256 wv = _mm256_loadu_ps(w + j * ldw + k);
        for (int i = 0; i < mr; i++)
          acc[i][j] = _mm256_fmadd_ps(_mm256_loadu_ps(x + i * ldx + k), wv, acc[i][j]);
      }
  }
  if (k < K) {
    __m256i m = tail_mask(K - k);
    for (int j = 0; j < nr; j++) {
      __m256 wv = _mm256_maskload_ps(w + j * ldw + k, m);
      for (int i = 0; i < mr; i++)
        acc[i][j] = _mm256_fmadd_ps(_mm256_maskload_ps(x + i * ldx + k, m), wv, acc[i][j]);
    }
  }
  for (int i = 0; i < mr; i++)
    for (int j = 0; j < nr; j++) y[i * ldy + j] = hsum8(acc[i][j]);
}
#endif

PORTABLE void rl_gemm(const float *x, long ldx, int M, const float *w, long ldw, int N, int K, float *y,
             long ldy, int threads, int simd) {
  int nblocks = (N + NR - 1) / NR;
  for (int m0 = 0; m0 < M; m0 += MC) {
    int m1 = M < m0 + MC ? M : m0 + MC;
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
    for (int b = 0; b < nblocks; b++) {
      int n0 = b * NR, nr = N - n0 < NR ? N - n0 : NR;
      for (int r0 = m0; r0 < m1; r0 += MR) {
        int mr = m1 - r0 < MR ? m1 - r0 : MR;
#if defined(__x86_64__)
        if (simd) {
          gemm_block_avx2(x + r0 * ldx, ldx, mr, w + n0 * ldw, ldw, nr, K, y + r0 * ldy + n0, ldy);
          continue;
        }
#endif
        for (int i = 0; i < mr; i++)
          for (int j = 0; j < nr; j++)
            y[(r0 + i) * ldy + n0 + j] = dot_generic(x + (r0 + i) * ldx, w + (n0 + j) * ldw, K);
      }
    }
  }
}

/* ---- RMSNorm: y = weight * (x * (1 / sqrt(dot(x, x) / K + eps))) ------------------- */
PORTABLE void rl_rms_norm(const float *x, long ldx, int M, int K, const float *weight, float eps, float *y,
                 long ldy, int threads, int simd) {
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1 && M > 8)
  for (int r = 0; r < M; r++) {
    const float *xr = x + r * ldx;
    float ss;
#if defined(__x86_64__)
    if (simd) ss = dot_avx2(xr, xr, K); else
#endif
    ss = dot_generic(xr, xr, K);
    float inv = 1.0f / sqrtf(ss / (float)K + eps);
    float *yr = y + r * ldy;
    for (int k = 0; k < K; k++) yr[k] = weight[k] * (xr[k] * inv);
  }
}

#if defined(__x86_64__)
/* The AVX2 parts of the kernels below; each returns how far it got, the scalar code
   finishes the row with the same operations per element. */
AVX2 static int silu_mul_avx2(const float *g, const float *u, float *o, int inter) {
  int k = 0;
  for (; k + 8 <= inter; k += 8) {
    __m256 gv = _mm256_loadu_ps(g + k);
    __m256 e = rexp8(_mm256_xor_ps(gv, _mm256_set1_ps(-0.0f)));
    __m256 sv = _mm256_div_ps(gv, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
    _mm256_storeu_ps(o + k, _mm256_mul_ps(sv, _mm256_loadu_ps(u + k)));
  }
  return k;
}

AVX2 static int exp_shifted_avx2(const float *x, int n, float m, float *probs, double *l) {
  __m256 mv = _mm256_set1_ps(m);
  __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd();
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 e = rexp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), mv));
    _mm256_storeu_ps(probs + i, e);
    a0 = _mm256_add_pd(a0, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
    a1 = _mm256_add_pd(a1, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
  }
  _mm256_storeu_pd(l, a0);
  _mm256_storeu_pd(l + 4, a1);
  return i;
}

AVX2 static int softmax_exp_avx2(float *s, int n, float mx, float *l) {
  __m256 lv = _mm256_setzero_ps(), mv = _mm256_set1_ps(mx);
  int j = 0;
  for (; j + 8 <= n; j += 8) {
    __m256 e = rexp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), mv));
    _mm256_storeu_ps(s + j, e);
    lv = _mm256_add_ps(lv, e);
  }
  _mm256_storeu_ps(l, lv);
  return j;
}

AVX2 static int axpy_avx2(float e, const float *v, float *acc, int d) {
  __m256 ev = _mm256_set1_ps(e);
  int c = 0;
  for (; c + 8 <= d; c += 8)
    _mm256_storeu_ps(acc + c, _mm256_fmadd_ps(ev, _mm256_loadu_ps(v + c), _mm256_loadu_ps(acc + c)));
  return c;
}
#endif

/* ---- SwiGLU: out = (g / (1 + exp(-g))) * u, gate_up = [g | u] ----------------------- */
PORTABLE void rl_silu_mul(const float *gu, long ld, int M, int inter, float *out, long ldo, int threads,
                 int simd) {
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1 && M > 1)
  for (int r = 0; r < M; r++) {
    const float *g = gu + r * ld, *u = g + inter;
    float *o = out + r * ldo;
    int k = 0;
#if defined(__x86_64__)
    if (simd) k = silu_mul_avx2(g, u, o, inter);
#endif
    for (; k < inter; k++) o[k] = (g[k] / (1.0f + rexp(-g[k]))) * u[k];
  }
}

/* ---- exp(x - m) over a row, and its sum in float64 (8 lanes, the fixed tree) --------- */
PORTABLE double rl_exp_shifted(const float *x, int n, float m, float *probs, int simd) {
  double l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int i = 0;
#if defined(__x86_64__)
  if (simd) i = exp_shifted_avx2(x, n, m, probs, l);
#endif
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; j++) {
      probs[i + j] = rexp(x[i + j] - m);
      l[j] += (double)probs[i + j];
    }
  for (int j = 0; i + j < n; j++) {
    probs[i + j] = rexp(x[i + j] - m);
    l[j] += (double)probs[i + j];
  }
  return tree8d(l);
}

/* ---- log in float64: log(m 2^e) = e ln2 + 2 atanh((m - 1) / (m + 1)), m in [1/sqrt2, sqrt2) */
double rl_log(double x) {
  if (!(x > 0.0) || isinf(x)) return x == 0.0 ? -INFINITY : (x > 0.0 ? x : NAN);
  int e;
  double m = frexp(x, &e); /* exact: x = m 2^e, m in [0.5, 1) */
  if (m < 0.70710678118654752440) {
    m *= 2.0;
    e -= 1;
  }
  double s = (m - 1.0) / (m + 1.0), s2 = s * s, p = 1.0 / 41.0;
  for (int k = 39; k >= 1; k -= 2) p = p * s2 + 1.0 / (double)k; /* |s| <= 0.1716: 2^-53 by k = 41 */
  /* ln2 split as fdlibm does (the high part has trailing zeros: e * LN2_HI is exact) */
  return (double)e * 6.93147180369123816490e-01 + ((double)e * 1.90821492927058770002e-10 + 2.0 * s * p);
}

/* ---- attention of one query row over its sequence's KV cache ------------------------
 * Cache layout of a sequence: [layers][2 (k, v)][kv_heads][cap][d]. Row r belongs to
 * the sequence whose cache starts at cache[r] with capacity cap[r]; its position is
 * pos[r], and it attends to keys 0..pos[r]. First every row's k and v are written at
 * its position, then each (row, head) is computed: scores by dot(), softmax with
 * rexp and an 8-lane sum, and the weighted sum of values in key order. q must be
 * scaled by 1/sqrt(d) already. */
PORTABLE void rl_attention(int rows, int heads, int kv_heads, int d, int layer, const float *q, long ldq,
                  const float *k, long ldk, const float *v, long ldv, const int64_t *cache,
                  const int64_t *cap, const int32_t *pos, float *out, long ldo, int threads,
                  int simd) {
  int group = heads / kv_heads;
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
#pragma omp for schedule(static)
    for (int r = 0; r < rows; r++) {
      float *base = (float *)(intptr_t)cache[r];
      long head_stride = cap[r] * (long)d, kv_stride = kv_heads * head_stride;
      float *kc = base + (long)layer * 2 * kv_stride, *vc = kc + kv_stride;
      for (int h = 0; h < kv_heads; h++) {
        memcpy(kc + h * head_stride + (long)pos[r] * d, k + r * ldk + h * d, d * sizeof(float));
        memcpy(vc + h * head_stride + (long)pos[r] * d, v + r * ldv + h * d, d * sizeof(float));
      }
    }
#pragma omp for schedule(dynamic, 4)
    for (int t = 0; t < rows * heads; t++) {
      int r = t / heads, h = t % heads, kvh = h / group, n = pos[r] + 1;
      const float *base = (const float *)(intptr_t)cache[r];
      long head_stride = cap[r] * (long)d, kv_stride = kv_heads * head_stride;
      const float *kc = base + (long)layer * 2 * kv_stride + kvh * head_stride;
      const float *vc = kc + kv_stride;
      const float *qr = q + r * ldq + h * d;
      float *o = out + r * ldo + h * d;
      float *s = (float *)malloc(sizeof(float) * (size_t)n);
      float *acc = (float *)calloc((size_t)d, sizeof(float));
      float mx = -INFINITY;
      for (int j = 0; j < n; j++) {
#if defined(__x86_64__)
        if (simd) s[j] = dot_avx2(qr, kc + (long)j * d, d); else
#endif
        s[j] = dot_generic(qr, kc + (long)j * d, d);
        mx = s[j] > mx ? s[j] : mx;
      }
      float l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      int j0 = 0;
#if defined(__x86_64__)
      if (simd) j0 = softmax_exp_avx2(s, n, mx, l);
#endif
      for (int j = j0; j < n; j++) {
        s[j] = rexp(s[j] - mx);
        l[j & 7] += s[j];
      }
      float total = tree8(l);
      for (int j = 0; j < n; j++) {
        const float *vr = vc + (long)j * d;
        int c = 0;
#if defined(__x86_64__)
        if (simd) c = axpy_avx2(s[j], vr, acc, d);
#endif
        for (; c < d; c++) acc[c] = fmaf(s[j], vr[c], acc[c]);
      }
      for (int c = 0; c < d; c++) o[c] = acc[c] / total;
      free(s);
      free(acc);
    }
  }
}
