/* A stand-in CUDA runtime with a private loader: it reaches the driver's cuGetProcAddress_v2
 * through glibc's own dlsym (fetched with dlvsym, so no dlsym hook sees the lookup), the way a
 * runtime that bypasses interposition would. Only cudaGetDriverEntryPoint* is implemented. */
#define _GNU_SOURCE
#include <dlfcn.h>

typedef int (*gpa_t)(const char *, void **, int, unsigned long long, int *);

static gpa_t driver_gpa(void) {
    void *(*real_dlsym)(void *, const char *) = (void *(*)(void *, const char *))dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    void *driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!real_dlsym || !driver) return 0;
    return (gpa_t)real_dlsym(driver, "cuGetProcAddress_v2");
}

int cudaGetDriverEntryPointByVersion(const char *symbol, void **fn, unsigned int version,
                                     unsigned long long flags, int *status) {
    gpa_t gpa = driver_gpa();
    if (!gpa) return 3;
    return gpa(symbol, fn, (int)version, flags, status) ? 500 : 0;
}

int cudaGetDriverEntryPoint(const char *symbol, void **fn, unsigned long long flags, int *status) {
    return cudaGetDriverEntryPointByVersion(symbol, fn, 12080, flags, status);
}
