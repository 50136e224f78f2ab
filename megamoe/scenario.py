"""A scenario: every input of one simulated (or executed) Mega MoE call.

``Scenario`` → :func:`Scenario.routing_ids` (``topk_idx`` per rank) → :func:`Scenario.plan`
(:class:`megamoe.plan.Plan`).  The default scenario is the main job's: DeepSeek-V4-Pro, EP8,
B200, 8192 tokens per rank, uniform routing, seed 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .errors import is_int, require, shown
from .plan import DESIGNS, Plan, build_plan
from .routing import RoutingSpec, check_ids, generate
from .shapes import MoEShape, get_shape

L2_WAITS = ("k_block", "pool_block")

DEFAULT_MAX_TOKENS = 8192  # DeepGEMM tests/test_mega_moe.py default num_max_tokens_per_rank
MAX_LAUNCH_SKEW_US = 100_000.0  # 0.1 s: far beyond launch jitter, and bounded memory (see Scenario)
#: Most tokens per rank (and buffer size) a scenario takes: the simulator keeps ~20 KB per
#: routed token (262,144 tokens per rank measured at 5.3 GB and 35 s on the CI machine), so
#: this bounds one rank's share; the whole simulation is bounded by ``MAX_ROUTED_SLOTS``,
#: ``MAX_RANKS_X_EXPERTS`` and ``sim.engine.MAX_BLOCKS`` (all three at their limits: 1024
#: ranks x 1024 experts, 12.6 M slots, 7.9 M blocks measured 9.7 GB and 2 min). Prefill
#: chunks of 128 K tokens per GPU are far beyond the published MegaMoE measurements
#: (DeepGEMM PR #316: up to 8,192 per rank).
MAX_TOKENS_PER_RANK = 131_072
#: Most routed slots (tokens summed over the ranks x top_k) a scenario takes, checked before
#: anything is allocated: the simulator's memory and time grow with them. 16 ranks x 131,072
#: tokens x top-k 6 measured 5.5 GB and 43 s on the CI machine (24 GB, 2 cores); 256 ranks x
#: 8192 tokens x 6, 7.8 GB and 87 s.
MAX_ROUTED_SLOTS = 12_582_912
#: Most ranks x experts: the plan keeps one source list per (expert, source rank) and the
#: simulator processes per SM of every rank. 1024 ranks x 1024 experts measured 1.0 GB
#: (4096 x 4096: 6.9 GB).
MAX_RANKS_X_EXPERTS = 1_048_576


def skew_in_range(v: float) -> bool:
    """A launch skew the model takes: finite microseconds in ``[0, MAX_LAUNCH_SKEW_US]``
    (the CLI, the sweep and :class:`Scenario` check with this)."""
    return math.isfinite(v) and 0 <= v <= MAX_LAUNCH_SKEW_US


def _skew_values(skew) -> tuple[bool, list]:
    """``launch_skew_us`` as (given as a list?, its values): a list, tuple or 1-D array, or one number."""
    if isinstance(skew, (list, tuple)) or (isinstance(skew, np.ndarray) and skew.ndim > 0):
        return True, list(skew)
    return False, [skew.item() if isinstance(skew, np.ndarray) else skew]


def check_tokens_per_rank(t) -> None:
    """One rank's token count as a scenario (and ``megamoe run``) takes it: an integer in
    ``[0, MAX_TOKENS_PER_RANK]`` (64.5, '64', NaN or True refused, not rounded).

    Raises:
        InputError: ``tokens``, naming the value as given.
    """
    require(is_int(t) and 0 <= t <= MAX_TOKENS_PER_RANK, "tokens",
            f"integers in [0, {MAX_TOKENS_PER_RANK}] per rank", shown(t))


@dataclass
class Scenario:
    """Inputs of one call.

    Integer fields take ``int`` or numpy integers (kept as the same ``int``), never ``bool``,
    ``float`` or strings: nothing is rounded or parsed.

    Attributes:
        shape: preset name, ``E,k,H,I`` string or :class:`MoEShape`.
        num_ranks: EP size R, an integer >= 1 dividing the expert count.
        tokens_per_rank: ``T`` for every rank, or a list / tuple / 1-D array with one ``T_r``
            per rank, integers in ``[0, MAX_TOKENS_PER_RANK]`` (default 8192, or what the
            routing file / ``topk_idx`` holds).
        max_tokens_per_rank: ``T_max`` (buffer size), an integer in ``[1,
            MAX_TOKENS_PER_RANK]``; default ``max(8192, max T_r)``.
        routing: :class:`RoutingSpec` or its CLI spelling (a string).
        seed: seed of the routing and of the simulator's block jitter (hardware figure
            ``block_jitter``), an integer >= 0.
        hardware: preset name (``b200``, ``h200``, ``h100``, ``h20``) or TOML path, a non-empty string
            (resolved by ``sim.hardware.load_hardware`` when simulated; an unknown name is
            refused there, on ``hardware``).
        design: ``deepgemm-sm100`` (reference) or ``megamoe-sm90`` (this project's kernel).
        experts_per_wave, block_m, pool_tokens, num_stages: plan overrides, integers >= 1
            (None = heuristic).
        l2_wait: ``k_block`` (PR #304) or ``pool_block`` (PR #316).
        k_split: ``megamoe-sm90`` what-if: split every block's K blocks into this many parts on
            consecutive block indices (split-K, :meth:`megamoe.plan.RankPlan.blocks`); None or 1:
            no split, as the kernel is built. An integer >= 1 dividing ``hidden / 128`` and
            ``intermediate / 128`` (checked by :meth:`plan`).
        wgmma_n_step: ``megamoe-sm90`` what-if: each block's WGMMAs (the tokens are their N) cover
            its valid rows rounded up to this many tokens, a multiple of 8 from 8 to 128 (checked
            by :meth:`plan`; at or above a block_m, whole blocks); None: the built kernel's
            (:data:`megamoe.design_sm90.WGMMA_N_STEP`, :attr:`megamoe.plan.RankPlan.wgmma_n_step`).
        ctas_per_sm: ``megamoe-sm90``: CTAs sharing one SM, None (the rule,
            :func:`megamoe.design_sm90.ctas_per_sm`: two at block_m 16 and one rank where the one-CTA
            wave rule gives at most 128 experts per wave, kernel v9.2), 1, or 2 where the kernel has
            that instance (block_m 16, one rank).
        combine_relay: ``megamoe-sm90`` what-if with one rank: True sums each token's 128-column
            slice while the GEMMs run and ends the call without a grid sync
            (:class:`megamoe.plan.RankPlan`); None or False: the combine after the final barrier,
            as the kernel is built.
        reserved_sms: SMs taken away from the kernel (e.g. for a shared expert), an integer
            >= 0 (its upper bound depends on the GPU: :meth:`plan` checks it).
        policies: a list (or tuple) of policy specs or objects (:mod:`megamoe.policies`)
            replacing reference heuristics: built-in names, ``module:Class``, ``file.py:Class``.
        topk_idx: explicit ids per rank (Python API; overrides ``routing``).
        launch_skew_us: when each rank's kernel starts, in microseconds (host launch jitter,
            outside the kernel): a list of one value per rank (only differences matter), or
            one number: how late the last rank starts (the others at 0). The ranks meet at
            the first NVLink barrier, so a late rank makes the others wait. Default 0; at most
            ``MAX_LAUNCH_SKEW_US`` (the bandwidth model keeps a time slot from 0 to the end of
            the latest rank, so memory grows with the skew: 1 s of skew takes ~1.3 GB).

    Raises:
        InputError: bad field (one-line message naming it: ``shape``, ``ranks``, ``tokens``,
            ``max_tokens``, ``routing`` / ``routing.<param>``, ``seed``, ``hardware``,
            ``design``, ``l2_wait``, ``reserved_sms``, ``experts_per_wave``, ``block_m``,
            ``pool_tokens``, ``num_stages``, ``k_split``, ``wgmma_n_step``, ``combine_relay``, ``ctas_per_sm``,
            ``policies`` /
            ``policy ...``,
            ``topk_idx[r]``,
            ``launch_skew_us``); the CLI's names are used for ``num_ranks`` (``ranks``),
            ``tokens_per_rank`` (``tokens``) and ``max_tokens_per_rank`` (``max_tokens``).
    """

    shape: str | MoEShape = "deepseek-v4-pro"
    num_ranks: int = 8
    tokens_per_rank: int | list[int] | None = None
    max_tokens_per_rank: int | None = None
    routing: str | RoutingSpec = "uniform"
    seed: int = 0
    hardware: str = "b200"
    design: str = "deepgemm-sm100"
    experts_per_wave: int | None = None
    block_m: int | None = None
    pool_tokens: int | None = None
    num_stages: int | None = None
    l2_wait: str = "k_block"
    k_split: int | None = None
    wgmma_n_step: int | None = None
    combine_relay: bool | None = None
    ctas_per_sm: int | None = None
    reserved_sms: int = 0
    policies: list = field(default_factory=list)
    topk_idx: list[np.ndarray] | None = field(default=None, repr=False)
    launch_skew_us: float | list[float] = 0.0

    def __post_init__(self) -> None:
        require(isinstance(self.shape, (str, MoEShape)), "shape",
                "a preset name, an E,k,H,I string or a MoEShape", self.shape)
        self.shape = get_shape(self.shape)
        require(isinstance(self.routing, (str, RoutingSpec)), "routing",
                "a RoutingSpec or its CLI spelling (e.g. 'uniform', 'zipf:1.2')", self.routing)
        if isinstance(self.routing, str):
            self.routing = RoutingSpec.parse(self.routing)
        require(is_int(self.seed) and self.seed >= 0, "seed", "an integer >= 0", shown(self.seed))
        require(isinstance(self.hardware, str) and bool(self.hardware), "hardware",
                "a preset name (b200, h100, h20, h200) or a .toml path", shown(self.hardware))
        require(isinstance(self.design, str) and self.design in DESIGNS, "design", " or ".join(DESIGNS),
                self.design)
        require(isinstance(self.l2_wait, str) and self.l2_wait in L2_WAITS, "l2_wait", " or ".join(L2_WAITS),
                self.l2_wait)
        require(is_int(self.num_ranks) and self.num_ranks >= 1, "ranks", "an integer >= 1",
                shown(self.num_ranks))
        given = self.tokens_per_rank
        if isinstance(given, np.ndarray):
            require(given.ndim == 1, "tokens", "one integer or a 1-D list with one per rank",
                    f"an array of shape {list(given.shape)}")
        # the raw values, before anything converts them: 64.5, '64', NaN or True are refused, not rounded
        for t in [] if given is None else list(given) if isinstance(given, (list, tuple, np.ndarray)) else [given]:
            check_tokens_per_rank(t)
        require(self.shape.num_experts % self.num_ranks == 0, "ranks",
                f"a divisor of the expert count {self.shape.num_experts}", self.num_ranks)
        E = self.shape.num_experts
        require(self.num_ranks * E <= MAX_RANKS_X_EXPERTS, "ranks",
                f"ranks x experts <= {MAX_RANKS_X_EXPERTS} (the simulator's memory grows with them)",
                f"{self.num_ranks} x {E} = {self.num_ranks * E}")
        if self.topk_idx is not None:
            ids, R = self.topk_idx, self.num_ranks
            got = f"{len(ids)} array{'s' if len(ids) != 1 else ''}" if isinstance(ids, (list, tuple)) \
                else type(ids).__name__
            require(isinstance(ids, (list, tuple)) and len(ids) == R, "topk_idx",
                    f"a list of {R} array{'s' if R != 1 else ''} (one per rank)", got)
            self.topk_idx = [check_ids(a, f"topk_idx[{r}]", E, self.shape.top_k) for r, a in enumerate(ids)]
        if self.topk_idx is not None or self.routing.kind == "file":
            if self.topk_idx is None:
                self._ids = generate(self.routing, self.num_ranks, [], self.shape.num_experts,
                                     self.shape.top_k, self.seed)
            ids = self.topk_idx if self.topk_idx is not None else self._ids
            self.tokens_per_rank = [int(len(t)) for t in ids]
            if given is not None:
                want = list(given) if isinstance(given, (list, tuple, np.ndarray)) else [given] * self.num_ranks
                require(list(want) == self.tokens_per_rank, "tokens",
                        f"the routing's own token counts {self.tokens_per_rank} (or leave it out)", given)
        elif given is None:
            self.tokens_per_rank = 8192
        toks = self.tokens_list()
        require(len(toks) == self.num_ranks, "tokens",
                f"{self.num_ranks} value{'s' if self.num_ranks != 1 else ''} (one per rank)", len(toks))
        k, slots = self.shape.top_k, sum(toks) * self.shape.top_k
        require(slots <= MAX_ROUTED_SLOTS, "tokens",
                f"ranks x tokens per rank x top_k <= {MAX_ROUTED_SLOTS} routed slots (the simulator's memory grows "
                "with them: 16 ranks x 131072 tokens x 6 took 5.5 GB)",
                f"{self.num_ranks} x {toks[0]} x {k} = {slots}" if len(set(toks)) == 1
                else f"{sum(toks)} tokens x {k} = {slots}")
        if self.max_tokens_per_rank is None:
            self.max_tokens_per_rank = max([DEFAULT_MAX_TOKENS, *toks])
        require(is_int(self.max_tokens_per_rank)
                and 1 <= self.max_tokens_per_rank <= MAX_TOKENS_PER_RANK, "max_tokens",
                f"an integer in [1, {MAX_TOKENS_PER_RANK}]", shown(self.max_tokens_per_rank))
        require(max(toks) <= self.max_tokens_per_rank, "tokens",
                f"<= max_tokens ({self.max_tokens_per_rank})", max(toks))
        require(is_int(self.reserved_sms) and self.reserved_sms >= 0, "reserved_sms", "an integer >= 0", shown(self.reserved_sms))
        is_list, vals = _skew_values(self.launch_skew_us)
        for v in vals:
            require(isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)
                    and skew_in_range(v), "launch_skew_us",
                    f"numbers in [0, {MAX_LAUNCH_SKEW_US:g}] (microseconds)", v)
        R = self.num_ranks
        require(not is_list or len(vals) == R, "launch_skew_us",
                f"one number or a list of {R} value{'s' if R > 1 else ''} (one per rank)",
                f"{len(vals)} value{'s' if len(vals) != 1 else ''}")
        require(R > 1 or vals[0] == 0, "launch_skew_us",
                "0 with one rank (there is no other rank to be late against)", vals[0])
        from .policies import policies_from_specs, policy_name

        require(isinstance(self.policies, (list, tuple)), "policies",
                "a list of policy specs or objects (e.g. ['rank-by-rank'])", self.policies)
        self._policies = policies_from_specs(self.policies)
        for name in ("experts_per_wave", "block_m", "pool_tokens", "num_stages", "k_split", "wgmma_n_step"):
            v = getattr(self, name)
            require(v is None or (is_int(v) and v >= 1), name, "a positive integer", shown(v))
        require(self.combine_relay in (None, False, True), "combine_relay", "None, False or True",
                shown(self.combine_relay))
        require(self.ctas_per_sm is None or (is_int(self.ctas_per_sm) and self.ctas_per_sm in (1, 2)), "ctas_per_sm",
                "1 or 2 (or unset: the kernel's rule)", shown(self.ctas_per_sm))
        # checked integers: a numpy integer is kept as the same Python int (JSON-able in to_dict)
        for name in ("num_ranks", "seed", "max_tokens_per_rank", "reserved_sms", "experts_per_wave", "block_m",
                     "pool_tokens", "num_stages", "k_split", "wgmma_n_step", "ctas_per_sm"):
            if isinstance(getattr(self, name), np.integer):
                setattr(self, name, int(getattr(self, name)))
        # one source per decision: a fixed override and a policy for the same choice conflict
        for name, kind in (("block_m", "block_config"), ("experts_per_wave", "wave")):
            pol = getattr(self._policies, kind, None)
            require(getattr(self, name) is None or pol is None, name,
                    f"either a fixed {name} or a {kind} policy, not both",
                    f"{getattr(self, name)} and policy {policy_name(pol) if pol else ''}")

    def tokens_list(self) -> list[int]:
        """``T_r`` for every rank."""
        t = self.tokens_per_rank
        return [int(x) for x in t] if isinstance(t, (list, tuple, np.ndarray)) else [int(t)] * self.num_ranks

    def launch_offsets_us(self) -> list[float]:
        """Each rank's launch time after the earliest rank's, microseconds
        (``launch_skew_us``; only differences matter, so a list is shifted to start at 0)."""
        is_list, vals = _skew_values(self.launch_skew_us)
        if is_list:
            vals = [float(v) for v in vals]
            return [v - min(vals) for v in vals]
        return [0.0] * (self.num_ranks - 1) + [float(vals[0])]

    def routing_ids(self) -> list[np.ndarray]:
        """``topk_idx`` per rank (int64 ``[T_r, k]``, ``-1`` masked), cached."""
        if self.topk_idx is not None:
            return self.topk_idx
        if not hasattr(self, "_ids"):
            self._ids = generate(self.routing, self.num_ranks, self.tokens_list(),
                                 self.shape.num_experts, self.shape.top_k, self.seed)
        return self._ids

    def usable_sms(self, num_sms: int) -> int:
        """The SMs the kernel gets on a GPU with ``num_sms``: all but ``reserved_sms`` (the
        plan's ``num_sms``).

        Raises:
            InputError: ``reserved_sms`` leaves fewer than 2.
        """
        usable = num_sms - self.reserved_sms
        require(usable >= 2, "reserved_sms", f"<= {num_sms - 2} (at least 2 SMs must remain)",
                self.reserved_sms)
        return usable

    def plan(self, num_sms: int, smem_capacity: int) -> Plan:
        """Build the plan for a GPU with ``num_sms`` SMs (before reserving ``reserved_sms``).

        Raises:
            InputError: overrides the design cannot take, or too many reserved SMs.
        """
        usable = self.usable_sms(num_sms)
        s = self.shape
        return build_plan(num_experts=s.num_experts, top_k=s.top_k, hidden=s.hidden,
                          intermediate=s.intermediate, num_ranks=self.num_ranks,
                          tokens_per_rank=self.tokens_list(),
                          max_tokens_per_rank=self.max_tokens_per_rank,
                          topk_idx=self.routing_ids(), num_sms=usable, smem_capacity=smem_capacity,
                          design=self.design, experts_per_wave=self.experts_per_wave,
                          block_m=self.block_m, pool_tokens=self.pool_tokens,
                          num_stages=self.num_stages, l2_wait=self.l2_wait, k_split=self.k_split,
                          combine_relay=self.combine_relay, policies=self._policies, ctas_per_sm=self.ctas_per_sm,
                          wgmma_n_step=self.wgmma_n_step)

    def to_dict(self) -> dict:
        """Every input as plain JSON types."""
        s = self.shape
        return {
            "shape": s.name, "num_experts": s.num_experts, "top_k": s.top_k, "hidden": s.hidden,
            "intermediate": s.intermediate, "num_ranks": self.num_ranks,
            "tokens_per_rank": self.tokens_list(), "max_tokens_per_rank": self.max_tokens_per_rank,
            "routing": self.routing.describe(), "seed": self.seed, "hardware": self.hardware,
            "design": self.design, "experts_per_wave": self.experts_per_wave,
            "block_m": self.block_m, "pool_tokens": self.pool_tokens, "num_stages": self.num_stages,
            "l2_wait": self.l2_wait, "k_split": self.k_split, "wgmma_n_step": self.wgmma_n_step,
            "combine_relay": self.combine_relay,
            "ctas_per_sm": self.ctas_per_sm,
            "reserved_sms": self.reserved_sms,
            "policies": self._policies.names(), "launch_skew_us": self.launch_offsets_us(),
        }
