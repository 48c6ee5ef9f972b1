// gemv-il-layout.h: the interleaved weight layout of the skinny int8 tensor-core GEMV (gemv-il.cuh).
//
// Plain C++ with optional __host__ __device__ markers, so the same index math runs in the CUDA kernels,
// in the host re-layout (set_tensor / tests) and in the CPU emulation of the kernel.
//
// Geometry. A ggml weight W[N, K] (Q4_0, Q8_0 or Q4_K) is cut into tiles of 16 rows; a tile is cut
// into chunks of 256 K (8 blocks of 32, or one Q4_K super-block). A full tile is stored as its
// chunks, one after the other, and a chunk as
//   quants: (Q4_0, Q4_K: 4, Q8_0: 8) warp loads of 512 bytes, lane l's 16 bytes = exactly the bytes of
//           its mma.m16n8k32 A fragments (rows g = l/4 and g+8, k = 4t..4t+3 and 16+4t.., t = l%4), then
//   meta:   256 bytes, lane l's 8 bytes = Q4_0/Q8_0: the fp16 scales of rows g and g+8 for blocks 2t
//           and 2t+1; Q4_K: half t%2 of the 16-byte header (d, dmin, 6-bit scales) of row g + 8*(t/2).
// So a warp streams a tile front to back with coalesced 16-byte loads and no separate scale stream.
// The N % 16 rows of a last, partial tile stay in ggml's row layout after the full tiles. The layout
// is a byte permutation inside each tile: same size as ggml's, invertible, and done tile by tile in place.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define GEMV_IL_HD __host__ __device__ __forceinline__
#else
#define GEMV_IL_HD inline
#endif

enum gemv_il_type {
    GEMV_IL_Q4_0 = 0,
    GEMV_IL_Q8_0 = 1,
    GEMV_IL_Q4_K = 2,
};

constexpr int GEMV_IL_TILE_ROWS     = 16;  // rows of the mma A tile
constexpr int GEMV_IL_CHUNK_BLOCKS  = 8;   // 32-blocks per chunk
constexpr int GEMV_IL_CHUNK_K       = 256;
constexpr int GEMV_IL_SCALE_BYTES   = 256; // meta: 16 rows x 8 blocks x fp16, or 16 rows x 16-byte Q4_K header
constexpr int GEMV_IL_WARP_LOAD     = 512; // 32 lanes x 16 bytes
constexpr int GEMV_IL_MAX_TOKENS    = 8;   // the mma's N: token rows of the activation

// ggml blocks: block_q4_0 = fp16 d + 16 bytes of nibbles (32 values); block_q8_0 = fp16 d + 32 int8;
// block_q4_K = fp16 d, fp16 dmin, 12 bytes of 6-bit scales and mins, 128 bytes of nibbles (256 values).
GEMV_IL_HD constexpr int gemv_il_block_bytes(int type) { return type == GEMV_IL_Q4_0 ? 18 : type == GEMV_IL_Q8_0 ? 34 : 144; }
GEMV_IL_HD constexpr int gemv_il_block_k(int type)     { return type == GEMV_IL_Q4_K ? 256 : 32; }
GEMV_IL_HD constexpr int gemv_il_quant_bytes(int type) { return type == GEMV_IL_Q8_0 ? 4096 : 2048; } // per chunk
GEMV_IL_HD constexpr int gemv_il_chunk_bytes(int type) { return gemv_il_quant_bytes(type) + GEMV_IL_SCALE_BYTES; }
GEMV_IL_HD constexpr int gemv_il_loads(int type)       { return gemv_il_quant_bytes(type) / GEMV_IL_WARP_LOAD; }
// bytes of one row inside one chunk (= chunk bytes / 16)
GEMV_IL_HD constexpr int gemv_il_chunk_row_bytes(int type) { return GEMV_IL_CHUNK_K / gemv_il_block_k(type) * gemv_il_block_bytes(type); }

GEMV_IL_HD constexpr int64_t gemv_il_row_bytes(int type, int64_t k)  { return k / GEMV_IL_CHUNK_K * gemv_il_chunk_row_bytes(type); }
GEMV_IL_HD constexpr int64_t gemv_il_tile_bytes(int type, int64_t k) { return GEMV_IL_TILE_ROWS * gemv_il_row_bytes(type, k); }

// Where a byte group of the interleaved chunk comes from in ggml's layout: tile row, block inside the
// chunk (always 0 for Q4_K), byte offset inside that ggml block.
struct gemv_il_src {
    int row;
    int blk;
    int off;
};

