// CPU checks of the interleaved GEMV that need no GPU (plain C++17, no CUDA):
//  1. the host re-layout is a bijection inside each tile: forward then inverse gives the ggml bytes back;
//  2. an emulation of gemv_il_mul_mat, lane by lane, with the layout header's own index math and
//     fragment unpacking, the PTX ISA's mma.m16n8k32 fragment layout and __shfl_sync's lane choice,
//     matches the float64 reference for every M, several K splits and partial tiles.
// Build and run (tests/test_gemv_layout.py does): c++ -O2 -std=c++17 -pthread -Iggml-patches/src/src/ggml-cuda bench/gemv/gemv_il_cpu_test.cpp -o /tmp/gemv_il_cpu_test && /tmp/gemv_il_cpu_test
#include "gemv_ref.h"

#include <cstdio>

// mma.m16n8k32.row.col.s32.s8.s8.s32 (K = 32; Q4_K: .u8 A) and mma.m16n8k16.row.col.s32.s8.s8.s32 (K = 16) as
// the PTX ISA defines them (lane = 4g + t):
//   A: a0 (row g, k 4t..4t+3), a1 (row g+8, k 4t..), and for K = 32 a2 (row g, k 16+4t..), a3 (row g+8, k 16+4t..)
//   B: b0 (col g, k 4t..4t+3), and for K = 32 b1 (col g, k 16+4t..);  C: c0, c1 (row g, col 2t, 2t+1), c2, c3 (row g+8)
template <int K, bool a_unsigned = false>
static void emulate_mma(const uint32_t a[32][K/8], const uint32_t b[32][K/16], int32_t c[32][4]) {
    int A[16][K], B[K][8];
    for (int l = 0; l < 32; ++l) {
        const int g = l / 4, t = l % 4;
        for (int r = 0; r < K/8; ++r) {
            for (int e = 0; e < 4; ++e) {
                const uint8_t v = (uint8_t) (a[l][r] >> (8*e));
                A[g + 8*(r % 2)][4*t + 16*(r / 2) + e] = a_unsigned ? (int) v : (int) (int8_t) v;
            }
        }
        for (int r = 0; r < K/16; ++r) {
            for (int e = 0; e < 4; ++e) {
                B[4*t + 16*r + e][g] = (int8_t) (b[l][r] >> (8*e));
            }
        }
    }
    for (int l = 0; l < 32; ++l) {
        const int g = l / 4, t = l % 4;
        for (int i = 0; i < 4; ++i) {
            const int row = g + 8*(i / 2), col = 2*t + i % 2;
            int s = 0;
            for (int kk = 0; kk < K; ++kk) s += A[row][kk]*B[kk][col];
            c[l][i] = s;
        }
    }
}

// mma.m16n8k8.row.col.f32.tf32.tf32.f32, D = A*B + C: A a0 (row g, k t), a1 (row g+8, k t), a2 (row g, k t+4),
// a3 (row g+8, k t+4); B b0 (k t, col g), b1 (k t+4, col g); C, D as above. The operands are used as tf32
// (top 19 bits); the sums in float, which is as exact as the tensor core's or more.
static void emulate_mma_tf32(const float a[32][4], const float b[32][2], float d[32][4]) {
    const auto tf32 = [](float f) { float hi, lo; gemv_il_tf32_split(f, hi, lo); return hi; };
    float A[16][8], B[8][8];
    for (int l = 0; l < 32; ++l) {
        const int g = l / 4, t = l % 4;
        for (int r = 0; r < 4; ++r) A[g + 8*(r % 2)][t + 4*(r / 2)] = tf32(a[l][r]);
        for (int r = 0; r < 2; ++r) B[t + 4*r][g] = tf32(b[l][r]);
    }
    for (int l = 0; l < 32; ++l) {
        const int g = l / 4, t = l % 4;
        for (int i = 0; i < 4; ++i) {
            double s = 0.0;
            for (int kk = 0; kk < 8; ++kk) s += (double) A[g + 8*(i / 2)][kk]*B[kk][2*t + i % 2];
            d[l][i] += (float) s;
        }
    }
}

