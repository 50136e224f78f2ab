// megamoe: E2M1 (FP4) -> E4M3 (FP8) decode for the SM90 kernel's register fragments.
#pragma once
#include <stdint.h>

namespace megamoe {

// The SM90 weight tiles store each 32-bit word of a thread's fragment with its eight E2M1
// values nibble-reordered (megamoe.layouts.permute_e2m1_for_sm90_rs): byte b holds element b
// in its low nibble and element 4 + b in its high nibble. An E2M1 code s|e1 e0|m placed as
// the E4M3 byte s|0 0 e1 e0|m 0 0 is exactly its value x 2^-6 (exponent field e, mantissa m/2:
// 2^(e-7)(1 + m/2) = 2^-6 * 2^(e-1)(1 + m/2) for e >= 1, and the subnormal 2^-6 * m/2 for
// e = 0), so the decode is two shifts and masks per four values, and the kernel adds 6 to
// every weight scale exponent (Sm90Tile::promote). Returns elements 0..3 (x) and 4..7 (y)
// as E4M3 bytes, element i in byte i % 4.
__device__ __forceinline__ uint2 decode_e2m1x8(uint32_t w) {
    return make_uint2(((w << 2) & 0x1C1C1C1Cu) | ((w << 4) & 0x80808080u),
                      ((w >> 2) & 0x1C1C1C1Cu) | (w & 0x80808080u));
}
// The exponent offset of decode_e2m1x8's values, folded into the weight scales.
constexpr uint32_t kE2M1DecodeExpOffset = 6;

}  // namespace megamoe
