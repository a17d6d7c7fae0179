/* Direct symbols: a library linked against libcuda.so.1 (-lcuda), as vLLM's cumem allocator,
 * torch_memory_saver and mscclpp are, whose driver calls are bound by the dynamic linker (PLT).
 * It hands those bound addresses out through the runtime's cudaGetDriverEntryPointByVersion
 * signature so the scriptable worker can call them: with the shim preloaded, the linker binds
 * every name the shim exports to the shim, the rest to the driver. Unsuffixed names map to the
 * symbol cuda.h's #defines pick for the requested version. */
#include <string.h>

#define FUNCTIONS(X)                                                                           \
    X(cuInit) X(cuDriverGetVersion) X(cuDeviceGetCount) X(cuDeviceGetAttribute)                \
    X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease_v2) X(cuDevicePrimaryCtxReset_v2)  \
    X(cuCtxSetCurrent) X(cuCtxGetCurrent) X(cuCtxCreate_v2) X(cuCtxCreate_v3) X(cuCtxCreate_v4)                   \
    X(cuCtxDestroy_v2) X(cuCtxSynchronize) X(cuMemGetAllocationGranularity) X(cuMemCreate)     \
    X(cuMemRelease) X(cuMemRetainAllocationHandle) X(cuMemGetAllocationPropertiesFromHandle)   \
    X(cuMemAddressReserve) X(cuMemAddressFree) X(cuMemMap) X(cuMemUnmap) X(cuMemSetAccess)     \
    X(cuMemGetAccess) X(cuMemExportToShareableHandle) X(cuMemImportFromShareableHandle)        \
    X(cuMemcpyHtoD_v2) X(cuMemcpyDtoH_v2) X(cuMemsetD8_v2) X(cuMemAlloc_v2) X(cuMemFree_v2)    \
    X(cuMemGetAddressRange_v2) X(cuMemHostRegister_v2) X(cuMemHostUnregister)                  \
    X(cuIpcGetMemHandle) X(cuIpcOpenMemHandle_v2) X(cuIpcCloseMemHandle)                       \
    X(cuMulticastGetGranularity) X(cuMulticastCreate) X(cuMulticastAddDevice)                  \
    X(cuMulticastBindMem) X(cuMulticastBindMem_v2) X(cuMulticastBindAddr)                      \
    X(cuMulticastBindAddr_v2) X(cuMulticastUnbind)

/* Only the addresses matter here; the caller casts each to its cuda.h prototype. */
#define DECLARE(f) extern void f(void);
FUNCTIONS(DECLARE)

struct entry {
    const char *name;
    void (*fn)(void);
};

#define EXACT(f) {#f, f},
static const struct entry EXACT_NAMES[] = {FUNCTIONS(EXACT)};

static const struct entry UNSUFFIXED[] = {
    {"cuDevicePrimaryCtxRelease", cuDevicePrimaryCtxRelease_v2},
    {"cuDevicePrimaryCtxReset", cuDevicePrimaryCtxReset_v2},
    {"cuCtxDestroy", cuCtxDestroy_v2},
    {"cuMemcpyHtoD", cuMemcpyHtoD_v2},
    {"cuMemcpyDtoH", cuMemcpyDtoH_v2},
    {"cuMemsetD8", cuMemsetD8_v2},
    {"cuMemAlloc", cuMemAlloc_v2},
    {"cuMemFree", cuMemFree_v2},
    {"cuMemGetAddressRange", cuMemGetAddressRange_v2},
    {"cuMemHostRegister", cuMemHostRegister_v2},
    {"cuIpcOpenMemHandle", cuIpcOpenMemHandle_v2},
};

static void (*find(const struct entry *table, unsigned long n, const char *name))(void) {
    for (unsigned long i = 0; i < n; i++)
        if (strcmp(table[i].name, name) == 0) return table[i].fn;
    return 0;
}

int cudaGetDriverEntryPointByVersion(const char *symbol, void **fn, unsigned int version,
                                     unsigned long long flags, int *status) {
    void (*f)(void) = 0;
    (void)flags;
    if (!symbol || !fn) return 1; /* cudaErrorInvalidValue */
    if (strcmp(symbol, "cuCtxCreate") == 0)
        f = version >= 12050 ? cuCtxCreate_v4 : version >= 11040 ? cuCtxCreate_v3 : cuCtxCreate_v2;
    if (!f) f = find(UNSUFFIXED, sizeof UNSUFFIXED / sizeof UNSUFFIXED[0], symbol);
    if (!f) f = find(EXACT_NAMES, sizeof EXACT_NAMES / sizeof EXACT_NAMES[0], symbol);
    if (status) *status = f ? 0 : 1; /* cudaDriverEntryPointSuccess / SymbolNotFound */
    *fn = (void *)f;
    return f ? 0 : 500; /* cudaErrorSymbolNotFound */
}
