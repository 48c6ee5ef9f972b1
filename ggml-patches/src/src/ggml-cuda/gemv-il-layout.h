// gemv-il-layout.h: the interleaved weight layout of the skinny int8 tensor-core GEMV (gemv-il.cuh).
//
// Plain C++ with optional __host__ __device__ markers, so the same index math runs in the CUDA kernels,
// in the host re-layout (set_tensor / tests) and in the CPU emulation of the kernel.
//
// Geometry. A ggml weight W[N, K] (Q4_0, Q8_0, Q4_K, Q6_K or pyqwen's PQ_W4A8) is cut into tiles of 16
// rows; a tile is cut into chunks of 256 K (8 blocks of 32, or one super-block of K-quants and W4A8). A
// full tile is stored as its chunks, one after the other, and a chunk as
//   quants: (Q4_0, Q4_K, W4A8: 4, Q6_K: 6, Q8_0: 8) warp loads of 512 bytes, lane l's 16 bytes = exactly
//           the bytes of its mma.m16n8k32 A fragments (rows g = l/4 and g+8, k = 4t..4t+3 and 16+4t..,
//           t = l%4; Q6_K: low nibbles and high bit pairs in separate loads; W4A8: the codes, which
//           one table lookup per value turns into the fragments' int8), then
//   meta:   256 bytes, lane l's 8 bytes = Q4_0/Q8_0: the fp16 scales of rows g and g+8 for blocks 2t
//           and 2t+1; Q4_K: the 16 rows' 16-byte headers (d, dmin, 6-bit scales and mins) in row order,
//           of which lane l loads those of rows g and g+8 (its group's 4 lanes load the same 32 bytes);
//           Q6_K: the int8 scales of rows g and g+8 for the 16-groups of blocks 2t and 2t+1, then
//           32 more bytes: the fp16 d of rows g and g+8 at 4*g, which the 4 lanes of group g all load;
//           W4A8: the e4m3 scale bytes of rows g and g+8 for the 16-groups of blocks 2t and 2t+1, then
//           64 bytes: the fp32 d of rows g and g+8 at 8*g (loaded by the 4 lanes of group g), then the
//           16 rows' codebook ids (a kernel reads them once: every block of a row has its row's id).
// So a warp streams a tile front to back with coalesced loads and no separate scale stream.
// The N % 16 rows of a last, partial tile stay in ggml's row layout after the full tiles. The layout
// is a byte permutation inside each tile: same size as ggml's, invertible, and done tile by tile in place.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define GEMV_IL_HD __host__ __device__ __forceinline__
#else
#define GEMV_IL_HD inline
#endif

// NVIDIA device code, where PTX asm is allowed (ggml's HIP build defines __CUDA_ARCH__ too)
#if defined(__CUDA_ARCH__) && !defined(GGML_USE_HIP)
#define GEMV_IL_PTX
#endif

enum gemv_il_type {
    GEMV_IL_Q4_0 = 0,
    GEMV_IL_Q8_0 = 1,
    GEMV_IL_Q4_K = 2,
    GEMV_IL_Q6_K = 3,
    GEMV_IL_W4A8 = 4, // GGML_TYPE_PQ_W4A8
    GEMV_IL_NTYPES,
};

constexpr int GEMV_IL_TILE_ROWS     = 16;  // rows of the mma A tile
constexpr int GEMV_IL_CHUNK_BLOCKS  = 8;   // 32-blocks per chunk
constexpr int GEMV_IL_CHUNK_K       = 256;
constexpr int GEMV_IL_WARP_LOAD     = 512; // 32 lanes x 16 bytes
constexpr int GEMV_IL_MAX_TOKENS    = 8;   // the mma's N: token rows of the activation

// ggml blocks: block_q4_0 = fp16 d + 16 bytes of nibbles (32 values); block_q8_0 = fp16 d + 32 int8;
// block_q4_K = fp16 d, fp16 dmin, 12 bytes of 6-bit scales and mins, 128 bytes of nibbles (256 values);
// block_q6_K = ql[128] low nibbles, qh[64] high bit pairs, int8 scales[16] (one per 16 values), fp16 d
// (256 values; value = d * scales[i/16] * (q6 - 32)), at these byte offsets:
constexpr int GEMV_IL_Q6_K_QH = 128, GEMV_IL_Q6_K_SCALES = 192, GEMV_IL_Q6_K_D = 208;
// block_pq_w4a8 (pyqwen-w4a8.h) = fp32 d, uint32 codebook id, 16 e4m3 scale bytes (one per 16 values),
// 128 bytes of codes (column 2i in the low nibble of byte i, 2i+1 in the high one); 256 values, value =
// d * levels[scale][code], levels the codebook's int8 table (256 scale bytes x 16 codes):
constexpr int GEMV_IL_W4A8_CB = 4, GEMV_IL_W4A8_SR = 8, GEMV_IL_W4A8_QS = 24;
constexpr int GEMV_IL_W4A8_CODEBOOKS = 1 << 16; // codebook ids a process can have (pyqwen-w4a8.c)

