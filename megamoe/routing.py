"""Top-k routing generators and loaders: ``topk_idx [T, k]`` (int64) per EP rank.

Every generator is seeded and deterministic: rank ``r`` draws from
``numpy.random.default_rng([seed, r])``, so ranks are independent and the same seed
always gives the same ids.  Slot value ``-1`` means "masked" (the slot routes nowhere).

Kinds (``RoutingSpec.parse`` accepts the CLI spelling in brackets):

* ``uniform`` [``uniform``] — each token picks ``k`` distinct experts uniformly at random, in
  random slot order.  This is the distribution of ``torch.topk(torch.randn(T, E), k)`` used
  by DeepGEMM's ``tests/test_mega_moe.py`` (iid continuous scores make every k-subset and
  every slot order equally likely); it is sampled directly instead of via scores.
* ``masked`` [``masked:RATIO``] — ``uniform``, then each slot independently becomes ``-1`` with
  probability ``RATIO`` (as ``topk_idx.masked_fill_(rand < masked_ratio, -1)`` in DeepGEMM's test).
* ``zipf`` [``zipf:S``] — expert popularity ``p_e ∝ 1 / (rank_e + 1) ** S`` over a seeded random
  permutation of the experts (popular experts are spread over EP ranks); each token draws
  ``k`` distinct experts by successive sampling without replacement (Plackett-Luce).
* ``hot`` [``hot:FRACTION[:N]``] — experts ``0 .. N-1`` (default ``N = 4``, so all on EP rank 0)
  are drawn with total per-draw probability ``FRACTION``; the rest share ``1 - FRACTION``.
  Draws are without replacement inside a token, so the realised share of slots going to
  hot experts is at most ``min(FRACTION, N / k)``-ish; :func:`routing_summary` reports it.
* ``one_expert`` [``one_expert``] — every token routes to expert ``ONE_EXPERT_ID = 3`` in slot 0
  (on EP rank 0 when a rank holds 4 or more experts, as with the presets) and to ``k - 1``
  other distinct experts drawn uniformly, in random slot order: the distribution of the
  kernel's input generator (``megamoe.kernel.check.make_inputs``: scores ``rand`` with
  expert 3's set to 10, then ``topk``), its one-hot-expert stress case.
* ``file`` [``file:PATH``] — a megamoe trace (``.npz`` with ``topk_idx_0`` .. ``topk_idx_{R-1}``:
  ``simulate --trace-npz``, the kernel's traces: its routing), or an ``.npy``, ``.npz`` (first array) or ``.pt`` integer array
  ``[T, k]`` per rank: ``PATH`` may contain ``{rank}`` (one file per rank, ``{rank}``
  replaced by ``0 .. R-1``), or hold one ``[R, T, k]`` array, or (for one rank) a ``[T, k]``
  array.  ``{rank}`` is the only placeholder: any other ``{`` or ``}`` in ``PATH`` (a
  misspelt ``{ranks}``, ``{foo}``, a lone brace) is refused with an ``InputError`` on
  ``routing.file``, so a file whose name holds braces must be renamed.

``megamoe simulate`` and ``megamoe run`` read ``--routing`` with the same parser. ``megamoe run``
draws its inputs with the kernel's own generator, which makes ``uniform``, ``zipf`` (exponent 1
only; there the popular experts are 0, 1, 2, ... in order, not a seeded permutation) and
``one_expert``; :func:`kernel_routing_name` maps a spec onto it and rejects the rest.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import numpy as np

from .errors import InputError, is_int, is_real, parse_float, parse_int, require, shown

KINDS = ("uniform", "masked", "zipf", "hot", "one_expert", "file")
ONE_EXPERT_ID = 3  # the expert every token picks in ``one_expert`` (as megamoe.kernel.check.make_inputs)
RUN_KINDS = ("uniform", "zipf", "one_expert")  # what ``megamoe run``'s input generator makes


def routing_kind(text: str) -> str:
    """The kind a routing's CLI spelling names (``zipf`` of ``Zipf:1.2``), lower-cased: what
    :meth:`RoutingSpec.parse` dispatches on."""
    return text.partition(":")[0].lower()


@dataclass(frozen=True)
class RoutingSpec:
    """How to produce ``topk_idx`` for every rank.

    Attributes:
        kind: one of ``uniform, masked, zipf, hot, one_expert, file``.
        masked_ratio: fraction of slots set to -1 (``masked``), a number in [0, 1].
        zipf_exponent: Zipf exponent ``S >= 0``, a finite number (``zipf``).
        hot_fraction: per-draw probability of a hot expert, a number in [0, 1] (``hot``).
        hot_experts: number of hot experts ``N``, an integer >= 1 (``hot``).
        path: file path (a string), may contain ``{rank}`` and no other brace (``file``).

    Every field is checked whatever the kind (numbers are ``int``/``float`` or numpy scalars,
    never strings or bools; nothing is converted).

    Raises:
        InputError: a field of the wrong type or out of range, named ``routing`` (kind) or
            ``routing.<field>`` (``routing.file`` for ``path``).
    """

    kind: str = "uniform"
    masked_ratio: float = 0.0
    zipf_exponent: float = 1.0
    hot_fraction: float = 0.5
    hot_experts: int = 4
    path: str = ""

    def __post_init__(self) -> None:
        require(isinstance(self.kind, str) and self.kind in KINDS, "routing", f"one of {', '.join(KINDS)}",
                self.kind)
        require(is_real(self.masked_ratio) and 0.0 <= self.masked_ratio <= 1.0, "routing.masked_ratio",
                "a ratio in [0, 1]", shown(self.masked_ratio))
        require(is_real(self.zipf_exponent) and 0.0 <= self.zipf_exponent < float("inf"),
                "routing.zipf_exponent", "a finite number >= 0", shown(self.zipf_exponent))
        require(is_real(self.hot_fraction) and 0.0 <= self.hot_fraction <= 1.0, "routing.hot_fraction",
                "a fraction in [0, 1]", shown(self.hot_fraction))
        require(is_int(self.hot_experts) and self.hot_experts >= 1, "routing.hot_experts",
                "an integer >= 1", shown(self.hot_experts))
        require(isinstance(self.path, str), "routing.file", "a path string", self.path)
        if self.kind == "file":
            require(bool(self.path), "routing.file", "a path", self.path)
            _check_rank_placeholder(self.path)

    @classmethod
    def parse(cls, text: str) -> "RoutingSpec":
        """Parse the CLI spelling (``uniform``, ``masked:0.2``, ``zipf:1.2``, ``hot:0.5:4``,
        ``one_expert``, ``file:PATH``).

        Raises:
            InputError: ``text`` not a string, unknown kind, a parameter that is empty or not a
                number (``N`` of ``hot`` not an integer), or a value :class:`RoutingSpec` refuses.
        """
        require(isinstance(text, str), "routing", "a RoutingSpec or its CLI spelling (e.g. 'uniform', 'zipf:1.2')",
                text)
        kind, (_, sep, rest) = routing_kind(text), text.partition(":")
        if kind == "file":
            return cls(kind="file", path=rest)
        args = rest.split(":") if sep else []  # an empty part ("zipf:") is refused, not defaulted

        def num(i: int, name: str, conv=parse_float):
            try:
                return conv(args[i])
            except ValueError:
                raise InputError(f"routing.{name}", "an integer" if conv is parse_int else "a number",
                                 args[i] or "''") from None

        if kind == "uniform" and not args:
            return cls()
        if kind == "one_expert" and not args:
            return cls(kind="one_expert")
        if kind == "masked" and len(args) <= 1:
            return cls(kind="masked", masked_ratio=num(0, "masked_ratio") if args else 0.5)
        if kind == "zipf" and len(args) <= 1:
            return cls(kind="zipf", zipf_exponent=num(0, "zipf_exponent") if args else 1.0)
        if kind == "hot" and len(args) <= 2:
            return cls(kind="hot", hot_fraction=num(0, "hot_fraction") if args else 0.5,
                       hot_experts=num(1, "hot_experts", parse_int) if len(args) > 1 else 4)
        raise InputError("routing", "uniform | masked[:RATIO] | zipf[:S] | hot[:FRACTION[:N]] | one_expert | "
                         "file:PATH", text)

    def describe(self) -> str:
        """The CLI spelling of this spec."""
        return {
            "uniform": "uniform",
            "masked": f"masked:{self.masked_ratio:g}",
            "zipf": f"zipf:{self.zipf_exponent:g}",
            "hot": f"hot:{self.hot_fraction:g}:{self.hot_experts}",
            "one_expert": "one_expert",
            "file": f"file:{self.path}",
        }[self.kind]


def _check_rank_placeholder(path: str) -> None:
    """``{rank}`` is a routing file path's only placeholder: any other brace is refused."""
    require(not any(c in path.replace("{rank}", "") for c in "{}"), "routing.file",
            "a path whose only placeholder is {rank} (no other { or })", path)


