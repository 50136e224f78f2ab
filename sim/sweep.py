"""``megamoe sweep``: the simulator over a grid of scenario / plan / hardware choices.

Axes are scenario fields (``tokens``, ``ranks``, ``shape``, ``routing``, ``seed``,
``hardware``, ``design``, ``experts_per_wave``, ``block_m``, ``pool_tokens``, ``num_stages``,
``k_split``, ``wgmma_n_step``, ``combine_relay`` (on / off), ``l2_wait``, ``reserved_sms``, ``max_tokens``), ``policy`` (one policy spec per point; join
several with ``+``), or hardware scale factors ``<figure>_scale`` (e.g. ``nvlink_gbs_per_direction_scale``,
with the short forms ``nvlink_scale``, ``hbm_scale``, ``tc_scale``).  Values: ``a,b,c`` or an
inclusive integer range ``start:stop[:step]``.  The grid is the Cartesian product.  A scaled
figure must stay in its range (``sim.hardware.FIGURE_RANGES``); every grid point's scaled
hardware is checked before any point runs or anything is written, and the first one out of
range refuses the whole sweep, naming the axis.

Runs in parallel over local cores (``concurrent.futures``; at most :func:`max_jobs` worker
processes, 4 per CPU, and never more than there are points to run) with a progress bar,
appends every finished *valid* point to ``points.jsonl`` (so an interrupted sweep resumes
where it stopped), and writes ``results.csv``, ``results.parquet`` and one PNG per swept axis
(predicted time against the axis, a line per combination of the other axes' values).  ``address`` runs the points on
a Dask (``tcp://...``) or Ray (``ray://...``) cluster instead (those packages are optional;
the cluster's own workers run the points, so ``jobs`` is refused with it).

Resume log (``points.jsonl``): one JSON object per line, a point's row plus ``_key``, its
identity: the point, the base scenario and a SHA-256 of the bytes of every input file they
name (hardware TOML, presets included; routing ``file:`` arrays, each ``{rank}`` file; policy
``.py`` files), so a point is reused only while its inputs' contents are unchanged.  The rule
that keeps a failed sweep from changing the log: only valid points are journaled.  An
invalid point (its row carries ``error``) fails fast and is recomputed on every run, so a
sweep with no valid point writes nothing (and leaves an earlier log byte for byte as it was).
The base hardware is loaded (and refused if bad) before the log is read, and the whole log
is checked before any point runs: a line that is not such an object (cut off, not UTF-8, no
``_key``, a missing result field) refuses the sweep with one error naming the file and the
line, never skipped; ``--no-resume`` (``resume=False``) ignores the log and replaces it once
a point is valid.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import itertools
import json
import math
import os
import re
import stat
from concurrent.futures import ProcessPoolExecutor, as_completed

from megamoe import design_sm90
from megamoe.errors import InputError, is_int, parse_float, parse_int, require
from megamoe.scenario import MAX_TOKENS_PER_RANK

SCENARIO_AXES = {"tokens": "tokens_per_rank", "ranks": "num_ranks", "shape": "shape", "routing": "routing",
                 "seed": "seed", "hardware": "hardware", "design": "design",
                 "experts_per_wave": "experts_per_wave", "block_m": "block_m", "pool_tokens": "pool_tokens",
                 "num_stages": "num_stages", "k_split": "k_split", "wgmma_n_step": "wgmma_n_step",
                 "combine_relay": "combine_relay",
                 "ctas_per_sm": "ctas_per_sm",
                 "l2_wait": "l2_wait",
                 "reserved_sms": "reserved_sms",
                 "max_tokens": "max_tokens_per_rank", "launch_skew_us": "launch_skew_us"}
SCALE_ALIASES = {"nvlink_scale": "nvlink_gbs_per_direction", "hbm_scale": "hbm_gbs",
                 "tc_scale": "fp8_dense_tflops"}
#: Every named axis (a hardware figure's ``<figure>_scale`` besides these).
AXIS_NAMES = (*SCENARIO_AXES, "policy", *SCALE_ALIASES)
#: Most values per axis and most points per sweep (a point is one simulation: seconds each).
MAX_POINTS = 100_000
INT_AXES = {"tokens", "ranks", "seed", "experts_per_wave", "block_m", "pool_tokens", "num_stages",
            "k_split", "wgmma_n_step", "reserved_sms", "max_tokens", "ctas_per_sm"}
#: The smallest value of an integer axis where it is not 1 (the Scenario's own lower bounds).
INT_AXIS_FLOOR = {"tokens": 0, "seed": 0, "reserved_sms": 0}
#: The largest value of an integer axis where the Scenario has one whatever the other axes are.
INT_AXIS_CEILING = {"tokens": MAX_TOKENS_PER_RANK, "max_tokens": MAX_TOKENS_PER_RANK}
#: The values an integer axis takes where they are a few (the Scenario's own choices).
INT_AXIS_CHOICES = {"ctas_per_sm": (1, 2), "wgmma_n_step": design_sm90.WGMMA_N_STEPS}
#: How a refusal names an axis's choices where listing them would be long.
INT_AXIS_CHOICES_TEXT = {"wgmma_n_step": "multiples of 8 from 8 to 128"}
RESULT_KEYS = ("time_us", "tflops", "hbm_gbs", "nvlink_gbs", "t_reduction_us", "overlap_efficiency",
               "speedup_vs_legacy")
#: The axes that override a plan decision (the scenario and hardware stay): for a sweep of these
#: only, the plan's own choice is the same call and can be set beside the grid.
PLAN_AXES = frozenset({"experts_per_wave", "block_m", "pool_tokens", "num_stages", "k_split", "wgmma_n_step",
                       "combine_relay",
                       "ctas_per_sm", "l2_wait", "policy"})
#: The axes that change the work a call does (its tokens, routing, model): points that differ in
#: one of them are not ranked against each other by time.
WORKLOAD_AXES = frozenset({"tokens", "ranks", "shape", "routing", "seed", "max_tokens", "launch_skew_us"})
#: The fields a row has besides its axes (in this order), and so every line of points.jsonl.
ROW_FIELDS = (*RESULT_KEYS, "experts_per_wave_r0", "block_m_r0", "wgmma_n_step_r0", "error")
#: Local worker processes per CPU at most (``jobs``): more only add memory (each worker holds
#: a Python interpreter and the simulator), not speed.
JOBS_PER_CPU = 4


def max_jobs() -> int:
    """The most local worker processes a sweep takes: ``JOBS_PER_CPU`` x the CPU count."""
    return JOBS_PER_CPU * (os.cpu_count() or 1)


def parse_values(axis: str, text: str) -> list:
    """Values of one axis from ``a,b,c`` or ``start:stop[:step]`` (inclusive, integers).

    Raises:
        InputError: unknown axis, bad number, empty range, an integer out of its axis's range
            (``INT_AXIS_FLOOR``, ``INT_AXIS_CEILING``, ``INT_AXIS_CHOICES``), a value given twice (it
            would be simulated twice and give two identical rows).
    """
    vals = _axis_values(axis, text)
    seen: dict = {}
    for v in vals:
        key = _point_key(axis, v, text)
        require(key not in seen, f"sweep.{axis}", "distinct values",
                f"{v!r} twice in {text!r}" if seen.get(key) == v else f"{seen.get(key)!r} and {v!r} (the same) in {text!r}")
        seen[key] = v
    return vals


def _point_key(axis: str, v, text: str):
    """What decides the simulation an axis value gives, for spotting a value given twice: a routing
    spec as parsed (``UNIFORM`` is ``uniform``, ``zipf:1.0`` is ``zipf:1``), a shape's four numbers
    (a preset and its ``E,k,H,I``), a policy axis's set of policies (``a+b`` is ``b+a``), a hardware
    preset's name in lower case (``H100`` is ``h100``: presets are case-insensitive); the value
    itself otherwise. A value of a name-like axis that is wrong in any grid point (an unknown shape,
    routing spec, policy, hardware preset, design or L2 wait) is refused here, before any point
    runs; whether a value fits the other axes' values (a block_m the design lacks) is each point's
    own error.

    Raises:
        InputError: ``sweep.<axis>``, naming the value and the axis text.
    """
    from megamoe.plan import DESIGNS

    try:
        if axis == "shape":
            from megamoe.shapes import get_shape

            sh = get_shape(v)
            return (sh.num_experts, sh.top_k, sh.hidden, sh.intermediate)
        if axis == "routing":
            from megamoe.routing import RoutingSpec

            return dataclasses.astuple(RoutingSpec.parse(v))
        if axis == "policy":
            from megamoe.policies import policies_from_specs

            parts = [p for p in str(v).split("+") if p]
            policies_from_specs(parts)
            return tuple(sorted(parts))
        if axis == "hardware":
            from .hardware import load_hardware, preset_path

            load_hardware(v)
            p = preset_path(v)
            return p.stem if p is not None else v  # a preset in any case: one key
        elif axis == "design":
            require(v in DESIGNS, "design", " or ".join(DESIGNS), v)
        elif axis == "l2_wait":
            require(v in ("k_block", "pool_block"), "l2_wait", "k_block or pool_block", v)
    except InputError as e:
        hint = "; a custom shape is E,k,H,I, and shapes are separated by ';' when one is custom" if axis == "shape" else ""
        got = repr(v) if text == str(v) else f"{v!r} in {text!r}"  # the value alone where it is the whole axis
        same = e.field == axis and str(e.got).strip("'") == str(v)  # the inner error says only that again
        # a field inside the value (a hardware file's arch, a routing's exponent) is named with what it expects
        want = e.expected if e.field == axis else f"a value whose {e.field} is {e.expected}"
        raise InputError(f"sweep.{axis}", f"{want}{hint}", got if same else f"{got} ({e.field}: {e.got})") from None
    return v


def _in_axis_range(axis: str, vals: list[int], text: str) -> list[int]:
    """``vals`` when each is in the axis's range (``INT_AXIS_FLOOR``, ``INT_AXIS_CEILING``) and one
    of its choices where it has a few (``INT_AXIS_CHOICES``), refused up front otherwise: such a
    value would be an invalid point in every grid, not a what-if."""
    if axis in INT_AXIS_CHOICES:
        ok = INT_AXIS_CHOICES[axis]
        bad = [v for v in vals if v not in ok]
        require(not bad, f"sweep.{axis}", INT_AXIS_CHOICES_TEXT.get(axis, " or ".join(map(str, ok))),
                f"{bad[0]} in {text!r}" if bad else "")
    lo, hi = INT_AXIS_FLOOR.get(axis, 1), INT_AXIS_CEILING.get(axis)
    bad = [v for v in vals if v < lo or (hi is not None and v > hi)]
    require(not bad, f"sweep.{axis}", f"integers >= {lo}" if hi is None else f"integers in [{lo}, {hi}]",
            f"{bad[0]} in {text!r}" if bad else "")
    return vals


def _scenario_default(field: str):
    """A :class:`megamoe.scenario.Scenario` field's default (what a point that does not set it gets)."""
    from megamoe.scenario import Scenario

    return Scenario.__dataclass_fields__[field].default


