"""GPU-free tests of the kernel-path selection (``megamoe.kernel.select``) and of the ctypes ABI
of both paths.

The compute capability is monkeypatched (no GPU here); the SM100 library is built with nvcc
and loaded with ctypes on this CPU machine (it links the CUDA runtime statically and its
host entry points that do not touch a device run without one). Nothing here executes
kernel code.
"""

import ctypes
import dataclasses
import importlib
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from megamoe.errors import InputError

select = importlib.import_module("megamoe.kernel.select")
runtime = importlib.import_module("megamoe.kernel.runtime")
kbuild = importlib.import_module("megamoe.kernel.build")
CSRC = Path(__file__).resolve().parents[1] / "csrc" / "megamoe"
SUPPORTED = "9.x (sm_90a, H100/H200) or 10.0 (sm_100a, B200)"


def _need_sm100_build():
    if kbuild.find_nvcc() is None:
        pytest.skip("nvcc not installed")
    if kbuild.find_cutlass_include() is None:
        pytest.skip("CUTLASS/CuTe headers not found (pip install nvidia-cutlass)")


# ------------------------------------------------------------------ selection


@pytest.mark.parametrize("cc,arch,prefix,launchable", [((9, 0), "sm_90a", "megamoe_sm90", True),
                                                        ((10, 0), "sm_100a", "megamoe_sm100", False)])
def test_select_supported_capabilities(monkeypatch, cc, arch, prefix, launchable):
    monkeypatch.setattr(select, "device_capability", lambda device=None: cc)
    p = select.path_for_device("cuda:0")
    assert p is select.PATHS[arch]
    assert (p.arch, p.prefix, p.symbol("launch")) == (arch, prefix, f"{prefix}_launch")
    assert (p.launch_missing is None) == launchable
    want = runtime.Params if arch == "sm_90a" else select._sm100_params()
    assert p.params_type is want
    assert p.entries[f"{prefix}_launch"][0](p) == [ctypes.POINTER(want), ctypes.c_void_p]
    if arch == "sm_100a":
        assert [f for f, _ in want._fields_] == ["base", "block_k", "pull_bytes", "sf_pool_rows", "reserved"]
        assert want._fields_[0][1] is runtime.Params


@pytest.mark.parametrize("cc", [(8, 0), (12, 0), (10, 3), (7, 5)])
def test_unsupported_capability_is_one_line_input_error(monkeypatch, cc):
    monkeypatch.setattr(select, "device_capability", lambda device=None: cc)
    with pytest.raises(InputError) as ei:
        select.path_for_device()
    msg = str(ei.value)
    assert msg == f"device.compute_capability: expected {SUPPORTED}, got {cc[0]}.{cc[1]}"
    assert "\n" not in msg


def test_selection_is_build_arch_for_capability():
    """One rule: the table answers exactly where build.arch_for_capability does."""
    for major in range(6, 13):
        for minor in range(10):
            try:
                arch = kbuild.arch_for_capability(major, minor)
            except kbuild.KernelBuildError:
                with pytest.raises(InputError):
                    select.select_path(major, minor)
                continue
            assert select.select_path(major, minor).arch == arch
    assert set(select.PATHS) == set(kbuild.SOURCES) == set(kbuild.LIBNAMES)


class _FakeLib:
    pass


@pytest.fixture
def fake_loader(monkeypatch):
    """Record which arch MegaMoEKernel loads, without building anything."""
    calls = []

    def fake(arch="sm_90a"):
        calls.append(arch)
        return _FakeLib()

    monkeypatch.setattr(runtime, "load_library", fake)
    return calls


def _kernel(device="cuda:0"):
    return runtime.MegaMoEKernel(num_experts=8, topk=2, hidden=256, inter=128, max_tokens=16, weights=None,
                                 num_sms=4, device=device)