def _sample_without_replacement(rng: np.random.Generator, num_tokens: int, num_experts: int,
                                top_k: int, probs: np.ndarray | None) -> np.ndarray:
    """Successive sampling of ``top_k`` distinct experts per token (slot j drawn from ``probs``
    conditioned on differing from slots < j).  Returns int64 ``[num_tokens, top_k]``."""
    out = np.empty((num_tokens, top_k), dtype=np.int64)
    cdf = None if probs is None else np.cumsum(probs)

    def draw(n: int) -> np.ndarray:
        if cdf is None:
            return rng.integers(0, num_experts, size=n, dtype=np.int64)
        return np.minimum(np.searchsorted(cdf, rng.random(n) * cdf[-1], side="right"),
                          num_experts - 1).astype(np.int64)

    for j in range(top_k):
        col = draw(num_tokens)
        for _ in range(10_000):
            clash = (out[:, :j] == col[:, None]).any(axis=1) if j else np.zeros(num_tokens, bool)
            n = int(clash.sum())
            if n == 0:
                break
            col[clash] = draw(n)
        else:  # pathological skew: finish the clashing rows exactly by renormalising
            rows = np.nonzero((out[:, :j] == col[:, None]).any(axis=1))[0]
            for t in rows:
                p = np.ones(num_experts) if probs is None else probs.copy()
                p[out[t, :j]] = 0.0
                col[t] = rng.choice(num_experts, p=p / p.sum())
        out[:, j] = col
    return out


