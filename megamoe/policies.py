"""Scheduler policies as plug-ins: wave size, block config, pull order, block order.

A policy is any class with one of these methods (the method decides its kind):

=====================  ==========================================  ==========================
kind                   method                                      returns
=====================  ==========================================  ==========================
wave policy            ``experts_per_wave(ctx: WaveContext)``      ``int`` in [1, E_local]
block-config policy    ``block_config(ctx: BlockContext)``         :class:`BlockConfig`
pull-order policy      ``pull_order(counts: np.ndarray)``          int ``[sum(counts), 2]``
block scheduler        ``block_list(ctx: ScheduleContext)``        int ``[N, 5]``
=====================  ==========================================  ==========================

``pull_order`` gets the tokens each source rank sends to one expert (``[R]``) and returns
``(source rank, index within that rank)`` per pool row; ``block_list`` returns the rank's
global block list ``(phase, local expert, m block, n block, wave)``; SM ``s`` runs rows
``s, s + S, ...`` (so keep 2-CTA pairs adjacent: even rows and the next row share the
(expert, m block)).  Every return value is checked: a wrong type, a missing block or a
non-permutation raises :class:`InputError` naming the policy and the method.

Built-ins (``--policy NAME``): ``reference-waves``, ``fixed-waves:N`` (N in [1, local experts],
refused above the pool's limit, not capped), ``adaptive-waves``,
``reference-blocks``, ``block-m:N``, ``round-robin`` (min-remaining, the reference),
``rank-by-rank`` (naive: source ranks one after another), ``wave-scheduler`` (the
reference ``MegaMoEScheduler``), ``wave-lag`` (each wave's L2 blocks after the next wave's
L1 blocks: the SM90 kernel's order at two CTAs per SM), ``interleaved`` (L2 blocks of expert e
right after the L1 blocks of expert e+1 inside a wave).  User classes: ``--policy package.module:Class`` or
``--policy path/to/file.py:Class`` (constructed with no arguments).
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import os
from dataclasses import dataclass, field

import numpy as np

from .errors import InputError, parse_int, require

KIND_METHODS = {"wave": "experts_per_wave", "block_config": "block_config",
                "pull_order": "pull_order", "scheduler": "block_list"}


@dataclass(frozen=True)
class WaveContext:
    """Inputs of a wave policy (one rank).

    Attributes:
        experts_per_rank, num_tokens (T_r), top_k, hidden, intermediate, block_m, block_n,
        num_sms, pool_tokens, max_tokens_per_rank, num_ranks: the plan's inputs.
        tokens_per_expert: int64 ``[E_local]`` actual routed items per local expert (known on
            the device after dispatch; the reference heuristic uses only the expectation).
        max_experts_per_wave: the most experts whose worst-case wave fits the pool.
    """

    experts_per_rank: int
    num_tokens: int
    top_k: int
    hidden: int
    intermediate: int
    block_m: int
    block_n: int
    num_sms: int
    pool_tokens: int
    max_tokens_per_rank: int
    num_ranks: int
    tokens_per_expert: np.ndarray = field(repr=False)
    max_experts_per_wave: int = 0


@dataclass(frozen=True)
class BlockContext:
    """Inputs of a block-config policy (one rank): ``num_tokens`` (T_r), ``num_ranks``,
    ``top_k``, ``num_experts``, ``hidden``, ``intermediate``, ``tokens_per_expert``."""

    num_tokens: int
    num_ranks: int
    top_k: int
    num_experts: int
    hidden: int
    intermediate: int
    tokens_per_expert: np.ndarray = field(repr=False)


@dataclass(frozen=True)
class ScheduleContext:
    """Inputs of a block scheduler (one rank): ``m_blocks_per_expert`` int64 ``[E_local]``,
    ``l1_n_blocks``, ``l2_n_blocks``, ``experts_per_wave``, ``num_sms``."""

    m_blocks_per_expert: np.ndarray
    l1_n_blocks: int
    l2_n_blocks: int
    experts_per_wave: int
    num_sms: int


# -- built-ins ------------------------------------------------------------------------
class ReferenceWaves:
    """DeepGEMM's heuristic (``get_num_experts_per_wave_for_mega_moe``)."""

    name = "reference-waves"

    def experts_per_wave(self, ctx: WaveContext) -> int:
        from .plan import sm100_experts_per_wave

        return sm100_experts_per_wave(ctx.experts_per_rank, ctx.num_tokens, ctx.top_k,
                                      ctx.intermediate, ctx.block_m, ctx.block_n, ctx.num_sms,
                                      ctx.pool_tokens, ctx.max_tokens_per_rank, ctx.num_ranks)