def test_megamoe_kernel_on_sm90_loads_the_sm90_library(monkeypatch, fake_loader):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(select, "device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda d: SimpleNamespace(major=9, minor=0, multi_processor_count=132))
    k = _kernel()
    assert fake_loader == ["sm_90a"]
    assert k.path is select.PATHS["sm_90a"] and isinstance(k.lib, _FakeLib)
    assert k.num_sms == 4


def test_megamoe_kernel_on_sm100_binds_then_says_what_is_missing(monkeypatch, fake_loader):
    pytest.importorskip("torch")
    monkeypatch.setattr(select, "device_capability", lambda device=None: (10, 0))
    with pytest.raises(NotImplementedError) as ei:
        _kernel()
    assert fake_loader == ["sm_100a"]  # the library was loaded (built, bound, ABI-checked) first
    msg = str(ei.value)
    assert msg == select.SM100_LAUNCH_MISSING
    for piece in ("design_sm90.design_for", "transform_weights_for_mega_moe", "sf_pool_rows",
                  "megamoe_sm100_launch", "never executed"):
        assert piece in msg


@pytest.mark.parametrize("cc", [(8, 0), (12, 0)])
def test_megamoe_kernel_on_other_gpus_raises_before_loading(monkeypatch, fake_loader, cc):
    pytest.importorskip("torch")
    monkeypatch.setattr(select, "device_capability", lambda device=None: cc)
    with pytest.raises(InputError, match=rf"got {cc[0]}\.{cc[1]}$"):
        _kernel()
    assert fake_loader == []


# ------------------------------------------------------------------ C sources vs ctypes


def _strip_comments(src: str) -> str:
    return re.sub(r"//[^\n]*", "", re.sub(r"/\*.*?\*/", "", src, flags=re.DOTALL))


def _struct_fields(src: str, name: str) -> list[tuple[str, str]]:
    """(field, kind) of ``struct <name> { ... };`` with kind int64 / double / ptr / a struct name."""
    body = re.search(r"struct\s+" + name + r"\s*\{(.*?)\};", _strip_comments(src), re.DOTALL).group(1)
    out = []
    for decl in (" ".join(d.split()) for d in body.split(";")):
        if not decl:
            continue
        if "*" in decl:
            kind, names = "ptr", decl.rsplit("*", 1)[1]
        else:
            m = re.fullmatch(r"(int64_t|double|\w+) (.+)", decl)
            kind, names = {"int64_t": "int64", "double": "double"}.get(m.group(1), m.group(1)), m.group(2)
        out += [(n.strip(), kind) for n in names.split(",")]
    return out


def _ctypes_fields(st) -> list[tuple[str, str]]:
    kinds = {ctypes.c_int64: "int64", ctypes.c_double: "double", ctypes.c_void_p: "ptr"}
    return [(n, kinds.get(t, t.__name__)) for n, t in st._fields_]


def test_sm90_params_mirror_matches_params_h_field_for_field():
    src = (CSRC / "params.h").read_text()
    assert _ctypes_fields(runtime.Params) == _struct_fields(src, "Params")


def test_sm100_params_mirror_matches_kernel_source_field_for_field():
    """Sm100Params (kernel_sm100.cu) = Params base + 4 int64 words; the ctypes mirror the
    SM100 path binds has the same fields in the same order and kinds, and 8-byte fields only,
    so the size is the field count times 8 (no padding)."""
    st = select.PATHS["sm_100a"].params_type
    c_fields = _struct_fields((CSRC / "kernel_sm100.cu").read_text(), "Sm100Params")
    assert c_fields == [("base", "Params"), ("block_k", "int64"), ("pull_bytes", "int64"),
                        ("sf_pool_rows", "int64"), ("reserved", "int64")]
    assert _ctypes_fields(st) == c_fields
    base = _struct_fields((CSRC / "params.h").read_text(), "Params")
    assert ctypes.sizeof(st) == 8 * (len(base) + len(c_fields) - 1)


_C_TYPES = {"int": ctypes.c_int, "long long": ctypes.c_longlong, "unsigned long long": ctypes.c_ulonglong,
            "const char*": ctypes.c_char_p, "void*": ctypes.c_void_p, "const void*": ctypes.c_void_p,
            "void**": ctypes.POINTER(ctypes.c_void_p)}


def _c_signatures(src: str) -> dict[str, tuple[str, list[str]]]:
    """name -> (return type, [parameter types]) of every ``megamoe_*`` function definition."""
    out = {}
    pat = re.compile(r"^((?:const )?[a-z ]+?\*?) (megamoe_\w+)\(([^)]*)\)\s*\{", re.MULTILINE)
    for m in pat.finditer(_strip_comments(src)):
        params = [] if m.group(3).strip() in ("", "void") else [
            re.sub(r"\s*\*\s*", "*", re.sub(r"\s+\w+$", "", p.strip())) for p in m.group(3).split(",")]
        out[m.group(2)] = (m.group(1).strip(), params)
    return out


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_bound_signatures_match_the_extern_c_definitions(arch):
    p = select.PATHS[arch]
    sigs = _c_signatures((CSRC / kbuild.SOURCES[arch]).read_text())
    struct = {"sm_90a": "const Params*", "sm_100a": "const Sm100Params*"}[arch]
    types = dict(_C_TYPES, **{struct: ctypes.POINTER(p.params_type)})
    for name, (args, res) in {**p.entries, **p.optional}.items():
        assert name in sigs, f"{name} not defined in {kbuild.SOURCES[arch]}"
        c_res, c_args = sigs[name]
        assert res is types[c_res], (name, c_res)
        if args is not None:
            assert (args(p) if callable(args) else list(args)) == [types[a] for a in c_args], (name, c_args)
    # every extern "C" entry point of the arch's prefix is in the table
    assert {n for n in sigs if n.startswith(p.prefix + "_")} <= set(p.entries) | set(p.optional)


# ------------------------------------------------------------------ the SM100 library on this machine


@pytest.fixture
def fresh_libs(monkeypatch):
    monkeypatch.setattr(runtime, "_LIBS", {})


def test_sm100_library_loads_and_binds_without_a_gpu(fresh_libs):
    """load_library("sm_100a") builds (or reuses) libmegamoe_sm100.so, binds the table's
    signatures and passes the ABI check: megamoe_sm100_abi_size() == sizeof(ctypes mirror)."""
    _need_sm100_build()
    from megamoe import design_sm100 as d100
    lib = runtime.load_library("sm_100a")
    st = select.PATHS["sm_100a"].params_type
    assert lib.megamoe_sm100_abi_size() == ctypes.sizeof(st) == ctypes.sizeof(runtime.Params) + 4 * 8
    assert lib.megamoe_sm100_launch.argtypes == [ctypes.POINTER(st), ctypes.c_void_p]
    assert runtime.load_library("sm_100a") is lib  # one per arch per process
    # the bound host entry points answer (no device touched)
    assert lib.megamoe_sm100_smem_bytes(128, 128, 4, 256) == d100.smem_bytes(128, 128, 4, 256)
    assert lib.megamoe_sm100_stage_bytes(16, 256) == d100.stage_bytes(16, 256)
    assert lib.megamoe_sm100_tmem_cols(192, 128) == d100.tmem_columns(192, 128)
    assert lib.megamoe_sm100_check_config(128, 128, 4, 8, 256, 4096, 2048, 1 << 33, 4096, 148) == 0
    assert lib.megamoe_sm100_check_config(48, 128, 4, 8, 256, 4096, 2048, 4608, 4096, 148) == -1
    assert lib.megamoe_sm100_error_string(-6) == b"the SM100 kernel needs a compute capability 10.x device (sm_100a)"


def test_abi_mismatch_is_a_kernel_error(monkeypatch, fresh_libs):
    _need_sm100_build()

    class Short(ctypes.Structure):
        _fields_ = [("base", runtime.Params), ("block_k", ctypes.c_int64)]

    bad = dataclasses.replace(select.PATHS["sm_100a"], params=lambda: Short)
    monkeypatch.setitem(select.PATHS, "sm_100a", bad)
    want = (rf"ABI mismatch \(sm_100a\): megamoe_sm100_abi_size\(\) = {ctypes.sizeof(runtime.Params) + 32} B, "
            rf"ctypes mirror Short = {ctypes.sizeof(runtime.Params) + 8} B$")
    with pytest.raises(runtime.KernelError, match=want):
        runtime.load_library("sm_100a")
    assert "sm_100a" not in runtime._LIBS


def test_unknown_arch():
    with pytest.raises(kbuild.KernelBuildError, match="expected one of"):
        runtime.load_library("sm_80")