def _trace_routing(path: str) -> list[np.ndarray] | None:
    """The routing a megamoe trace file (``.npz`` with arrays ``topk_idx_0`` .. ``topk_idx_{R-1}``:
    ``megamoe simulate --trace-npz``, the kernel's traces) holds, one array per rank; ``None`` for
    any other file (read, and refused where unreadable, as a routing array)."""
    if not (path.endswith(".npz") and os.path.isfile(path)):
        return None
    try:
        with np.load(path) as z:
            names = [k for k in z.files if k.startswith("topk_idx_")]
            if not names:
                return None
            want = [f"topk_idx_{r}" for r in range(len(names))]
            require(sorted(names) == sorted(want), "routing.file", "a trace's arrays topk_idx_0 .. topk_idx_{R-1}",
                    f"{path} with {', '.join(sorted(names))}")
            return [np.asarray(z[k]) for k in want]
    except InputError:
        raise
    except Exception:  # not a readable zip: _load_array reports it
        return None


def _load_array(path: str) -> np.ndarray:
    if not os.path.exists(path):
        raise InputError("routing.file", "an existing .npy/.npz/.pt file", path)
    try:
        if path.endswith(".pt"):
            try:
                import torch  # optional dependency, only for .pt files
            except ImportError:
                raise InputError("routing.file", "an .npy/.npz file, or torch installed to read a .pt file",
                                 f"{path} (torch is not installed)") from None

            obj = torch.load(path, map_location="cpu", weights_only=True)
            arr = obj.numpy() if hasattr(obj, "numpy") else np.asarray(obj)
        elif path.endswith(".npz"):
            with np.load(path) as z:
                key = "topk_idx" if "topk_idx" in z.files else (z.files[0] if len(z.files) == 1 else None)
                if key is None:
                    raise InputError("routing.file", "an .npz with one array or an array named topk_idx",
                                     f"{path} with arrays {', '.join(z.files)}")
                arr = z[key]
        else:
            arr = np.load(path, allow_pickle=False)
    except InputError:
        raise
    except Exception as exc:  # unreadable file: report it in one line
        # numpy's ValueError text (about pickles) misleads for a file that is no NumPy file at all;
        # a real NumPy file raises it for an object (pickled) array
        why = ""
        if isinstance(exc, ValueError) and not path.endswith(".pt"):
            head = b""
            with contextlib.suppress(OSError), open(path, "rb") as f:
                head = f.read(6)
            why = (": an object (pickled) array; save the ids as an integer array"
                   if head.startswith((b"\x93NUMPY", b"PK")) else
                   ": not a NumPy file (an .npz is a zip archive, an .npy starts with a NumPy header)")
        raise InputError("routing.file", "a readable .npy/.npz/.pt integer array",
                         f"{path} ({type(exc).__name__}{why})") from None
    return np.asarray(arr)


