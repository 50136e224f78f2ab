"""The one trace schema shared by the simulator and the kernel.

One record per interval with the columns of :data:`COLUMNS`: ``rank, sm, role, kind, expert,
m_block, n_block, wave, t_start_ns, t_end_ns, bytes, tokens``.  ``role`` and ``kind`` are
stored as small integer codes into :data:`ROLES` / :data:`KINDS`.  ``sm = -1`` marks an
interval that is the same on every SM of the rank (the simulator's dispatch phases, the
combine).  ``expert``/``m_block``/``n_block``/``wave`` are ``-1`` where they do not apply.

Exports: Chrome trace-event JSON (opens in Perfetto: ``pid`` = rank, ``tid`` = SM x role,
``ph: "X"``, ``ts``/``dur`` in microseconds, metadata events naming processes and threads)
and NPZ (columnar, for analysis; :func:`Trace.load` reads it back).

A trace file (NPZ) may also carry ``meta`` (a JSON object: the scenario that produced it,
e.g. ``Scenario.to_dict()`` plus ``source`` = ``"kernel"`` or ``"simulator"``, the device,
the plan numbers) and the routing it ran (``topk_idx`` per rank) so that
``megamoe compare`` can simulate exactly the same call.
"""

from __future__ import annotations

import gzip
import json
import os
import zipfile
import zlib
from dataclasses import dataclass

import numpy as np

from .errors import InputError, require, shown_text

ROLES = ("dispatch", "tma_a", "tma_b", "mma", "epilogue", "producer", "consumer")
KINDS = ("count", "index_exchange", "grid_sync", "nvl_barrier", "pull", "l1_load", "l1_mma",
         "l1_epilogue", "l2_load", "l2_mma", "l2_epilogue", "combine", "idle_wait")
COLUMNS = ("rank", "sm", "role", "kind", "expert", "m_block", "n_block", "wave",
           "t_start_ns", "t_end_ns", "bytes", "tokens")
_DTYPES = {"t_start_ns": np.float64, "t_end_ns": np.float64, "bytes": np.int64}
ROLE = {n: i for i, n in enumerate(ROLES)}
KIND = {n: i for i, n in enumerate(KINDS)}


