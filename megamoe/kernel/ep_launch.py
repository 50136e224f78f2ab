"""The per-rank entry of ``megamoe run --ranks R``: ``torchrun`` starts this module once per
GPU (``python -m megamoe.kernel.ep_launch --ranks 2 --tokens 64`` outside a process group
starts ``torchrun`` itself), and it calls :func:`megamoe.kernel.ep.run_ep_main`. A module of
its own, so that ``-m`` does not run ``megamoe.kernel.ep``, which the package has imported
already (Python warns of that)."""

import argparse
import sys

from .ep import run_ep_main


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m megamoe.kernel.ep_launch", description=run_ep_main.__doc__)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--experts", type=int, default=256)
    ap.add_argument("--topk", type=int, default=6)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--inter", type=int, default=2048)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--routing", default="uniform")
    ap.add_argument("--clamp", type=float, default=None)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--trace", default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-check", action="store_true")
    a = ap.parse_args()
    return run_ep_main(a.ranks, a.experts, a.topk, a.hidden, a.inter, a.tokens, a.routing, a.clamp, a.reps, a.trace,
                       not a.no_check, a.seed)


if __name__ == "__main__":
    sys.exit(main())