struct lane_chunk {
    uint32_t q[8][4];
    uint32_t s[8];
};

// gemv_il_load_chunk (full tile) or gemv_il_gather_chunk (partial tile) for all 32 lanes.
static void emulate_load(int type, const uint8_t * tile, int nrows, int64_t k, int c, lane_chunk r[32]) {
    for (int lane = 0; lane < 32; ++lane) {
        if (nrows == GEMV_IL_TILE_ROWS) {
            const uint8_t * chunk = tile + (int64_t) c*gemv_il_chunk_bytes(type);
            for (int j = 0; j < gemv_il_loads(type); ++j) memcpy(r[lane].q[j], chunk + j*GEMV_IL_WARP_LOAD + lane*16, 16);
            for (int i = 0; i < gemv_il_meta_words(type); ++i) {
                memcpy(&r[lane].s[i], chunk + gemv_il_quant_bytes(type) + 2*gemv_il_meta_word_unit(type, lane, i), 4);
            }
            continue;
        }
        const int ub = gemv_il_quant_unit_bytes(type);
        for (int j = 0; j < gemv_il_loads(type); ++j) {
            for (int w = 0; w < 4; ++w) {
                uint8_t v[4] = {};
                for (int u = 0; u < 4/ub; ++u) {
                    const int qi = (j*(GEMV_IL_WARP_LOAD/4) + lane*4 + w)*(4/ub) + u;
                    if (gemv_il_quant_src(type, qi).row < nrows) memcpy(v + ub*u, tile + gemv_il_quant_src_offset(type, k, c, qi), ub);
                }
                memcpy(&r[lane].q[j][w], v, 4);
            }
        }
        for (int i = 0; i < gemv_il_meta_words(type); ++i) {
            uint16_t lo = 0, hi = 0;
            const int si = gemv_il_meta_word_unit(type, lane, i);
            if (gemv_il_meta_src(type, si).row < nrows)     memcpy(&lo, tile + gemv_il_meta_src_offset(type, k, c, si), 2);
            if (gemv_il_meta_src(type, si + 1).row < nrows) memcpy(&hi, tile + gemv_il_meta_src_offset(type, k, c, si + 1), 2);
            r[lane].s[i] = lo | ((uint32_t) hi << 16);
        }
    }
}