def _axis_values(axis: str, text: str) -> list:
    if axis not in AXIS_NAMES and not axis.endswith("_scale"):
        import difflib

        near = difflib.get_close_matches(axis, AXIS_NAMES, n=1, cutoff=0.8)
        raise InputError("sweep axis", f"one of {', '.join(AXIS_NAMES)} or <hardware figure>_scale",
                         f"{axis} (did you mean {near[0]}?)" if near else axis)
    numeric = axis in INT_AXES
    if numeric and ":" in text and "," not in text:
        parts = text.split(":")
        try:
            nums = [parse_int(p) for p in parts]
        except ValueError:
            raise InputError(f"sweep.{axis}", "start:stop[:step] integers", text) from None
        require(len(nums) in (2, 3) and (len(nums) == 2 or nums[2] > 0), f"sweep.{axis}",
                "start:stop[:step] with step > 0", text)
        r = range(nums[0], nums[1] + 1, nums[2] if len(nums) == 3 else 1)
        require(len(r) <= MAX_POINTS, f"sweep.{axis}", f"a range of at most {MAX_POINTS} values", f"{text} ({len(r)})")
        vals = list(r)
        require(bool(vals), f"sweep.{axis}", "a non-empty range", text)
        return _in_axis_range(axis, vals, text)
    if axis == "shape":  # a custom shape is itself E,k,H,I: shapes are separated by ';'
        parts = text.split(",")
        one_custom = ";" not in text and len(parts) == 4 and all(p.strip().isdigit() for p in parts)
        sep = ";" if ";" in text else ","
        vals = [text] if one_custom else text.split(sep)
    else:
        sep = ","
        vals = text.split(sep)
    require(text == "" or all(v != "" for v in vals), f"sweep.{axis}",
            f"values separated by single {'semicolons' if sep == ';' else 'commas'} (no empty value)", repr(text))
    vals = [v for v in vals if v != ""]
    require(bool(vals), f"sweep.{axis}", "at least one value", repr(text))
    require(len(vals) <= MAX_POINTS, f"sweep.{axis}", f"at most {MAX_POINTS} values", len(vals))
    if numeric:
        try:
            vals = [parse_int(v) for v in vals]
        except ValueError:
            raise InputError(f"sweep.{axis}", "integers", text) from None
        return _in_axis_range(axis, vals, text)
    if axis == "combine_relay":  # on / off, as the CLI's --combine-relay
        require(all(v in ("on", "off") for v in vals), f"sweep.{axis}", "on and/or off", text)
        return vals  # kept as spelled in the rows and outputs; the Scenario gets a bool
    if axis == "launch_skew_us":  # the last rank's lateness, microseconds
        try:
            out = [parse_float(v) for v in vals]
        except ValueError:
            raise InputError(f"sweep.{axis}", "numbers (microseconds)", text) from None
        from megamoe.scenario import MAX_LAUNCH_SKEW_US, skew_in_range

        require(all(skew_in_range(v) for v in out), f"sweep.{axis}",
                f"microseconds in [0, {MAX_LAUNCH_SKEW_US:g}]", text)
        return out
    if axis.endswith("_scale") or axis in SCALE_ALIASES:
        from .hardware import FIGURE_RANGES

        fig = scale_figure(axis)
        require(fig in FIGURE_RANGES and fig != "num_sms", "sweep axis",
                "<hardware figure>_scale for a figure other than num_sms (or nvlink_scale, hbm_scale, tc_scale)",
                axis)
        try:
            out = [parse_float(v) for v in vals]
        except ValueError:
            raise InputError(f"sweep.{axis}", "numbers", text) from None
        # a figure that may be 0 (block_jitter, the excess figures) may be scaled to 0: switched off
        zero = FIGURE_RANGES[fig][0] == 0
        require(all(math.isfinite(v) and (v > 0 or (zero and v == 0)) for v in out), f"sweep.{axis}",
                f"finite factors {'>=' if zero else '>'} 0", text)
        return out
    return vals