def check_ids(arr: np.ndarray, field: str, num_experts: int, top_k: int) -> np.ndarray:
    """Check one rank's ``topk_idx`` (int ``[T, top_k]``, ids in ``[-1, num_experts)``, distinct
    within a row except ``-1``) and return it as int64.

    Raises:
        InputError: named ``field``: wrong dtype or shape, an id out of range, a repeated id.
    """
    arr = np.asarray(arr)
    require(np.issubdtype(arr.dtype, np.integer), field, "an integer array", f"dtype {arr.dtype}")
    require(arr.ndim == 2 and arr.shape[1] == top_k, field, f"shape [T, {top_k}]",
            f"shape {list(arr.shape)}")
    if arr.size:
        lo, hi = int(arr.min()), int(arr.max())
        require(lo >= -1 and hi < num_experts, field, f"ids in [-1, {num_experts})",
                f"ids in [{lo}, {hi}]")
        # a token's top-k experts are distinct (-1 = masked slot may repeat)
        srt = np.sort(arr, axis=1)
        dup = (srt[:, 1:] == srt[:, :-1]) & (srt[:, 1:] >= 0)
        if dup.any():
            t = int(np.nonzero(dup.any(axis=1))[0][0])
            raise InputError(field, "distinct expert ids within each token's row (-1 may repeat)",
                             f"row {t} = {arr[t].tolist()}")
    return arr.astype(np.int64, copy=False)


