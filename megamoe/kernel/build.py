"""Build the kernel library with nvcc (no GPU needed), cached by a hash of the sources.

``build(arch)`` compiles one architecture's kernel into ``build/kernel/<hash>/<lib>.so``
(repo checkout) or ``~/.cache/megamoe/...`` and parses ptxas's resource report (registers,
stack frame, spill bytes per template instance):

* ``"sm_90a"``  -> ``csrc/megamoe/kernel_sm90.cu``  -> ``libmegamoe_sm90.so`` (H100/H200)
* ``"sm_100a"`` -> ``csrc/megamoe/kernel_sm100.cu`` -> ``libmegamoe_sm100.so`` (B200); needs
  the CUTLASS/CuTe headers (``pip install nvidia-cutlass``, or ``MEGAMOE_CUTLASS_INCLUDE`` /
  ``CUTLASS_PATH``), see :func:`find_cutlass_include`.

:func:`arch_for_capability` picks the arch from a device's compute capability (9.x ->
sm_90a, 10.x -> sm_100a). :func:`disassemble` / :func:`sass_opcodes` / :func:`check_sass`
read the SASS back (``cuobjdump -sass`` from the CUDA toolkit or the ``nvidia-cuda-cuobjdump``
wheel) and check the matrix instructions each binary must contain (:data:`REQUIRED_SASS`);
:func:`k_loop_sizes` counts each instance's K-loop instructions and :func:`sass_digests` tells
two builds' SASS apart (``megamoe build`` prints both).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

CSRC = Path(__file__).resolve().parents[2] / "csrc" / "megamoe"
SOURCES = {"sm_90a": "kernel_sm90.cu", "sm_100a": "kernel_sm100.cu"}
LIBNAMES = {"sm_90a": "libmegamoe_sm90.so", "sm_100a": "libmegamoe_sm100.so"}
GENCODE = {"sm_90a": "arch=compute_90a,code=sm_90a", "sm_100a": "arch=compute_100a,code=sm_100a"}
#: Architectures whose source needs the CUTLASS/CuTe headers.
NEEDS_CUTLASS = {"sm_90a", "sm_100a"}
#: SASS opcode prefixes each binary must contain, with what they are (found by disassembling
#: the builds; nvcc 13.0). sm_90a: FP8 WGMMA for every block_m instance (swap AB: N = block_m
#: tokens) and the setmaxnreg register split. sm_100a: the 2-CTA block-scaled UMMA, the UTCCP
#: scale copy, the TMEM load, the multicast commit and the TMEM allocator.
REQUIRED_SASS = {
    "sm_90a": {"QGMMA.64x": "wgmma.mma_async m64nNk32 E4M3 x E4M3 -> FP32 (N = the instance's block_m)",
               "WARPGROUP.DEPBAR": "wgmma.wait_group",
               "USETMAXREG": "setmaxnreg (dispatch/producer -> consumer registers)"},
    "sm_100a": {"UTCQMMA.2CTA": "tcgen05.mma.cta_group::2.kind::mxf8f6f4.block_scale (2-CTA, block-scaled)",
                "UTCCP.T.S.2CTA.4x32dp128bit": "tcgen05.cp.cta_group::2.32x128b.warpx4 (UE8M0 scales -> TMEM)",
                "LDTM": "tcgen05.ld (epilogue TMEM -> registers)",
                "UTCBAR.2CTA.MULTICAST": "tcgen05.commit multicast to both CTAs' mbarriers",
                "UTCATOMSWS.2CTA.FIND_AND_SET": "tcgen05.alloc.cta_group::2 (TMEM allocation)"},
}
FLAGS = ["-O3", "-std=c++17", "-Xcompiler", "-fPIC", "-shared", "-lineinfo", "-Xptxas", "-v",
         "-diag-suppress", "177"]
#: Spill bytes (ptxas, whole kernel) allowed per instance before ``build(strict=True)`` fails:
#: a cap against blow-ups. The sharp check is :func:`hot_loop_local_memory` (no local-memory
#: access inside the matrix loops), which needs the disassembler.
SPILL_LIMIT_BYTES = 512
#: The same cap for the SM90 two-CTAs-per-SM instances (``block_m=16,pair``, kernel v9.2): 64
#: registers per thread at launch, the dispatch and producer warps on 48 each since v9.6
#: (``design_sm90.PAIR_REGS``), ~860 B of spill stores in v9.10 (~2.2 KB with the dispatch on 32
#: in session 37; no local memory in the K loop; benchmarks/NOTES_kernel.md).
PAIR_SPILL_LIMIT_BYTES = 4096


def spill_limit(instance: str) -> int:
    """Spill bytes :func:`build` allows an instance (named as :func:`parse_ptxas` names it) in
    strict mode: :data:`PAIR_SPILL_LIMIT_BYTES` for the two-CTAs-per-SM instances, else
    :data:`SPILL_LIMIT_BYTES`."""
    return PAIR_SPILL_LIMIT_BYTES if ",pair" in instance else SPILL_LIMIT_BYTES
#: The matrix instructions that delimit a kernel's hot loop in SASS, per arch.
HOT_LOOP_OPS = {"sm_90a": "QGMMA", "sm_100a": "UTCQMMA"}


class KernelBuildError(RuntimeError):
    """nvcc missing, compile error; in strict mode: spills over the limit, local memory in
    the matrix loop, or WGMMAs serialized by ptxas."""


class BuildSetupError(KernelBuildError):
    """What the build needs is missing or wrong (an unknown arch, no nvcc, no CUTLASS headers,
    no cuobjdump, no kernel sources): the user's setup, not the code (``megamoe build`` exits 2)."""