def scale_figure(axis: str) -> str:
    """The hardware figure a scale axis multiplies (``hbm_scale`` -> ``hbm_gbs``)."""
    return SCALE_ALIASES.get(axis, axis[: -len("_scale")])


def _split_point(point: dict, base: dict) -> tuple[dict, dict, dict]:
    """(Scenario keyword arguments, figure -> factor, figure -> the axis that gave it)."""
    kw = dict(base)
    scales, labels = {}, {}
    for axis, v in point.items():
        if axis == "combine_relay":
            kw["combine_relay"] = v == "on"
        elif axis in SCENARIO_AXES:
            kw[SCENARIO_AXES[axis]] = v
        elif axis == "policy":
            kw["policies"] = list(kw.get("policies", [])) + [p for p in str(v).split("+") if p]
        else:
            fig = scale_figure(axis)
            require(fig not in scales, "sweep", "one scale axis per hardware figure",
                    f"{labels.get(fig, '?').removeprefix('sweep.')} and {axis} both scale {fig}")
            scales[fig] = v
            labels[fig] = f"sweep.{axis}"
    return kw, scales, labels


def check_scaled_hardware(points: list[dict], base: dict) -> None:
    """Check every point's scaled hardware (each distinct hardware and factors once).

    Raises:
        InputError: a scaled figure outside its range, named by the axis that scaled it
            (``sweep.hbm_scale: expected a factor that keeps hbm_gbs in ...``).  A point whose
            hardware itself does not load is left to :func:`run_point`, which records it.
    """
    from .hardware import load_hardware

    default_hw = _scenario_default("hardware")
    seen, loaded = set(), {}
    for p in points:
        kw, scales, labels = _split_point(p, base)
        if not scales:
            continue
        spec = kw.get("hardware") or default_hw
        key = (str(spec), tuple(sorted(scales.items())))
        if key in seen:
            continue
        seen.add(key)
        if spec not in loaded:
            try:
                loaded[spec] = load_hardware(spec)
            except (InputError, TypeError, AttributeError):
                loaded[spec] = None
        if loaded[spec] is not None:
            loaded[spec].scaled(labels, **scales)


