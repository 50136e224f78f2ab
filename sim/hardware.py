"""Hardware models loaded from TOML files, each figure with its source.

A hardware file has a ``name``, a ``[figures]`` table and a ``[sources]`` table with one
entry (a string naming where the number comes from) for every figure.  Presets live in
``sim/hardware/*.toml`` (``b200``, ``h200``, ``h20``); ``load_hardware`` takes a preset
name or a path.

Figures (units in the key names):

* ``num_sms``, ``clock_ghz``, ``smem_per_block_bytes``, ``l2_cache_bytes``
* ``fp8_dense_tflops`` — peak dense FP8 tensor-core rate of the GPU; ``mma_efficiency`` —
  fraction of it a block-scaled FP8xFP4 K loop sustains.
* ``hbm_gbs`` — HBM bandwidth (GB/s, bytes read + written); ``hbm_efficiency``.
* ``sm_load_gbs`` — most one SM's TMA engine moves per second.
* ``nvlink_gbs_per_direction`` — NVLink bandwidth of one GPU in one direction (all links);
  ``nvlink_efficiency``; ``nvlink_latency_ns`` — one remote access round trip (the SM90 EP
  pull pays it per dependent remote load on top of the local pull, so where it is fitted to
  kernel traces it is the excess of a remote load over a local one).
* ``nvlink_peer_gbs`` — most one directed GPU pair can carry (equal to the port through a
  switch; a fraction of it with point-to-point links).
* ``launch_ns``, ``grid_sync_ns``, ``nvl_barrier_ns``, ``atomic_same_address_ns``,
  ``tma_latency_ns``, ``pull_latency_ns``
* ``l1_epilogue_thread_ns_per_elem``, ``l2_epilogue_thread_ns_per_elem`` — epilogue cost per
  accumulator element per epilogue thread.
* ``block_overhead_ns`` — fixed cost of one block hand-off (scheduler step, barrier phase
  flips, TMEM full/empty, arrival-mask release), spread over the K loop and the epilogue.
* ``sm90_mma_fraction`` — SM90 design: the rate of this project's SM90 kernel's matrix path
  (FP8 WGMMA plus the per-32-K FP32 promotion of the UE8M0 scales) as a fraction of the
  sustained FP8 GEMM rate (``fp8_dense_tflops x mma_efficiency``); unused by the SM100
  reference design, whose UMMA K loop runs at the sustained rate.
* ``e2m1_decode_thread_ns_per_elem`` — SM90 design: the consumers' per-stage preparation
  before the MMA, per element per consumer thread (kernel v4: the E2M1 -> E4M3 decode into
  shared memory; v5 decodes into the WGMMA registers inside the MMA phase, and this term is
  the token-scale table and the warpgroup barrier, fitted from the per-role profile).
* ``stage_handoff_ns`` — SM90 design: fixed cost of one pipeline stage (barrier waits and
  releases between producer and consumers, the fixed part of the WGMMA wait and promotion),
  paid per K block.
* ``sm90_issue_kblock_ns`` — SM90 design: the producer's time to issue one K block's loads
  (token tile, scales, FP4 weights and their scales) once its stage is free; a block's last
  copy issue comes no earlier than ``K blocks x`` this after its first, and this long after
  the consumers free the stage a ring back.  Close to the consumers' K-block time, so with
  an empty ring (a CTA's first block, a block after few others) the producer runs barely
  ahead of the consumers.
* ``sched_block_ns``, ``sched_step_ns`` — SM90 design: the block scheduler between two blocks
  of one CTA (paid by the producer and by the consumers, each running its own copy): a
  fixed part per block (the scheduler call, the trace records, the accumulator reset) plus
  one step for every non-empty expert the scheduler walks past and every phase switch of a
  wave (``csrc/megamoe/scheduler.cuh``); also after the last block, to the end of the list.
* ``l2_epilogue_fixed_ns`` — SM90 design: fixed part of the L2 epilogue (the row-metadata
  round trips); the SM90 L2 epilogue is this plus ``l2_epilogue_thread_ns_per_elem`` per
  element of the block's rows and again per element of its valid (stored) rows.
* ``l2_epilogue_ep_ns`` — SM90 design with several ranks: added to every L2 epilogue.  The
  kernel then stores each row, this rank's too, into its source rank's combine buffer
  through the symmetric-memory peer table: the stores wait for the destination's base
  address, a load that depends on the row's source rank.  Which rank the rows go to does not
  change the time (the stores are posted).
* ``combine_round_ns`` — SM90 design: one grid-stride round of the combine (every thread
  sums the top-k BF16 copies of one 16-byte slice of a token); the combine takes
  ``ceil(tokens x hidden / 8 / (SMs x 512 threads))`` rounds, or the HBM time if longer.
* ``legacy_launch_ns`` — per-kernel launch gap of the unfused path.
* ``legacy_a2a_latency_ns`` — fixed latency of each DeepEP all-to-all (dispatch, combine) of
  the unfused path beyond its bytes and barrier: notify round, layout and CPU-side sync.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path

from megamoe.errors import InputError, require
from megamoe.plan import MAX_SMS

PRESET_DIR = Path(__file__).parent / "hardware"


@dataclass(frozen=True)
class Hardware:
    """One GPU model (see module docstring for units).  All figures are positive."""

    name: str
    num_sms: int
    clock_ghz: float
    smem_per_block_bytes: int
    l2_cache_bytes: int
    fp8_dense_tflops: float
    mma_efficiency: float
    hbm_gbs: float
    hbm_efficiency: float
    sm_load_gbs: float
    nvlink_gbs_per_direction: float
    nvlink_peer_gbs: float
    nvlink_efficiency: float
    nvlink_latency_ns: float
    launch_ns: float
    grid_sync_ns: float
    nvl_barrier_ns: float
    atomic_same_address_ns: float
    tma_latency_ns: float
    pull_latency_ns: float
    l1_epilogue_thread_ns_per_elem: float
    l2_epilogue_thread_ns_per_elem: float
    block_overhead_ns: float
    sm90_mma_fraction: float
    e2m1_decode_thread_ns_per_elem: float
    stage_handoff_ns: float
    sm90_issue_kblock_ns: float
    sched_block_ns: float
    sched_step_ns: float
    l2_epilogue_fixed_ns: float
    l2_epilogue_ep_ns: float
    combine_round_ns: float
    legacy_launch_ns: float
    legacy_a2a_latency_ns: float
    sources: dict
    path: str = ""

    # derived rates -------------------------------------------------------------
    @property
    def tc_flops_per_ns_per_sm(self) -> float:
        """Sustained tensor-core FLOP per ns of one SM."""
        return self.fp8_dense_tflops * 1e3 * self.mma_efficiency / self.num_sms

    @property
    def hbm_bytes_per_ns(self) -> float:
        return self.hbm_gbs * self.hbm_efficiency

    @property
    def nvlink_bytes_per_ns(self) -> float:
        return self.nvlink_gbs_per_direction * self.nvlink_efficiency

    @property
    def sm_load_bytes_per_ns(self) -> float:
        return self.sm_load_gbs

    def scaled(self, **factors: float) -> "Hardware":
        """A copy with figures multiplied (``hbm_gbs=0.5`` halves HBM bandwidth)."""
        vals = {f.name: getattr(self, f.name) for f in fields(self)}
        for k, v in factors.items():
            require(k in vals and isinstance(vals[k], (int, float)) and k != "num_sms", "hardware scale",
                    "a numeric figure name", k)
            require(v > 0, f"hardware.{k} scale", "> 0", v)
            vals[k] = type(vals[k])(vals[k] * v)
        return Hardware(**vals)


_FIGURES = [f.name for f in fields(Hardware) if f.name not in ("name", "sources", "path")]
_INTS = {"num_sms", "smem_per_block_bytes", "l2_cache_bytes"}
_FRACTIONS = {"mma_efficiency", "hbm_efficiency", "nvlink_efficiency", "sm90_mma_fraction"}


def parse_hardware(data: dict, path: str = "<dict>") -> Hardware:
    """Validate a parsed hardware TOML document.

    Raises:
        InputError: missing or non-numeric figure, a figure <= 0 (e.g. a negative bandwidth),
            an efficiency above 1, or a figure without a source.
    """
    require(isinstance(data.get("name"), str), "hardware.name", "a string", data.get("name"))
    figs = data.get("figures")
    require(isinstance(figs, dict), "hardware.figures", "a [figures] table", type(figs).__name__)
    srcs = data.get("sources", {})
    vals = {}
    for k in _FIGURES:
        require(k in figs, f"hardware.figures.{k}", "a number", "missing")
        v = figs[k]
        require(isinstance(v, (int, float)) and not isinstance(v, bool), f"hardware.figures.{k}",
                "a number", v)
        require(v > 0, f"hardware.figures.{k}", "a positive number", v)
        if k in _INTS:
            require(float(v).is_integer(), f"hardware.figures.{k}", "an integer", v)
            v = int(v)
        if k == "num_sms":
            require(2 <= v <= MAX_SMS, f"hardware.figures.{k}", f"an integer in [2, {MAX_SMS}]", v)
        if k in _FRACTIONS:
            require(v <= 1.0, f"hardware.figures.{k}", "a fraction in (0, 1]", v)
        require(isinstance(srcs.get(k), str) and srcs[k].strip() != "", f"hardware.sources.{k}",
                "a source string", srcs.get(k, "missing"))
        vals[k] = float(v) if k not in _INTS else v
    unknown = sorted(set(figs) - set(_FIGURES))
    require(not unknown, "hardware.figures", f"only {', '.join(_FIGURES)}", ", ".join(unknown))
    return Hardware(name=data["name"], sources=dict(srcs), path=path, **vals)


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.toml"))


def load_hardware(spec: str) -> Hardware:
    """Load a preset (``b200``, ``h200``, ``h20``; case-insensitive) or a TOML path.

    Raises:
        InputError: unknown preset, unreadable file, or an invalid figure.
    """
    p = PRESET_DIR / f"{spec.lower()}.toml"
    if not p.exists():
        p = Path(spec)
        require(spec.endswith(".toml") or os.sep in spec, "hardware",
                f"a preset ({', '.join(preset_names())}) or a .toml path", spec)
        require(p.is_file(), "hardware", "an existing TOML file", spec)
    try:
        data = tomllib.loads(p.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise InputError("hardware", "valid TOML", f"{p}: {exc}") from None
    except OSError as exc:
        raise InputError("hardware", "a readable .toml file", f"{p} ({exc.strerror})") from None
    return parse_hardware(data, str(p))