GEMV_IL_HD constexpr int gemv_il_block_bytes(int type) {
    return type == GEMV_IL_Q4_0 ? 18 : type == GEMV_IL_Q8_0 ? 34 : type == GEMV_IL_Q4_K ? 144 : type == GEMV_IL_Q6_K ? 210 : 152;
}
GEMV_IL_HD constexpr int gemv_il_block_k(int type)     { return type == GEMV_IL_Q4_0 || type == GEMV_IL_Q8_0 ? 32 : 256; }
// per chunk: quant bytes (whole warp loads), then meta bytes (2-byte units)
GEMV_IL_HD constexpr int gemv_il_quant_bytes(int type) { return type == GEMV_IL_Q8_0 ? 4096 : type == GEMV_IL_Q6_K ? 3072 : 2048; }
GEMV_IL_HD constexpr int gemv_il_meta_bytes(int type)  { return type == GEMV_IL_Q6_K ? 288 : type == GEMV_IL_W4A8 ? 384 : 256; }
GEMV_IL_HD constexpr int gemv_il_chunk_bytes(int type) { return gemv_il_quant_bytes(type) + gemv_il_meta_bytes(type); }
GEMV_IL_HD constexpr int gemv_il_loads(int type)       { return gemv_il_quant_bytes(type) / GEMV_IL_WARP_LOAD; }
// Bytes of a quant unit: the runs of ggml bytes the layout moves. A lane's 4-byte word is one unit, or for
// W4A8 two (its 4 codes at k 4t.. and its 4 at 16+4t.. lie 8 bytes apart in ggml's row).
GEMV_IL_HD constexpr int gemv_il_quant_unit_bytes(int type) { return type == GEMV_IL_W4A8 ? 2 : 4; }
// 4-byte meta words per lane: 8 bytes of its own, plus Q6_K's d word (W4A8: d words) shared by its group of
// 4 lanes; Q4_K: the two headers of its rows
GEMV_IL_HD constexpr int gemv_il_meta_words(int type)  {
    return type == GEMV_IL_Q4_K ? 8 : type == GEMV_IL_Q6_K ? 3 : type == GEMV_IL_W4A8 ? 4 : 2;
}
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

// W4A8's k order in a block: the mma's k = 4t..4t+3 (lane t of a group) is column c0(t) = 4t + 8*(t/2),
// and k + 16 is column c0(t) + 8, which swaps the block's 8-column quarters 1 and 2. The GEMV gives the
// activations the same order (gemv_il_w4a8_swap).
GEMV_IL_HD constexpr int gemv_il_w4a8_col0(int t) { return 4*t + 8*(t >> 1); }