@dataclass
class Trace:
    """Columnar trace: one numpy array per column of :data:`COLUMNS` (equal lengths).

    Attributes:
        cols: column name -> array.
        meta: free-form JSON-able dict (scenario, source, device, plan numbers).
        topk_idx: routing per rank (int64 ``[T_r, k]``) or None.
    """

    cols: dict
    meta: dict = None
    topk_idx: list = None

    @classmethod
    def from_rows(cls, rows: list[tuple] | np.ndarray) -> "Trace":
        """Build from rows ordered as :data:`COLUMNS` (role/kind as codes or names).

        Args:
            rows: a list / tuple of rows (each a sequence of ``len(COLUMNS)`` values, ``role``
                and ``kind`` as names of :data:`ROLES` / :data:`KINDS` or their codes), or a
                2-D numeric array ``[N, len(COLUMNS)]`` of codes.

        Raises:
            InputError: ``rows`` not a list, tuple or 2-D array of ``len(COLUMNS)`` columns
                (``trace.rows``); a row of another length (``trace.rows``); an unknown role /
                kind name or a code outside the schema (``trace.role`` / ``trace.kind``); a
                value that is not a number (``trace.rows``); non-finite times
                (``trace.t_start_ns`` / ``trace.t_end_ns``); an integer column holding a
                fraction, a non-finite value or one outside its dtype (``trace.<column>``).
        """
        n = len(COLUMNS)
        require(isinstance(rows, (list, tuple, np.ndarray)), "trace.rows",
                f"a list of rows or an [N, {n}] array", type(rows).__name__)
        if len(rows) == 0:
            return cls({c: np.zeros(0, dtype=_DTYPES.get(c, np.int32)) for c in COLUMNS})
        if not isinstance(rows, np.ndarray):
            out = []
            for i, r in enumerate(rows):
                require(isinstance(r, (list, tuple, np.ndarray)) and len(r) == n, "trace.rows",
                        f"rows of {n} values ({', '.join(COLUMNS)})",
                        f"row {i}: {len(r)} values" if isinstance(r, (list, tuple, np.ndarray))
                        else f"row {i}: {type(r).__name__}")
                role, kind = r[2], r[3]
                if isinstance(role, str):
                    require(role in ROLE, "trace.role", f"a role name ({', '.join(ROLES)}) or code "
                            f"0..{len(ROLES) - 1}", f"row {i}: {role!r}")
                    role = ROLE[role]
                if isinstance(kind, str):
                    require(kind in KIND, "trace.kind", f"a kind name ({', '.join(KINDS)}) or code "
                            f"0..{len(KINDS) - 1}", f"row {i}: {kind!r}")
                    kind = KIND[kind]
                out.append((r[0], r[1], role, kind, *r[4:]))
            rows = out
        try:
            arr = np.asarray(rows, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise InputError("trace.rows", f"numbers in every column ({', '.join(COLUMNS)})",
                             f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from None
        require(arr.ndim == 2 and arr.shape[1] == n, "trace.rows", f"an [N, {n}] array ({', '.join(COLUMNS)})",
                f"shape {list(arr.shape)}")
        for i, c in enumerate(COLUMNS):
            v = arr[:, i]
            dt = _DTYPES.get(c, np.int32)
            if dt is np.float64:
                bad = ~np.isfinite(v)
                expected = "finite times (ns) in every record"
            else:
                info = np.iinfo(dt)
                names = {"role": ROLES, "kind": KINDS}.get(c)
                lo, hi = (0, len(names) - 1) if names else (info.min, info.max)
                with np.errstate(invalid="ignore"):
                    bad = ~np.isfinite(v) | (v != np.floor(v)) | (v < lo) | (v > hi)
                expected = f"codes 0..{hi}" if names else f"integers in [{lo}, {hi}]"
            if bad.any():
                j = int(np.argmax(bad))
                raise InputError(f"trace.{c}", expected, f"row {j}: {v[j]:g}")
        return cls({c: arr[:, i].astype(_DTYPES.get(c, np.int32)) for i, c in enumerate(COLUMNS)})

    @classmethod
    def concat(cls, traces: list["Trace"]) -> "Trace":
        return cls({c: np.concatenate([t.cols[c] for t in traces]) for c in COLUMNS})

    def __len__(self) -> int:
        return len(self.cols["rank"])

    def __getitem__(self, col: str) -> np.ndarray:
        return self.cols[col]

    def select(self, mask: np.ndarray) -> "Trace":
        return Trace({c: v[mask] for c, v in self.cols.items()}, meta=self.meta, topk_idx=self.topk_idx)

    def where(self, **eq) -> "Trace":
        """Rows whose columns equal the given values (role/kind may be names)."""
        m = np.ones(len(self), dtype=bool)
        for k, v in eq.items():
            if k == "role" and isinstance(v, str):
                v = ROLE[v]
            if k == "kind" and isinstance(v, str):
                v = KIND[v]
            m &= self.cols[k] == v
        return self.select(m)

    @property
    def from_simulator(self) -> bool:
        """Whether the simulator made this trace (``meta["source"]``), not a kernel run."""
        return isinstance(self.meta, dict) and self.meta.get("source") == "simulator"

    def unit_keys(self) -> np.ndarray:
        """int64 ``[N]``: one key per record's unit, its (rank, SM) pair (the SM column holds the CTA
        at two CTAs per SM); records of one unit share a key, and keys sort by rank, then SM."""
        return self.cols["rank"].astype(np.int64) * (1 << 20) + self.cols["sm"]

    @property
    def makespan_ns(self) -> float:
        """From the first interval's start to the last one's end (ns); a kernel trace's clock
        starts at its first record, so launch latency is outside both traces' makespans."""
        return float(self.cols["t_end_ns"].max() - self.cols["t_start_ns"].min()) if len(self) else 0.0

    # -- files -----------------------------------------------------------------
    def save_npz(self, path: str) -> None:
        """Write columns, ``meta`` (as JSON) and ``topk_idx`` (``topk_idx_<rank>``)."""
        extra = {}
        if self.meta is not None:
            extra["meta_json"] = np.array(json.dumps(self.meta))
        for r, ids in enumerate(self.topk_idx or []):
            extra[f"topk_idx_{r}"] = np.asarray(ids, dtype=np.int64)
        np.savez_compressed(path, **self.cols, **extra)

    @classmethod
    def load(cls, path: str) -> "Trace":
        """Load an NPZ written by :meth:`save_npz`.

        Args:
            path: file path (``str`` or ``os.PathLike``).

        Raises:
            InputError: ``path`` not a path, missing file, not an NPZ, an unreadable NPZ
                (truncated or corrupt: ``BadZipFile``, ``zlib.error``, ``EOFError``), missing
                schema columns, a column that is not 1-D, no records, role / kind codes
                outside the schema, non-finite times, records that end before they start,
                ranks or SMs outside ``meta``'s ``num_ranks`` / ``num_sms``, or
                ``topk_idx_<rank>`` arrays not numbered ``0 .. n-1``.
        """
        require(isinstance(path, (str, os.PathLike)), "trace", "a path to an .npz trace file",
                repr(path) if isinstance(path, bytes) else path)

        def unreadable(exc: BaseException) -> InputError:
            # numpy's ValueError text (about pickles) misleads for a file that is no NPZ at all
            zipped = isinstance(exc, (zipfile.BadZipFile, zlib.error, EOFError)) and str(exc)
            msg = (f": {str(exc).splitlines()[0]}" if zipped
                   else ": not a zip archive, which an .npz is" if isinstance(exc, ValueError) else "")
            kind = "zlib.error" if isinstance(exc, zlib.error) else type(exc).__name__
            return InputError("trace", "an .npz trace file", f"{shown_text(os.fspath(path))} ({kind}{msg})")

        # a truncated or corrupt zip raises BadZipFile / zlib.error / EOFError, at open or at read
        broken = (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error)
        try:
            z = np.load(path, allow_pickle=False)
        except broken as exc:
            raise unreadable(exc) from None
        if not isinstance(z, np.lib.npyio.NpzFile):  # a plain .npy array
            raise InputError("trace", "an .npz trace file (columns of the trace schema)",
                             f"{path} (a single array)")
        with z:
            missing = [c for c in COLUMNS if c not in z.files]
            if missing:
                raise InputError("trace", f"columns {', '.join(COLUMNS)}", f"missing {', '.join(missing)}")
            stored = {f for f in z.files if f.startswith("topk_idx_")}
            want = [f"topk_idx_{r}" for r in range(len(stored))]
            require(stored == set(want), "trace.topk_idx", "arrays topk_idx_0 .. topk_idx_<R-1> (one per rank)",
                    f"{', '.join(sorted(stored - set(want)))} among {len(stored)} arrays")
            try:
                raw_meta = z["meta_json"] if "meta_json" in z.files else None
                cols = {c: z[c] for c in COLUMNS}
                topk = [z[f] for f in want] or None
            except broken as exc:
                raise unreadable(exc) from None
        try:
            meta = json.loads(str(raw_meta)) if raw_meta is not None else None
        except ValueError:
            raise InputError("trace.meta_json", "a JSON object (the scenario meta)",
                             f"{path}: not JSON") from None
        if meta is not None and not isinstance(meta, dict):
            raise InputError("trace.meta_json", "a JSON object (the scenario meta)", type(meta).__name__)
        for c, v in cols.items():
            require(v.ndim == 1, f"trace.{c}", "a 1-D column (one value per record)", f"shape {list(v.shape)}")
        n = {len(v) for v in cols.values()}
        if len(n) != 1:
            raise InputError("trace", "columns of one length", f"lengths {sorted(n)}")
        require(n != {0}, "trace", "at least one record", "0 records")
        for col in COLUMNS:
            times = col in ("t_start_ns", "t_end_ns")
            require(cols[col].dtype.kind in ("fiu" if times else "iu"), f"trace.{col}",
                    "a numeric column" if times else "an integer column", f"dtype {cols[col].dtype}")
        for col, names in (("role", ROLES), ("kind", KINDS)):
            bad = (cols[col] < 0) | (cols[col] >= len(names))
            if bad.any():
                raise InputError(f"trace.{col}", f"codes 0..{len(names) - 1}", int(cols[col][bad][0]))
        # rank and SM indices: within the scenario's ranks and the device's SMs when meta gives them
        # (SM90 kernel traces at two CTAs per SM, kernel v9.2, record the CTA: meta plan.ctas_per_sm)
        plan = (meta or {}).get("plan")
        ctas = plan.get("ctas_per_sm", 1) if isinstance(plan, dict) else 1
        require(ctas in (1, 2) and not isinstance(ctas, bool), "trace.meta.plan.ctas_per_sm", "1 or 2", ctas)
        for col, lo, key in (("rank", 0, "num_ranks"), ("sm", -1, "num_sms")):
            hi = (meta or {}).get(key)
            if isinstance(hi, int) and not isinstance(hi, bool):
                require(hi >= 1, f"trace.meta.{key}", "an integer >= 1", hi)
                per = ctas if col == "sm" else 1
                bad, expected = ((cols[col] < lo) | (cols[col] >= hi * per),
                                 f"values in [{lo}, {hi * per}) (meta {key} = {hi}"
                                 + (f" x plan.ctas_per_sm = {per})" if per > 1 else ")"))
            else:
                bad, expected = cols[col] < lo, f"values >= {lo}"
            if bad.any():
                i = int(np.argmax(bad))
                raise InputError(f"trace.{col}", expected, f"record {i}: {int(cols[col][i])}")
        for col in ("t_start_ns", "t_end_ns"):  # NaN slips through every comparison: refuse it by name
            bad = ~np.isfinite(cols[col])
            if bad.any():
                i = int(np.argmax(bad))
                raise InputError(f"trace.{col}", "finite times (ns) in every record", f"record {i}: {cols[col][i]}")
        back = cols["t_end_ns"] < cols["t_start_ns"]
        if back.any():
            i = int(np.argmax(back))
            raise InputError("trace.t_end_ns", "t_end_ns >= t_start_ns in every record",
                             f"record {i}: {cols['t_start_ns'][i]} .. {cols['t_end_ns'][i]}")
        return cls(cols, meta=meta, topk_idx=topk)

    def to_chrome(self, max_sms: int | None = 8, sms: list[int] | None = None) -> dict:
        """Chrome trace-event JSON (a dict).

        Args:
            max_sms: keep SMs ``0 .. max_sms-1`` of every rank (plus ``sm = -1`` rows) so a
                full scenario stays small enough to open; ``None`` keeps all.
            sms: explicit SM list (overrides ``max_sms``).
        """
        sm = self.cols["sm"]
        if sms is not None:
            keep = np.isin(sm, np.asarray(sms)) | (sm < 0)
        elif max_sms is not None:
            keep = sm < max_sms
        else:
            keep = np.ones(len(self), dtype=bool)
        t = self.select(keep)
        events = []
        seen_pid, seen_tid = set(), set()
        c = t.cols
        for i in range(len(t)):
            rank, s, role = int(c["rank"][i]), int(c["sm"][i]), int(c["role"][i])
            tid = (s + 1) * 16 + role
            if rank not in seen_pid:
                seen_pid.add(rank)
                events.append({"ph": "M", "name": "process_name", "pid": rank, "tid": 0,
                               "args": {"name": f"rank {rank}"}})
            if (rank, tid) not in seen_tid:
                seen_tid.add((rank, tid))
                label = f"{'all SMs' if s < 0 else f'SM {s}'} {ROLES[role]}"
                events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": tid,
                               "args": {"name": label}})
                events.append({"ph": "M", "name": "thread_sort_index", "pid": rank, "tid": tid,
                               "args": {"sort_index": tid}})
            args = {k: int(c[k][i]) for k in ("expert", "m_block", "n_block", "wave", "bytes", "tokens")
                    if int(c[k][i]) >= 0}
            events.append({"ph": "X", "name": KINDS[int(c["kind"][i])], "pid": rank, "tid": tid,
                           "ts": float(c["t_start_ns"][i]) / 1e3,
                           "dur": float(c["t_end_ns"][i] - c["t_start_ns"][i]) / 1e3,
                           "cat": ROLES[role], "args": args})
        return {"traceEvents": events, "displayTimeUnit": "ns"}

    def save_chrome(self, path: str, **kw) -> None:
        """Write :meth:`to_chrome` as JSON (gzip if the path ends in ``.gz``)."""
        data = json.dumps(self.to_chrome(**kw))
        if path.endswith(".gz"):
            with gzip.open(path, "wt") as f:
                f.write(data)
        else:
            with open(path, "w") as f:
                f.write(data)
