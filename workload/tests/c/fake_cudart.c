/* A stand-in CUDA runtime exposing only the driver entry-point queries, answered through the
 * driver's cuGetProcAddress_v2 (as libcudart does). Built with -DLEGACY_ONLY it exports only
 * cudaGetDriverEntryPoint, to exercise the worker's fallback. */
#include <dlfcn.h>
#include <stddef.h>

typedef int (*get_proc_v2)(const char *, void **, int, unsigned long long, unsigned int *);

static get_proc_v2 driver_get_proc(void) {
    static get_proc_v2 get;
    if (!get) {
        void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        if (h) {
            get = (get_proc_v2)dlsym(h, "cuGetProcAddress_v2");
        }
    }
    return get;
}

static int lookup(const char *name, void **p, unsigned int version, unsigned long long flags,
                  int *status) {
    get_proc_v2 get = driver_get_proc();
    unsigned int st = 1;
    if (!get) {
        return 35; /* cudaErrorInsufficientDriver */
    }
    int r = get(name, p, (int)version, flags, &st);
    if (status) {
        *status = (int)st;
    }
    return r == 0 ? 0 : 500; /* cudaErrorSymbolNotFound */
}

#ifndef LEGACY_ONLY
int cudaGetDriverEntryPointByVersion(const char *name, void **p, unsigned int version,
                                     unsigned long long flags, int *status) {
    return lookup(name, p, version, flags, status);
}
#endif

int cudaGetDriverEntryPoint(const char *name, void **p, unsigned long long flags, int *status) {
    return lookup(name, p, 12000, flags, status);
}