// Quant unit qi (0 .. quant_bytes/unit bytes) of a chunk; but for W4A8, unit = word. Lane l = 4g + t of
// warp load j holds words 4l..4l+3 of that load:
//   Q4_0 [row g, blk 2j][row g+8, blk 2j][row g, blk 2j+1][row g+8, blk 2j+1], each the nibble bytes
//        4t..4t+3 (low nibbles k = 4t.., high nibbles k = 16+4t..);
//   Q8_0 [row g][row g+8][row g][row g+8] of block j, k = 4t.. for the first two and k = 16+4t.. for
//        the last two (= a0..a3);
//   Q4_K [row g][row g+8][row g][row g+8], qs bytes 32j+4t.. and 32j+16+4t..: the low nibbles are
//        sub-block 2j (k = 4t.., 16+4t..), the high nibbles sub-block 2j+1 (ggml's order).
//   Q6_K loads j = 3h + p cover half h of the super-block (ggml's 32-blocks b = 4h + s, s = 0..3):
//        [row g][row g+8][row g][row g+8] at k = 4t.. then 16+4t.. of
//        p = 0: ql bytes 64h + 4t.. (low nibbles: block s = 0, high nibbles: s = 2),
//        p = 1: ql bytes 64h + 32 + 4t.. (s = 1 and s = 3),
//        p = 2: qh bytes 32h + 4t.. (bit pair s: the high bits of block s, for all four).
//   W4A8 as Q4_0 by rows and blocks, [row g, blk 2j][row g+8, blk 2j][row g, blk 2j+1][row g+8, blk 2j+1],
//        each word two units, in the block's k order with its 8-column quarters 1 and 2 swapped
//        (gemv_il_w4a8_col0): code bytes c/2, c/2 + 1 of columns c = c0(t) .. c0(t)+3 (k = 4t..4t+3,
//        nibble i = column c0(t)+i), then those of c0(t)+8 .. (k = 16+4t..). So lanes t = 0, 1 hold only
//        the block's first 16-group, t = 2, 3 only its second: one level row a row.
GEMV_IL_HD gemv_il_src gemv_il_quant_src(int type, int qi) {
    if (type == GEMV_IL_W4A8) {
        const int wi = qi >> 1, j = wi >> 7, l = (wi >> 2) & 31, w = wi & 3;
        const int g = l >> 2, t = l & 3, b = 2*j + (w >> 1);
        return { g + 8*(w & 1), 0, GEMV_IL_W4A8_QS + 16*b + (gemv_il_w4a8_col0(t) + 8*(qi & 1))/2 };
    }
    const int j = qi >> 7, l = (qi >> 2) & 31, w = qi & 3;
    const int g = l >> 2, t = l & 3;
    if (type == GEMV_IL_Q4_0) {
        return { g + 8*(w & 1), 2*j + (w >> 1), 2 + 4*t };
    }
    if (type == GEMV_IL_Q4_K) {
        return { g + 8*(w & 1), 0, 16 + 32*j + 4*t + 16*(w >> 1) };
    }
    if (type == GEMV_IL_Q6_K) {
        const int h = j / 3, p = j % 3, k = 4*t + 16*(w >> 1);
        return { g + 8*(w & 1), 0, p < 2 ? 64*h + 32*p + k : GEMV_IL_Q6_K_QH + 32*h + k };
    }
    return { g + 8*(w & 1), j, 2 + 4*t + 16*(w >> 1) };
}

// 2-byte meta unit si (0 .. meta_bytes/2) of a chunk.
//   Q4_0, Q8_0: lane l = 4g + t holds d[g, 2t], d[g+8, 2t], d[g, 2t+1], d[g+8, 2t+1], so the half2
//     {d[g, b], d[g+8, b]} every lane of group g needs for block b sits in lane 4g + b/2, word b%2.
//   Q4_K: unit 8r + i is bytes 2i, 2i+1 of row r's header (d, dmin, 12 bytes of scales and mins).
//   Q6_K: lane l = 4g + t holds, for blocks b = 2t, 2t+1, the scale pair {scales[2b], scales[2b+1]} of
//     row g, then of row g+8: block b's 4 scales sit in lane 4g + b/2, word b%2, as for Q4_0. Units 128..143
//     are the half2 {d[g], d[g+8]} for g = 0..7.
//   W4A8: units 0..127 as Q6_K's, with the scale bytes {sr[2b], sr[2b+1]} of rows g and g+8 for blocks
//     b = 2t, 2t+1; units 128..159 the fp32 {d[g], d[g+8]} for g = 0..7; units 160..191 the rows' ids.
GEMV_IL_HD gemv_il_src gemv_il_meta_src(int type, int si) {
    const int l = si >> 2, h = si & 3;
    const int g = l >> 2, t = l & 3;
    if (type == GEMV_IL_W4A8) {
        const int u = si - 128, v = si - 160;
        return si < 128 ? gemv_il_src{ g + 8*(h & 1), 0, GEMV_IL_W4A8_SR + 2*(2*t + (h >> 1)) }
             : si < 160 ? gemv_il_src{ (u >> 2) + 8*((u >> 1) & 1), 0, 2*(u & 1) }
                        : gemv_il_src{ v >> 1, 0, GEMV_IL_W4A8_CB + 2*(v & 1) };
    }
    if (type == GEMV_IL_Q4_K) {
        return { si >> 3, 0, 2*(si & 7) };
    }
    if (type == GEMV_IL_Q6_K) {
        const int u = si - 128;
        return si < 128 ? gemv_il_src{ g + 8*(h & 1), 0, GEMV_IL_Q6_K_SCALES + 2*(2*t + (h >> 1)) }
                        : gemv_il_src{ (u >> 1) + 8*(u & 1), 0, GEMV_IL_Q6_K_D };
    }
    return { g + 8*(h & 1), 2*t + (h >> 1), 0 };
}

