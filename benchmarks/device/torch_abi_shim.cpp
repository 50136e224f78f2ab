// A shim for running sgl-deep-gemm 0.2.5's PyPI wheel (DeepGEMM's SM90 fp8_mega_moe, issue 5's
// third peer) on the lent H200s' torch 2.11: its _C.so was built against a newer torch and
// imports functions torch 2.11 exports under other names or not at all. Loaded with RTLD_GLOBAL
// before the wheel's _C.so (benchmarks/device/sgl_deep_gemm_probe.py --shim), this supplies
// the ones on the wheel's load and launch paths (the imports, nm -D of the wheel's _C.so; the
// calls, objdump of it):
//   * c10::cuda::CUDAErrorLogCapture's constructor: leaves the object as it is. At the wheel's
//     four call sites the object is constructed, its address passed to the check below, and
//     never read or destroyed out of line afterwards.
//   * the six-argument c10_cuda_check_implementation (the fifth argument a log capture):
//     forwards to torch's five-argument one, which raises torch's CUDA error.
// Targets are looked up in the global scope, then in torch's already-loaded libraries by soname.
//   * torch::Library::_def, both overloads, with the operator tags as torch::headeronly::Tag:
//     forward to torch 2.11's, whose tags are at::Tag (the mangled names differ only there;
//     every argument is a pointer, a reference or an enum, so the call passes through as is).
//   * at::TensorBase::const_data_ptr<float>() const: forwards to the first of torch 2.11's
//     spellings of it (or data_ptr<float>) that the process exports.
// A forwarder whose target is not found prints the names it tried and aborts: a run either
// goes through torch's own code or ends naming what was missing. The wheel's remaining
// imports (error paths) get aborting stubs from missing_symbol_stubs.py.
// Our own code: no torch headers, only mangled names. x86-64 System V calling convention.
// Build: g++ -O2 -shared -fPIC -o libtorch_abi_shim.so torch_abi_shim.cpp -ldl
#include <dlfcn.h>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace {
using Fwd = void* (*)(void*, void*, void*, void*, long);

// `name` from the global scope or from torch's libraries, which Python loads as dependencies of
// torch._C, outside the global scope (dlopen by soname with RTLD_NOLOAD: only if already loaded).
void* lookup(const char* name) {
    if (void* f = dlsym(RTLD_DEFAULT, name)) return f;
    static const char* const libs[] = {"libtorch_cpu.so", "libc10_cuda.so", "libc10.so", "libtorch_cuda.so",
                                       "libtorch.so"};
    for (const char* lib : libs)
        if (void* h = dlopen(lib, RTLD_LAZY | RTLD_NOLOAD))
            if (void* f = dlsym(h, name)) return f;
    return nullptr;
}

// The first of `names` (null-terminated) that `lookup` finds; abort naming them if none.
void* find_or_die(const char* what, const char* const* names) {
    for (const char* const* n = names; *n != nullptr; ++n)
        if (void* f = lookup(*n)) return f;
    std::fprintf(stderr, "torch_abi_shim: no target for %s; tried:", what);
    for (const char* const* n = names; *n != nullptr; ++n) std::fprintf(stderr, " %s", *n);
    std::fprintf(stderr, "\n");
    std::abort();
}
}  // namespace

namespace c10::cuda {
class CUDAErrorLogCapture {
public:
    CUDAErrorLogCapture();
};
CUDAErrorLogCapture::CUDAErrorLogCapture() {}

void c10_cuda_check_implementation(int32_t err, const char* filename, const char* function_name,
                                   uint32_t line_number, bool include_device_assertions,
                                   CUDAErrorLogCapture* /*capture*/) {
    using Check5 = void (*)(int32_t, const char*, const char*, uint32_t, bool);
    static Check5 check5 = reinterpret_cast<Check5>(lookup("_ZN3c104cuda29c10_cuda_check_implementationEiPKcS2_jb"));
    if (check5 == nullptr) {
        if (err == 0) return;
        std::fprintf(stderr, "torch_abi_shim: CUDA error %d at %s:%u (%s), and torch's "
                     "five-argument check was not found\n", (int)err, filename, line_number, function_name);
        std::abort();
    }
    check5(err, filename, function_name, line_number, include_device_assertions);
}
}  // namespace c10::cuda

// torch::Library::_def(std::variant<c10::OperatorName, c10::FunctionSchema>&&, CppFunction&&,
//                      const std::vector<torch::headeronly::Tag>&) &
extern "C" void* megamoe_def_variant(void* a, void* b, void* c, void* d, long e) __asm__(
    "_ZNR5torch7Library4_defEOSt7variantIJN3c1012OperatorNameENS2_14FunctionSchemaEEEONS_11CppFunctionERKSt6vectorINS_10headeronly3TagESaISB_EE");
extern "C" void* megamoe_def_variant(void* a, void* b, void* c, void* d, long e) {
    static const char* const names[] = {
        "_ZNR5torch7Library4_defEOSt7variantIJN3c1012OperatorNameENS2_14FunctionSchemaEEEONS_11CppFunctionERKSt6vectorIN2at3TagESaISB_EE",
        nullptr};
    static Fwd f = reinterpret_cast<Fwd>(find_or_die("Library::_def(variant, CppFunction, tags)", names));
    return f(a, b, c, d, e);
}

// torch::Library::_def(c10::FunctionSchema&&, c10::OperatorName*,
//                      const std::vector<torch::headeronly::Tag>&, _RegisterOrVerify) &
extern "C" void* megamoe_def_schema(void* a, void* b, void* c, void* d, long e) __asm__(
    "_ZNR5torch7Library4_defEON3c1014FunctionSchemaEPNS1_12OperatorNameERKSt6vectorINS_10headeronly3TagESaIS8_EENS_17_RegisterOrVerifyE");
extern "C" void* megamoe_def_schema(void* a, void* b, void* c, void* d, long e) {
    static const char* const names[] = {
        "_ZNR5torch7Library4_defEON3c1014FunctionSchemaEPNS1_12OperatorNameERKSt6vectorIN2at3TagESaIS8_EENS_17_RegisterOrVerifyE",
        nullptr};
    static Fwd f = reinterpret_cast<Fwd>(find_or_die("Library::_def(schema, name, tags, mode)", names));
    return f(a, b, c, d, e);
}

// float const* at::TensorBase::const_data_ptr<float>() const
extern "C" void* megamoe_const_data_ptr_f(void* self) __asm__("_ZNK2at10TensorBase14const_data_ptrIfEEPKT_v");
extern "C" void* megamoe_const_data_ptr_f(void* self) {
    static const char* const names[] = {
        "_ZNK2at10TensorBase14const_data_ptrIfTnNSt9enable_ifIXntsr3stdE10is_const_vIT_EEiE4typeELi0EEEPKS3_v",
        "_ZNK2at10TensorBase14const_data_ptrIfLi0EEEPKT_v",
        "_ZNK2at10TensorBase8data_ptrIfEEPT_v",
        nullptr};
    using Get = void* (*)(void*);
    static Get f = reinterpret_cast<Get>(find_or_die("TensorBase::const_data_ptr<float>", names));
    return f(self);
}