@dataclass
class BuildResult:
    path: Path
    arch: str
    cached: bool
    resources: dict = field(default_factory=dict)  # kernel instance -> {registers, stack, spill_stores, spill_loads}
    log: str = ""
    #: non-inlined device functions (ptxas reports their frames separately) -> same keys
    device_functions: dict = field(default_factory=dict)

    def max_spill(self) -> int:
        return max((r["spill_stores"] for r in (*self.resources.values(), *self.device_functions.values())),
                   default=0)

    def over_spill_limit(self) -> dict[str, int]:
        """Instances (and device functions) whose spill stores exceed :func:`spill_limit`."""
        return {k: r["spill_stores"] for k, r in (*self.resources.items(), *self.device_functions.items())
                if r["spill_stores"] > spill_limit(k)}


def _cache_root() -> Path:
    env = os.environ.get("MEGAMOE_BUILD_DIR")
    if env:
        return Path(env)
    repo = CSRC.parents[1]
    if (repo / "pyproject.toml").exists() and os.access(repo, os.W_OK):
        return repo / "build" / "kernel"
    return Path.home() / ".cache" / "megamoe" / "kernel"


def _source_hash(arch: str) -> str:
    src = CSRC / SOURCES[arch]
    if not src.is_file():  # a wheel (non-editable) install carries no csrc/
        raise BuildSetupError(f"kernel sources: expected {src} (a source checkout installed with "
                               f"`pip install -e .`), got no such file")
    h = hashlib.sha256()
    for p in sorted(CSRC.glob("*")):
        # every header, but only this arch's translation unit (an SM100 edit keeps the SM90 cache)
        if p.suffix in (".cuh", ".h") or p.name == SOURCES.get(arch):
            h.update(p.name.encode())
            h.update(p.read_bytes())
    h.update(arch.encode())
    h.update(" ".join(FLAGS).encode())
    # CUTLASS/CuTe headers are not part of the key: a build carried to a machine without them
    # (a GPU node) keeps its cache entry. Use force=True after changing the CUTLASS install.
    return h.hexdigest()[:16]


def _has_cute(inc: Path) -> bool:
    return (inc / "cute" / "arch" / "mma_sm100_umma.hpp").is_file() and (inc / "cutlass" / "arch" / "barrier.h").is_file()