// gemv_il_chunk_dot for all 32 lanes.
static void emulate_chunk_dot(int type, const lane_chunk r[32], const uint8_t * xq, const float * xs, const float * xsum, float acc[32][4]) {
    // Q4_K: scales of rows g, g+8 per lane; the tf32 mma of mins and block sums
    uint32_t sc[32][2][2];
    float mins[32][4] = {}, am[32][4], bhi[32][2], blo[32][2];
    for (int lane = 0; type == GEMV_IL_Q4_K && lane < 32; ++lane) {
        gemv_il_q4_k_scales(r[lane].s, sc[lane][0]);
        gemv_il_q4_k_scales(r[lane].s + 4, sc[lane][1]);
        gemv_il_q4_k_mins(r[lane].s, r[lane].s + 4, lane & 3, am[lane]);
        for (int i = 0; i < 2; ++i) gemv_il_tf32_split(xsum[gemv_il_xs_index(lane >> 2, 4*i + (lane & 3))], bhi[lane][i], blo[lane][i]);
    }
    if (type == GEMV_IL_Q4_K) {
        emulate_mma_tf32(am, bhi, mins);
        emulate_mma_tf32(am, blo, mins);
    }
    float accd_hi[32][4] = {};  // Q4_K: odd sub-blocks
    float accd[32][4] = {};  // the chunk's sums before its rows' d (Q4_K: even sub-blocks)
    for (int jp = 0; jp < GEMV_IL_CHUNK_BLOCKS/2; ++jp) {
        for (int h = 0; h < 2; ++h) {
            uint32_t a[32][4], b[32][2];
            float dx[32][2];
            for (int lane = 0; lane < 32; ++lane) {
                if (type == GEMV_IL_W4A8) { // the block's scale word from lane 4g + jp (__shfl_sync)
                    const int8_t * const levels[2] = {ref_w4a8_levels(), ref_w4a8_levels()};
                    gemv_il_w4a8_frag(r[lane].q, 2*jp + h, r[(lane & ~3) | jp].s[h], lane & 3, levels, a[lane]);
                } else {
                    gemv_il_frag_a(type, r[lane].q, 2*jp + h, a[lane]);
                }
                uint32_t xa[4];
                memcpy(xa, xq + jp*GEMV_IL_WARP_LOAD + lane*16, 16);
                b[lane][0] = xa[2*h];
                b[lane][1] = xa[2*h + 1];
                const float * xd = xs + jp*16 + (lane & 3)*4;
                dx[lane][0] = xd[2*h];
                dx[lane][1] = xd[2*h + 1];
            }
            if (type == GEMV_IL_W4A8) { // the activations in its k order (__shfl_xor_sync with lane ^ 2)
                uint32_t out[32];
                for (int lane = 0; lane < 32; ++lane) out[lane] = gemv_il_w4a8_swap_out(lane & 3, b[lane][0], b[lane][1]);
                for (int lane = 0; lane < 32; ++lane) gemv_il_w4a8_swap(lane & 3, out[lane ^ 2], b[lane][0], b[lane][1]);
            }
            if (type == GEMV_IL_Q6_K) {
                // two k16 MMAs: (a0, a1) with b0, (a2, a3) with b1
                uint32_t alo[32][2], ahi[32][2], blo[32][1], bhi[32][1];
                for (int lane = 0; lane < 32; ++lane) {
                    alo[lane][0] = a[lane][0]; alo[lane][1] = a[lane][1]; blo[lane][0] = b[lane][0];
                    ahi[lane][0] = a[lane][2]; ahi[lane][1] = a[lane][3]; bhi[lane][0] = b[lane][1];
                }
                int32_t clo[32][4], chi[32][4];
                emulate_mma<16>(alo, blo, clo);
                emulate_mma<16>(ahi, bhi, chi);
                for (int lane = 0; lane < 32; ++lane) {
                    int c[4];
                    gemv_il_q6_k_scale(clo[lane], chi[lane], r[(lane & ~3) | jp].s[h], c);
                    for (int i = 0; i < 4; ++i) accd[lane][i] += (float) c[i] * dx[lane][i % 2];
                }
                continue;
            }
            int32_t c[32][4];
            if (type == GEMV_IL_Q4_K) {
                emulate_mma<32, true>(a, b, c);
                const int blk = 2*jp + h;
                for (int lane = 0; lane < 32; ++lane) {
                    for (int i = 0; i < 4; ++i) {
                        const int s = gemv_il_byte<false>(sc[lane][i / 2][blk >> 2], blk & 3);
                        (h ? accd_hi : accd)[lane][i] += (float) (c[lane][i]*s) * dx[lane][i % 2];
                    }
                }
                continue;
            }
            emulate_mma<32>(a, b, c);
            if (type == GEMV_IL_W4A8) {
                for (int lane = 0; lane < 32; ++lane) {
                    for (int i = 0; i < 4; ++i) accd[lane][i] += (float) c[lane][i] * dx[lane][i % 2];
                }
                continue;
            }
            for (int lane = 0; lane < 32; ++lane) {
                const int src = (lane & ~3) | jp;   // __shfl_sync source lane
                const uint32_t bits = r[src].s[h];
                const float dw0 = ref_half_to_float((uint16_t) bits), dw1 = ref_half_to_float((uint16_t) (bits >> 16));
                acc[lane][0] += (float) c[lane][0] * (dw0*dx[lane][0]);
                acc[lane][1] += (float) c[lane][1] * (dw0*dx[lane][1]);
                acc[lane][2] += (float) c[lane][2] * (dw1*dx[lane][0]);
                acc[lane][3] += (float) c[lane][3] * (dw1*dx[lane][1]);
            }
        }
    }
    for (int lane = 0; type == GEMV_IL_Q4_K && lane < 32; ++lane) {
        for (int i = 0; i < 4; ++i) {
            const uint32_t h = r[lane].s[4*(i / 2)];  // d | dmin << 16 of row g or g+8
            const float d = ref_half_to_float((uint16_t) h), dmin = ref_half_to_float((uint16_t) (h >> 16));
            acc[lane][i] += d*(accd[lane][i] + accd_hi[lane][i]*(1.0f/16.0f)) - dmin*mins[lane][i];
        }
    }
    for (int lane = 0; type == GEMV_IL_W4A8 && lane < 32; ++lane) {
        for (int i = 0; i < 4; ++i) {
            float d;  // d[g] (s[2]) or d[g+8] (s[3])
            memcpy(&d, &r[lane].s[2 + i/2], 4);
            acc[lane][i] += accd[lane][i]*d;
        }
    }
    for (int lane = 0; type == GEMV_IL_Q6_K && lane < 32; ++lane) {
        const uint32_t d = r[lane].s[2];  // {d[g], d[g+8]}
        for (int i = 0; i < 4; ++i) acc[lane][i] += accd[lane][i]*ref_half_to_float((uint16_t) (d >> 16*(i / 2)));
    }
}