// First meta unit of lane `lane`'s meta word i (its 2 units are consecutive). Q4_K: words 0..3 are row g's
// header, 4..7 row g+8's. W4A8: words 2, 3 are d[g], d[g+8].
GEMV_IL_HD constexpr int gemv_il_meta_word_unit(int type, int lane, int i) {
    return type == GEMV_IL_Q4_K ? 8*((lane >> 2) + 8*(i >> 2)) + 2*(i & 3) : i < 2 ? 4*lane + 2*i :
           type == GEMV_IL_W4A8 ? 128 + 4*(lane >> 2) + 2*(i - 2) : 128 + 2*(lane >> 2);
}

// Byte offset, inside the 16 rows of a tile in ggml's layout, of a quant / meta unit of chunk c.
GEMV_IL_HD int64_t gemv_il_src_offset(int type, int64_t k, int c, gemv_il_src s) {
    return s.row*gemv_il_row_bytes(type, k) + (int64_t) c*gemv_il_chunk_row_bytes(type) + s.blk*gemv_il_block_bytes(type) + s.off;
}
GEMV_IL_HD int64_t gemv_il_quant_src_offset(int type, int64_t k, int c, int qi) {
    return gemv_il_src_offset(type, k, c, gemv_il_quant_src(type, qi));
}
GEMV_IL_HD int64_t gemv_il_meta_src_offset(int type, int64_t k, int c, int si) {
    return gemv_il_src_offset(type, k, c, gemv_il_meta_src(type, si));
}

// ---- whole tiles in place, in 2-byte units (gemv_il_relayout_tiles: a prefill gives upstream's kernels
// ggml's layout and takes the interleaved one back) ----

// Where halfword h of an interleaved chunk comes from: its byte in ggml's layout of the chunk's 16 row
// parts, row r's part (chunk_row_bytes long) at r * chunk_row_bytes, i.e. in a tile one chunk wide.
// A permutation of the chunk's bytes.
GEMV_IL_HD int gemv_il_chunk_halfword_src(int type, int h) {
    const int qh = gemv_il_quant_bytes(type)/2, ub = gemv_il_quant_unit_bytes(type);
    const gemv_il_src s = h < qh ? gemv_il_quant_src(type, 2*h / ub) : gemv_il_meta_src(type, h - qh);
    return (int) gemv_il_src_offset(type, GEMV_IL_CHUNK_K, 0, s) + (h < qh ? 2*h % ub : 0);
}

// Entry of interleaved halfword h in the chunk map (chunk_bytes/2 ints) that gemv_il_relayout_unit_src reads:
// to ggml's layout (to_plain), the ggml halfword's interleaved halfword; else the interleaved halfword's
// ggml byte in the tile, less its chunk's part of the row. row_bytes: a ggml row's.
GEMV_IL_HD void gemv_il_relayout_map_entry(int type, int row_bytes, int h, bool to_plain, int * map) {
    const int p = gemv_il_chunk_halfword_src(type, h), crb = gemv_il_chunk_row_bytes(type);
    if (to_plain) {
        map[p/2] = h;
    } else {
        map[h] = p / crb * row_bytes + p % crb;
    }
}

// Where byte o of a tile sits in the kernel's shared-memory copy of it: 16 bytes of padding after every
// 512. The gathers of a warp would otherwise hit a few banks many times: sources 512 bytes apart (the
// same lane's words in successive warp loads) or a ggml row apart (a multiple of 128 bytes) share a bank.
GEMV_IL_HD int gemv_il_stage_offset(int o) {
    return o + (o >> 9 << 4);
}
GEMV_IL_HD int gemv_il_stage_bytes(int tile_bytes) {
    return gemv_il_stage_offset(tile_bytes - 1) + 1;
}