def find_cutlass_include() -> Path | None:
    """The CUTLASS/CuTe include directory with the SM100 atoms, or None.

    Looked up in order: ``$MEGAMOE_CUTLASS_INCLUDE`` (the include dir), ``$CUTLASS_PATH``
    (a CUTLASS checkout: ``<path>/include``), the ``nvidia-cutlass`` wheel
    (``cutlass_library/source/include`` of the installed package, found without importing it).
    """
    cands: list[Path] = []
    for env in ("MEGAMOE_CUTLASS_INCLUDE",):
        if os.environ.get(env):
            cands.append(Path(os.environ[env]))
    if os.environ.get("CUTLASS_PATH"):
        cands += [Path(os.environ["CUTLASS_PATH"]) / "include", Path(os.environ["CUTLASS_PATH"])]
    try:
        import importlib.util
        spec = importlib.util.find_spec("cutlass_library")
        if spec is not None and spec.submodule_search_locations:
            for loc in spec.submodule_search_locations:
                cands.append(Path(loc) / "source" / "include")
    except (ImportError, ValueError):
        pass
    for c in cands:
        if _has_cute(c):
            return c.resolve()
    return None


def find_cuobjdump() -> str | None:
    """``cuobjdump`` from $CUOBJDUMP, PATH, the toolkit beside nvcc, or the nvidia-cuda-cuobjdump wheel."""
    cands = [os.environ.get("CUOBJDUMP"), shutil.which("cuobjdump")]
    nvcc = find_nvcc()
    if nvcc:
        cands.append(str(Path(nvcc).resolve().parent / "cuobjdump"))
    cands.append("/usr/local/cuda/bin/cuobjdump")
    try:
        import importlib.util
        spec = importlib.util.find_spec("nvidia")
        for loc in (spec.submodule_search_locations or []) if spec else []:
            cands += [str(p) for p in sorted(Path(loc).glob("*/bin/cuobjdump"))]
    except (ImportError, ValueError):
        pass
    for c in cands:
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return c
    return None


def arch_for_capability(major: int, minor: int = 0) -> str:
    """Kernel arch for a device's compute capability: 9.x -> sm_90a, 10.x -> sm_100a.

    Raises:
        KernelBuildError: no kernel for that capability (the ``a`` targets run only on their
            own major version: sm_100a code does not run on 10.3 / 12.x parts either way).
    """
    if major == 9:
        return "sm_90a"
    if major == 10 and minor == 0:
        return "sm_100a"
    raise KernelBuildError(f"no megamoe kernel for compute capability {major}.{minor} "
                           "(sm_90a needs 9.0, sm_100a needs 10.0)")


