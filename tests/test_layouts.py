"""megamoe.layouts: kernel weight / scale layouts, against explicit index formulas."""

from __future__ import annotations

import re

import pytest
import torch

from megamoe import layouts as L
from megamoe.errors import InputError
from megamoe.formats import pack_ue8m0, unpack_ue8m0


def _ckpt(e=2, inter=128, h=256, seed=0):
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *s: torch.randint(0, 256, s, generator=g, dtype=torch.int32).to(torch.uint8)
    return (rnd(e, 2 * inter, h // 2), rnd(e, 2 * inter, h // 32)), \
           (rnd(e, h, inter // 2), rnd(e, h, inter // 32))


def interleaved_source_row(q: int, inter: int) -> int:
    """Checkpoint row that lands at interleaved row q: blocks of 16 = 8 gate + 8 up."""
    blk, r = divmod(q, 16)
    return blk * 8 + r if r < 8 else inter + blk * 8 + (r - 8)


def utccp_source_row(r: int) -> int:
    """Logical row stored at row r after the [4, 32] -> [32, 4] transpose."""
    base, w = divmod(r, 128)
    i, j = divmod(w, 4)
    return base * 128 + 32 * j + i


def test_interleave_gate_up_row_order():
    inter = 16
    t = torch.arange(2 * inter).reshape(1, 2 * inter, 1).expand(1, 2 * inter, 3).contiguous()
    out = L.interleave_gate_up(t)
    assert out[0, :, 0].tolist() == [interleaved_source_row(q, inter) for q in range(2 * inter)]
    assert out[0, :, 0].tolist()[:16] == list(range(8)) + list(range(16, 24))
    assert torch.equal(L.deinterleave_gate_up(out), t)


def test_utccp_transpose_row_order_and_inverse():
    sf = torch.arange(2 * 256 * 3, dtype=torch.int32).reshape(2, 256, 3)
    out = L.utccp_transpose_sf(sf)
    for r in range(256):
        assert torch.equal(out[:, r], sf[:, utccp_source_row(r)])
    assert torch.equal(L.utccp_untranspose_sf(out), sf)
    # strides are preserved (an MN-major input stays MN-major)
    mn = L.to_mn_major(sf)
    assert L.is_mn_major(L.utccp_transpose_sf(mn))


def test_mn_major_and_k_major():
    sf = torch.arange(2 * 130 * 3, dtype=torch.int32).reshape(2, 130, 3)
    mn = L.to_mn_major(sf)
    assert torch.equal(mn, sf)
    assert mn.stride(1) == 1 and mn.stride(2) == 132 and mn.stride(0) == 132 * 3  # 16-byte aligned
    k = L.to_k_major(mn)
    assert k.is_contiguous() and torch.equal(k, sf)
    assert L.to_mn_major(sf[0]).stride() == (1, 132)


def test_transform_for_mega_moe_matches_index_formulas_and_inverts():
    (w1, s1), (w2, s2) = _ckpt()
    inter, h = 128, 256
    (w1t, s1t), (w2t, s2t) = L.transform_weights_for_mega_moe((w1, s1), (w2, s2))
    assert w1t.dtype == torch.uint8 and s1t.dtype == torch.int32
    assert s1t.shape == (2, 2 * inter, h // 128) and s2t.shape == (2, h, inter // 128)
    assert L.is_mn_major(s1t) and L.is_mn_major(s2t)
    for q in range(2 * inter):
        assert torch.equal(w1t[:, q], w1[:, interleaved_source_row(q, inter)])
    s1b = unpack_ue8m0(s1t.contiguous())
    for r in range(2 * inter):
        src = interleaved_source_row(utccp_source_row(r), inter)
        assert torch.equal(s1b[:, r], s1[:, src])
    s2b = unpack_ue8m0(s2t.contiguous())
    for r in range(h):
        assert torch.equal(s2b[:, r], s2[:, utccp_source_row(r)])
    assert torch.equal(w2t, w2)
    (a, b), (c, d) = L.untransform_weights_for_mega_moe((w1t, s1t), (w2t, s2t))
    for x, y in ((a, w1), (b, s1), (c, w2), (d, s2)):
        assert torch.equal(x, y)
    # int8-typed weights (DeepGEMM's dtype) go through unchanged in type
    (w1i, _), _ = L.transform_weights_for_mega_moe((w1.view(torch.int8), s1), (w2, s2))
    assert w1i.dtype == torch.int8 and torch.equal(w1i.view(torch.uint8), w1t)


def test_sm90_tiles_element_by_element():
    """Tile (e, j, kb) row r byte c holds, for L1, checkpoint row interleaved_source_row(128 j + r)
    and, for L2, row 128 j + r; the register-fragment order puts source byte 8p + 2t + b at
    16t + 2p + b, then byte b of every word holds that word's values' magnitudes 2b (bits 0-2)
    and 2b + 1 (bits 4-6) and the signs of values 4 + b (bit 3) and b (bit 7)."""
    inter, h = 128, 256
    (w1, s1), (w2, s2) = _ckpt(inter=inter, h=h, seed=1)
    (w1t, s1t), (w2t, s2t) = L.transform_weights_for_sm90((w1, s1), (w2, s2))
    assert tuple(w1t.shape) == (2, 2 * inter // 128, h // 128, 128, 64) and tuple(s1t.shape) == (2, 2, 2, 128, 4)
    assert tuple(w2t.shape) == (2, h // 128, inter // 128, 128, 64) and tuple(s2t.shape) == (2, 2, 1, 128, 4)
    src_byte = [0] * 64
    for t in range(4):
        for p in range(8):
            for b in range(2):
                src_byte[16 * t + 2 * p + b] = 8 * p + 2 * t + b

    def nib(row, kb, c, j):  # value j (0..7, K order) of the byte-permuted word holding byte c
        byte = int(row[64 * kb + src_byte[4 * (c // 4) + j // 2]])
        return byte >> 4 if j % 2 else byte & 0xF
    for (w, s, wt, st, l1) in ((w1, s1, w1t, s1t, True), (w2, s2, w2t, s2t, False)):
        E, NB, KB = wt.shape[:3]
        for e in range(E):
            for j in range(NB):
                for kb in range(KB):
                    for r in (0, 7, 8, 15, 16, 63, 64, 127):
                        row = interleaved_source_row(128 * j + r, inter) if l1 else 128 * j + r
                        want = [(nib(w[e, row], kb, c, 2 * (c % 4)) & 7) | (nib(w[e, row], kb, c, 4 + c % 4) >> 3) << 3
                                | (nib(w[e, row], kb, c, 2 * (c % 4) + 1) & 7) << 4 | (nib(w[e, row], kb, c, c % 4) >> 3) << 7
                                for c in range(64)]
                        assert wt[e, j, kb, r].tolist() == want, (l1, e, j, kb, r)
                        assert st[e, j, kb, r].tolist() == s[e, row, 4 * kb: 4 * kb + 4].tolist()
    (a, b), (c, d) = L.untransform_weights_for_sm90((w1t, s1t), (w2t, s2t))
    for x, y in ((a, w1), (b, s1), (c, w2), (d, s2)):
        assert torch.equal(x, y)


def test_sm90_tiles_bad_input():
    (w1, s1), (w2, s2) = _ckpt(inter=64, h=256)  # 2I = 128 fine, L2 K = I = 64: not a tile
    with pytest.raises(InputError, match=r"^l2_weights: expected \[E, N, K/2\] with N and K multiples of 128"):
        L.transform_weights_for_sm90((w1, s1), (w2, s2))
    (w1, s1), (w2, s2) = _ckpt(inter=128, h=256)
    # L1 (2, 2I = 256, H/2 = 128): H = 256, I = 128, so L2 must be (E, 256, 64); the message
    # says where 256 and 64 come from, for a wrong H and for a wrong I alike
    src = re.escape("with H and I from l1_weights (E, 2I, H/2) = (2, 256, 128), got shape ")
    with pytest.raises(InputError, match=r"^l2_weights: expected shape \(E, H=256, I/2=64\) " + src + r"\(2, 384, 64\)$"):
        L.transform_weights_for_sm90((w1, s1), (torch.zeros(2, 384, 64, dtype=torch.uint8),
                                                torch.zeros(2, 384, 4, dtype=torch.uint8)))
    with pytest.raises(InputError, match=r"^l2_weights: expected shape \(E, H=256, I/2=64\) " + src + r"\(2, 256, 128\)$"):
        L.transform_weights_for_sm90((w1, s1), (torch.zeros(2, 256, 128, dtype=torch.uint8),
                                                torch.zeros(2, 256, 8, dtype=torch.uint8)))
    with pytest.raises(InputError, match=r"^l2_weights: expected shape \(E, H=256, I/2\) with H from l1_weights "
                                         r"\(E, 2I, H/2\) = \(2, 256, 128\), got shape \(2, 384, 64\)$"):
        L.transform_weights_for_mega_moe((w1, s1), (torch.zeros(2, 384, 64, dtype=torch.uint8),
                                                    torch.zeros(2, 384, 4, dtype=torch.uint8)))
    with pytest.raises(InputError, match=r"^l2_weights: expected 2 experts \(as l1_weights\)"):
        L.transform_weights_for_sm90((w1, s1), (w2[:1].contiguous(), s2[:1].contiguous()))
    with pytest.raises(InputError, match=r"^l1_weights_sf: expected SM90 tiles"):
        L.untransform_weights_for_sm90((torch.zeros(1, 1, 1, 128, 64, dtype=torch.uint8),
                                        torch.zeros(1, 128, 4, dtype=torch.uint8)), (None, None))


def test_pack_then_interleave_commutes():
    _, s = _ckpt()[0]
    assert torch.equal(pack_ue8m0(L.interleave_gate_up(s)), L.interleave_gate_up(pack_ue8m0(s)))


def test_bad_inputs_name_the_tensor():
    (w1, s1), (w2, s2) = _ckpt()
    with pytest.raises(InputError, match=r"^l1_weights_sf: expected shape"):
        L.transform_weights_for_mega_moe((w1, s1[:, :, :4]), (w2, s2))
    with pytest.raises(InputError, match=r"^l2_weights: expected dtype"):
        L.transform_weights_for_mega_moe((w1, s1), (w2.float(), s2))
    with pytest.raises(InputError, match=r"^l1_weights: expected a contiguous tensor"):
        L.transform_weights_for_mega_moe((w1.transpose(1, 2), s1), (w2, s2))
    with pytest.raises(InputError, match=r"^sf: expected dim 1 \(MN\) a multiple of 128"):
        L.utccp_transpose_sf(torch.zeros(1, 96, 2, dtype=torch.int32))
    with pytest.raises(InputError, match=r"^t: expected dim 1"):
        L.interleave_gate_up(torch.zeros(1, 24, 2))
    with pytest.raises(InputError, match=r"^l1_weights: expected K = 2 \* shape\[2\] a multiple of 32"):
        L.check_mxfp4_weights(torch.zeros(1, 32, 24, dtype=torch.uint8),
                              torch.zeros(1, 32, 1, dtype=torch.uint8), "l1_weights")


def test_sm90_rs_permutation_by_hand():
    # one row, one K block: bytes 0..63. Thread t's chunk = bytes 8p + 2t, 8p + 2t + 1, p = 0..7.
    # Chunk 0 word 0 = bytes 0, 1, 8, 9: codes c0..c7 (low nibble first) 0,0, 1,0, 8,0, 9,0;
    # magnitudes 0,0,1,0,0,0,1,0, signs only c4 and c6. Byte b = m(2b) | s(4+b) << 3 |
    # m(2b+1) << 4 | s(b) << 7: 0|8, 1, 0|8, 1. Word 1 = bytes 16, 17, 24, 25 = 0x10, 0x11, 0x18,
    # 0x19: codes 0,1, 1,1, 8,1, 9,1 -> 8|16, 1|16, 8|16, 1|16. Chunk 1 word 0 = bytes 2, 3, 10,
    # 11: codes 2,0, 3,0, 10,0, 11,0 -> 2|8, 3, 2|8, 3.
    row = torch.arange(64, dtype=torch.uint8).view(1, 64)
    got = L.permute_e2m1_for_sm90_rs(row)[0].tolist()
    assert got[:8] == [8, 1, 8, 1, 24, 17, 24, 17]
    assert got[16:20] == [10, 3, 10, 3]
    # a negative c0 (code 15 = -6 in byte 0's low nibble) sets bit 7 of byte 0, its magnitude 7
    # bits 0-2 of byte 0
    row = torch.zeros(1, 64, dtype=torch.uint8)
    row[0, 0] = 0x0F
    assert L.permute_e2m1_for_sm90_rs(row)[0, :4].tolist() == [0x87, 0, 0, 0]


def _codes_of_word(word):
    """The eight E2M1 codes of a permuted 4-byte word (fp4.cuh's bit layout, read back)."""
    v = int.from_bytes(bytes(word), "little")
    return [((v >> (4 * j)) & 7) | (((v >> (8 * j + 7)) if j < 4 else (v >> (8 * (j - 4) + 3))) & 1) << 3
            for j in range(8)]


def test_sm90_rs_permutation_gives_each_thread_its_wgmma_fragment():
    """Word q of chunk t holds the K elements of registers a0 / a2 of k32 step q for
    t = lane % 4: [32q + 4t, +4) as its values 0..3, [32q + 16 + 4t, +4) as 4..7 (CuTe
    ALayout_64x32)."""
    g = torch.Generator().manual_seed(0)
    w = torch.randint(0, 256, (3, 5, 128), dtype=torch.uint8, generator=g)  # K = 256: two K blocks
    nib = torch.stack([w & 15, w >> 4], -1).reshape(3, 5, 256)              # element k of each row
    pw = L.permute_e2m1_for_sm90_rs(w)
    for kb in range(2):
        for t in range(4):
            chunk = pw[..., kb * 64 + 16 * t: kb * 64 + 16 * t + 16]
            for q in range(4):
                word = chunk[..., 4 * q: 4 * q + 4].reshape(-1, 4)
                got = torch.tensor([_codes_of_word(wd.tolist()) for wd in word]).view(3, 5, 8)
                k0 = kb * 128 + 32 * q + 4 * t
                want = torch.cat([nib[..., k0:k0 + 4], nib[..., k0 + 16:k0 + 20]], -1).long()
                assert torch.equal(got, want), (kb, t, q)
    assert torch.equal(L.unpermute_e2m1_for_sm90_rs(pw), w)


E2M1_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]  # OCP MX: codes 0..7, bit 3 the sign


def _prmt(a, b, sel):
    """PTX prmt.b32 (default mode): byte n of the result = byte (sel nibble n & 7) of {b, a};
    if that nibble's bit 3 is set, the selected byte's sign bit replicated (PTX ISA)."""
    src = [(a >> (8 * i)) & 0xFF for i in range(4)] + [(b >> (8 * i)) & 0xFF for i in range(4)]
    out = 0
    for n in range(4):
        nib = (sel >> (4 * n)) & 0xF
        byte = src[nib & 7]
        out |= ((0xFF if byte & 0x80 else 0) if nib & 8 else byte) << (8 * n)
    return out


def _decode(w, tab_row):
    """csrc/megamoe/fp4.cuh decode_e2m1x8 on Python integers (prmt as the PTX ISA defines it)."""
    tx, ty = int.from_bytes(bytes(tab_row[:4]), "little"), int.from_bytes(bytes(tab_row[4:]), "little")
    m = w & 0x77777777
    x = _prmt(tx, ty, m) | (w & 0x80808080)
    y = _prmt(tx, ty, m >> 16) | ((w << 4) & 0x80808080)
    return x & 0xFFFFFFFF, y & 0xFFFFFFFF


def test_sm90_fold_table_by_hand():
    """Row d, byte c: E4M3 of E2M1 magnitude c x 2^(6 - d), nearest-even with subnormals.
    d = 0: 0, 32 = 2^5 (exponent field 12: 0x60), 64 (0x68), 96 (0x6C), 128 (0x70), 192 (0x74),
    256 (0x78), 384 (0x7C). d = 14 (x 2^-8): 2^-9 .. 1.5 x 2^-6 -> subnormals 1, 2, 3, 4, 6
    (units of 2^-9), then 2^-6 (0x08) and 1.5 x 2^-6 (0x0C): still exact. d = 15 (x 2^-9): 0.5 x
    2^-9 ties to 0, 1.5 x 2^-9 ties to 2 x 2^-9. d = 18: only 6 x 2^-12 = 0.75 x 2^-9 rounds up
    to 2^-9 (4 x 2^-12 ties to 0). d = 19: all zero."""
    t = L.sm90_fold_table()
    assert t.dtype == torch.uint8 and tuple(t.shape) == (20, 8)
    assert t[0].tolist() == [0, 0x60, 0x68, 0x6C, 0x70, 0x74, 0x78, 0x7C]
    assert t[14].tolist() == [0, 1, 2, 3, 4, 6, 8, 12]
    assert t[15].tolist() == [0, 0, 1, 2, 2, 3, 4, 6]
    assert t[18].tolist() == [0, 0, 0, 0, 0, 0, 0, 1]
    assert t[19].tolist() == [0] * 8


def test_sm90_decode_gives_the_folded_e2m1_values():
    """The kernel's decode (prmt through the fold table row d, then the signs) turns every
    permuted word into E4M3 bytes, in register order (x: the word's values 0..3, y: 4..7),
    whose values are E2M1 x 2^(6 - d) exactly for d <= 14 (float64, by hand), and for every d
    those of torch's float8 cast of E2M1 x 2^(6 - d) (a second rounding implementation).
    Byte-local except for the signs, so all 256 bytes in each byte position cover every case."""
    tab = L.sm90_fold_table()

    def e4m3(word):
        b = torch.tensor([(word >> (8 * i)) & 0xFF for i in range(4)], dtype=torch.uint8)
        return b.view(torch.float8_e4m3fn).to(torch.float64).tolist()

    def e2m1(code):
        return (-1.0 if code & 8 else 1.0) * E2M1_VALUES[code & 7]

    for d in (0, 1, 7, 14, 15, 16, 18, 19):
        for pos in range(4):
            for byte in range(256):
                w = 0x11111111 & ~(0xFF << (8 * pos)) | byte << (8 * pos)  # other bytes: codes 1, 1
                values = [e2m1(c) for c in _codes_of_word(list(w.to_bytes(4, "little")))]
                x, y = _decode(w, tab[d].tolist())
                got = e4m3(x) + e4m3(y)
                cast = torch.tensor(values, dtype=torch.float32) * 2.0 ** (6 - d)
                assert got == cast.to(torch.float8_e4m3fn).to(torch.float64).tolist(), (d, pos, byte)
                if d <= 14:
                    assert got == [v * 2.0 ** (6 - d) for v in values], (d, pos, byte)


def test_fold_e2m1_scales_by_hand():
    """s_max = the largest scale over the row's groups with a nonzero value; offset 8 min(max(
    s_max - s, 0), 19)."""
    w = torch.zeros(3, 64, dtype=torch.uint8)  # 3 rows x 128 K: four 32-groups of 16 bytes
    sf = torch.tensor([[120, 127, 100, 130], [1, 2, 3, 4], [127, 127, 127, 127]], dtype=torch.uint8)
    w[0, 0:16] = 0x21        # group 0: codes 1, 2
    w[0, 16] = 0x0F          # group 1: one -6
    w[0, 32] = 0x80          # group 2: a -0 (code 8) and a 0: no value, still a value-less group ...
    w[0, 33] = 0x01          # ... until this 0.5
    # group 3 stays zero (scale 130 ignored): s_max = 127; d = 7, 0, 27 -> 19, -3 -> 0
    w[1, 20] = 0x70          # row 1: only group 1 (scale 2) has a value: d = 1, 0, -1 -> 0, -2 -> 0
    # row 2: all zero -> s_max = 127 (any), d = 0
    off, smax = L.fold_e2m1_scales_for_sm90(w, sf)
    assert smax.tolist() == [127, 2, 127] and smax.dtype == torch.uint8
    assert off.tolist() == [[56, 0, 152, 0], [8, 0, 0, 0], [0, 0, 0, 0]] and off.dtype == torch.uint8
    # batched [E, N, K/2] like the checkpoint; int8 weights are fine (DeepGEMM's dtype)
    o3, s3 = L.fold_e2m1_scales_for_sm90(w.view(torch.int8).expand(2, 3, 64), sf.expand(2, 3, 4))
    assert torch.equal(o3[1], off) and torch.equal(s3[0], smax)
    with pytest.raises(InputError, match=r"^w1_sf: expected \[\.\.\., N, K/32\] UE8M0 bytes for w1 \(3, 64\), got \(3, 3\)$"):
        L.fold_e2m1_scales_for_sm90(w, sf[:, :3], "w1")
    # K not a multiple of 32 is w's fault, not the scales'; one row is not [..., N, K/2]
    with pytest.raises(InputError, match=r"^w1: expected packed E2M1 \[\.\.\., N, K/2\] with K a multiple of 32, "
                                         r"got shape \(3, 40\)$"):
        L.fold_e2m1_scales_for_sm90(w[:, :40], sf, "w1")
    with pytest.raises(InputError, match=r"^w1: expected at least 2 dimensions, got shape \(64,\)$"):
        L.fold_e2m1_scales_for_sm90(w[0], sf[0], "w1")


def test_fold_e4m3_scales_by_hand():
    """The activation fold on one row of 128 K (two 64-K groups): group pair (0, 1) with scales
    127 and 125 -> group 1's values x 1/4 (1.5 -> 0.375, 0.5 -> 0.125, 448 -> 112); pair (2, 3):
    group 2 all zero with the larger scale 200 does not set s_max, group 3 keeps its values and
    both bytes become 120 (group 2's zeros, -0 too, stay)."""
    x = torch.zeros(1, 128, dtype=torch.uint8)
    x[0, 0] = 0x38                     # 1.0 in group 0
    x[0, 32], x[0, 33], x[0, 34] = 0x3C, 0xB0, 0x7E   # group 1: 1.5, -0.5, 448
    x[0, 64] = 0x80                    # group 2: -0
    x[0, 96] = 0x44                    # group 3: 3.0
    sf = torch.tensor([[127, 125, 200, 120]], dtype=torch.uint8)
    f, fs = L.fold_e4m3_scales_for_sm90(x, sf)
    assert fs.tolist() == [[127, 127, 120, 120]] and f.dtype == torch.uint8
    want = x.clone()
    want[0, 32], want[0, 33], want[0, 34] = 0x2C, 0xA0, 0x6E   # normal values: exponent field - 2 (0x10 per binade)
    assert torch.equal(f, want)
    # 30 binades below: 448 x 2^-30 rounds to +0, -0.5 to -0
    sf2 = torch.tensor([[127, 97, 120, 120]], dtype=torch.uint8)
    f2, fs2 = L.fold_e4m3_scales_for_sm90(x, sf2)
    assert f2[0, 32:35].tolist() == [0x00, 0x80, 0x00] and fs2.tolist() == [[127, 127, 120, 120]]
    with pytest.raises(InputError, match=r"^fold: expected a positive multiple of 32, got 48$"):
        L.fold_e4m3_scales_for_sm90(x, sf, fold=48)
    with pytest.raises(InputError, match=r"^x: expected \[\.\.\., K\] E4M3 bytes with K a multiple of 64, got shape \(1, 96\)$"):
        L.fold_e4m3_scales_for_sm90(x[:, :96], sf[:, :3])
    with pytest.raises(InputError, match=r"^h_sf: expected \[\.\.\., K/32\] UE8M0 bytes for h \(1, 128\), got \(1, 3\)$"):
        L.fold_e4m3_scales_for_sm90(x, sf[:, :3], name="h")
    with pytest.raises(InputError, match=r"^x_sf"):
        L.fold_e4m3_scales_for_sm90(x, sf.float())


def test_sm90_rs_permutation_bad_input():
    with pytest.raises(InputError, match=r"^weights: expected packed E2M1 \[\.\.\., K/2\] with K a multiple of 128"):
        L.permute_e2m1_for_sm90_rs(torch.zeros(2, 96, dtype=torch.uint8))
    with pytest.raises(InputError, match=r"^w1"):
        L.permute_e2m1_for_sm90_rs(torch.zeros(2, 64), name="w1")


@pytest.mark.parametrize("gran, got", [(0, "0"), (-8, "-8"), (2.5, r"2\.5"), (8.0, r"8\.0"), (True, "True"),
                                       ("8", "'8'")])
@pytest.mark.parametrize("fn", ["interleave_gate_up", "deinterleave_gate_up"])
def test_gran_must_be_a_positive_int(fn, gran, got):
    """gran=0 was a ZeroDivisionError."""
    with pytest.raises(InputError, match=r"^gran: expected a positive integer \(rows per gate/up group, 8 for the "
                                         rf"kernels\), got {got}$"):
        getattr(L, fn)(torch.zeros(1, 32, 4, dtype=torch.uint8), gran=gran)


def test_gran_other_than_8_round_trips():
    t = torch.arange(2 * 12 * 3, dtype=torch.int32).reshape(2, 12, 3)
    assert torch.equal(L.deinterleave_gate_up(L.interleave_gate_up(t, gran=3), gran=3), t)


@pytest.mark.parametrize("kw, msg", [
    (dict(rows=2.5), r"^rows: expected None or a positive integer, got 2\.5$"),
    (dict(k="64"), r"^k: expected None or a positive integer, got '64'$"),
    (dict(k=0), r"^k: expected None or a positive integer, got 0$"),
])
def test_check_mxfp4_weights_rows_and_k(kw, msg):
    w, sf = torch.zeros(1, 8, 32, dtype=torch.uint8), torch.zeros(1, 8, 2, dtype=torch.uint8)
    assert L.check_mxfp4_weights(w, sf, "w") == (1, 8, 64)
    with pytest.raises(InputError, match=msg):
        L.check_mxfp4_weights(w, sf, "w", **kw)