def load_routing_file(path: str, num_ranks: int, num_experts: int, top_k: int) -> list[np.ndarray]:
    """Load ``topk_idx`` for every rank from ``path`` (see module docstring).

    Raises:
        InputError: a brace other than ``{rank}`` in ``path``, missing file, wrong dtype or
            shape, ids outside ``[-1, num_experts)``.
    """
    require(isinstance(path, str), "routing.file", "a path string", path)
    _check_rank_placeholder(path)
    ranks = _trace_routing(path)
    if ranks is not None:  # a megamoe trace file: its routing, one array per rank
        require(len(ranks) == num_ranks, "routing.file", f"a trace of {num_ranks} rank{'s' * (num_ranks != 1)} "
                f"(arrays topk_idx_0 .. topk_idx_{num_ranks - 1})", f"{path} with {len(ranks)}")
        return [check_ids(a, f"routing.file (topk_idx_{r})", num_experts, top_k) for r, a in enumerate(ranks)]
    if "{rank}" in path:  # plain replacement: str.format would read any other brace as a field
        return [check_ids(_load_array(path.replace("{rank}", str(r))), "routing.file", num_experts, top_k)
                for r in range(num_ranks)]
    arr = _load_array(path)
    require(np.issubdtype(arr.dtype, np.integer), "routing.file", "an integer array", f"dtype {arr.dtype}")
    if arr.ndim == 3 and arr.shape[0] == num_ranks and arr.shape[2] == top_k:
        return [check_ids(a, "routing.file", num_experts, top_k) for a in arr]
    if arr.ndim == 2 and num_ranks == 1:
        return [check_ids(arr, "routing.file", num_experts, top_k)]
    raise InputError("routing.file", f"a [{num_ranks}, T, {top_k}] array" +
                     (f" or a [T, {top_k}] array" if num_ranks == 1 else
                      f" (or a path with {{rank}}: one [T, {top_k}] file per rank)"),
                     f"shape {list(arr.shape)}")


def generate(spec: RoutingSpec, num_ranks: int, tokens_per_rank: list[int], num_experts: int,
             top_k: int, seed: int) -> list[np.ndarray]:
    """Produce ``topk_idx`` (int64 ``[T_r, k]``, ``-1`` = masked) for every rank.

    Args:
        spec: routing kind and parameters.
        num_ranks: EP size R.
        tokens_per_rank: ``T_r`` for each rank (ignored for ``file``, whose arrays decide).
        num_experts: experts over all ranks.
        top_k: slots per token.
        seed: base seed; rank r uses ``default_rng([seed, r])``.

    Raises:
        InputError: ``spec`` not a :class:`RoutingSpec`; ``num_ranks``, ``num_experts`` or
            ``top_k`` not a positive integer (``top_k <= num_experts``); ``seed`` not an
            integer >= 0; ``tokens_per_rank`` not ``num_ranks`` integers >= 0 (other kinds
            than ``file``); see :func:`load_routing_file`; ``hot_experts`` > experts;
            ``one_expert`` with 3 experts or fewer.
    """
    require(isinstance(spec, RoutingSpec), "routing", "a RoutingSpec", type(spec).__name__)
    for name, v in (("num_ranks", num_ranks), ("num_experts", num_experts), ("top_k", top_k)):
        require(is_int(v) and v >= 1, name, "an integer >= 1", shown(v))
    require(top_k <= num_experts, "top_k", f"<= num_experts ({num_experts})", top_k)
    require(is_int(seed) and seed >= 0, "seed", "an integer >= 0", shown(seed))
    if spec.kind == "file":
        return load_routing_file(spec.path, num_ranks, num_experts, top_k)
    probs = None
    if spec.kind == "zipf":
        perm = np.random.default_rng([seed, 1_000_003]).permutation(num_experts)
        with np.errstate(over="ignore"):  # a huge S underflows weights to 0 (checked below)
            w = 1.0 / (np.arange(num_experts) + 1.0) ** spec.zipf_exponent
        probs = np.empty(num_experts)
        probs[perm] = w
        probs /= probs.sum()
    elif spec.kind == "hot":
        n = spec.hot_experts
        require(n < num_experts, "routing.hot_experts", f"< num_experts ({num_experts})", n)
        probs = np.full(num_experts, (1.0 - spec.hot_fraction) / (num_experts - n))
        probs[:n] = spec.hot_fraction / n
        if probs.sum() <= 0:
            probs = None
    if probs is not None:  # sampling k distinct experts needs k with a nonzero probability
        nz = int(np.count_nonzero(probs))
        require(nz >= top_k, f"routing.{spec.kind}",
                f"parameters that leave at least top_k = {top_k} experts with a nonzero probability",
                f"{spec.describe()} ({nz} left)")
    if spec.kind == "one_expert":
        require(num_experts > ONE_EXPERT_ID, "routing.one_expert",
                f"a shape with more than {ONE_EXPERT_ID} experts (every token routes to expert {ONE_EXPERT_ID})",
                f"{num_experts} experts")
    toks = list(tokens_per_rank) if isinstance(tokens_per_rank, (list, tuple, np.ndarray)) else None
    require(toks is not None and len(toks) == num_ranks, "tokens_per_rank",
            f"a list of {num_ranks} token count{'s' if num_ranks != 1 else ''} (one per rank)",
            f"{len(toks)} value{'s' if len(toks) != 1 else ''}" if toks is not None else shown(tokens_per_rank))
    for t in toks:
        require(is_int(t) and t >= 0, "tokens_per_rank", "integers >= 0 (one per rank)", shown(t))
    out = []
    for r in range(num_ranks):
        rng = np.random.default_rng([seed, r])
        if spec.kind == "one_expert":  # expert 3 in slot 0, k - 1 distinct others drawn uniformly
            rest = _sample_without_replacement(rng, tokens_per_rank[r], num_experts - 1, top_k - 1, None)
            rest += rest >= ONE_EXPERT_ID  # skip expert 3: ids 0..E-2 -> the other E-1 experts
            out.append(np.concatenate([np.full((len(rest), 1), ONE_EXPERT_ID, np.int64), rest], axis=1))
            continue
        ids = _sample_without_replacement(rng, tokens_per_rank[r], num_experts, top_k, probs)
        if spec.kind == "masked" and ids.size:
            ids[rng.random(ids.shape) < spec.masked_ratio] = -1
        out.append(ids)
    return out