def _designs(axes: dict[str, list], base: dict) -> list[str]:
    """The designs a sweep's points run: its design axis, else the base's (or the default)."""
    return axes.get("design") or [base.get("design") or _scenario_default("design")]


def check_block_m(axes: dict[str, list], base: dict) -> None:
    """Refuse a block_m axis value that no design of the sweep takes (every point with it would
    be invalid: ``block_m=17`` ran each point to its error); one that only some designs take is
    left to each point.

    Raises:
        InputError: ``sweep.block_m``, naming the value and the designs' choices.
    """
    if "block_m" not in axes:
        return
    from megamoe.plan import block_m_choices

    designs = _designs(axes, base)
    ok = sorted({bm for d in designs for bm in block_m_choices(d)})
    bad = [v for v in axes["block_m"] if v not in ok]
    require(not bad, "sweep.block_m", f"values a design of the sweep takes ({', '.join(designs)}: "
            f"{', '.join(map(str, ok))})", ", ".join(map(str, bad)))


def check_design_only_axes(axes: dict[str, list], base: dict) -> None:
    """Refuse an axis that only design megamoe-sm90 models (``wgmma_n_step``, ``k_split`` above 1)
    in a sweep none of whose designs is megamoe-sm90: every point would be invalid (it ran each to
    its error; fresh-user report, session 51).

    Raises:
        InputError: ``sweep.<axis>``, naming the sweep's designs.
    """
    designs = _designs(axes, base)
    if "megamoe-sm90" in designs:
        return
    for axis, ok in (("wgmma_n_step", lambda v: False), ("k_split", lambda v: v == 1)):
        bad = [v for v in axes.get(axis, []) if not ok(v)]
        require(not bad, f"sweep.{axis}", f"design megamoe-sm90 among the sweep's designs (it is modelled for "
                f"that design only; the sweep's: {', '.join(designs)})", ", ".join(map(str, bad)))


def grid(axes: dict[str, list]) -> list[dict]:
    """Cartesian product of the axes, as a list of point dicts (first axis slowest).

    Raises:
        InputError: more than :data:`MAX_POINTS` points.
    """
    names = list(axes)
    n = math.prod(len(axes[a]) for a in names)
    require(n <= MAX_POINTS, "sweep", f"at most {MAX_POINTS} points (the product of the axes' lengths)", n)
    return [dict(zip(names, combo)) for combo in itertools.product(*(axes[n] for n in names))]


