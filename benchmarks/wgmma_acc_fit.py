"""Fit a model of the H200's FP8 WGMMA accumulation to what the tensor core returns.

Two steps around one GPU run of ``benchmarks/device/wgmma_acc_probe.cu``:

    python benchmarks/wgmma_acc_fit.py make IN.bin            # operands (seeded, here)
    out/probe/wgmma_acc_probe IN.bin OUT.bin                   # on the GPU machine
    python benchmarks/wgmma_acc_fit.py fit IN.bin OUT.bin [--json F]

``fit`` compares the four probe results of every tile (see the .cu file) with candidate models
of the accumulator built from exact float64 products and prints, per model, the smallest
fraction of results that agree bit for bit over the operand kinds and the four variants (the
JSON holds every fraction). The model kept in ``megamoe.reference`` (``h200_wgmma_partials``)
is the first row.
"""
from __future__ import annotations

import json
import os
import sys

import numpy as np

from megamoe.errors import OneLineArgumentParser

M, N, K, V = 64, 16, 128, 4
KINDS = ("weights x tokens (L1-like)", "random E4M3 x E4M3", "cancelling", "weights x SwiGLU (L2-like)")
TILES_PER_KIND = 128


def e4m3_values() -> np.ndarray:
    """float64 value of every E4M3 byte (NaN for 0x7F / 0xFF)."""
    b = np.arange(256)
    s = np.where(b >> 7, -1.0, 1.0)
    e, m = (b >> 3) & 15, b & 7
    v = np.where(e == 0, m * 2.0 ** -9, (8 + m) * np.exp2(e.astype(np.float64) - 10))
    v = s * v
    v[(e == 15) & (m == 7)] = np.nan
    return v


E4M3 = e4m3_values()
_FINITE = np.isfinite(E4M3)
_ORDER = np.argsort(np.where(_FINITE, E4M3, np.inf), kind="stable")[: int(_FINITE.sum())]


def to_e4m3(x: np.ndarray) -> np.ndarray:
    """Nearest E4M3 byte (ties to the even code), saturating at +-448."""
    vals = E4M3[_ORDER]
    x = np.clip(x, -448.0, 448.0)
    i = np.searchsorted(vals, x).clip(1, len(vals) - 1)
    lo, hi = vals[i - 1], vals[i]
    pick_hi = (hi - x < x - lo) | ((hi - x == x - lo) & (_ORDER[i] % 2 == 0))
    return _ORDER[np.where(pick_hi, i, i - 1)].astype(np.uint8)