def kernel_routing_name(spec: RoutingSpec | str) -> str:
    """The name of ``spec`` in the kernel's input generator (``megamoe.kernel.check.make_inputs``,
    what ``megamoe run`` draws its inputs with): ``uniform``, ``zipf`` or ``one_expert``.

    That generator's ``zipf`` has exponent 1 and makes experts 0, 1, 2, ... the most popular
    (the simulator's ``zipf`` spreads them with a seeded permutation); its ``uniform`` and
    ``one_expert`` have the simulator's distributions.

    Raises:
        InputError: a kind the generator does not make (``masked``, ``hot``, ``file``, or no
            routing kind at all: the message names the generator's kinds), a spelling of one of
            its kinds that :meth:`RoutingSpec.parse` rejects, or ``zipf`` with an exponent other
            than 1.
    """
    text = spec if isinstance(spec, str) else spec.describe()
    require(routing_kind(text) in RUN_KINDS, "routing",
            "uniform, zipf[:1] or one_expert for megamoe run --routing (the kernel's input generator makes "
            "only these; masked, hot and file: are simulate-only)", text)
    spec = RoutingSpec.parse(spec) if isinstance(spec, str) else spec
    if spec.kind == "zipf":
        require(spec.zipf_exponent == 1.0, "routing.zipf_exponent", "1 for megamoe run --routing (the "
                "kernel's input generator has exponent 1 only)", f"{spec.zipf_exponent:g}")
    return spec.kind


def routing_summary(topk_idx: list[np.ndarray], num_experts: int, num_ranks: int) -> dict:
    """Counts that describe a routing: valid slots, per-expert load min/mean/max, share of
    slots landing on EP rank 0 .. R-1 (returned as a list)."""
    counts = np.zeros(num_experts, dtype=np.int64)
    for ids in topk_idx:
        v = ids[ids >= 0]
        counts += np.bincount(v, minlength=num_experts)
    total = int(counts.sum())
    per_rank = counts.reshape(num_ranks, -1).sum(axis=1)
    return {
        "valid_slots": total,
        "expert_load_min": int(counts.min()) if num_experts else 0,
        "expert_load_mean": float(counts.mean()) if num_experts else 0.0,
        "expert_load_max": int(counts.max()) if num_experts else 0,
        "rank_share": [float(x) / total if total else 0.0 for x in per_rank],
    }