// The bytes of a full tile, as it is now, that the 8 halfwords of its 16-byte unit i in the other layout
// copy. One division by row_bytes a unit (the rest divide by constants): the kernel's inner loop.
GEMV_IL_HD void gemv_il_relayout_unit_src(int type, int row_bytes, const int * map, int i, bool to_plain, int src[8]) {
    const int cb = gemv_il_chunk_bytes(type), crb = gemv_il_chunk_row_bytes(type);
    if (to_plain) {
        int row = 16*i / row_bytes, rb = 16*i - row*row_bytes;
        for (int e = 0; e < 8; ++e, rb += 2) {
            if (rb == row_bytes) {
                ++row;
                rb = 0;
            }
            const int c = rb / crb;
            src[e] = c*cb + 2*map[(row*crb + rb - c*crb)/2];
        }
    } else {
        const int c = 16*i / cb, h = (16*i - c*cb)/2; // cb = 16 crb: a unit lies in one chunk
        for (int e = 0; e < 8; ++e) {
            src[e] = map[h + e] + c*crb;
        }
    }
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

// The A fragments of one 32-block of a chunk, from the words of its quant loads. Q4_0 nibbles become
// 16*(q - 8): the nibble goes to the high half of the byte and its top bit flips, one LOP3 (and a shift)
// per register. Q4_K's stay unsigned, for an mma with u8 A: the low nibbles as q, the high ones as 16*q,
// one LOP3 per register (the 16 is taken out per chunk, the min per sub-block by gemv_il_q4_k_mins). Q6_K's 6-bit q becomes 4*(q - 32) the same way: the low nibble to bits 2..5, the
// high bit pair to bits 6..7 with its top bit flipped (flipped once per qh word, for its 4 pairs at once):
// two shifts and two LOP3 per register. The factor (16, 4) is taken out once per output (gemv_il_out_scale).
GEMV_IL_HD uint32_t gemv_il_q4_lo(uint32_t x) { return ((x << 4) & 0xF0F0F0F0u) ^ 0x80808080u; }
GEMV_IL_HD uint32_t gemv_il_q4_hi(uint32_t x) { return (x & 0xF0F0F0F0u) ^ 0x80808080u; }
// Q6_K: a qh word with the top bit of each of its 4 bit pairs flipped, once for the 4 blocks that use it.
GEMV_IL_HD uint32_t gemv_il_q6_flip(uint32_t qh) {
    uint32_t x = qh ^ 0xAAAAAAAAu;
#if defined(__CUDA_ARCH__)
    asm("" : "+r"(x)); // else the compiler moves the flip behind each block's shift, one more op per register
#endif // defined(__CUDA_ARCH__)
    return x;
}
// Q6_K block s (0..3) of its half: low nibbles from ql word lo (nibble s/2), high bits from the flipped
// qh word hi_x (pair s).
GEMV_IL_HD uint32_t gemv_il_q6(uint32_t lo, uint32_t hi_x, int s) {
    const uint32_t l = (s & 2 ? lo >> 2 : lo << 2) & 0x3C3C3C3Cu;
    return l | ((hi_x << (6 - 2*s)) & 0xC0C0C0C0u);
}
GEMV_IL_HD constexpr float gemv_il_out_scale(int type) {
    return type == GEMV_IL_Q4_0 ? 1.0f/16.0f : type == GEMV_IL_Q6_K ? 0.25f : 1.0f;
}

// A fragment (a0..a3: rows g, g+8 at k 4t.., then at k 16+4t..) of block b (0..7) of a chunk whose quant
// loads hold the words q[load][0..3].
GEMV_IL_HD void gemv_il_frag_a(int type, const uint32_t (*q)[4], int b, uint32_t a[4]) {
    if (type == GEMV_IL_Q4_0) {
        const uint32_t * w = q[b >> 1];
        const uint32_t xg = w[2*(b & 1)], xg8 = w[2*(b & 1) + 1];
        a[0] = gemv_il_q4_lo(xg);
        a[1] = gemv_il_q4_lo(xg8);
        a[2] = gemv_il_q4_hi(xg);
        a[3] = gemv_il_q4_hi(xg8);
    } else if (type == GEMV_IL_Q4_K) {
        for (int r = 0; r < 4; ++r) {
            a[r] = q[b >> 1][r] & (b & 1 ? 0xF0F0F0F0u : 0x0F0F0F0Fu);
        }
    } else if (type == GEMV_IL_Q6_K) {
        const int h = b >> 2, s = b & 3;
        for (int r = 0; r < 4; ++r) {
            a[r] = gemv_il_q6(q[3*h + (s & 1)][r], gemv_il_q6_flip(q[3*h + 2][r]), s);
        }
    } else {
        for (int r = 0; r < 4; ++r) {
            a[r] = q[b][r];
        }
    }
}

// Byte i of w as a signed (Q6_K's scales) or unsigned (Q4_K's) int. On the device one PRMT: a selector nibble
// with its msb set replicates the sign of the byte it picks, selector 4 picks a zero byte of the second
// operand (PTX ISA, prmt); ptxas shifts first for bytes 1 and 2 when written in C.
template <bool is_signed>
GEMV_IL_HD int gemv_il_byte(uint32_t w, int i) {
#if defined(GEMV_IL_PTX)
    int r;
    asm("prmt.b32 %0, %1, 0, %2;" : "=r"(r) : "r"(w), "r"(is_signed ? 0x8880 + 0x1111*i : 0x4440 + i));
    return r;
#else
    return is_signed ? (int) (int8_t) (w >> 8*i) : (int) ((w >> 8*i) & 0xFF);
#endif // defined(GEMV_IL_PTX)
}

// PRMT: byte n of the result is byte (s >> 4n) & 7 of the 8 bytes {y:x} (x the low 4), or that byte's
// sign in all 8 bits where bit 3 of the selector nibble is set; s's upper 16 bits are not read. In asm:
// __byte_perm clears the nibbles' bit 3 first.
GEMV_IL_HD uint32_t gemv_il_byte_perm(uint32_t x, uint32_t y, uint32_t s) {
#if defined(GEMV_IL_PTX)
    uint32_t r;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(x), "r"(y), "r"(s));
    return r;
#else
    const uint64_t v = x | (uint64_t) y << 32;
    uint32_t r = 0;
    for (int n = 0; n < 4; ++n) {
        const uint32_t sel = (s >> 4*n) & 15, b = (uint32_t) (v >> 8*(sel & 7)) & 0xFF;
        r |= (sel & 8 ? (b & 0x80 ? 0xFFu : 0u) : b) << 8*n;
    }
    return r;
#endif // defined(GEMV_IL_PTX)
}