// gemv_il_mul_mat: every CTA, nwarps warps splitting K, the shared-memory sum, the output scatter.
static void emulate_mul_mat(int type, const uint8_t * w, const uint8_t * xq, const float * xs, float * y,
                            int n, int k, int m, int nwarps) {
    const int nchunks = k / GEMV_IL_CHUNK_K;
    for (int blk = 0; blk < (n + 15) / 16; ++blk) {
        const int row0 = blk*16, nrows = std::min(n - row0, 16);
        const uint8_t * tile = w + (int64_t) blk*gemv_il_tile_bytes(type, k);
        std::vector<float> partial((size_t) nwarps*128, 0.0f);
        for (int warp = 0; warp < nwarps; ++warp) {
            float acc[32][4] = {};
            for (int c = warp; c < nchunks; c += nwarps) {
                lane_chunk r[32];
                emulate_load(type, tile, nrows, k, c, r);
                const int64_t cs = (int64_t) c*GEMV_IL_CHUNK_BLOCKS*GEMV_IL_MAX_TOKENS;
                emulate_chunk_dot(type, r, xq + (int64_t) c*GEMV_IL_CHUNK_K*GEMV_IL_MAX_TOKENS, xs + cs, xs + gemv_il_xs_count(k) + cs, acc);
            }
            for (int lane = 0; lane < 32; ++lane) {
                for (int i = 0; i < 4; ++i) partial[(size_t) warp*128 + lane*4 + i] = acc[lane][i];
            }
        }
        // the CTA's nwarps*32 threads stride over the 128 outputs, as the kernel does
        for (int tid = 0; tid < nwarps*32; ++tid) {
            for (int e = tid; e < 128; e += nwarps*32) {
                float sum = 0.0f;
                for (int wi = 0; wi < nwarps; ++wi) sum += partial[(size_t) wi*128 + e];
                const int l = e / 4, i = e % 4;
                const int row = l / 4 + 8*(i / 2), tok = 2*(l % 4) + i % 2;
                if (tok < m && row < nrows) y[(size_t) tok*n + row0 + row] = sum*gemv_il_out_scale(type);
            }
        }
    }
}

