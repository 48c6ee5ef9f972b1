// Host side of the GEMV checks, shared by the device harness (gemv_bench.cu) and the CPU emulation
// (gemv_il_cpu_test.cpp): random ggml blocks, the activation quantization, and a float64 reference.
#pragma once

#include "gemv-il-layout.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

static inline uint64_t ref_splitmix(uint64_t & s) {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static inline double ref_uniform(uint64_t & s) { return (ref_splitmix(s) >> 11) * (1.0 / 9007199254740992.0); }

static inline float ref_half_to_float(uint16_t h) {
    const uint32_t sign = (uint32_t) (h >> 15) << 31, exp = (h >> 10) & 31, man = h & 1023;
    float f;
    if (exp == 0) {
        f = std::ldexp((float) man, -24);
    } else if (exp == 31) {
        f = man ? NAN : INFINITY;
    } else {
        f = std::ldexp((float) (man | 1024), (int) exp - 25);
    }
    uint32_t bits;
    memcpy(&bits, &f, 4);
    bits |= sign;
    memcpy(&f, &bits, 4);
    return f;
}

// normal numbers only, round to nearest even (scales are drawn in [2^-9, 2^-4])
static inline uint16_t ref_float_to_half(float f) {
    uint32_t b;
    memcpy(&b, &f, 4);
    const uint32_t sign = (b >> 16) & 0x8000;
    const int exp = (int) ((b >> 23) & 255) - 127 + 15;
    uint32_t man = b & 0x7FFFFF;
    uint32_t h = sign | ((uint32_t) exp << 10) | (man >> 13);
    const uint32_t rest = man & 0x1FFF;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) {
        ++h;
    }
    return (uint16_t) h;
}

// W4A8: e4m3fn byte -> float (NaN for 0x7F, 0xFF), and the level table of the checks' codebook, built as
// pyqwen-w4a8.c builds it (round(value * scale) in float, half to even, clamped to +-127; 0 for NaN scales).
// A non-uniform codebook, so that the table lookup is what is tested.
static inline float ref_e4m3_to_float(uint8_t b) {
    const int exp = (b >> 3) & 15, man = b & 7;
    if ((b & 0x7F) == 0x7F) return NAN;
    const float v = exp == 0 ? std::ldexp((float) man, -9) : std::ldexp(1.0f + man/8.0f, exp - 7);
    return b & 0x80 ? -v : v;
}
static inline const int8_t * ref_w4a8_levels() {
    static const std::vector<int8_t> table = [] {
        const float values[16] = {-8.0f, -6.1f, -4.5f, -3.2f, -2.2f, -1.4f, -0.7f, -0.2f, 0.25f, 0.7f, 1.4f, 2.2f, 3.3f, 4.5f, 6.0f, 7.5f};
        std::vector<int8_t> t(256*16);
        for (int sc = 0; sc < 256; ++sc) {
            for (int q = 0; q < 16; ++q) {
                const float v = values[q]*ref_e4m3_to_float((uint8_t) sc);
                t[16*sc + q] = std::isnan(v) ? 0 : (int8_t) std::nearbyint(std::fmin(std::fmax(v, -127.0f), 127.0f));
            }
        }
        return t;
    }();
    return table.data();
}

template <typename F>
static void ref_parallel_for(int64_t n, F f) {
    const int64_t nt = std::max(1u, std::thread::hardware_concurrency());
    std::vector<std::thread> th;
    for (int64_t t = 0; t < nt; ++t) {
        th.emplace_back([=] { for (int64_t i = t*n/nt; i < (t + 1)*n/nt; ++i) f(i); });
    }
    for (auto & x : th) x.join();
}

static inline uint16_t ref_random_scale(uint64_t & s, bool any_sign) {
    const float d = (float) (std::ldexp(1.0, -9 + (int) (ref_splitmix(s) % 5)) * (1.0 + ref_uniform(s)));
    return ref_float_to_half(any_sign && (ref_splitmix(s) & 1) ? -d : d);
}