// W4A8: the int8 levels of the 4 codes in half h of x (its nibbles 4h..4h+3, column order) from the level
// row T[0..3] of their scale byte (levels 0..15). As selectors, the codes pick from levels 0..7 as they
// are and from levels 8..15 with bit 3 flipped, each pick right where the other is junk (a set bit 3 asks
// PRMT for the byte's sign); a third PRMT makes the mask of codes >= 8 from those bits 3, the signs of
// bytes of x << 4 (even nibbles) and of x (odd ones).
GEMV_IL_HD uint32_t gemv_il_w4a8_levels(uint32_t x, int h, const uint32_t T[4]) {
    const uint32_t v  = x >> 16*h;
    const uint32_t lo = gemv_il_byte_perm(T[0], T[1], v);
    const uint32_t hi = gemv_il_byte_perm(T[2], T[3], v ^ 0x8888u);
    const uint32_t m  = gemv_il_byte_perm(x << 4, x, h ? 0xFBEAu : 0xD9C8u);
    return (lo & ~m) | (hi & m);
}

// The level row of scale byte s in the codebook's table (256 rows of 16 int8).
GEMV_IL_HD void gemv_il_w4a8_row(const int8_t * levels, uint32_t s, uint32_t T[4]) {
#if defined(__CUDA_ARCH__)
    const uint4 v = __ldg((const uint4 *) (levels + 16*s)); // read-only: the non-coherent path, not a generic load
    T[0] = v.x; T[1] = v.y; T[2] = v.z; T[3] = v.w;
#else
    memcpy(T, levels + 16*s, 16);
#endif // defined(__CUDA_ARCH__)
}

// W4A8's A fragment of block b for lane t of a group, from the chunk's quant words, the block's scale
// word sw = {row g: sr[2b], sr[2b+1]}{row g+8: the same} and the level tables of rows g and g+8: all four
// registers are in 16-group t/2 (gemv_il_w4a8_col0), so one level row a row.
GEMV_IL_HD void gemv_il_w4a8_frag(const uint32_t (*q)[4], int b, uint32_t sw, int t, const int8_t * const levels[2], uint32_t a[4]) {
    const uint32_t * w = q[b >> 1];
    for (int r = 0; r < 2; ++r) { // row g, then g+8
        const uint32_t x = w[2*(b & 1) + r];
        uint32_t T[4];
        gemv_il_w4a8_row(levels[r], (sw >> (16*r + 8*(t >> 1))) & 0xFF, T);
        a[r] = gemv_il_w4a8_levels(x, 0, T);
        a[2 + r] = gemv_il_w4a8_levels(x, 1, T);
    }
}

// The activations in W4A8's k order, from the B fragment {b0: k 4t.., b1: k 16+4t..} of the usual order:
// lanes t = 0, 1 keep b0 and take b1 from lane t + 2's b0; lanes 2, 3 keep b1 and take b0 from lane t - 2's
// b1. `other` is what the partner lane (t ^ 2) sent: its b0 if t < 2, else its b1.
GEMV_IL_HD void gemv_il_w4a8_swap(int t, uint32_t other, uint32_t & b0, uint32_t & b1) {
    (t < 2 ? b1 : b0) = other;
}
// What lane t sends its partner for gemv_il_w4a8_swap.
GEMV_IL_HD uint32_t gemv_il_w4a8_swap_out(int t, uint32_t b0, uint32_t b1) { return t < 2 ? b1 : b0; }

