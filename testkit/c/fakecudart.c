/* A stand-in CUDA runtime exposing only the driver entry-point queries, answered through the
 * driver's cuGetProcAddress_v2 reached with glibc's own dlsym (fetched with dlvsym, so no dlsym
 * hook sees that lookup), the way libcudart loads the driver. Built with -DLEGACY_ONLY it
 * exports only cudaGetDriverEntryPoint (CUDA 12.0-12.4 runtimes), otherwise also
 * cudaGetDriverEntryPointByVersion (12.5+), which a caller prefers. */
#define _GNU_SOURCE
#include <dlfcn.h>

typedef int (*gpa_t)(const char *, void **, int, unsigned long long, int *);

static gpa_t driver_gpa(void) {
    void *(*real_dlsym)(void *, const char *) =
        (void *(*)(void *, const char *))dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    void *driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!real_dlsym || !driver) return 0;
    return (gpa_t)real_dlsym(driver, "cuGetProcAddress_v2");
}

static int by_version(const char *symbol, void **fn, unsigned int version,
                      unsigned long long flags, int *status) {
    gpa_t gpa = driver_gpa();
    if (!gpa) return 3; /* cudaErrorInitializationError */
    return gpa(symbol, fn, (int)version, flags, status) ? 500 : 0; /* cudaErrorSymbolNotFound */
}

#ifndef LEGACY_ONLY
int cudaGetDriverEntryPointByVersion(const char *symbol, void **fn, unsigned int version,
                                     unsigned long long flags, int *status) {
    return by_version(symbol, fn, version, flags, status);
}
#endif

/* The runtime's own CUDA version decides which ABI an unsuffixed name gets. */
int cudaGetDriverEntryPoint(const char *symbol, void **fn, unsigned long long flags, int *status) {
    return by_version(symbol, fn, 12040, flags, status);
}
