const _: () = assert!(cudarc::driver::sys::CUmemAllocationType_enum::CU_MEM_ALLOCATION_TYPE_PINNED as u32 == 1);
pub fn f() -> usize { core::mem::size_of::<cudarc::driver::sys::CUmemAllocationProp>() }
