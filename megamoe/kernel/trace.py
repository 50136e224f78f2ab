"""Decode the kernel's in-kernel trace into the shared trace schema.

Each CTA writes 48-byte records (``trace_record`` in ``csrc/megamoe/common.cuh``): u32 sm,
u32 role<<16|kind, i32 expert, m_block, n_block, wave, tokens, cta, u64 t_start_ns,
u64 t_end_ns. Times come from ``%globaltimer`` (a device-wide nanosecond clock shared by all
SMs, so no per-SM alignment is needed; its update granularity is measured by the benchmark
and reported in benchmarks/NOTES_kernel.md). Decoded times are relative to the earliest
record of the launch.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import require

TRACE_ROLES = ("dispatch", "producer", "consumer")
TRACE_KINDS = ("count", "index_exchange", "grid_sync", "nvl_barrier", "pull", "l1_load", "l1_mma",
               "l1_epilogue", "l2_load", "l2_mma", "l2_epilogue", "combine", "idle_wait")

RECORD_DTYPE = np.dtype([("sm", "<u4"), ("role_kind", "<u4"), ("expert", "<i4"), ("m_block", "<i4"),
                         ("n_block", "<i4"), ("wave", "<i4"), ("tokens", "<i4"), ("cta", "<i4"),
                         ("t_start_ns", "<u8"), ("t_end_ns", "<u8")])


def trace_capacity(design, inter: int, hidden: int, num_sms: int, fixed: int) -> int:
    """Records each CTA may write: a generous bound of 4 per block (load, MMA, epilogue, wait)
    over the pool's L1 and L2 blocks shared by ``num_sms`` CTAs, plus ``fixed`` rank-level
    records (dispatch phases, barriers, combine) and 64 of slack."""
    blocks = (design.pool_rows // design.block_m) * (2 * inter // 128 + hidden // 128)
    return int(fixed + 4 * math.ceil(blocks / num_sms) + 64)


def record_ranges(bottom: int, top: int, trace_cap: int) -> tuple[range, range, int]:
    """The slots of one CTA's record buffer that hold its records, and how many records were
    lost: ``(bottom slots, top slots, dropped)``.

    ``bottom``: records reserved from slot 0 up (every role's ``trace_reserve``, first row of
    ``trace_count``); ``top``: records the SM90 consumer's recording thread wrote from slot
    ``trace_cap - 1`` down, two a block (second row; kernel v9.13). Records past the capacity
    were never written; a slot both sides reached holds either record, so neither side keeps
    it.

    Raises:
        InputError: a negative count or a capacity below 1.
    """
    require(bottom >= 0 and top >= 0, "bottom, top", "non-negative record counts", (bottom, top))
    require(trace_cap >= 1, "trace_cap", "a record capacity >= 1", trace_cap)
    lo, hi = min(bottom, trace_cap), min(top, trace_cap)
    overlap = max(0, lo + hi - trace_cap)
    kept_bottom = range(0, lo - overlap)
    kept_top = range(trace_cap - hi + overlap, trace_cap)
    return kept_bottom, kept_top, bottom + top - len(kept_bottom) - len(kept_top)


def _count_rows(counts: np.ndarray, num_ctas: int) -> np.ndarray:
    """``counts`` as ``int64 [2, num_ctas]`` (a 1-D ``[num_ctas]`` array: every record from the
    bottom, the top row zero)."""
    c = np.asarray(counts).astype(np.int64)
    if c.ndim == 1:
        c = np.stack([c, np.zeros_like(c)])
    require(c.shape == (2, num_ctas), "counts", f"shape ({num_ctas},) or (2, {num_ctas})", tuple(np.shape(counts)))
    return c


def decode_trace(raw: np.ndarray, counts: np.ndarray, trace_cap: int, rank: int = 0) -> list[dict]:
    """Decode one launch's records.

    Args:
        raw: uint64 ``[num_ctas, trace_cap, 6]``, the record buffer.
        counts: the ``trace_count`` buffer, ``[2, num_ctas]`` (per CTA the records from the
            bottom of its slots, then those from the top: :func:`record_ranges`), or
            ``[num_ctas]`` when every record was reserved from the bottom.
        trace_cap: records per CTA.
        rank: the rank the records are tagged with.

    Returns records of the shared schema (rank, sm, role, kind, expert, m_block, n_block,
    wave, t_start_ns, t_end_ns, tokens, cta), sorted by start time. Records that did not fit
    ``trace_cap`` are left out (``dropped`` is reported by
    :meth:`MegaMoEKernel.last_trace_dropped`).

    Raises:
        InputError: ``counts`` of another shape, or a record whose role or kind is out of range
            (a slot the kernel did not write).
    """
    raw = np.ascontiguousarray(raw, dtype=np.uint64)
    recs = raw.view(RECORD_DTYPE).reshape(raw.shape[0], trace_cap)
    rows = _count_rows(counts, raw.shape[0])
    out = []
    for c in range(raw.shape[0]):
        bottom, top, _ = record_ranges(int(rows[0, c]), int(rows[1, c]), trace_cap)
        kept = np.concatenate([recs[c, bottom.start:bottom.stop], recs[c, top.start:top.stop]])
        roles, kinds = kept["role_kind"] >> 16, kept["role_kind"] & 0xFFFF
        bad = np.flatnonzero((roles >= len(TRACE_ROLES)) | (kinds >= len(TRACE_KINDS)))
        require(bad.size == 0, "trace record", f"a role < {len(TRACE_ROLES)} and a kind < {len(TRACE_KINDS)} (CTA {c})",
                (int(roles[bad[0]]), int(kinds[bad[0]])) if bad.size else None)
        for r, role, kind in zip(kept, roles.tolist(), kinds.tolist()):
            out.append(dict(rank=rank, sm=int(r["sm"]), role=TRACE_ROLES[role], kind=TRACE_KINDS[kind],
                            expert=int(r["expert"]), m_block=int(r["m_block"]), n_block=int(r["n_block"]),
                            wave=int(r["wave"]), t_start_ns=int(r["t_start_ns"]), t_end_ns=int(r["t_end_ns"]),
                            tokens=int(r["tokens"]), cta=int(r["cta"])))
    if out:
        t0 = min(r["t_start_ns"] for r in out)
        for r in out:
            r["t_start_ns"] -= t0
            r["t_end_ns"] -= t0
    out.sort(key=lambda r: (r["t_start_ns"], r["cta"]))
    return out


def trace_dropped(counts: np.ndarray, trace_cap: int) -> int:
    """Records of a launch that its CTAs' capacity did not keep (:func:`record_ranges`), from the
    ``trace_count`` buffer (shapes as :func:`decode_trace`)."""
    rows = _count_rows(counts, np.shape(counts)[-1])
    return sum(record_ranges(int(b), int(t), trace_cap)[2] for b, t in zip(rows[0], rows[1]))


def block_order(records: list[dict]) -> dict[int, list[tuple]]:
    """Per CTA, the (phase, expert, m_block, n_block) sequence its consumers executed."""
    seq: dict[int, list[tuple]] = {}
    for r in sorted(records, key=lambda r: (r["cta"], r["t_start_ns"])):
        if r["role"] == "consumer" and r["kind"] in ("l1_mma", "l2_mma"):
            seq.setdefault(r["cta"], []).append((1 if r["kind"] == "l1_mma" else 2, r["expert"], r["m_block"],
                                                 r["n_block"]))
    return seq


def to_chrome(records: list[dict]) -> dict:
    """Chrome trace event JSON (pid = rank, tid = sm * 3 + role), microseconds."""
    ev = []
    seen = set()
    for r in records:
        tid = r["sm"] * 3 + TRACE_ROLES.index(r["role"])
        if (r["rank"], tid) not in seen:
            seen.add((r["rank"], tid))
            ev.append({"ph": "M", "name": "thread_name", "pid": r["rank"], "tid": tid,
                       "args": {"name": f"SM{r['sm']} {r['role']}"}})
        ev.append({"ph": "X", "name": r["kind"], "pid": r["rank"], "tid": tid, "ts": r["t_start_ns"] / 1e3,
                   "dur": max(r["t_end_ns"] - r["t_start_ns"], 0) / 1e3,
                   "args": {k: r[k] for k in ("expert", "m_block", "n_block", "wave", "tokens")}})
    for rank in sorted({r["rank"] for r in records}):
        ev.append({"ph": "M", "name": "process_name", "pid": rank, "args": {"name": f"rank {rank}"}})
    return {"traceEvents": ev, "displayTimeUnit": "ns"}


def record_buffers(owner, num_ctas: int, cap: int):
    """A kernel's trace record buffers ``(int64 [num_ctas, cap, 6], int32 [2, num_ctas] counts)``
    on ``owner.device``, allocated once per size and reused (no allocation while ranks launch
    concurrently); the counts (:func:`record_ranges`) are zeroed, slots outside a CTA's counted
    ranges are never read."""
    torch = owner.torch
    if getattr(owner, "_tr_key", None) != (num_ctas, cap):
        owner._tr = (torch.empty(num_ctas, cap, 6, dtype=torch.int64, device=owner.device),
                     torch.zeros(2, num_ctas, dtype=torch.int32, device=owner.device))
        owner._tr_key = (num_ctas, cap)
    owner._tr[1].zero_()
    return owner._tr


def fetch_records(owner, rank: int = 0) -> list[dict]:
    """Check and decode ``owner``'s last traced launch (``owner._pending_trace`` = the record
    buffers and capacity it launched with); sets ``owner.last_trace_dropped``.

    Raises:
        KernelError: the launch reported an error (``owner.check()``, which synchronizes).
        InputError: no traced launch is pending.
    """
    require(getattr(owner, "_pending_trace", None) is not None, "trace", "a preceding traced call", None)
    tr, trc, cap = owner._pending_trace
    owner._pending_trace = None
    owner.check()
    counts = trc.cpu().numpy()
    recs = decode_trace(tr.cpu().numpy().view(np.uint64), counts, cap, rank=rank)
    owner.last_trace_dropped = trace_dropped(counts, cap)
    return recs


def to_schema(records: list[dict]):
    """Decoded kernel records (any ranks) as the shared columnar trace
    (:class:`megamoe.trace.Trace`), the input of ``megamoe compare``; the schema's ``sm`` is
    the CTA index (``blockIdx.x``), which the plan's block order is keyed by."""
    from ..trace import KIND, ROLE, Trace

    rows = [(r["rank"], r["cta"], ROLE[r["role"]], KIND[r["kind"]], r["expert"], r["m_block"], r["n_block"],
             r["wave"], r["t_start_ns"], r["t_end_ns"], 0, r["tokens"]) for r in records]
    return Trace.from_rows(np.asarray(rows, dtype=np.float64)) if rows else Trace.from_rows([])