// 4-byte quant word qi (0 .. quant_bytes/4) of a chunk. Lane l = 4g + t of warp load j holds words
// 4l..4l+3 of that load:
//   Q4_0 [row g, blk 2j][row g+8, blk 2j][row g, blk 2j+1][row g+8, blk 2j+1], each the nibble bytes
//        4t..4t+3 (low nibbles k = 4t.., high nibbles k = 16+4t..);
//   Q8_0 [row g][row g+8][row g][row g+8] of block j, k = 4t.. for the first two and k = 16+4t.. for
//        the last two (= a0..a3);
//   Q4_K [row g][row g+8][row g][row g+8], qs bytes 32j+4t.. and 32j+16+4t..: the low nibbles are
//        sub-block 2j (k = 4t.., 16+4t..), the high nibbles sub-block 2j+1.
GEMV_IL_HD gemv_il_src gemv_il_quant_src(int type, int qi) {
    const int j = qi >> 7, l = (qi >> 2) & 31, w = qi & 3;
    const int g = l >> 2, t = l & 3;
    if (type == GEMV_IL_Q4_0) {
        return { g + 8*(w & 1), 2*j + (w >> 1), 2 + 4*t };
    }
    if (type == GEMV_IL_Q4_K) {
        return { g + 8*(w & 1), 0, 16 + 32*j + 4*t + 16*(w >> 1) };
    }
    return { g + 8*(w & 1), j, 2 + 4*t + 16*(w >> 1) };
}

// 2-byte meta unit si (0..127) of a chunk.
//   Q4_0, Q8_0: lane l = 4g + t holds d[g, 2t], d[g+8, 2t], d[g, 2t+1], d[g+8, 2t+1], so the half2
//     {d[g, b], d[g+8, b]} every lane of group g needs for block b sits in lane 4g + b/2, word b%2.
//   Q4_K: lane l = 4g + t holds header bytes 8*(t%2)..+7 of row g + 8*(t/2).
GEMV_IL_HD gemv_il_src gemv_il_scale_src(int type, int si) {
    const int l = si >> 2, h = si & 3;
    const int g = l >> 2, t = l & 3;
    if (type == GEMV_IL_Q4_K) {
        return { g + 8*(t >> 1), 0, 8*(t & 1) + 2*h };
    }
    return { g + 8*(h & 1), 2*t + (h >> 1), 0 };
}

// Byte offset, inside the 16 rows of a tile in ggml's layout, of a quant word / meta unit of chunk c.
GEMV_IL_HD int64_t gemv_il_src_offset(int type, int64_t k, int c, gemv_il_src s) {
    return s.row*gemv_il_row_bytes(type, k) + (int64_t) c*gemv_il_chunk_row_bytes(type) + s.blk*gemv_il_block_bytes(type) + s.off;
}
GEMV_IL_HD int64_t gemv_il_quant_src_offset(int type, int64_t k, int c, int qi) {
    return gemv_il_src_offset(type, k, c, gemv_il_quant_src(type, qi));
}
GEMV_IL_HD int64_t gemv_il_scale_src_offset(int type, int64_t k, int c, int si) {
    return gemv_il_src_offset(type, k, c, gemv_il_scale_src(type, si));
}

// Quantized activations (written by the quantize kernel, read by the GEMV): 8 token rows, int8 per
// 32-block with one float scale d = amax/127, q = round(x/d), and the float s = d * sum(q) (ggml's q8_1,
// with d and s in fp32; s serves the Q4_K mins).
// Block pair p (k = 64p .. 64p+63) is 512 bytes: lane 4m + t holds token m's B fragments of blocks
// 2p and 2p+1: [blk 2p: k 4t..4t+3][blk 2p: k 16+4t..][blk 2p+1: k 4t..][blk 2p+1: k 16+4t..].
// Scales: 16 floats per pair, lane t reads float4 {d[2p][2t], d[2p][2t+1], d[2p+1][2t], d[2p+1][2t+1]};
// the sums s follow all the scales in the same order (xs + gemv_il_xs_count(k)).
GEMV_IL_HD int64_t gemv_il_xq_offset(int m, int64_t b, int kk) {
    const int part = kk >> 4, t = (kk >> 2) & 3, byte = kk & 3;
    return (b >> 1)*GEMV_IL_WARP_LOAD + (4*m + t)*16 + (b & 1)*8 + part*4 + byte;
}
GEMV_IL_HD int64_t gemv_il_xs_index(int m, int64_t b) {
    return (b >> 1)*16 + (m >> 1)*4 + (b & 1)*2 + (m & 1);
}
GEMV_IL_HD int64_t gemv_il_xq_bytes(int64_t k) { return GEMV_IL_MAX_TOKENS*k; }
GEMV_IL_HD int64_t gemv_il_xs_count(int64_t k) { return GEMV_IL_MAX_TOKENS*(k/32); }  // scales; as many sums follow

