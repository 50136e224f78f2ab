"""EP=1 unchanged by the EP work: the library built from the previous commit's sources and the
current one, driven by the same ctypes Params (the new fields are appended at the end of the
struct, so the old library reads the prefix it knows), must give bitwise identical outputs.

    python benchmarks/device/ep_ep1_compat.py build/ep_old/libmegamoe_sm90_head.so $OUT/ep1_compat.json
"""

from __future__ import annotations

import ctypes
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from megamoe.kernel import MegaMoEKernel, prepare_weights  # noqa: E402
from megamoe.kernel.check import make_inputs, make_weights  # noqa: E402
from megamoe.kernel.runtime import Params  # noqa: E402


def old_lib(path):
    lib = ctypes.CDLL(path)
    lib.megamoe_sm90_launch.argtypes = [ctypes.POINTER(Params), ctypes.c_void_p]
    lib.megamoe_sm90_launch.restype = ctypes.c_int
    lib.megamoe_sm90_error_string.argtypes = [ctypes.c_int]
    lib.megamoe_sm90_error_string.restype = ctypes.c_char_p
    return lib


def main():
    path, out = sys.argv[1], sys.argv[2]
    lib = old_lib(path)
    rows = []
    for (E, K, H, I), cases in (((8, 2, 256, 128), [(1, "uniform", 0.0, None), (200, "uniform", 0.3, 0.05),
                                                    (300, "zipf", 0.0, None)]),
                                ((256, 6, 4096, 2048), [(1, "uniform", 0.0, None), (128, "uniform", 0.0, None),
                                                        (1000, "zipf", 0.1, None), (4096, "uniform", 0.0, None)])):
        w = make_weights(E, H, I, "cuda", seed=3)
        for T, routing, mask, clamp in cases:
            new = MegaMoEKernel(E, K, H, I, T, prepare_weights(*w), clamp=clamp)
            old = MegaMoEKernel(E, K, H, I, T, prepare_weights(*w), clamp=clamp)
            old.lib = lib
            x, xs, idx, tw = make_inputs(T, E, K, H, "cuda", seed=T, routing=routing, mask_frac=mask)
            yn = new(x, xs, idx, tw)
            new.check()
            yo = old(x, xs, idx, tw)
            old.check()
            same = bool(torch.equal(yn.view(torch.int16), yo.view(torch.int16)))
            rows.append(dict(E=E, T=T, routing=routing, mask=mask, clamp=clamp, bitwise_equal=same))
            print(rows[-1], flush=True)
            del new, old
    Path(out).write_text(json.dumps({"old_library": path, "rows": rows, "all_equal": all(r["bitwise_equal"] for r in rows)},
                                    indent=1))
    print("EP1 old-vs-new all bitwise equal:", all(r["bitwise_equal"] for r in rows))


if __name__ == "__main__":
    main()