// Random weight rows in ggml's block layout: any code, scales of both signs, magnitudes 2^-9..2^-4
// (Q4_K: any 6-bit scales and mins, d of both signs, dmin > 0; Q6_K: any int8 scales, d of both signs;
// W4A8: fp32 d of both signs, any scale byte but the NaNs, codebook id row % 2).
static void ref_fill_weights(int type, int64_t n, int64_t k, uint8_t * w, uint64_t seed) {
    const int64_t rb = gemv_il_row_bytes(type, k), bs = gemv_il_block_bytes(type), bk = gemv_il_block_k(type);
    ref_parallel_for(n, [=](int64_t r) {
        uint64_t s = seed ^ (0xD1B54A32D192ED03ull * (uint64_t) (r + 1));
        uint8_t * row = w + r*rb;
        for (int64_t i = 0; i < rb; i += 8) {
            const uint64_t v = ref_splitmix(s);
            memcpy(row + i, &v, std::min<int64_t>(8, rb - i));
        }
        for (int64_t b = 0; b < k/bk; ++b) {
            if (type == GEMV_IL_W4A8) {
                const float d = ref_half_to_float(ref_random_scale(s, true));
                const uint32_t id = (uint32_t) (r % 2); // two ids, so that the round trip moves them
                memcpy(row + b*bs, &d, 4);
                memcpy(row + b*bs + GEMV_IL_W4A8_CB, &id, 4);
                for (int g = 0; g < 16; ++g) {
                    uint8_t & sr = row[b*bs + GEMV_IL_W4A8_SR + g];
                    while ((sr & 0x7F) == 0x7F) sr = (uint8_t) ref_splitmix(s);
                }
                continue;
            }
            const uint16_t d = ref_random_scale(s, true);
            memcpy(row + b*bs + (type == GEMV_IL_Q6_K ? GEMV_IL_Q6_K_D : 0), &d, 2);
            if (type == GEMV_IL_Q4_K) {
                const uint16_t dmin = ref_random_scale(s, false);
                memcpy(row + b*bs + 2, &dmin, 2);
            }
        }
    });
}

// Token rows like hidden states: N(0,1) with an outlier (x 30) in about one value of 64.
static void ref_fill_activations(int64_t k, float * x, uint64_t seed) {
    uint64_t s = seed;
    for (int64_t i = 0; i < GEMV_IL_MAX_TOKENS*k; ++i) {
        const double u1 = std::max(ref_uniform(s), 1e-300), u2 = ref_uniform(s);
        double v = std::sqrt(-2.0*std::log(u1))*std::cos(6.283185307179586*u2);
        if (ref_splitmix(s) % 64 == 0) v *= 30.0;
        x[i] = (float) v;
    }
}

// The kernel's quantization, same float operations (IEEE division, round half away from zero):
// q[m*k + i], d[m*(k/32) + b], sum[m*(k/32) + b] = d * (sum of the block's q); token rows >= m_used are zero.
static void ref_quantize(int64_t k, int m_used, const float * x, int8_t * q, float * d, float * sum) {
    for (int m = 0; m < GEMV_IL_MAX_TOKENS; ++m) {
        for (int64_t b = 0; b < k/32; ++b) {
            const float * xb = x + m*k + 32*b;
            float amax = 0.0f;
            for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(xb[i]));
            if (m >= m_used) amax = 0.0f;
            const float db = amax / 127.0f;
            int qsum = 0;
            for (int i = 0; i < 32; ++i) {
                q[m*k + 32*b + i] = amax == 0.0f ? 0 : (int8_t) std::round(xb[i] / db);
                qsum += q[m*k + 32*b + i];
            }
            d[m*(k/32) + b] = db;
            sum[m*(k/32) + b] = db*(float) qsum;
        }
    }
}

// The same codes in the kernel's interleaved activation buffers (xs: 2 * gemv_il_xs_count(k) floats).
static void ref_interleave_activations(int64_t k, const int8_t * q, const float * d, const float * sum, uint8_t * xq, float * xs) {
    for (int m = 0; m < GEMV_IL_MAX_TOKENS; ++m) {
        for (int64_t b = 0; b < k/32; ++b) {
            for (int i = 0; i < 32; ++i) xq[gemv_il_xq_offset(m, b, i)] = (uint8_t) q[m*k + 32*b + i];
            xs[gemv_il_xs_index(m, b)] = d[m*(k/32) + b];
            xs[gemv_il_xs_count(k) + gemv_il_xs_index(m, b)] = sum[m*(k/32) + b];
        }
    }
}