def _file_digest(path: str, cache: dict) -> str:
    """SHA-256 of a file's bytes (``missing`` / ``unreadable (...)`` when it cannot be read:
    the point then fails when it runs, and a later run with the file back recomputes it)."""
    if path not in cache:
        try:
            h = hashlib.sha256()
            with open(path, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
            cache[path] = h.hexdigest()
        except FileNotFoundError:
            cache[path] = "missing"
        except OSError as exc:
            cache[path] = f"unreadable ({exc.strerror or type(exc).__name__})"
    return cache[path]


def input_files(kw: dict) -> list[str]:
    """The files a point's scenario keyword arguments read: the hardware TOML (a preset is a
    file too, resolved as :func:`sim.hardware.load_hardware` does), a ``file:`` routing's
    array(s) (each ``{rank}`` expansion) and ``file.py:Class`` policies.  Values that do not
    parse name no file (the point fails when it runs)."""
    from megamoe.policies import is_builtin
    from megamoe.routing import RoutingSpec
    from megamoe.scenario import MAX_RANKS_X_EXPERTS

    from .hardware import hardware_path

    files = []
    hw = kw.get("hardware") or _scenario_default("hardware")
    if isinstance(hw, str):
        files.append(str(hardware_path(hw)))
    routing = kw.get("routing", "uniform")
    try:
        spec = RoutingSpec.parse(routing) if isinstance(routing, str) else routing
    except InputError:
        spec = None
    if getattr(spec, "kind", None) == "file" and isinstance(spec.path, str):
        if "{rank}" in spec.path:
            n = kw.get("num_ranks", _scenario_default("num_ranks"))
            n = n if is_int(n) and 1 <= n <= MAX_RANKS_X_EXPERTS else 0
            files += [spec.path.replace("{rank}", str(r)) for r in range(n)]
        else:
            files.append(spec.path)
    for pol in kw.get("policies") or []:
        if isinstance(pol, str) and not is_builtin(pol):
            mod = pol.rpartition(":")[0]
            if mod.endswith(".py"):
                files.append(mod)
    return files


def point_key(point: dict, base: dict, digests: dict | None = None) -> str:
    """Identity of a finished point for resuming: the point, the base it ran on and the
    SHA-256 of every input file they name (:func:`input_files`).  A sweep resumed with other
    base options (another --hardware) or after an input file changed recomputes the points
    concerned.  ``digests`` caches the hashes by path (one sweep reads each file once)."""
    digests = {} if digests is None else digests
    try:
        kw = _split_point(point, base)[0]
    except InputError:  # two scale axes on one figure: refused before this is called
        kw = dict(base)
    files = {p: _file_digest(p, digests) for p in input_files(kw)}
    return json.dumps({"base": base, "point": point, "files": files}, sort_keys=True, default=str)


def read_log(log: str) -> dict[str, dict]:
    """The valid points of a resume log: ``_key`` -> the row's :data:`ROW_FIELDS` (its axis
    values come from the point the key matches).  Rows with an ``error`` (written by earlier
    versions) are left out: invalid points are recomputed.

    Raises:
        InputError: on ``<log>``: the file cannot be read, or a line (named by its number) is
            not UTF-8, not a JSON object, has no string ``_key``, lacks a result field or
            holds a result that is not a number.
    """
    expected = ("one JSON object per line as megamoe sweep writes it (delete or fix the line, or "
                "rerun with --no-resume to start the log over)")
    try:
        if not stat.S_ISREG(os.stat(log).st_mode):  # a pipe or device would block or never end
            raise InputError(log, "a regular file as the resume log (or rerun with --no-resume)",
                             "not a regular file")
        with open(log, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise InputError(log, "a readable resume log (or rerun with --no-resume)",
                         f"{exc.strerror or type(exc).__name__}") from None
    done: dict[str, dict] = {}
    for n, raw in enumerate(data.split(b"\n"), 1):
        def bad(what: str, n: int = n) -> InputError:
            return InputError(log, expected, f"line {n}: {what}")

        try:
            line = raw.decode("utf-8").strip()
        except UnicodeDecodeError as exc:
            raise bad(f"byte 0x{raw[exc.start]:02x} at column {exc.start + 1} is not UTF-8") from None
        if not line:
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise bad(f"not JSON, e.g. cut off ({exc.msg}, column {exc.colno})") from None
        if not isinstance(row, dict):
            raise bad(f"a JSON {type(row).__name__ if not isinstance(row, list) else 'array'}, not an object")
        key = row.pop("_key", None)
        if not isinstance(key, str):
            raise bad("no _key" if key is None else "a _key that is not a string")
        missing = [k for k in ROW_FIELDS if k not in row]
        if missing:
            raise bad(f"no {', '.join(missing)}")
        if not isinstance(row["error"], str):
            raise bad("an error field that is not a string")
        if row["error"]:
            continue
        for k in ROW_FIELDS[:-1]:
            v = row[k]
            if not (v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))) or \
                    (k == "time_us" and v is None):
                raise bad(f"{k} {json.dumps(v)} is not a number")
            if v is not None and not (math.isfinite(v) and v >= 0):  # results are finite and >= 0
                raise bad(f"{k} {json.dumps(v)} is not a finite number >= 0")
        done[key] = {k: row[k] for k in ROW_FIELDS}  # a reused row takes its axes from its point
    return done