def _weights(rng, rows: int) -> np.ndarray:
    """E2M1 codes x 2^(6 - d), d per (row, 32-group): the SM90 kernel's decoded weight fold."""
    e2m1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6])
    mag = e2m1[rng.integers(0, 8, (rows, K))]
    sign = np.where(rng.random((rows, K)) < 0.5, -1.0, 1.0)
    d = np.minimum(rng.geometric(0.55, (rows, K // 32)) - 1, 12).repeat(32, axis=1)
    return to_e4m3(sign * mag * np.exp2(6.0 - d))


def _tokens(rng, rows: int, heavy: bool) -> np.ndarray:
    """Per-32 quantized rows (amax -> 448), folded per 64 like the pools (smaller group shifted)."""
    x = rng.standard_t(3, (rows, K)) if heavy else rng.standard_normal((rows, K))
    x *= np.exp2(rng.integers(-4, 5, (rows, K // 32))).repeat(32, axis=1)
    g = np.abs(x.reshape(rows, K // 32, 32)).max(-1)
    lv = np.ceil(np.log2(g / 448.0))                                 # UE8M0 exponent per 32
    lm = np.maximum(lv[:, 0::2], lv[:, 1::2]).repeat(2, axis=1)      # fold per 64: the larger
    return to_e4m3(x * np.exp2(-lm).repeat(32, axis=1))


def make(path: str, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    t = len(KINDS) * TILES_PER_KIND
    A = np.empty((t, M, K), np.uint8)
    B = np.empty((t, N, K), np.uint8)
    for kind in range(len(KINDS)):
        sl = slice(kind * TILES_PER_KIND, (kind + 1) * TILES_PER_KIND)
        n = TILES_PER_KIND
        if kind == 1:
            pool = np.flatnonzero(_FINITE).astype(np.uint8)
            A[sl] = rng.choice(pool, (n, M, K))
            B[sl] = rng.choice(pool, (n, N, K))
            continue
        A[sl] = _weights(rng, n * M).reshape(n, M, K)
        B[sl] = _tokens(rng, n * N, heavy=kind == 3).reshape(n, N, K)
        if kind == 2:  # the second 16 of every 32 K = minus the first, a few bits perturbed
            a = E4M3[A[sl]].reshape(n, M, K // 32, 2, 16)
            pert = np.where(rng.random(a[:, :, :, 0].shape) < 0.1, 1.25, 1.0)
            a[:, :, :, 1] = -a[:, :, :, 0] * pert
            A[sl] = to_e4m3(a.reshape(n, M, K))
            b = E4M3[B[sl]].reshape(n, N, K // 32, 2, 16)
            b[:, :, :, 1] = b[:, :, :, 0]
            B[sl] = to_e4m3(b.reshape(n, N, K))
    # v3's accumulator: FP32 values from far below to far above the step's sum
    s0 = np.einsum("tmk,tnk->tmn", E4M3[A[:, :, :32]], E4M3[B[:, :, :32]])
    mag = np.abs(s0) + 1.0
    C = (rng.standard_normal((t, M, N)) * mag * np.exp2(rng.integers(-30, 31, (t, M, N)))).astype(np.float32)
    C[rng.random(C.shape) < 0.05] = 0.0
    with open(path, "wb") as f:
        f.write(np.int32(t).tobytes())
        f.write(A.tobytes()); f.write(B.tobytes()); f.write(C.tobytes())
    return {"tiles": t, "seed": seed}


class ProbeFileError(ValueError):
    """A probe file that is missing or has the wrong size (one-line message)."""


def load(inp: str, outp: str | None = None):
    """The probe's operands (and results): A uint8 [t, 64, 128], B uint8 [t, 16, 128], C float32
    [t, 64, 16], D float32 [t, 4, 64, 16] or None. Raises ProbeFileError."""
    try:
        raw = np.fromfile(inp, np.uint8)
        t = int(raw[:4].view(np.int32)[0]) if raw.size >= 4 else -1
        want = 4 + t * (M * K + N * K + M * N * 4)
        if t <= 0 or raw.size != want:
            raise ProbeFileError(f"inp: expected a file written by 'make' (int32 tiles, then A, B, C), got {raw.size} "
                                 f"bytes from {inp}")
        o = 4
        A = raw[o:o + t * M * K].reshape(t, M, K); o += t * M * K
        B = raw[o:o + t * N * K].reshape(t, N, K); o += t * N * K
        C = raw[o:o + t * M * N * 4].view(np.float32).reshape(t, M, N)
        D = None
        if outp is not None:
            out = np.fromfile(outp, np.float32)
            if out.size != t * V * M * N:
                raise ProbeFileError(f"outp: expected {t * V * M * N} float32 results ({t} tiles x {V} x {M} x {N}), "
                                     f"got {out.size} from {outp}")
            D = out.reshape(t, V, M, N)
    except OSError as e:
        raise ProbeFileError(f"{e.filename}: cannot read ({e.strerror})") from None
    return A, B, C, D


def products(A, B, q: int) -> np.ndarray:
    """Exact float64 products of k32 step q: [tiles, M, N, 32] (every product is exact)."""
    a = E4M3[A[:, :, 32 * q:32 * q + 32]]
    b = E4M3[B[:, :, 32 * q:32 * q + 32]]
    return a[:, :, None, :] * b[:, None, :, :]


def main(argv=None) -> int:
    ap = OneLineArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("inp")
    m.add_argument("--seed", type=int, default=0, help="a non-negative integer")
    f = sub.add_parser("fit")
    f.add_argument("inp")
    f.add_argument("outp")
    f.add_argument("--json")
    f.add_argument("--note", default="", help="stored in the JSON (where and when the probe ran)")
    a = ap.parse_args(argv)
    if a.cmd == "make" and a.seed < 0:
        print(f"wgmma_acc_fit.py: error: --seed: expected a non-negative integer, got {a.seed}", file=sys.stderr)
        return 2
    try:
        if a.cmd == "make":
            print(json.dumps(make(a.inp, a.seed)))
            return 0
        if a.json:  # fail on an unwritable output before the work (and create nothing)
            d = os.path.dirname(os.path.abspath(a.json))
            if os.path.isdir(a.json) or not os.path.isdir(d) or not os.access(d, os.W_OK):
                print(f"wgmma_acc_fit.py: error: --json: expected a writable file path, got {a.json!r}", file=sys.stderr)
                return 2
        return fit(a.inp, a.outp, a.json, a.note)
    except ProbeFileError as e:
        print(f"wgmma_acc_fit.py: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the table piped into a closed reader (e.g. head)
        sys.stderr.close()
        return 0
    except OSError as e:
        path = e.filename if e.filename is not None else (a.inp if a.cmd == "make" else a.json)
        print(f"wgmma_acc_fit.py: error: {path!r}: cannot write ({e.strerror})", file=sys.stderr)
        return 2


_B = np.arange(256)
#: exponent field of every E4M3 byte as the tensor core aligns it (subnormals -6)
E4M3_EXP = np.where(((_B >> 3) & 15) == 0, -6, ((_B >> 3) & 15) - 7).astype(np.float64)


def _floor_log2(x: np.ndarray) -> np.ndarray:
    return np.floor(np.log2(np.abs(np.where(x == 0, 1.0, x))))


def _trunc_sig(x: np.ndarray, bits: int) -> np.ndarray:
    q = np.exp2(_floor_log2(x) - bits + 1)
    return np.where(x == 0, 0.0, np.trunc(x / q) * q)


def step(A, B, q: int, c, align: str, bits: int | None, final: str) -> np.ndarray:
    """One k32 step (step q of the tile) onto accumulator c (None: from zero), float64.

    align: "none" (exact products), "field" (to the largest e_a + e_b, the kept model) or
    "value" (to the largest floor(log2 |product|)); bits: fraction bits kept below it;
    final: "rn32" (round to FP32) or "rz14" (truncate to 14 significant bits)."""
    p = products(A, B, q)
    c = np.zeros(p.shape[:-1]) if c is None else c
    if align == "none":
        s = p.sum(-1) + c
    else:
        if align == "field":
            e = E4M3_EXP[A[:, :, 32 * q:32 * q + 32]][:, :, None, :] + E4M3_EXP[B[:, :, 32 * q:32 * q + 32]][:, None, :, :]
        else:
            e = _floor_log2(p)
        em = np.where(p == 0, -1e9, e).max(-1)
        em = np.maximum(em, np.where(c == 0, -1e9, _floor_log2(c)))
        qv = np.exp2(np.maximum(em, -200) - bits)
        s = (np.trunc(p / qv[..., None]) * qv[..., None]).sum(-1) + np.trunc(c / qv) * qv
    return _trunc_sig(s, 14) if final == "rz14" else s.astype(np.float32).astype(np.float64)


MODELS = {  # name -> (align, bits, final); the first is the kept model (megamoe.reference)
    "aligned to max(e_a + e_b), 13 bits, truncated; sum truncated to 14 bits": ("field", 13, "rz14"),
    "aligned to max(e_a + e_b), 14 bits, truncated; sum truncated to 14 bits": ("field", 14, "rz14"),
    "aligned to max(e_a + e_b), 13 bits, truncated; sum rounded to FP32": ("field", 13, "rn32"),
    "aligned to the largest product's value exponent, 13 bits; sum truncated to 14 bits": ("value", 13, "rz14"),
    "exact sum truncated to 14 significant bits": ("none", 0, "rz14"),
    "exact sum rounded to FP32": ("none", 0, "rn32"),
}
VARIANTS = ("one k32 step from zero", "two chained (a 64-K group)", "four chained (128 K)", "one step onto C")


def fit(inp: str, outp: str, json_path: str | None, note: str = "") -> int:
    A, B, C, D = load(inp, outp)
    if A.shape[0] != len(KINDS) * TILES_PER_KIND:
        raise ProbeFileError(f"inp: expected {len(KINDS) * TILES_PER_KIND} tiles ({len(KINDS)} operand kinds x "
                             f"{TILES_PER_KIND}, as 'make' writes them), got {A.shape[0]}")
    res = {}
    for name, (align, bits, final) in MODELS.items():
        res[name] = {}
        for kind, kname in enumerate(KINDS):
            sl = slice(kind * TILES_PER_KIND, (kind + 1) * TILES_PER_KIND)
            a, b = A[sl], B[sl]
            m = [step(a, b, 0, None, align, bits, final)]
            m.append(step(a, b, 1, m[0], align, bits, final))
            m.append(step(a, b, 3, step(a, b, 2, m[1], align, bits, final), align, bits, final))
            m.append(step(a, b, 0, C[sl].astype(np.float64), align, bits, final))
            res[name][kname] = {v: float((m[i] == D[sl, i]).mean()) for i, v in enumerate(VARIANTS)}
        worst = min(min(r.values()) for r in res[name].values())
        print(f"{worst:9.6f}  {name}")
    out = {"note": note, "tiles": int(A.shape[0]), "results_per_variant": int(A.shape[0] * M * N), "kinds": list(KINDS),
               "variants": list(VARIANTS), "fraction_bitwise_equal": res}
    if json_path:
        with open(json_path, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
