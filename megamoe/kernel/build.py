"""Build the kernel library with nvcc (no GPU needed), cached by a hash of the sources.

``build(arch="sm_90a")`` compiles ``csrc/megamoe/kernel_sm90.cu`` into
``build/kernel/<hash>/libmegamoe_sm90.so`` (repo checkout) or ``~/.cache/megamoe/...``, and
parses ptxas's resource report (registers, stack frame, spill bytes per template instance).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

CSRC = Path(__file__).resolve().parents[2] / "csrc" / "megamoe"
SOURCES = {"sm_90a": "kernel_sm90.cu"}
LIBNAMES = {"sm_90a": "libmegamoe_sm90.so"}
FLAGS = ["-O3", "-std=c++17", "-Xcompiler", "-fPIC", "-shared", "-lineinfo", "-Xptxas", "-v",
         "-diag-suppress", "177"]
#: Spill bytes allowed per instance before ``build(strict=True)`` fails (hot-loop spills).
SPILL_LIMIT_BYTES = 256


class KernelBuildError(RuntimeError):
    """nvcc missing, compile error, or spills over the limit in strict mode."""


@dataclass
class BuildResult:
    path: Path
    arch: str
    cached: bool
    resources: dict = field(default_factory=dict)  # instance -> {registers, stack, spill_stores, spill_loads}
    log: str = ""

    def max_spill(self) -> int:
        return max((r["spill_stores"] for r in self.resources.values()), default=0)


def _cache_root() -> Path:
    env = os.environ.get("MEGAMOE_BUILD_DIR")
    if env:
        return Path(env)
    repo = CSRC.parents[1]
    if (repo / "pyproject.toml").exists() and os.access(repo, os.W_OK):
        return repo / "build" / "kernel"
    return Path.home() / ".cache" / "megamoe" / "kernel"


def _source_hash(arch: str) -> str:
    h = hashlib.sha256()
    for p in sorted(CSRC.glob("*")):
        if p.suffix in (".cu", ".cuh", ".h"):
            h.update(p.name.encode())
            h.update(p.read_bytes())
    h.update(arch.encode())
    h.update(" ".join(FLAGS).encode())
    return h.hexdigest()[:16]


def find_nvcc() -> str | None:
    for cand in (os.environ.get("NVCC"), shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if cand and Path(cand).exists():
            return cand
    return None


def parse_ptxas(log: str) -> dict:
    """Registers / stack / spills per kernel instance from ``-Xptxas -v`` output."""
    res: dict = {}
    cur = None
    for line in log.splitlines():
        m = re.search(r"Function properties for (\S+)", line)
        if m:
            cur = m.group(1)
            bm = re.search(r"ILi(\d+)E", cur)
            cur = f"block_m={bm.group(1)}" if bm else cur
            res.setdefault(cur, {"registers": 0, "stack": 0, "spill_stores": 0, "spill_loads": 0})
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and cur:
            res[cur].update(stack=int(m.group(1)), spill_stores=int(m.group(2)), spill_loads=int(m.group(3)))
        m = re.search(r"Used (\d+) registers", line)
        if m and cur:
            res[cur]["registers"] = int(m.group(1))
    return res


def library_path(arch: str = "sm_90a") -> Path:
    return _cache_root() / _source_hash(arch) / LIBNAMES[arch]


def build(arch: str = "sm_90a", force: bool = False, strict: bool = False, verbose: bool = False) -> BuildResult:
    """Compile (or reuse) the kernel library for ``arch``; see module docstring."""
    if arch not in SOURCES:
        raise KernelBuildError(f"arch: expected one of {sorted(SOURCES)}, got {arch!r} "
                               "(the sm_100a path is not written yet)")
    out = library_path(arch)
    logf = out.with_suffix(".log")
    if out.exists() and logf.exists() and not force:
        log = logf.read_text()
        r = BuildResult(out, arch, True, parse_ptxas(log), log)
    else:
        nvcc = find_nvcc()
        if nvcc is None:
            raise KernelBuildError("nvcc not found: install the CUDA toolkit (12.4+) or set NVCC=/path/to/nvcc")
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp.so")
        gencode = {"sm_90a": "arch=compute_90a,code=sm_90a"}[arch]
        cmd = [nvcc, f"-gencode={gencode}", *FLAGS, "-o", str(tmp), str(CSRC / SOURCES[arch])]
        p = subprocess.run(cmd, capture_output=True, text=True)
        log = p.stdout + p.stderr
        if p.returncode != 0:
            raise KernelBuildError(f"nvcc failed ({p.returncode}):\n{log[-4000:]}")
        tmp.replace(out)
        logf.write_text(log)
        r = BuildResult(out, arch, False, parse_ptxas(log), log)
    if verbose:
        for k, v in sorted(r.resources.items()):
            print(f"{arch} {k}: {v['registers']} registers, {v['stack']} B stack, "
                  f"{v['spill_stores']} B spill stores, {v['spill_loads']} B spill loads")
    if strict and r.max_spill() > SPILL_LIMIT_BYTES:
        raise KernelBuildError(f"register spills over {SPILL_LIMIT_BYTES} B: {r.resources}")
    return r