def _quiet_sigint() -> None:
    """A worker process ends at once and silently on Ctrl-C (the parent prints one line and
    exits 130; each worker used to print a KeyboardInterrupt traceback).  Ignoring it instead
    would make the parent's pool wait for every queued point before exiting."""
    import signal

    signal.signal(signal.SIGINT, lambda *_: os._exit(130))


def run_point(point: dict, base: dict) -> dict:
    """Simulate one point; never raises for bad combinations (the row carries ``error``)."""
    from megamoe.scenario import Scenario

    from .engine import simulate
    from .hardware import load_hardware

    row = {**point, **{k: None for k in RESULT_KEYS}, "experts_per_wave_r0": None, "block_m_r0": None,
           "wgmma_n_step_r0": None, "error": ""}
    try:
        kw, scales, labels = _split_point(point, base)
        sc = Scenario(**kw)
        hw = load_hardware(sc.hardware)
        if scales:
            hw = hw.scaled(labels, **scales)
        res = simulate(sc, hw)
        for k in RESULT_KEYS:
            row[k] = res.summary[k]
        row["experts_per_wave_r0"] = res.plan.ranks[0].experts_per_wave
        row["block_m_r0"] = res.plan.ranks[0].config.block_m
        row["wgmma_n_step_r0"] = res.plan.ranks[0].wgmma_n_step  # the effective step (at most block_m)
    except InputError as exc:
        row["error"] = str(exc)
    return row


def _executor_map(points, base, jobs, address):
    """Yield result rows as they finish (local processes, Dask or Ray)."""
    if address:
        if address.startswith("ray://") or address == "ray":
            try:
                import ray
            except ImportError:
                raise InputError("sweep.address", "the 'ray' package installed for a ray:// address",
                                 address) from None
            ray.init(address=None if address == "ray" else address, ignore_reinit_error=True)
            remote = ray.remote(run_point)
            refs = [remote.remote(p, base) for p in points]
            while refs:
                done, refs = ray.wait(refs, num_returns=1)
                yield ray.get(done[0])
            return
        try:
            from dask.distributed import Client, as_completed as dask_completed
        except ImportError:
            raise InputError("sweep.address", "the 'dask[distributed]' package installed for a Dask address",
                             address) from None
        try:
            client = Client(address, timeout=10)
        except (ValueError, OSError, TimeoutError) as exc:
            raise InputError("sweep.address", "a reachable Dask scheduler (tcp://host:port) or ray://host:port",
                             f"{address} ({type(exc).__name__})") from None
        try:
            futures = client.map(run_point, points, base=base, pure=False)
            for fut in dask_completed(futures):
                yield fut.result()
        finally:
            client.close()
        return
    workers = min(jobs, len(points))  # no idle workers: each one is a process with its own memory
    if workers <= 1:
        for p in points:
            yield run_point(p, base)
        return
    with ProcessPoolExecutor(max_workers=workers, initializer=_quiet_sigint) as ex:
        futs = [ex.submit(run_point, p, base) for p in points]
        for f in as_completed(futs):
            yield f.result()


