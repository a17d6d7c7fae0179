/* A driver that does nothing, for measuring what the shim's gate adds to a pass-through
 * call when the driver itself costs (almost) nothing and takes no lock. */
int cuDriverGetVersion(int *version) {
    *version = 13010;
    return 0;
}

int cuCtxGetDevice(int *device) {
    *device = 0;
    return 0;
}
