//! Page-locked host allocations, managed memory and pointer attributes, as clients such as
//! NVIDIA's `cuda.core` use them: host buffers for copies, managed buffers the host touches
//! directly, and `cuPointerGetAttribute(s)` to tell what an address is.

mod support;

use std::ffi::c_void;
use support::*;

/// `CU_POINTER_ATTRIBUTE_*`.
const CONTEXT: u32 = 1;
const MEMORY_TYPE: u32 = 2;
const HOST_POINTER: u32 = 4;
const IS_MANAGED: u32 = 8;
const DEVICE_ORDINAL: u32 = 9;
const RANGE_START: u32 = 11;
const RANGE_SIZE: u32 = 12;
/// `CUmemorytype`.
const HOST: u32 = 1;
const DEVICE: u32 = 2;

fn attribute_u32(cu: &Cuda, attribute: u32, p: u64) -> Result<u32, u32> {
    let mut v = 0u32;
    match cu.cuPointerGetAttribute((&mut v as *mut u32).cast(), attribute, p) {
        SUCCESS => Ok(v),
        e => Err(e),
    }
}

fn attribute_u64(cu: &Cuda, attribute: u32, p: u64) -> Result<u64, u32> {
    let mut v = 0u64;
    match cu.cuPointerGetAttribute((&mut v as *mut u64).cast(), attribute, p) {
        SUCCESS => Ok(v),
        e => Err(e),
    }
}

#[test]
fn host_allocations_copy_and_describe_themselves() {
    let _serial = serial();
    let cu = cuda();
    let ctx = cu.setup(0);
    let mut p: *mut c_void = std::ptr::null_mut();
    ok(cu.cuMemHostAlloc(&mut p, 4096, 0x2));
    let host = p as u64;
    // SAFETY: 4096 writable bytes fakecuda just allocated.
    unsafe { std::ptr::write_bytes(p.cast::<u8>(), 0x5A, 4096) };
    let h = cu.create(GRAN, 0, 0);
    let dev = cu.map_rw(h, GRAN, 0);
    ok(cu.cuMemcpyHtoD_v2(dev, p, 4096));
    assert_eq!(cu.read(dev, 4096), vec![0x5A; 4096]);
    let mut flags = 0;
    ok(cu.cuMemHostGetFlags(&mut flags, p));
    assert_eq!(flags, 0x2);
    let mut alias = 0;
    ok(cu.cuMemHostGetDevicePointer_v2(&mut alias, p, 0));
    assert_eq!(alias, host, "unified addressing: the same address");
    assert_eq!(attribute_u32(cu, MEMORY_TYPE, host + 10), Ok(HOST));
    assert_eq!(attribute_u64(cu, CONTEXT, host), Ok(ctx as u64));
    assert_eq!(attribute_u64(cu, HOST_POINTER, host + 10), Ok(host + 10));
    assert_eq!(attribute_u64(cu, RANGE_START, host + 10), Ok(host));
    assert_eq!(attribute_u64(cu, RANGE_SIZE, host + 10), Ok(4096));
    // Device memory: a device type, no host alias.
    assert_eq!(attribute_u32(cu, MEMORY_TYPE, dev), Ok(DEVICE));
    assert_eq!(attribute_u32(cu, DEVICE_ORDINAL, dev), Ok(0));
    assert_eq!(attribute_u64(cu, HOST_POINTER, dev), Err(INVALID_VALUE));
    assert_eq!(
        cu.cuMemHostAlloc(&mut p, 4096, 0x80),
        INVALID_VALUE,
        "unknown flags"
    );
    ok(cu.cuMemFreeHost(host as *mut c_void));
    assert_eq!(
        cu.cuMemFreeHost(host as *mut c_void),
        INVALID_VALUE,
        "freed twice"
    );
    assert_eq!(attribute_u32(cu, MEMORY_TYPE, host), Err(INVALID_VALUE));
    cu.unmap_free(dev, GRAN, h);
}

#[test]
fn managed_memory_is_touched_by_the_host_and_copied_by_the_device() {
    let (_serial, cu) = begin(1);
    let mut m = 0;
    ok(cu.cuMemAllocManaged(&mut m, 1000, 1));
    // SAFETY: managed memory is host-accessible; 1000 bytes were allocated.
    unsafe { std::ptr::write_bytes(m as *mut u8, 7, 1000) };
    assert_eq!(cu.read(m, 1000), vec![7; 1000]);
    assert_eq!(attribute_u32(cu, IS_MANAGED, m), Ok(1));
    assert_eq!(attribute_u32(cu, DEVICE_ORDINAL, m), Ok(1));
    assert_eq!(attribute_u64(cu, HOST_POINTER, m), Ok(m));
    assert_eq!(attribute_u64(cu, RANGE_SIZE, m + 5), Ok(1000));
    assert_eq!(
        cu.cuMemAllocManaged(&mut m, 1000, 4),
        INVALID_VALUE,
        "unknown attach flag"
    );
    ok(cu.cuMemFree_v2(m));
}

#[test]
fn unknown_addresses_are_errors_one_by_one_and_zeros_in_bulk() {
    let (_serial, cu) = begin(0);
    let local = [0u8; 16];
    let p = local.as_ptr() as u64;
    assert_eq!(attribute_u32(cu, MEMORY_TYPE, p), Err(INVALID_VALUE));
    let attributes = [MEMORY_TYPE, CONTEXT, IS_MANAGED];
    let (mut kind, mut ctx, mut managed) = (9u32, 9u64, 9u32);
    let mut data: [*mut c_void; 3] = [
        (&mut kind as *mut u32).cast(),
        (&mut ctx as *mut u64).cast(),
        (&mut managed as *mut u32).cast(),
    ];
    ok(cu.cuPointerGetAttributes(3, attributes.as_ptr(), data.as_mut_ptr(), p));
    assert_eq!((kind, ctx, managed), (0, 0, 0));
    // Registered host memory is known.
    let mut buffer = vec![0u8; 8192];
    ok(cu.cuMemHostRegister_v2(buffer.as_mut_ptr().cast(), 8192, 0));
    let registered = buffer.as_ptr() as u64;
    ok(cu.cuPointerGetAttributes(3, attributes.as_ptr(), data.as_mut_ptr(), registered));
    assert_eq!(kind, HOST);
    ok(cu.cuMemHostUnregister(buffer.as_mut_ptr().cast()));
    assert_eq!(
        cu.cuPointerGetAttribute((&mut kind as *mut u32).cast(), 5, registered),
        INVALID_VALUE,
        "P2P tokens"
    );
}