// 32-block b of a ggml row as w[i] = a*v[i] - c (ggml's dequantize_row_*; c = 0 but for Q4_K; Q6_K's
// v[i] = scales[i/16]*(q6 - 32) carries its per-16 scale).
static inline void ref_decode32(int type, const uint8_t * row, int64_t b, int v[32], double & a, double & c) {
    uint16_t h;
    c = 0.0;
    if (type == GEMV_IL_W4A8) {  // ggml_pyqwen_w4a8_to_q8_0's values, times d
        const uint8_t * sb = row + b/8*gemv_il_block_bytes(type);
        const int j = (int) (b % 8);
        float d;
        memcpy(&d, sb, 4);
        a = d;
        for (int i = 0; i < 32; ++i) {
            const int code = (sb[GEMV_IL_W4A8_QS + 16*j + i/2] >> (4*(i & 1))) & 15;
            v[i] = ref_w4a8_levels()[16*sb[GEMV_IL_W4A8_SR + 2*j + i/16] + code];
        }
        return;
    }
    if (type == GEMV_IL_Q6_K) {  // dequantize_row_q6_K: block j = 4*half + s of the super-block
        const uint8_t * sb = row + b/8*gemv_il_block_bytes(type);
        const int j = (int) (b % 8), half = j / 4, s = j % 4;
        const uint8_t * ql = sb + 64*half + 32*(s % 2), * qh = sb + GEMV_IL_Q6_K_QH + 32*half;
        const int8_t * sc = (const int8_t *) (sb + GEMV_IL_Q6_K_SCALES) + 8*half + 2*s;
        memcpy(&h, sb + GEMV_IL_Q6_K_D, 2);
        a = ref_half_to_float(h);
        for (int i = 0; i < 32; ++i) {
            const int q = ((ql[i] >> (4*(s / 2))) & 15) | (((qh[i] >> (2*s)) & 3) << 4);
            v[i] = sc[i / 16]*(q - 32);
        }
        return;
    }
    if (type != GEMV_IL_Q4_K) {
        const uint8_t * blk = row + b*gemv_il_block_bytes(type);
        memcpy(&h, blk, 2);
        a = ref_half_to_float(h);
        for (int i = 0; i < 32; ++i) {
            v[i] = type == GEMV_IL_Q4_0 ? (int8_t) (((blk[2 + i % 16] >> (4*(i/16))) & 15) - 8) : (int8_t) blk[2 + i];
        }
        return;
    }
    const uint8_t * sb = row + b/8*gemv_il_block_bytes(type), * sc = sb + 4, * qs = sb + 16;
    const int j = (int) (b % 8);
    int scale, mn;  // get_scale_min_k4
    if (j < 4) {
        scale = sc[j] & 63;
        mn    = sc[j + 4] & 63;
    } else {
        scale = (sc[j + 4] & 0xF) | ((sc[j - 4] >> 6) << 4);
        mn    = (sc[j + 4] >>  4) | ((sc[j    ] >> 6) << 4);
    }
    memcpy(&h, sb, 2);
    a = (double) ref_half_to_float(h)*scale;
    memcpy(&h, sb + 2, 2);
    c = (double) ref_half_to_float(h)*mn;
    for (int i = 0; i < 32; ++i) v[i] = (int8_t) ((qs[32*(j/2) + i] >> (4*(j % 2))) & 15);
}

// Per output [tok*n + row], all in float64:
//   yq:    the GEMV's math exactly (dequantized weights x dequantized int8 activations),
//   mag:   sum of |block terms| of yq (scale for the fp32 rounding of the kernel's sums),
//   yf:    dequantized weights x the float activations,
//   bound: sum |w| * d_x/2, the largest |yq - yf| int8 rounding of the activations can cause.
struct ref_result {
    std::vector<double> yq, mag, yf, bound;
};

