// megamoe: E2M1 (FP4) -> E4M3 (FP8) decode for the SM90 kernel's register fragments.
#pragma once
#include <stdint.h>

namespace megamoe {

// The weight fold (megamoe.layouts.fold_e2m1_scales_for_sm90): a 32-group of a weight row
// whose scale is 2^d below the row's largest decodes as E2M1 x 2^(6 - d), one row of an 8-byte
// table per d (megamoe.layouts.sm90_fold_table: byte c = the E4M3 bits of magnitude code c x
// 2^(6 - d), nearest-even with subnormals, zero from d = 19). The stage's weight-scale bytes are
// the table offsets 8 d, so the FP32 promotion needs only the token's scale and the row's
// 2^(s_max - 133) is applied once in the epilogue.
constexpr int kFoldTableRows = 20;
constexpr uint32_t kFoldTableBytes = kFoldTableRows * 8;

// The SM90 weight tiles store each 32-bit word of a thread's fragment with the bits of its eight
// E2M1 values c0..c7 re-packed (megamoe.layouts.permute_e2m1_for_sm90_rs): nibble j holds the
// magnitude of c_j in its bits 0-2 (a prmt byte selector, bit 3 of every selector nibble
// clear), the sign of c_j (j < 4) is bit 8j + 7 and that of c_{4+j} bit 8j + 3. So each
// register is one byte permute from the table (t.x = bytes 0-3, t.y = bytes 4-7) and one OR of
// the signs. Returns elements 0..3 (x) and 4..7 (y) as E4M3 bytes, element i in byte i % 4.
// (prmt through asm: with __byte_perm the compiler masks each selector half separately, one
// more instruction per word; prmt reads only the selector's low 16 bits.)
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
    uint32_t r;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
    return r;
}
__device__ __forceinline__ uint2 decode_e2m1x8(uint32_t w, uint2 t) {
    const uint32_t m = w & 0x77777777u;
    return make_uint2(prmt(t.x, t.y, m) | (w & 0x80808080u), prmt(t.x, t.y, m >> 16) | ((w << 4) & 0x80808080u));
}
// Byte q of a word as a 32-bit offset (one prmt: bytes 4-7 of the pair are zero).
__device__ __forceinline__ uint32_t byte_of(uint32_t w, int q) { return prmt(w, 0u, 0x4440u | (uint32_t)q); }

}  // namespace megamoe