// Where byte `off` (0..151) of tile row `row`'s block in a W4A8 chunk lies in the interleaved chunk: the
// inverse of gemv_il_quant_src / gemv_il_meta_src, for the prefill's expansion to Q8_0.
GEMV_IL_HD int gemv_il_w4a8_il_offset(int row, int off) {
    const int g = row & 7, hi = row >> 3;
    const int meta = gemv_il_quant_bytes(GEMV_IL_W4A8);
    if (off < GEMV_IL_W4A8_CB) {
        return meta + 2*(128 + 4*g + 2*hi) + off;
    }
    if (off < GEMV_IL_W4A8_SR) {
        return meta + 2*(160 + 2*row) + off - GEMV_IL_W4A8_CB;
    }
    if (off < GEMV_IL_W4A8_QS) {
        const int i = off - GEMV_IL_W4A8_SR, b = i >> 1;
        return meta + 2*(4*(4*g + (b >> 1)) + 2*(b & 1) + hi) + (i & 1);
    }
    const int p = off - GEMV_IL_W4A8_QS, b = p >> 4, i = p & 15; // code byte i: columns 2i, 2i+1
    const int t = ((i >> 1) & 1) + 2*(i >> 3), unit = (i >> 2) & 1; // the inverse of gemv_il_w4a8_col0
    const int word = 128*(b >> 1) + 4*(4*g + t) + 2*(b & 1) + hi;
    return 4*word + 2*unit + (i & 1);
}

// The 4-byte field at byte off of a W4A8 block whose bytes `byte(off)` reads (d, the codebook id).
template <typename Byte>
GEMV_IL_HD uint32_t gemv_il_w4a8_word(Byte byte, int off) {
    return (uint32_t) byte(off) | (uint32_t) byte(off + 1) << 8 | (uint32_t) byte(off + 2) << 16 | (uint32_t) byte(off + 3) << 24;
}

// W4A8 -> Q8_0 (the prefill's expansion, as ggml_pyqwen_w4a8_to_q8_0): the 32-column block j (0..7) of a
// W4A8 block whose bytes `byte(off)` reads (off = the byte in ggml's block), with its codebook's table:
// d = the row scale (NaN when either 16-group's scale is NaN) and the 32 int8 levels as 8 words (0 then),
// four codes a gemv_il_w4a8_levels, as in the GEMV.
template <typename Byte>
GEMV_IL_HD void gemv_il_w4a8_q8_0(Byte byte, const int8_t * levels, int j, float & d, uint32_t qs[8]) {
    const uint8_t s[2] = { byte(GEMV_IL_W4A8_SR + 2*j), byte(GEMV_IL_W4A8_SR + 2*j + 1) };
    const bool nan = (s[0] & 0x7F) == 0x7F || (s[1] & 0x7F) == 0x7F;
    const uint32_t bits = gemv_il_w4a8_word(byte, 0);
    memcpy(&d, &bits, 4);
    d = nan ? NAN : d;
    for (int h = 0; h < 2; ++h) { // 16-group 2j + h: code bytes 8h..8h+7, two columns a byte
        uint32_t T[4];
        gemv_il_w4a8_row(levels, s[h], T);
        for (int m = 0; m < 8; m += 2) {
            const int at = GEMV_IL_W4A8_QS + 16*j + 8*h + m;
            qs[4*h + m/2] = nan ? 0 : gemv_il_w4a8_levels((uint32_t) byte(at) | (uint32_t) byte(at + 1) << 8, 0, T);
        }
    }
}

// Which of rows g (bit 0) and g+8 (bit 1) have a NaN scale byte (e4m3fn: 0x7F, 0xFF) in the scale word sw:
// their products are NaN, as on the CPU.
GEMV_IL_HD int gemv_il_w4a8_nan_rows(uint32_t sw) {
    const uint32_t top = ((sw & 0x7F7F7F7Fu) + 0x01010101u) & 0x80808080u; // bit 7 of each byte that was 0x7F
    return (top & 0x8080u ? 1 : 0) | (top & 0x80800000u ? 2 : 0);
}