def sweep(axes: dict[str, list], base: dict, out_dir: str, jobs: int | None = None,
          resume: bool = True, address: str | None = None, progress: bool = True) -> list[dict]:
    """Run the grid; returns all rows (old ones from ``points.jsonl`` included when resuming).

    Args:
        axes: axis name -> values (see :func:`parse_values`).
        base: :class:`megamoe.scenario.Scenario` keyword arguments shared by every point.
        out_dir: folder for ``points.jsonl``, ``results.csv``, ``results.parquet``, PNGs.
        jobs: local worker processes (default: CPU count), at most :func:`max_jobs`; no more
            are started than there are points to run.  Not with ``address``.
        resume: skip points already in ``points.jsonl`` (same point, base and input files'
            contents: :func:`point_key`).
        address: Dask scheduler (``tcp://host:port``, another Dask scheme, or ``host:port``) or
            Ray (``ray://host:port``, or ``ray`` for a local Ray) address.

    Nothing is written (not even ``out_dir``) before a valid point has finished, and only
    valid points are journaled: a sweep whose points are all invalid leaves no folder or
    file behind (and an earlier ``points.jsonl`` byte for byte as it was).

    Raises:
        InputError: ``jobs`` out of range (``sweep --jobs``), more than :data:`MAX_POINTS`
            points, a point whose scaled hardware leaves a figure's range (checked before
            anything runs, see :func:`check_scaled_hardware`), a block_m no design of the sweep
            takes (:func:`check_block_m`), a base hardware that does not
            load (``hardware``), a bad line in ``points.jsonl`` (:func:`read_log`), or no
            valid point (the first point's error is quoted), an ``address`` of neither form
            (``sweep.address``, before anything runs), or a cluster package missing.
    """
    bound = max_jobs()
    if jobs is not None:
        require(isinstance(jobs, int) and not isinstance(jobs, bool) and 1 <= jobs <= bound, "sweep --jobs",
                f"an integer in [1, {bound}] ({JOBS_PER_CPU} x the {os.cpu_count() or 1} CPUs)", jobs)
        require(not address, "sweep --jobs", "no --jobs with --address (the cluster's own workers run the points)",
                jobs)
    # the form of a cluster address, before anything runs or is written (Dask also takes host:port)
    require(not address or (isinstance(address, str) and (
        address == "ray" or re.fullmatch(r"(tcp|tls|ucx|inproc|ws|wss|ray)://\S+|[\w.\-]+:\d+", address))),
        "sweep.address", "tcp://host:port or host:port (Dask), or ray://host:port or ray (Ray)", address)
    port = re.search(r":(\d+)/?$", address) if address else None
    require(port is None or 1 <= int(port.group(1)) <= 65535, "sweep.address",
            "a port from 1 to 65535", address)
    log = os.path.join(out_dir, "points.jsonl")
    points = grid(axes)
    check_scaled_hardware(points, base)
    check_block_m(axes, base)
    check_design_only_axes(axes, base)
    if "hardware" not in axes:  # one hardware for every point: a bad one refuses the sweep now
        from .hardware import load_hardware

        load_hardware(base.get("hardware") or _scenario_default("hardware"))
    digests: dict[str, str] = {}  # each input file hashed once, before any point runs
    keys = [point_key(p, base, digests) for p in points]
    key_of = {json.dumps(p, sort_keys=True, default=str): k for p, k in zip(points, keys)}
    done: dict[str, dict] = {}
    if resume and os.path.exists(log):
        old = read_log(log)
        done = {k: {**p, **old[k]} for p, k in zip(points, keys) if k in old}
    todo = [p for p, k in zip(points, keys) if k not in done]
    jobs = jobs or os.cpu_count() or 1
    rows_iter = _executor_map(todo, base, jobs, address)
    mode = "a" if resume else "w"  # a fresh sweep replaces an earlier log, once it has a valid point

    def record(row: dict) -> None:
        nonlocal mode
        key = key_of[json.dumps({k: row[k] for k in axes}, sort_keys=True, default=str)]
        done[key] = row
        if row["error"]:  # invalid points are not journaled: recomputed (fast) on every run
            return
        os.makedirs(out_dir, exist_ok=True)
        with open(log, mode + "b") as f:
            if mode == "a" and f.tell() > 0:  # a log cut short without its last newline: start a line
                with open(log, "rb") as r:
                    r.seek(-1, os.SEEK_END)
                    if r.read(1) != b"\n":
                        f.write(b"\n")
            f.write((json.dumps({"_key": key, **row}) + "\n").encode())
        mode = "a"

    if progress and todo:
        from rich.progress import Progress

        with Progress(transient=False) as bar:
            task = bar.add_task(f"sweep ({len(points) - len(todo)} resumed)", total=len(todo))
            for row in rows_iter:
                record(row)
                bar.advance(task)
    else:
        for row in rows_iter:
            record(row)
    rows = [done[k] for k in keys if k in done]
    bad = [r for r in rows if r["error"]]
    if bad and len(bad) == len(rows):
        raise InputError("sweep", "at least one valid point", f"none ({bad[0]['error']})")
    write_outputs(rows, list(axes), out_dir, fixed=fixed_title(base, list(axes)))
    return rows


def fastest(rows: list[dict], n: int = 10) -> list[dict]:
    """The ``n`` valid rows of a sweep with the shortest predicted time, fastest first (ties in the
    grid's order)."""
    ok = [r for r in rows if not r["error"] and r["time_us"] is not None]
    return sorted(ok, key=lambda r: r["time_us"])[:n]


def fixed_title(base: dict, axis_names: list[str]) -> str:
    """What a sweep holds fixed, for its plots' titles: the shape, ranks, tokens per rank, hardware
    and design of ``base`` (the Scenario keywords) that no axis varies."""
    def given(key):
        v = base.get(key)
        return _scenario_default(key) if v is None else v

    shape, tokens = given("shape"), given("tokens_per_rank")
    parts = {"shape": getattr(shape, "name", shape), "ranks": f"EP{given('num_ranks')}",
             "tokens": None if tokens is None else f"{tokens} tokens/rank",  # None: a routing file's
             "hardware": given("hardware"), "design": given("design")}
    return ", ".join(str(v) for k, v in parts.items() if k not in axis_names and v is not None)


