// megamoe: E2M1 (FP4) -> E4M3 (FP8) decode, exact (every E2M1 value is an E4M3 value).
// Packed layout: element 2i in the low nibble of byte i (OCP MX / torch float4_e2m1fn_x2).
#pragma once
#include <stdint.h>

namespace megamoe {

// E4M3 bytes of the E2M1 magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6.
constexpr uint32_t kE2M1ToE4M3Lo = 0x3C383000u;  // bytes 0..3
constexpr uint32_t kE2M1ToE4M3Hi = 0x4C484440u;  // bytes 4..7

// prmt.b32 with PTX's default mode: selector nibble bit 3 set replicates the selected byte's
// most significant bit over the output byte (CUDA's __byte_perm documents only bits 0-2).
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
    uint32_t r;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
    return r;
}

// 8 E2M1 values (one 32-bit word, element j in nibble j) -> 8 E4M3 bytes (two words), 10
// integer instructions: the magnitudes through the 8-entry table (each nibble's low 3 bits
// select a table byte), the signs by sign replication. Byte b of w holds element 2b in its
// low nibble (sign: bit 3, the msb of byte b of w << 4) and element 2b + 1 in its high
// nibble (sign: the msb of byte b of w).
__device__ __forceinline__ uint2 decode_e2m1x8(uint32_t w) {
    const uint32_t mag0 = prmt(kE2M1ToE4M3Lo, kE2M1ToE4M3Hi, w & 0x7777u);
    const uint32_t mag1 = prmt(kE2M1ToE4M3Lo, kE2M1ToE4M3Hi, (w >> 16) & 0x7777u);
    const uint32_t w4 = w << 4;
    const uint32_t sgn0 = prmt(w4, w, 0xD9C8u);  // elements 0..3: msb of w4.b0, w.b0, w4.b1, w.b1
    const uint32_t sgn1 = prmt(w4, w, 0xFBEAu);  // elements 4..7: msb of w4.b2, w.b2, w4.b3, w.b3
    return make_uint2(mag0 | (sgn0 & 0x80808080u), mag1 | (sgn1 & 0x80808080u));
}

}  // namespace megamoe