// The A fragments of the block(s) of one 16-byte quant load. Q4_0 nibbles become 16*(q - 8): the nibble
// goes to the high half of the byte and its top bit flips, one LOP3 (and a shift) per register; the
// factor 16 is taken out once per output (gemv_il_out_scale).
GEMV_IL_HD uint32_t gemv_il_q4_lo(uint32_t x) { return ((x << 4) & 0xF0F0F0F0u) ^ 0x80808080u; }
GEMV_IL_HD uint32_t gemv_il_q4_hi(uint32_t x) { return (x & 0xF0F0F0F0u) ^ 0x80808080u; }
GEMV_IL_HD constexpr float gemv_il_out_scale(int type) { return type == GEMV_IL_Q8_0 ? 1.0f : 1.0f/16.0f; }

// A fragment (a0..a3) of block h (0/1) of a Q4_0 or Q4_K load (words w[0..3]), or of the Q8_0 load.
GEMV_IL_HD void gemv_il_frag_a(int type, const uint32_t w[4], int h, uint32_t a[4]) {
    if (type == GEMV_IL_Q4_0) {
        const uint32_t xg = w[2*h], xg8 = w[2*h + 1];
        a[0] = gemv_il_q4_lo(xg);
        a[1] = gemv_il_q4_lo(xg8);
        a[2] = gemv_il_q4_hi(xg);
        a[3] = gemv_il_q4_hi(xg8);
    } else if (type == GEMV_IL_Q4_K) {
        for (int r = 0; r < 4; ++r) {
            a[r] = h ? gemv_il_q4_hi(w[r]) : gemv_il_q4_lo(w[r]);
        }
    } else {
        a[0] = w[0]; a[1] = w[1]; a[2] = w[2]; a[3] = w[3];
    }
}

// Q4_K: 6-bit scale and min of sub-block j from the 12 scale bytes as 3 little-endian words
// (ggml's get_scale_min_k4).
GEMV_IL_HD void gemv_il_q4_k_scale_min(const uint32_t q[3], int j, int & sc, int & m) {
    const auto byte = [&](int w, int i) { return (int) ((q[w] >> (8*i)) & 0xFF); };
    if (j < 4) {
        sc = byte(0, j) & 63;
        m  = byte(1, j) & 63;
    } else {
        sc = (byte(2, j - 4) & 0xF) | ((byte(0, j - 4) >> 6) << 4);
        m  = (byte(2, j - 4) >>  4) | ((byte(1, j - 4) >> 6) << 4);
    }
}

// ---- host side: re-layout of whole tensors (set_tensor, get_tensor, tests) ----

// One full tile: ggml rows -> interleaved (inverse = false) or back. src and dst must not overlap.
inline void gemv_il_relayout_tile(int type, int64_t k, const uint8_t * src, uint8_t * dst, bool inverse) {
    const int nchunks = (int) (k / GEMV_IL_CHUNK_K);
    const int qwords  = gemv_il_quant_bytes(type) / 4;
    for (int c = 0; c < nchunks; ++c) {
        const int64_t base = (int64_t) c*gemv_il_chunk_bytes(type);
        for (int qi = 0; qi < qwords; ++qi) {
            const int64_t o = gemv_il_quant_src_offset(type, k, c, qi), il = base + 4*qi;
            if (inverse) memcpy(dst + o, src + il, 4); else memcpy(dst + il, src + o, 4);
        }
        for (int si = 0; si < GEMV_IL_SCALE_BYTES/2; ++si) {
            const int64_t o = gemv_il_scale_src_offset(type, k, c, si), il = base + gemv_il_quant_bytes(type) + 2*si;
            if (inverse) memcpy(dst + o, src + il, 2); else memcpy(dst + il, src + o, 2);
        }
    }
}

// Whole tensor in place, one tile at a time through `tmp` (gemv_il_tile_bytes(type, k) bytes): the only
// extra memory. The partial last tile is left as it is.
inline void gemv_il_relayout_inplace_host(int type, int64_t n, int64_t k, uint8_t * data, uint8_t * tmp, bool inverse) {
    const int64_t tb = gemv_il_tile_bytes(type, k);
    for (int64_t tile = 0; tile < n / GEMV_IL_TILE_ROWS; ++tile) {
        memcpy(tmp, data + tile*tb, tb);
        gemv_il_relayout_tile(type, k, tmp, data + tile*tb, inverse);
    }
}

// Which shapes the layout takes: K in whole chunks (so K-quant super-blocks fit the same chunks).
inline bool gemv_il_supported_shape(int64_t n, int64_t k) {
    return n >= 1 && k >= GEMV_IL_CHUNK_K && k % GEMV_IL_CHUNK_K == 0;
}
