// megamoe: E2M1 (FP4) -> E4M3 (FP8) decode, exact (every E2M1 value is an E4M3 value).
// Packed layout: element 2i in the low nibble of byte i (OCP MX / torch float4_e2m1fn_x2).
#pragma once
#include <stdint.h>

namespace megamoe {

// E4M3 bytes of the E2M1 magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6.
constexpr uint32_t kE2M1ToE4M3Lo = 0x3C383000u;  // bytes 0..3
constexpr uint32_t kE2M1ToE4M3Hi = 0x4C484440u;  // bytes 4..7

// 8 E2M1 values (one 32-bit word, element j in nibble j) -> 8 E4M3 bytes (two words).
__device__ __forceinline__ uint2 decode_e2m1x8(uint32_t w) {
    const uint32_t mag0 = __byte_perm(kE2M1ToE4M3Lo, kE2M1ToE4M3Hi, w & 0x7777u);
    const uint32_t mag1 = __byte_perm(kE2M1ToE4M3Lo, kE2M1ToE4M3Hi, (w >> 16) & 0x7777u);
    // Sign bits: nibble j's bit 3 -> output byte j's bit 7.
    const uint32_t s0 = __byte_perm(w, 0u, 0x4140u);  // bytes [w.b0, 0, w.b1, 0]
    const uint32_t s1 = __byte_perm(w, 0u, 0x4342u);  // bytes [w.b2, 0, w.b3, 0]
    const uint32_t sign0 = ((s0 & 0x00080008u) << 4) | ((s0 & 0x00800080u) << 8);
    const uint32_t sign1 = ((s1 & 0x00080008u) << 4) | ((s1 & 0x00800080u) << 8);
    return make_uint2(mag0 | sign0, mag1 | sign1);
}

}  // namespace megamoe