static ref_result ref_mul_mat(int type, int64_t n, int64_t k, const uint8_t * w, const float * x, const int8_t * q, const float * d) {
    ref_result r;
    const size_t ne = (size_t) GEMV_IL_MAX_TOKENS*n;
    r.yq.assign(ne, 0.0); r.mag.assign(ne, 0.0); r.yf.assign(ne, 0.0); r.bound.assign(ne, 0.0);
    const int64_t rb = gemv_il_row_bytes(type, k);
    ref_parallel_for(n, [&](int64_t row) {
        double yq[GEMV_IL_MAX_TOKENS] = {0}, mag[GEMV_IL_MAX_TOKENS] = {0}, yf[GEMV_IL_MAX_TOKENS] = {0}, bd[GEMV_IL_MAX_TOKENS] = {0};
        for (int64_t b = 0; b < k/32; ++b) {
            int v[32];
            double a, c;
            ref_decode32(type, w + row*rb, b, v, a, c);
            double wabs = 0.0;
            for (int i = 0; i < 32; ++i) wabs += std::fabs(a*v[i] - c);
            for (int m = 0; m < GEMV_IL_MAX_TOKENS; ++m) {
                const int8_t * qm = q + m*k + 32*b;
                const float  * xm = x + m*k + 32*b;
                int   idot = 0, isum = 0;
                float fdot = 0.0f, fsum = 0.0f;
                for (int i = 0; i < 32; ++i) {
                    idot += v[i]*qm[i];
                    isum += qm[i];
                    fdot += v[i]*xm[i];
                    fsum += xm[i];
                }
                const double dx = d[m*(k/32) + b];
                yq[m]  += dx*(a*idot - c*isum);
                mag[m] += dx*(std::fabs(a*idot) + std::fabs(c*isum));
                yf[m]  += a*fdot - c*fsum;
                bd[m]  += wabs*dx*0.5;
            }
        }
        for (int m = 0; m < GEMV_IL_MAX_TOKENS; ++m) {
            r.yq[m*n + row] = yq[m]; r.mag[m*n + row] = mag[m]; r.yf[m*n + row] = yf[m]; r.bound[m*n + row] = bd[m];
        }
    });
    return r;
}

// Checks rows < m of y[tok*n + row] against the reference, and that rows >= m still hold the poison.
struct ref_check {
    bool   ok = true;
    double err_q = 0.0;  // ||y - yq|| / ||yq||
    double err_f = 0.0;  // ||y - yf|| / ||yf||
    int64_t bad = 0;     // elements outside the tolerance, NaN, or written where they must not be
};

static ref_check ref_compare(const ref_result & r, int64_t n, int m, const float * y, uint32_t poison) {
    ref_check c;
    double dq = 0, nq = 0, df = 0, nf = 0;
    for (int tok = 0; tok < GEMV_IL_MAX_TOKENS; ++tok) {
        for (int64_t row = 0; row < n; ++row) {
            const size_t i = (size_t) tok*n + row;
            if (tok >= m) {
                uint32_t bits;
                memcpy(&bits, &y[i], 4);
                c.bad += bits != poison;
                continue;
            }
            const double v = y[i];
            // the kernel sums k/32 block terms in fp32: allow 1e-5 of their summed magnitudes
            const double tol_q = 1e-5*r.mag[i] + 1e-30;
            const bool good = std::isfinite(v) && std::fabs(v - r.yq[i]) <= tol_q
                           && std::fabs(v - r.yf[i]) <= r.bound[i]*1.001 + tol_q;
            c.bad += !good;
            dq += (v - r.yq[i])*(v - r.yq[i]); nq += r.yq[i]*r.yq[i];
            df += (v - r.yf[i])*(v - r.yf[i]); nf += r.yf[i]*r.yf[i];
        }
    }
    c.err_q = std::sqrt(dq / std::max(nq, 1e-300));
    c.err_f = std::sqrt(df / std::max(nf, 1e-300));
    c.ok = c.bad == 0 && std::isfinite(c.err_q) && c.err_q < 1e-5;
    return c;
}