class FixedWaves:
    """A fixed number of experts per wave, ``N`` in [1, local experts] and at most the experts
    whose worst-case wave fits the pool; a larger ``N`` is refused (one-line InputError, like
    ``--experts-per-wave``), not capped."""

    def __init__(self, n: int):
        require(isinstance(n, (int, np.integer)) and not isinstance(n, bool) and n >= 1, "policy",
                _FIXED_WAVES_EXPECTED, f"fixed-waves:{n}")
        self.n = int(n)
        self.name = f"fixed-waves:{self.n}"

    def experts_per_wave(self, ctx: WaveContext) -> int:
        require(self.n <= ctx.experts_per_rank, f"policy {self.name}",
                f"N in [1, {ctx.experts_per_rank}] (local experts)", self.n)
        cap = ctx.max_experts_per_wave or ctx.experts_per_rank
        require(self.n <= cap, f"policy {self.name}",
                f"N in [1, {cap}] (the most experts whose worst-case wave fits the pool of {ctx.pool_tokens} "
                f"tokens at block_m {ctx.block_m})", self.n)
        return self.n


_FIXED_WAVES_EXPECTED = "fixed-waves:N with an integer N >= 1"


class AdaptiveWaves:
    """Imbalance-aware: the smallest wave whose *actual* L1 blocks fill every SM in every
    full wave (uses the real per-expert counts instead of the expectation x imbalance 2)."""

    name = "adaptive-waves"

    def experts_per_wave(self, ctx: WaveContext) -> int:
        mb = -(-ctx.tokens_per_expert // ctx.block_m)
        nb = 2 * ctx.intermediate // ctx.block_n
        cap = ctx.max_experts_per_wave or ctx.experts_per_rank
        for epw in range(1, cap + 1):
            full = len(mb) // epw
            if full == 0:
                return min(epw, cap)
            blocks = mb[:full * epw].reshape(full, epw).sum(axis=1) * nb
            if blocks.min() >= ctx.num_sms:
                return epw
        return cap


class ReferenceBlocks:
    """DeepGEMM's block-config table (``get_block_config_for_mega_moe``)."""

    name = "reference-blocks"

    def block_config(self, ctx: BlockContext):
        from .plan import sm100_block_config

        return sm100_block_config(ctx.num_tokens, ctx.num_ranks, ctx.top_k, ctx.num_experts)


class FixedBlockM:
    """Always this block_m (the table row of that block_m gives the rest)."""

    def __init__(self, block_m: int):
        self.block_m = int(block_m)
        self.name = f"block-m:{self.block_m}"

    def block_config(self, ctx: BlockContext):
        from .plan import sm100_block_config

        return sm100_block_config(ctx.num_tokens, ctx.num_ranks, ctx.top_k, ctx.num_experts,
                                  block_m=self.block_m)


class RoundRobinPull:
    """Round-robin min-remaining (the reference)."""

    name = "round-robin"

    def pull_order(self, counts: np.ndarray) -> np.ndarray:
        from .plan import pull_order

        return pull_order(counts)


class RankByRankPull:
    """Naive: every token of source rank 0, then rank 1, ... (one link busy at a time)."""

    name = "rank-by-rank"

    def pull_order(self, counts: np.ndarray) -> np.ndarray:
        counts = np.asarray(counts, dtype=np.int64)
        src = np.repeat(np.arange(len(counts)), counts)
        idx = np.concatenate([np.arange(c) for c in counts]) if len(counts) else np.zeros(0, np.int64)
        return np.stack([src, idx], axis=1).astype(np.int64)


def _expert_rows(phase: int, e: int, m: int, nb: int, w: int) -> np.ndarray:
    rows = np.empty((m * nb, 5), dtype=np.int32)
    rows[:, 0], rows[:, 1], rows[:, 4] = phase, e, w
    rows[:, 2] = np.repeat(np.arange(m), nb)
    rows[:, 3] = np.tile(np.arange(nb), m)
    return rows


def _pass_rows(ctx: ScheduleContext, w: int, phase: int) -> list[np.ndarray]:
    """The rows of wave ``w``'s L1 (``phase`` 1) or L2 (2) pass: its experts in order, each
    m-major over the phase's n blocks."""
    mb, epw = ctx.m_blocks_per_expert, ctx.experts_per_wave
    nb = ctx.l1_n_blocks if phase == 1 else ctx.l2_n_blocks
    return [_expert_rows(phase, e, int(mb[e]), nb, w) for e in range(w * epw, min((w + 1) * epw, len(mb))) if mb[e]]


def _rows(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts) if parts else np.zeros((0, 5), np.int32)


class WaveScheduler:
    """DeepGEMM's ``MegaMoEScheduler``: per wave all L1 blocks, then all L2 blocks."""

    name = "wave-scheduler"

    def block_list(self, ctx: ScheduleContext) -> np.ndarray:
        waves = range(math.ceil(len(ctx.m_blocks_per_expert) / ctx.experts_per_wave))
        return _rows([r for w in waves for phase in (1, 2) for r in _pass_rows(ctx, w, phase)])


class WaveLagScheduler:
    """Each wave's L2 pass after the next wave's L1 pass: L1(0), L1(1), L2(0), L1(2), L2(1), ...,
    L1(W-1), L2(W-2), L2(W-1), each pass in ``WaveScheduler``'s order. The SM90 kernel's order
    where its CTAs take blocks by ticket (kernel v9.4, :func:`megamoe.design_sm90.wave_lag`):
    a CTA that takes a wave's first L2 rows finds its L1 rows done instead of waiting for them
    while the next wave's L1 rows wait behind it. Not a DeepGEMM order."""

    name = "wave-lag"

    def block_list(self, ctx: ScheduleContext) -> np.ndarray:
        n = math.ceil(len(ctx.m_blocks_per_expert) / ctx.experts_per_wave)
        passes = [(0, 1)] + [p for w in range(1, n + 1) for p in (((w, 1),) if w < n else ()) + ((w - 1, 2),)]
        return _rows([r for w, phase in passes for r in _pass_rows(ctx, w, phase)])


class InterleavedScheduler:
    """Inside a wave: L1 of expert 0, L1 of expert 1, L2 of expert 0, L1 of expert 2, L2 of
    expert 1, ... (L2 of expert e one expert behind its L1), so L2 work starts before the
    wave's last L1 block.  An alternative to the reference order, not a DeepGEMM copy."""

    name = "interleaved"

    def block_list(self, ctx: ScheduleContext) -> np.ndarray:
        mb, epw = ctx.m_blocks_per_expert, ctx.experts_per_wave
        parts = []
        for w in range(math.ceil(len(mb) / epw)):
            experts = [e for e in range(w * epw, min((w + 1) * epw, len(mb))) if mb[e]]
            for i, e in enumerate(experts):
                parts.append(_expert_rows(1, e, int(mb[e]), ctx.l1_n_blocks, w))
                if i:
                    p = experts[i - 1]
                    parts.append(_expert_rows(2, p, int(mb[p]), ctx.l2_n_blocks, w))
            if experts:
                parts.append(_expert_rows(2, experts[-1], int(mb[experts[-1]]), ctx.l2_n_blocks, w))
        return np.concatenate(parts) if parts else np.zeros((0, 5), np.int32)


BUILTINS = {
    "reference-waves": ReferenceWaves, "fixed-waves": FixedWaves, "adaptive-waves": AdaptiveWaves,
    "reference-blocks": ReferenceBlocks, "block-m": FixedBlockM, "round-robin": RoundRobinPull,
    "rank-by-rank": RankByRankPull, "wave-scheduler": WaveScheduler, "wave-lag": WaveLagScheduler,
    "interleaved": InterleavedScheduler,
}


@dataclass
class Policies:
    """One policy per kind; ``None`` means the reference design's."""

    wave: object = None
    block_config: object = None
    pull_order: object = None
    scheduler: object = None

    def names(self) -> dict:
        return {k: policy_name(getattr(self, k)) for k in KIND_METHODS if getattr(self, k) is not None}


def policy_name(p) -> str:
    return getattr(p, "name", None) or type(p).__name__


def _load_class(spec: str):
    mod, _, cls = spec.rpartition(":")
    require(bool(mod) and bool(cls), "policy",
            f"a built-in ({', '.join(sorted(BUILTINS))}), module:Class or file.py:Class", spec)
    if mod.endswith(".py"):
        require(os.path.exists(mod), "policy", "an existing .py file", mod)
        s = importlib.util.spec_from_file_location(f"megamoe_user_policy_{abs(hash(mod))}", mod)
        module = importlib.util.module_from_spec(s)
        try:
            s.loader.exec_module(module)
        except Exception as exc:
            raise InputError("policy", f"an importable file ({mod})", f"{type(exc).__name__}: {exc}") from None
    else:
        try:
            module = importlib.import_module(mod)
        except ImportError as exc:
            raise InputError("policy", "an importable module", f"{mod} ({exc})") from None
    require(hasattr(module, cls), "policy", f"a class {cls} in {mod}", "missing")
    return getattr(module, cls)


def is_builtin(spec: str | object) -> bool:
    """Whether ``spec`` names a built-in policy (``fixed-waves:4``), not ``module:Class`` /
    ``file.py:Class`` or an object: a trace records a policy by its name only, which re-creates a
    built-in and nothing else."""
    return isinstance(spec, str) and spec.partition(":")[0] in BUILTINS


def make_policy(spec: str | object):
    """A policy object from a built-in name (``fixed-waves:4``), ``module:Class``,
    ``file.py:Class``, or an object (returned as is).

    Raises:
        InputError: unknown name, unimportable module/file, a class that cannot be built or
            has none of the policy methods.
    """
    if not isinstance(spec, str):
        obj = spec
    else:
        name, _, arg = spec.partition(":")
        if name in BUILTINS:
            cls = BUILTINS[name]
            expected = {"fixed-waves": _FIXED_WAVES_EXPECTED, "block-m": "block-m:N with an integer N"}.get(name, name)
            try:
                obj = cls(parse_int(arg)) if arg else cls()
            except InputError:
                raise
            except (TypeError, ValueError):
                raise InputError("policy", expected, spec) from None
        else:
            cls = _load_class(spec)
            try:
                obj = cls()
            except Exception as exc:
                raise InputError(f"policy {spec}", "a class constructible with no arguments",
                                 f"{type(exc).__name__}: {exc}") from None
    kinds = [k for k, m in KIND_METHODS.items() if callable(getattr(obj, m, None))]
    require(bool(kinds), f"policy {policy_name(obj)}",
            "a method experts_per_wave(ctx), block_config(ctx), pull_order(counts) or block_list(ctx)",
            "none of them")
    return obj


def policies_from_specs(specs: list) -> Policies:
    """Assign each spec to the kind(s) its methods implement.

    Raises:
        InputError: two policies of the same kind.
    """
    out = Policies()
    for spec in specs or []:
        obj = make_policy(spec)
        for kind, meth in KIND_METHODS.items():
            if callable(getattr(obj, meth, None)):
                require(getattr(out, kind) is None, f"policy {policy_name(obj)}",
                        f"one {kind} policy", f"a second one (already {policy_name(getattr(out, kind))})")
                setattr(out, kind, obj)
    return out


# -- checked calls ----------------------------------------------------------------------
def _call(p, meth: str, *args):
    try:
        return getattr(p, meth)(*args)
    except InputError:
        raise
    except Exception as exc:
        raise InputError(f"policy {policy_name(p)}.{meth}", "to run", f"{type(exc).__name__}: {exc}") from None


def call_wave(p, ctx: WaveContext) -> int:
    v = _call(p, "experts_per_wave", ctx)
    require(isinstance(v, (int, np.integer)) and not isinstance(v, bool), f"policy {policy_name(p)}.experts_per_wave",
            "an int", type(v).__name__)
    require(1 <= v <= ctx.experts_per_rank, f"policy {policy_name(p)}.experts_per_wave",
            f"in [1, {ctx.experts_per_rank}]", int(v))
    return int(v)


def call_block_config(p, ctx: BlockContext):
    from .plan import CANDIDATE_BLOCK_M, BlockConfig

    v = _call(p, "block_config", ctx)
    require(isinstance(v, BlockConfig), f"policy {policy_name(p)}.block_config", "a BlockConfig",
            type(v).__name__)
    require(v.block_m in CANDIDATE_BLOCK_M, f"policy {policy_name(p)}.block_config",
            f"block_m in {CANDIDATE_BLOCK_M}", v.block_m)
    return v


def call_pull_order(p, counts: np.ndarray) -> np.ndarray:
    v = _call(p, "pull_order", counts)
    field_ = f"policy {policy_name(p)}.pull_order"
    require(isinstance(v, np.ndarray) and np.issubdtype(v.dtype, np.integer), field_,
            "an integer numpy array", type(v).__name__)
    n = int(np.sum(counts))
    require(v.shape == (n, 2), field_, f"shape [{n}, 2]", list(v.shape))
    for j, c in enumerate(np.asarray(counts).tolist()):
        got = np.sort(v[v[:, 0] == j, 1])
        require(len(got) == c and (got == np.arange(c)).all(), field_,
                f"each of rank {j}'s {c} tokens exactly once", "a different set")
    return v.astype(np.int64)


def call_block_list(p, ctx: ScheduleContext, reference: np.ndarray, pairs: bool = True) -> np.ndarray:
    v = _call(p, "block_list", ctx)
    field_ = f"policy {policy_name(p)}.block_list"
    require(isinstance(v, np.ndarray) and np.issubdtype(v.dtype, np.integer), field_,
            "an integer numpy array", type(v).__name__)
    require(v.ndim == 2 and v.shape[1] == 5, field_, "shape [N, 5]", list(v.shape))
    key = lambda a: sorted(map(tuple, a[:, :4].tolist()))
    require(len(v) == len(reference) and key(v) == key(reference), field_,
            f"every (phase, expert, m, n) block exactly once ({len(reference)} blocks)", f"{len(v)} rows")
    if pairs and len(v):
        a, b = v[0::2], v[1::2]
        require((a[:, :3] == b[:, :3]).all(), field_,
                "2-CTA pairs (rows 2i, 2i+1 share phase, expert and m block)", "a split pair")
    return v.astype(np.int32)