def find_nvcc() -> str | None:
    for cand in (os.environ.get("NVCC"), shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if cand and Path(cand).exists():
            return cand
    return None


def _split_entries(log: str, res: dict) -> tuple[dict, dict]:
    """(kernel instances, non-inlined device functions) of a :func:`parse_ptxas` result."""
    entries = set(re.findall(r"Compiling entry function '(\S+)'", log))
    if not entries:
        return res, {}
    keys = {_instance_name(e) for e in entries}
    return ({k: v for k, v in res.items() if k in keys}, {k: v for k, v in res.items() if k not in keys})


def _instance_name(sym: str) -> str:
    """An SM90 instance ``megamoe_sm90_kernel<BM, PROF, WIDE, CTAS, TR>`` as ``block_m=16``
    (untraced: no trace code, kernel v9.13), ``block_m=16,traced`` (TR, launched with a trace
    capacity) or ``block_m=16,profile`` (PROF and TR: fault_inject bit 32), with ``,wide`` for
    the wide walk and ``,pair`` for two CTAs per SM before the last tag (``block_m=16,wide,pair,
    traced``); ``block_m=128,block_k=128`` (SM100); or the symbol itself."""
    sm90 = re.search(r"ILi(\d+)ELb([01])ELb([01])ELi([12])ELb([01])E", sym)
    if sm90:
        bm, prof, wide, ctas, tr = sm90.groups()
        return (f"block_m={bm}" + (",wide" if wide == "1" else "") + (",pair" if ctas == "2" else "")
                + (",profile" if prof == "1" else ",traced" if tr == "1" else ""))
    bmk = re.search(r"ILi(\d+)ELi(\d+)E", sym)
    if bmk:
        return f"block_m={bmk.group(1)},block_k={bmk.group(2)}"
    return sym


def parse_ptxas(log: str) -> dict:
    """Registers / stack / spills per function (kernel instances named ``block_m=..``) from
    ``-Xptxas -v`` output."""
    res: dict = {}
    cur = None
    for line in log.splitlines():
        m = re.search(r"Function properties for (\S+)", line)
        if m:
            cur = _instance_name(m.group(1))
            res.setdefault(cur, {"registers": 0, "stack": 0, "spill_stores": 0, "spill_loads": 0})
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and cur:
            res[cur].update(stack=int(m.group(1)), spill_stores=int(m.group(2)), spill_loads=int(m.group(3)))
        m = re.search(r"Used (\d+) registers", line)
        if m and cur:
            res[cur]["registers"] = int(m.group(1))
    return res


_SERIALIZED = re.compile(r"\((C\d+)\) Potential Performance Loss: wgmma\.mma_async instructions are serialized"
                         r"(.*?) in the function '(\S+?)'")


def serialized_wgmma(log: str) -> dict[str, str]:
    """Kernel instances whose WGMMAs ptxas serialized (each waited for before the next is
    issued, so no WGMMA overlaps any other work), from ``-Xptxas -v`` output: instance name
    (as :func:`parse_ptxas`) -> ``"C75xx: <ptxas's reason>"``. ptxas does this when, for
    example, a non-WGMMA instruction reads an accumulator of a WGMMA in flight (C7514) or a
    WGMMA is in flight across a branch it cannot prove warp-uniform (C7518). It is only a
    diagnostic: the build succeeds and the kernel runs, slower (benchmarks/NOTES_kernel.md,
    thirteenth session)."""
    out: dict[str, str] = {}
    for m in _SERIALIZED.finditer(log):
        out[_instance_name(m.group(3))] = f"{m.group(1)}:{m.group(2).strip()}"
    return out


def _result(out: Path, arch: str, cached: bool, log: str) -> BuildResult:
    kernels, funcs = _split_entries(log, parse_ptxas(log))
    return BuildResult(out, arch, cached, kernels, log, device_functions=funcs)


def library_path(arch: str = "sm_90a") -> Path:
    return _cache_root() / _source_hash(arch) / LIBNAMES[arch]


def build(arch: str = "sm_90a", force: bool = False, strict: bool = False, verbose: bool = False) -> BuildResult:
    """Compile (or reuse) the kernel library for ``arch``; see module docstring."""
    if arch not in SOURCES:
        raise BuildSetupError(f"arch: expected one of {sorted(SOURCES)}, got {arch!r}")
    have_cuobjdump = find_cuobjdump() is not None
    if strict and not have_cuobjdump:  # the matrix-loop check reads the SASS: said before compiling
        raise BuildSetupError("strict: expected cuobjdump for the SASS check of the matrix loops (install the CUDA "
                              "toolkit or `pip install nvidia-cuda-cuobjdump`, or set CUOBJDUMP=/path/to/cuobjdump), "
                              "got none")
    out = library_path(arch)
    logf = out.with_suffix(".log")
    if out.exists() and logf.exists() and not force:
        log = logf.read_text()
        r = _result(out, arch, True, log)
    else:
        nvcc = find_nvcc()
        if nvcc is None:
            raise BuildSetupError("nvcc not found: install the CUDA toolkit (12.4+) or set NVCC=/path/to/nvcc")
        includes = []
        if arch in NEEDS_CUTLASS:
            inc = find_cutlass_include()
            if inc is None:
                raise BuildSetupError(
                    f"{arch} needs the CUTLASS/CuTe headers: `pip install -e '.[kernel]'` (or "
                    "`pip install 'nvidia-cutlass>=4.2'`), or set MEGAMOE_CUTLASS_INCLUDE=/path/to/cutlass/include "
                    "or CUTLASS_PATH=/path/to/cutlass")
            includes = [f"-I{inc}"]
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:  # e.g. MEGAMOE_BUILD_DIR under /proc, or a file where a folder goes
            where = "MEGAMOE_BUILD_DIR" if os.environ.get("MEGAMOE_BUILD_DIR") else "build folder"
            raise BuildSetupError(f"{where}: expected a folder this process can create and write, got "
                                  f"{out.parent} ({e.strerror or type(e).__name__})") from None
        tmp = out.with_suffix(".tmp.so")
        cmd = [nvcc, f"-gencode={GENCODE[arch]}", *FLAGS, *includes, "-o", str(tmp), str(CSRC / SOURCES[arch])]
        p = subprocess.run(cmd, capture_output=True, text=True)
        log = p.stdout + p.stderr
        if p.returncode != 0:
            raise KernelBuildError(f"nvcc failed ({p.returncode}):\n{log[-4000:]}")
        tmp.replace(out)
        logf.write_text(log)
        r = _result(out, arch, False, log)
    if verbose:
        for k, v in sorted(r.resources.items()):
            print(f"{arch} {k}: {v['registers']} registers, {v['stack']} B stack, "
                  f"{v['spill_stores']} B spill stores, {v['spill_loads']} B spill loads")
        for k, v in sorted(r.device_functions.items()):  # out-of-line (__noinline__) functions: no register count
            print(f"{arch} device function {k}: {v['stack']} B stack, "
                  f"{v['spill_stores']} B spill stores, {v['spill_loads']} B spill loads")
    if strict and (over := r.over_spill_limit()):
        raise KernelBuildError(f"register spills over {SPILL_LIMIT_BYTES} B ({PAIR_SPILL_LIMIT_BYTES} B for the "
                               f"two-CTAs-per-SM instances): {over}")
    if strict and (serialized := serialized_wgmma(r.log)):
        raise KernelBuildError(f"ptxas serialized the WGMMAs of: {serialized}")
    sass = disassemble(r.path) if (strict or verbose) and have_cuobjdump else None
    if verbose and sass is not None:
        sizes, digests = k_loop_sizes(arch, sass), sass_digests(sass)
        for k in sorted(digests, key=lambda k: [int(x) if x.isdigit() else x for x in re.split(r"(\d+)", k)]):
            loop = f"K loop {sizes[k]} instructions, " if k in sizes else ""
            print(f"{arch} {k}: {loop}SASS {digests[k]}")
    if strict and sass is not None:
        bad = hot_loop_spills(arch, sass)
        if bad:
            raise KernelBuildError(f"local-memory loads/stores inside the matrix loop: {bad}")
    return r


def disassemble(path: Path | str) -> str:
    """SASS text of a built library (``cuobjdump -sass``).

    Raises:
        KernelBuildError: no cuobjdump (install the CUDA toolkit or ``pip install
            nvidia-cuda-cuobjdump``, or set CUOBJDUMP) or it failed.
    """
    tool = find_cuobjdump()
    if tool is None:
        raise BuildSetupError("cuobjdump not found: install the CUDA toolkit, `pip install nvidia-cuda-cuobjdump`, "
                               "or set CUOBJDUMP=/path/to/cuobjdump")
    p = subprocess.run([tool, "-sass", str(path)], capture_output=True, text=True)
    if p.returncode != 0:
        raise KernelBuildError(f"cuobjdump failed ({p.returncode}): {p.stderr[-2000:]}")
    return p.stdout


#: an instruction's opcode (with modifiers) after its predicate, if any
_SASS_OP = re.compile(r"(?:@!?U?P[0-9T]\s+)?([A-Z][A-Z0-9_]*(?:\.[A-Za-z0-9_]+)*)")


def sass_functions(sass: str) -> dict[str, list[str]]:
    """Opcode (with modifiers) sequence per kernel function of a ``cuobjdump -sass`` listing."""
    return {fn: [op for _, op, _ in ins] for fn, ins in _sass_instructions(sass).items()}


_SASS_BRANCH = re.compile(r"\bBRA(?:\.\w+)*\s+(?:U?R\w+,\s*)?0x([0-9a-f]+)")


def _sass_lines(sass: str) -> dict[str, list[tuple[int, str]]]:
    """(address, instruction text without the trailing ``;``) per kernel function of a
    ``cuobjdump -sass`` listing."""
    out: dict[str, list[tuple[int, str]]] = {}
    cur = None
    for line in sass.splitlines():
        m = re.search(r"Function : (\S+)", line)
        if m:
            cur = out.setdefault(m.group(1), [])
            continue
        m = re.match(r"^\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
        if m and cur is not None:
            cur.append((int(m.group(1), 16), m.group(2)))
    return out


def _sass_instructions(sass: str) -> dict[str, list[tuple[int, str, int | None]]]:
    """(address, opcode, branch target or None) per instruction per kernel function."""
    out: dict[str, list[tuple[int, str, int | None]]] = {}
    for fn, lines in _sass_lines(sass).items():
        ins = out[fn] = []
        for a, t in lines:
            m = _SASS_OP.match(t)
            if m:
                b = _SASS_BRANCH.search(t)
                ins.append((a, m.group(1), int(b.group(1), 16) if b else None))
    return out


def _backward_loops(branches: list[tuple[int, int | None]]) -> list[tuple[int, int]]:
    """The loops of one function given (address, branch target or None) per instruction: (index
    of the target, index of the branch) for every branch back to an instruction of the listing."""
    pos = {a: i for i, (a, _) in enumerate(branches)}
    return [(pos[t], i) for i, (a, t) in enumerate(branches) if t is not None and t <= a and t in pos]


def sass_opcodes(sass: str) -> dict[str, dict[str, int]]:
    """Opcode (with modifiers) counts per kernel function of a ``cuobjdump -sass`` listing."""
    return {fn: dict(Counter(ops)) for fn, ops in sass_functions(sass).items()}


def hot_loop_local_memory(arch: str, sass: str) -> dict[str, int]:
    """Per kernel function, the number of local-memory instructions (``LDL``/``STL``, i.e.
    register spills) in its matrix code: the span from its first to its last matrix instruction
    (:data:`HOT_LOOP_OPS`), and the K loop around each matrix instruction (the smallest loop,
    a backward branch and its target, around it, when no other matrix loop lies inside it)
    from the loop's top (the stage wait) to its back edge, so that a reload after a K block's
    last WGMMA counts too (kernel v7.3 experiments, benchmarks/NOTES_kernel.md). Out-of-line
    slow paths (the spin-waits' timeouts) and a peeled K block's enclosing block loop are not
    counted. Spills elsewhere (dispatch, producer
    address set-up, once-per-block epilogue code) are allowed up to :data:`SPILL_LIMIT_BYTES`."""
    mma = HOT_LOOP_OPS[arch]
    out: dict[str, int] = {}
    for fn, ins in _sass_instructions(sass).items():
        ops = [op for _, op, _ in ins]
        idx = [i for i, o in enumerate(ops) if o.startswith(mma)]
        if not idx:
            out[fn] = 0
            continue
        loops = [(b, e) for b, e in _backward_loops([(a, t) for a, _, t in ins]) if any(b <= j <= e for j in idx)]
        hot = set(range(idx[0], idx[-1] + 1))
        for j in idx:  # the smallest loop around each matrix instruction, if it is a K loop
            around = [(e - b, b, e) for b, e in loops if b <= j <= e]
            if around:
                _, b, e = min(around)
                if not any(b <= b2 and e2 <= e and (b2, e2) != (b, e) for b2, e2 in loops):
                    hot.update(range(b, e + 1))
        out[fn] = sum(1 for j in hot if ops[j].startswith(("LDL", "STL")))
    return out


def hot_loop_spills(arch: str, sass: str) -> dict[str, int]:
    """The timed kernel instances with local memory in their matrix code
    (:func:`hot_loop_local_memory` > 0), instance name (as :func:`parse_ptxas`) -> count: what
    ``build(strict=True)`` refuses. The SM90 profile instances (``block_m=..,profile``, launched
    only with ``fault_inject`` bit 32) are left out: their clock reads cost the block_m 128 K
    loop a few spill reloads by design (kernel v6.6, benchmarks/NOTES_kernel.md)."""
    return {_instance_name(fn): n for fn, n in hot_loop_local_memory(arch, sass).items()
            if n and not _instance_name(fn).endswith(",profile")}


def k_loop_sizes(arch: str, sass: str) -> dict[str, int]:
    """Per kernel instance (named as :func:`parse_ptxas` names them), the SASS instructions one K
    block runs: the smallest loop (a backward branch and its target) around the instance's first
    matrix instruction (:data:`HOT_LOOP_OPS`), from its top (the stage wait) to its back edge,
    less each spin wait's retry code (what the first forward branch inside the loop after an
    unpredicated ``TRYWAIT`` jumps over). These are the K-loop sizes ``benchmarks/NOTES_kernel.md`` gives per
    kernel version (v8.4 and v8.5: 154 / 177 / 224 / 313 at block_m 16 / 32 / 64 / 128). Functions
    without such a loop are left out."""
    mma = HOT_LOOP_OPS[arch]
    out: dict[str, int] = {}
    for fn, lines in _sass_lines(sass).items():
        first = next((i for i, (_, t) in enumerate(lines) if (m := _SASS_OP.match(t)) and m.group(1).startswith(mma)),
                     None)
        if first is None:
            continue
        targets = [(a, int(b.group(1), 16) if (b := _SASS_BRANCH.search(t)) else None) for a, t in lines]
        around = [(e - b, b, e) for b, e in _backward_loops(targets) if b <= first <= e]
        if not around:
            continue
        _, lo, hi = min(around)
        n, skip_to, after_wait, end = 0, None, False, lines[hi][0]
        for (a, t), (_, target) in zip(lines[lo:hi + 1], targets[lo:hi + 1]):
            if skip_to is not None:
                if a < skip_to:
                    continue
                skip_to = None
            n += 1
            if "TRYWAIT" in t and not t.startswith("@"):
                after_wait = True
            elif after_wait and target is not None and a < target <= end:
                skip_to, after_wait = target, False
        out[_instance_name(fn)] = n
    return out


def sass_digests(sass: str) -> dict[str, str]:
    """Per kernel instance, a digest (12 hex digits of SHA-256) of its SASS instruction text,
    addresses and encodings left out: equal digests mean identical SASS, the check behind "SASS
    identical" in ``benchmarks/NOTES_kernel.md`` (a source change that must not change the
    measured code, e.g. a comment or a helper)."""
    return {_instance_name(fn): hashlib.sha256("\n".join(t for _, t in lines).encode()).hexdigest()[:12]
            for fn, lines in _sass_lines(sass).items()}


def check_sass(arch: str, sass: str) -> dict[str, dict[str, int]]:
    """Per kernel function, how many instructions start with each :data:`REQUIRED_SASS` prefix
    of ``arch``. Raises :class:`KernelBuildError` naming the function and the missing prefixes
    if any function lacks one."""
    req = REQUIRED_SASS[arch]
    found: dict[str, dict[str, int]] = {}
    missing = []
    for fn, ops in sass_opcodes(sass).items():
        found[fn] = {r: sum(n for op, n in ops.items() if op.startswith(r)) for r in req}
        lack = [r for r, n in found[fn].items() if n == 0]
        if lack:
            missing.append(f"{fn}: {lack}")
    if not found:
        raise KernelBuildError(f"no kernel functions in the {arch} SASS listing")
    if missing:
        raise KernelBuildError(f"{arch} SASS lacks required instructions: " + "; ".join(missing))
    return found