int main() {
    int passed = 0, failed = 0;
    const char * names[5] = {"q4_0", "q8_0", "q4_k", "q6_k", "w4a8"};
    const int shapes[][2] = {{256, 16}, {256, 37}, {512, 5}, {768, 100}, {1280, 48}, {2048, 33}};  // {k, n}
    uint64_t seed = 1234;
    for (int type : {GEMV_IL_Q4_0, GEMV_IL_Q8_0, GEMV_IL_Q4_K, GEMV_IL_Q6_K, GEMV_IL_W4A8}) {
        for (const auto & sh : shapes) {
            const int k = sh[0], n = sh[1];
            const size_t wbytes = (size_t) n*gemv_il_row_bytes(type, k);
            std::vector<uint8_t> w(wbytes), il(wbytes), back(wbytes, 0xAA), tmp(gemv_il_tile_bytes(type, k));
            ref_fill_weights(type, n, k, w.data(), ++seed);

            // 1. round trip, which also proves every ggml byte lands somewhere (back starts as 0xAA)
            il = w;
            gemv_il_relayout_inplace_host(type, n, k, il.data(), tmp.data(), false);
            const int64_t full = (int64_t) (n / 16)*gemv_il_tile_bytes(type, k);
            for (int64_t t = 0; t < n / 16; ++t) {
                gemv_il_relayout_tile(type, k, il.data() + t*gemv_il_tile_bytes(type, k), back.data() + t*gemv_il_tile_bytes(type, k), true);
            }
            memcpy(back.data() + full, il.data() + full, wbytes - full);
            const bool moved = n < 16 || memcmp(w.data(), il.data(), full) != 0;
            const bool rt = back == w && moved;
            printf("%s relayout round trip k=%d n=%d: %s\n", names[type], k, n, rt ? "ok" : "FAILED");
            rt ? ++passed : ++failed;

            // the device's in-place tile moves (gemv_il_relayout_tiles) by their index math and padded
            // staging, both ways, against the host re-layout; the map starts poisoned, so an entry it misses fails
            for (const bool to_plain : {false, true}) {
                const int row_bytes = (int) gemv_il_row_bytes(type, k), tb = (int) gemv_il_tile_bytes(type, k);
                std::vector<int> map(gemv_il_chunk_bytes(type)/2, 1 << 30);
                for (int h = 0; h < (int) map.size(); ++h) gemv_il_relayout_map_entry(type, row_bytes, h, to_plain, map.data());
                std::vector<uint8_t> moved_tiles(wbytes, 0xAA);
                const std::vector<uint8_t> & from = to_plain ? il : w;
                bool in_range = true;
                std::vector<uint8_t> stage(gemv_il_stage_bytes(tb));
                for (int64_t t = 0; t < n / 16; ++t) {
                    for (int i = 0; i < tb/16; ++i) memcpy(stage.data() + gemv_il_stage_offset(16*i), from.data() + t*tb + 16*i, 16);
                    for (int i = 0; i < tb/16; ++i) {
                        int src[8];
                        gemv_il_relayout_unit_src(type, row_bytes, map.data(), i, to_plain, src);
                        for (int e = 0; e < 8; ++e) {
                            in_range = in_range && src[e] >= 0 && src[e] + 1 < tb;
                            if (in_range) memcpy(moved_tiles.data() + t*tb + 16*i + 2*e, stage.data() + gemv_il_stage_offset(src[e]), 2);
                        }
                    }
                }
                const std::vector<uint8_t> & want = to_plain ? w : il;
                const bool same = in_range && memcmp(moved_tiles.data(), want.data(), full) == 0;
                printf("%s in-place tile move %s k=%d n=%d: %s\n", names[type], to_plain ? "to ggml" : "to interleaved", k, n, same ? "ok" : "FAILED");
                same ? ++passed : ++failed;
            }
            if (type == GEMV_IL_W4A8) { // the inverse map the prefill's expansion to Q8_0 reads with
                bool inv = true;
                for (int64_t t = 0; t < n / 16; ++t) {
                    for (int c = 0; c < k / GEMV_IL_CHUNK_K; ++c) {
                        for (int row = 0; row < 16; ++row) {
                            for (int off = 0; off < gemv_il_block_bytes(type); ++off) {
                                inv = inv && il[t*gemv_il_tile_bytes(type, k) + (int64_t) c*gemv_il_chunk_bytes(type) + gemv_il_w4a8_il_offset(row, off)]
                                          == w[(t*16 + row)*gemv_il_row_bytes(type, k) + (int64_t) c*gemv_il_block_bytes(type) + off];
                            }
                        }
                    }
                }
                printf("w4a8 inverse map k=%d n=%d: %s\n", k, n, inv ? "ok" : "FAILED");
                inv ? ++passed : ++failed;

                // the prefill's expansion to Q8_0 through that map, against ggml_pyqwen_w4a8_to_q8_0's rule
                // read off ggml's bytes; one 16-group scale made NaN (its whole 32-block is NaN, levels 0)
                std::vector<uint8_t> wn = w, iln(wbytes);
                wn[(int64_t) 3 % n*gemv_il_row_bytes(type, k) + GEMV_IL_W4A8_SR + 5] = 0x7F;
                iln = wn;
                gemv_il_relayout_inplace_host(type, n, k, iln.data(), tmp.data(), false);
                bool q8 = true;
                for (int64_t row = 0; row < n / 16 * 16; ++row) {
                    const uint8_t * ggml_row = wn.data() + row*gemv_il_row_bytes(type, k);
                    for (int c = 0; c < k / GEMV_IL_CHUNK_K; ++c) {
                        const uint8_t * chunk = iln.data() + row/16*gemv_il_tile_bytes(type, k) + (int64_t) c*gemv_il_chunk_bytes(type);
                        const uint8_t * blk = ggml_row + (int64_t) c*gemv_il_block_bytes(type);
                        for (int j = 0; j < 8; ++j) {
                            float d;
                            uint32_t words[8];
                            int8_t qs[32];
                            gemv_il_w4a8_q8_0([&](int off) { return chunk[gemv_il_w4a8_il_offset((int) (row % 16), off)]; },
                                              ref_w4a8_levels(), j, d, words);
                            memcpy(qs, words, 32);
                            const bool nan = std::isnan(ref_e4m3_to_float(blk[GEMV_IL_W4A8_SR + 2*j])) ||
                                             std::isnan(ref_e4m3_to_float(blk[GEMV_IL_W4A8_SR + 2*j + 1]));
                            int v[32];
                            double dref, unused;
                            ref_decode32(type, ggml_row, (int64_t) c*8 + j, v, dref, unused);
                            q8 = q8 && (nan ? std::isnan(d) : d == (float) dref);
                            for (int i = 0; i < 32; ++i) {
                                q8 = q8 && qs[i] == (nan ? 0 : v[i]);
                            }
                        }
                    }
                }
                printf("w4a8 expansion to Q8_0 k=%d n=%d: %s\n", k, n, q8 ? "ok" : "FAILED");
                q8 ? ++passed : ++failed;
            }

            // 2. the kernel's arithmetic on the interleaved tensor, for every M and several K splits
            std::vector<float> x((size_t) GEMV_IL_MAX_TOKENS*k), d((size_t) GEMV_IL_MAX_TOKENS*(k/32)), sum(d.size()), xs(2*gemv_il_xs_count(k));
            std::vector<int8_t> q((size_t) GEMV_IL_MAX_TOKENS*k);
            std::vector<uint8_t> xq(gemv_il_xq_bytes(k));
            ref_fill_activations(k, x.data(), ++seed);
            ref_quantize(k, GEMV_IL_MAX_TOKENS, x.data(), q.data(), d.data(), sum.data());
            ref_interleave_activations(k, q.data(), d.data(), sum.data(), xq.data(), xs.data());
            const ref_result ref = ref_mul_mat(type, n, k, w.data(), x.data(), q.data(), d.data());
            for (int m = 1; m <= GEMV_IL_MAX_TOKENS; ++m) {
                for (int nwarps : {1, 2, 4, 16}) {
                    const uint32_t poison = 0x7FC0DEADu;
                    std::vector<float> y((size_t) GEMV_IL_MAX_TOKENS*n);
                    for (auto & v : y) memcpy(&v, &poison, 4);
                    emulate_mul_mat(type, il.data(), xq.data(), xs.data(), y.data(), n, k, m, nwarps);
                    const ref_check c = ref_compare(ref, n, m, y.data(), poison);
                    if (!c.ok || (m == 8 && nwarps == 1)) {
                        printf("%s emulated gemv k=%d n=%d m=%d nwarps=%d: %s (rel err vs same-quant math %.2e, vs float activations %.2e, bad %lld)\n",
                               names[type], k, n, m, nwarps, c.ok ? "ok" : "FAILED", c.err_q, c.err_f, (long long) c.bad);
                    }
                    c.ok ? ++passed : ++failed;
                }
            }
        }
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