def write_outputs(rows: list[dict], axis_names: list[str], out_dir: str, fixed: str = "") -> None:
    """``results.csv``, ``results.parquet`` (only with pandas and pyarrow, the ``analysis`` extra)
    and ``time_us_vs_<axis>.png`` (titled ``fixed``: :func:`fixed_title`),
    all or nothing (:class:`megamoe.outputs.Outputs`: an error leaves the folder's earlier
    results as they were). Once they are written, an earlier sweep's ``time_us_vs_*.png`` of
    another axis (a plot of results no longer in the folder) is removed.

    Raises:
        InputError: an output path is a folder or a read-only file, or the folder is not writable.
    """
    from megamoe.outputs import Outputs

    if not rows:
        return
    cols = list(rows[0])
    with Outputs() as outs:
        csv_path = outs.reserve("sweep --out", os.path.join(out_dir, "results.csv"), (".csv",))
        try:
            import pandas as pd
            import pyarrow  # noqa: F401  (to_parquet's engine)
        except ImportError:  # pragma: no cover - the analysis extra is missing
            pd = None
        pq_path = outs.reserve("sweep --out", os.path.join(out_dir, "results.parquet"), (".parquet",)) if pd else None
        ok = any(r["time_us"] is not None for r in rows)  # nothing valid: no plots
        pngs = {a: outs.reserve("sweep --out", os.path.join(out_dir, f"time_us_vs_{a}.png"), (".png",))
                for a in (axis_names if ok else [])}
        with open(csv_path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=cols)
            w.writeheader()
            w.writerows(rows)
        if pd is not None:
            df = pd.DataFrame(rows)
            for c in axis_names:
                if df[c].map(type).nunique() > 1:
                    df[c] = df[c].astype(str)
            df.to_parquet(pq_path, index=False)
        plot_axes(rows, axis_names, pngs, fixed)
        outs.commit()
    mine = {os.path.basename(p) for p in pngs.values()}
    for f in os.listdir(out_dir):
        path = os.path.join(out_dir, f)
        if f.startswith("time_us_vs_") and f.endswith(".png") and f not in mine and os.path.isfile(path):
            os.remove(path)


#: Most lines one per-axis plot draws, one per combination of the other axes' values; with more
#: combinations it draws the fastest over them and shades their range.
MAX_PLOT_LINES = 8


def plot_axes(rows: list[dict], axis_names: list[str], paths: dict[str, str], fixed: str = "") -> None:
    """One PNG per axis, ``paths[axis]``: predicted time against the axis, one line per combination
    of the other axes' values (at most :data:`MAX_PLOT_LINES`; beyond that the fastest over them,
    with their range shaded), from 0 us up; an axis of powers of two spanning 8x or more on a
    base-2 log scale, one spanning over 50x on a log scale; ``fixed`` (what the sweep held fixed) as
    the title."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r["time_us"] is not None]
    if not ok:  # nothing valid to plot
        return
    for axis in axis_names:
        vals = list(dict.fromkeys(r[axis] for r in ok))
        others = [x for x in axis_names if x != axis]
        groups: dict[tuple, dict] = {}
        for r in ok:
            groups.setdefault(tuple(r[x] for x in others), {})[r[axis]] = r["time_us"]
        fig, ax = plt.subplots(figsize=(6.4, 3.8))
        numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals)
        xs = vals if numeric else list(range(len(vals)))
        pos = dict(zip(vals, xs))
        style = dict(marker="o", linestyle="-" if numeric else "none")  # categories: markers only
        if len(groups) <= MAX_PLOT_LINES:
            for key, ys in groups.items():
                label = ", ".join(f"{x}={v}" for x, v in zip(others, key)) or None
                pts = [(pos[v], ys[v]) for v in vals if v in ys]
                ax.plot([p[0] for p in pts], [p[1] for p in pts], label=label, **style)
            if others:
                ax.legend(fontsize=7)
            ylab = "predicted time (us)"
        else:
            lo = [min(g[v] for g in groups.values() if v in g) for v in vals]
            hi = [max(g[v] for g in groups.values() if v in g) for v in vals]
            ax.fill_between(xs, lo, hi, alpha=0.2, step=None if numeric else "mid")
            ax.plot(xs, lo, **style)
            ylab = f"predicted time (us)\nfastest of {len(groups)} other-axis points, their range shaded"
        if not numeric:
            ax.set_xticks(xs)
            ax.set_xticklabels([str(v) for v in vals], rotation=20, fontsize=8)
        else:
            if len(vals) > 2 and min(vals) > 0 and all(isinstance(v, int) and v & (v - 1) == 0 for v in vals) \
                    and max(vals) / min(vals) >= 8:
                ax.set_xscale("log", base=2)
            elif len(vals) > 2 and min(vals) > 0 and max(vals) / min(vals) > 50:
                ax.set_xscale("log")
            if len(vals) <= 10:  # a tick at each value swept
                ax.set_xticks(vals, [f"{v:g}" for v in vals])
                ax.minorticks_off()
            elif all(isinstance(v, int) for v in vals):  # no 4.5-token ticks on an integer axis
                from matplotlib.ticker import MaxNLocator

                ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylim(bottom=0)
        if fixed:
            ax.set_title(fixed, fontsize=8)
        ax.set_xlabel(axis)
        ax.set_ylabel(ylab, fontsize=9)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(paths[axis], dpi=100)
        plt.close(fig)