// Q6_K: block b's two m16n8k16 results lo (k 0..15) and hi (k 16..31), in the C layout (rows g, g, g+8,
// g+8), times the int8 scales of those 16-groups from the meta word {row g: lo, hi}{row g+8: lo, hi}.
// Exact in int32: |lo|, |hi| <= 16*128*127, so |c| < 2^26.
GEMV_IL_HD void gemv_il_q6_k_scale(const int lo[4], const int hi[4], uint32_t sc, int c[4]) {
    for (int i = 0; i < 4; ++i) {
        const int r = 2*(i >> 1);
        c[i] = lo[i]*gemv_il_byte<true>(sc, r) + hi[i]*gemv_il_byte<true>(sc, r + 1);
    }
}

// Q4_K header words of a row: h[0] = d | dmin << 16 (fp16), h[1..3] = ggml's 12 bytes of 6-bit scales and
// mins (get_scale_min_k4: bytes 0..3 scales 0..3 and the top bits of scales 4..7, bytes 4..7 the same for
// the mins, bytes 8..11 the low nibbles of scales 4..7 | mins 4..7 << 4).
// The row's 8 scales, one per byte: sc[0] sub-blocks 0..3, sc[1] sub-blocks 4..7 (each then one PRMT).
GEMV_IL_HD void gemv_il_q4_k_scales(const uint32_t h[4], uint32_t sc[2]) {
    sc[0] = h[1] & 0x3F3F3F3Fu;
    sc[1] = (h[3] & 0x0F0F0F0Fu) | ((h[1] >> 2) & 0x30303030u);
}

// Q4_K mins, as the A fragment of an m16n8k8 tf32 mma whose k is the chunk's sub-block: lane 4g + t gets the
// mins of sub-blocks t (a0: row g, a1: row g+8) and t+4 (a2, a3), from the header words hg, hg8 of rows g,
// g+8. Integers up to 63, exact in tf32. Times the activation block sums (B: k = sub-block, n = token), the
// mma gives each row and token its sum over the chunk of min * block sum.
GEMV_IL_HD void gemv_il_q4_k_mins(const uint32_t hg[4], const uint32_t hg8[4], int t, float a[4]) {
    const uint32_t sel = t | (4 + t) << 8; // byte t of row g's word to half 0, of row g+8's to half 1
    const uint32_t w2 = gemv_il_byte_perm(hg[2], hg8[2], sel), w3 = gemv_il_byte_perm(hg[3], hg8[3], sel);
    const uint32_t lo = w2 & 0x003F003Fu;                                      // mins t
    const uint32_t hi = ((w3 >> 4) & 0x000F000Fu) | ((w2 >> 2) & 0x00300030u); // mins t+4
    a[0] = (float) (lo & 0xFFFF);
    a[1] = (float) (lo >> 16);
    a[2] = (float) (hi & 0xFFFF);
    a[3] = (float) (hi >> 16);
}

// s as hi + lo, both tf32 (the top 19 bits of a float, what the mma reads): |s - hi - lo| <= 2^-21 |s|.
GEMV_IL_HD void gemv_il_tf32_split(float s, float & hi, float & lo) {
    const auto tf32 = [](float f) {
        uint32_t u;
        memcpy(&u, &f, 4);
        u &= 0xFFFFE000u;
        memcpy(&f, &u, 4);
        return f;
    };
    hi = tf32(s);
    lo = tf32(s - hi);
}

// ---- host side: re-layout of whole tensors (set_tensor, get_tensor, tests) ----

// One full tile: ggml rows -> interleaved (inverse = false) or back. src and dst must not overlap.
inline void gemv_il_relayout_tile(int type, int64_t k, const uint8_t * src, uint8_t * dst, bool inverse) {
    const int nchunks = (int) (k / GEMV_IL_CHUNK_K);
    const int ub      = gemv_il_quant_unit_bytes(type);
    for (int c = 0; c < nchunks; ++c) {
        const int64_t base = (int64_t) c*gemv_il_chunk_bytes(type);
        for (int qi = 0; qi < gemv_il_quant_bytes(type) / ub; ++qi) {
            const int64_t o = gemv_il_quant_src_offset(type, k, c, qi), il = base + ub*qi;
            if (inverse) memcpy(dst + o, src + il, ub); else memcpy(dst + il, src + o, ub);
        }
        for (int si = 0; si < gemv_il_meta_bytes(type)/2; ++si) {
            const int64_t o = gemv_il_meta_src_offset(type, k, c, si), il = base + gemv_il_quant_bytes(type) + 2*si;
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
