//! Identity and init, VMM, export and import, descriptors, driver objects.

use super::*;

impl State {
    pub(super) fn run_memory(&mut self, cmd: Command, fd: Option<OwnedFd>) -> Outcome {
        match cmd {
            Command::Ping => {
                let (pid, nspid) = pids();
                reply(Reply::Hello {
                    pid,
                    nspid,
                    // SAFETY: getppid has no preconditions.
                    ppid: unsafe { libc::getppid() },
                })
            }
            Command::Init { device } => {
                let d = self.driver()?;
                let mut count: c_int = 0;
                let mut ctx: *mut c_void = std::ptr::null_mut();
                // SAFETY: cuInit takes flags only; the out-parameters are valid locals.
                unsafe {
                    d.init(0)?;
                    d.device_get_count(&mut count)?;
                    d.primary_ctx_retain(&mut ctx, device)?;
                    d.ctx_set_current(ctx)?;
                }
                let (pid, nspid) = pids();
                reply(Reply::Init {
                    pid,
                    nspid,
                    device_count: count,
                })
            }
            Command::SetDevice { device } => {
                let d = self.driver()?;
                let mut ctx: *mut c_void = std::ptr::null_mut();
                // SAFETY: `ctx` is a valid out-parameter; the context comes from the driver.
                unsafe {
                    d.primary_ctx_retain(&mut ctx, device)?;
                    d.ctx_set_current(ctx)?;
                }
                reply(Reply::Context {
                    ctx: ctx as usize as u64,
                })
            }
            Command::DriverVersion => {
                let mut v: c_int = 0;
                // SAFETY: valid out-parameter.
                unsafe { self.driver()?.driver_get_version(&mut v)? };
                reply(Reply::Version { version: v })
            }
            Command::Granularity {
                device,
                handle_types,
                option,
            } => {
                let prop = RawAllocProp::pinned(cuda::LOCATION_TYPE_DEVICE, device, handle_types);
                let d = self.driver()?;
                // SAFETY: valid property input and out-parameter.
                size_reply(|g| unsafe { d.mem_get_allocation_granularity(g, &prop, option) })
            }
            Command::Create {
                size,
                device,
                handle_types,
                location_type,
            } => {
                let prop = RawAllocProp::pinned(location_type, device, handle_types);
                let size = usize_of(size, "size")?;
                let mut h = 0u64;
                // SAFETY: valid property input and out-parameter.
                unsafe { self.driver()?.mem_create(&mut h, size, &prop, 0)? };
                reply(Reply::Handle { handle: h })
            }
            Command::Release { handle } => {
                // SAFETY: integers only.
                unsafe { self.driver()?.mem_release(handle)? };
                done()
            }
            Command::Retain { address } => {
                let mut h = 0u64;
                // SAFETY: valid out-parameter; the address is only looked up.
                unsafe {
                    self.driver()?
                        .mem_retain_allocation_handle(&mut h, ptr_of(address))?
                };
                reply(Reply::Handle { handle: h })
            }
            Command::Properties { handle } => {
                let mut p = RawAllocProp::zeroed();
                // SAFETY: valid out-parameter.
                unsafe {
                    self.driver()?
                        .mem_get_allocation_properties(&mut p, handle)?
                };
                let f = p.alloc_flags;
                reply(Reply::Properties(AllocationProperties {
                    allocation_type: p.type_,
                    requested_handle_types: p.requested_handle_types,
                    location_type: p.location.type_,
                    location_id: p.location.id,
                    win32_handle_meta_data: p.win32_handle_meta_data as usize as u64,
                    compression_type: f[0],
                    gpu_direct_rdma_capable: f[1],
                    usage: u16::from_ne_bytes([f[2], f[3]]),
                }))
            }
            Command::Reserve {
                size,
                alignment,
                hint,
                flags,
            } => {
                let mut p = 0u64;
                let (size, alignment) =
                    (usize_of(size, "size")?, usize_of(alignment, "alignment")?);
                // SAFETY: valid out-parameter.
                unsafe {
                    self.driver()?
                        .mem_address_reserve(&mut p, size, alignment, hint, flags)?
                };
                reply(Reply::Address { address: p })
            }
            Command::FreeAddress { address, size } => {
                let size = usize_of(size, "size")?;
                // SAFETY: integers only.
                unsafe { self.driver()?.mem_address_free(address, size)? };
                done()
            }
            Command::Map {
                address,
                size,
                offset,
                handle,
            } => {
                let (size, offset) = (usize_of(size, "size")?, usize_of(offset, "offset")?);
                // SAFETY: integers only.
                unsafe { self.driver()?.mem_map(address, size, offset, handle, 0)? };
                done()
            }
            Command::Unmap { address, size } => {
                let size = usize_of(size, "size")?;
                // SAFETY: integers only.
                unsafe { self.driver()?.mem_unmap(address, size)? };
                done()
            }
            Command::SetAccess {
                address,
                size,
                grants,
            } => {
                let descs: Vec<RawAccessDesc> = grants
                    .iter()
                    .map(|g| RawAccessDesc {
                        location: RawLocation {
                            type_: g.location_type,
                            id: g.id,
                        },
                        flags: g.flags,
                    })
                    .collect();
                let size = usize_of(size, "size")?;
                let ptr = if descs.is_empty() {
                    std::ptr::null()
                } else {
                    descs.as_ptr()
                };
                // SAFETY: `ptr` points at `descs.len()` descriptors (or is null for none).
                unsafe {
                    self.driver()?
                        .mem_set_access(address, size, ptr, descs.len())?
                };
                done()
            }
            Command::GetAccess {
                address,
                device,
                location_type,
            } => {
                let loc = RawLocation {
                    type_: location_type,
                    id: device,
                };
                let mut flags = 0u64;
                // SAFETY: valid location input and out-parameter.
                unsafe { self.driver()?.mem_get_access(&mut flags, &loc, address)? };
                reply(Reply::Access { flags })
            }
            Command::Export {
                handle,
                handle_type,
                keep,
                flags,
            } => {
                // Room for any shareable handle (an int, or a 64-byte fabric handle), aligned.
                let mut buf = [0u64; 8];
                // SAFETY: `buf` is 64 writable, aligned bytes: enough for every handle type.
                unsafe {
                    self.driver()?.mem_export(
                        buf.as_mut_ptr().cast(),
                        handle,
                        handle_type,
                        flags,
                    )?
                };
                let bytes: Vec<u8> = buf.iter().flat_map(|w| w.to_ne_bytes()).collect();
                if handle_type == cuda::HANDLE_TYPE_POSIX_FD {
                    let raw = i32::from_ne_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
                    exported_fd(raw, keep)
                } else {
                    reply(Reply::Exported {
                        fd: None,
                        shareable: Some(bytes),
                    })
                }
            }
            Command::Import {
                handle_type,
                fd: number,
                shareable,
                keep,
            } => {
                let mut h = 0u64;
                let mut bytes = [0u8; 64];
                let os_handle: *mut c_void = match (&fd, number, &shareable) {
                    (Some(f), _, _) => f.as_raw_fd() as usize as *mut c_void,
                    (None, Some(n), _) => n as usize as *mut c_void,
                    (None, None, Some(s)) => {
                        if s.len() > bytes.len() {
                            return Err(failure::request("shareable handle over 64 bytes"));
                        }
                        bytes[..s.len()].copy_from_slice(s);
                        bytes.as_mut_ptr().cast()
                    }
                    (None, None, None) => {
                        return Err(failure::request(
                            "import needs an attached descriptor, an fd number or shareable bytes",
                        ));
                    }
                };
                // SAFETY: a POSIX FD travels as the pointer's value; other types point at
                // `bytes`, which outlives the call.
                unsafe { self.driver()?.mem_import(&mut h, os_handle, handle_type)? };
                let kept = match fd {
                    Some(f) if keep => Some(f.into_raw_fd()),
                    _ => None,
                };
                reply(Reply::Imported {
                    handle: h,
                    fd: kept,
                })
            }
            Command::ImportFromPid {
                pid,
                fd,
                handle_type,
            } => {
                let got = pidfd_getfd(pid, fd)?;
                let mut h = 0u64;
                // SAFETY: a POSIX FD travels as the pointer's value; `got` stays open for the
                // call.
                unsafe {
                    self.driver()?.mem_import(
                        &mut h,
                        got.as_raw_fd() as usize as *mut c_void,
                        handle_type,
                    )?
                };
                reply(Reply::Imported {
                    handle: h,
                    fd: None,
                })
            }
            Command::PidGetFd { pid, fd } => {
                let got = pidfd_getfd(pid, fd)?;
                reply(Reply::Fd {
                    fd: got.into_raw_fd(),
                })
            }
            Command::CloseFd { fd } => {
                // SAFETY: closing a number the driving side names; the worker holds no Rust
                // owner for descriptors it reports (kept exports/imports, PidGetFd, DupFd).
                if unsafe { libc::close(fd) } != 0 {
                    return Err(failure::errno(&format!("close({fd})"), Errno::last()));
                }
                done()
            }
            Command::HoldFd => {
                let Some(fd) = fd else {
                    return Err(failure::request("hold_fd needs an attached descriptor"));
                };
                reply(Reply::Fd {
                    fd: fd.into_raw_fd(),
                })
            }
            Command::SendFd { fd: number, close } => {
                // SAFETY: F_DUPFD_CLOEXEC on any number returns a new descriptor or -1.
                let copy = unsafe { libc::fcntl(number, libc::F_DUPFD_CLOEXEC, 0) };
                if copy < 0 {
                    return Err(failure::errno(&format!("dup({number})"), Errno::last()));
                }
                // SAFETY: fcntl just returned this new descriptor; nothing else owns it.
                let copy = unsafe { OwnedFd::from_raw_fd(copy) };
                // SAFETY: closing a number the driving side names and gave up (see CloseFd).
                if close && unsafe { libc::close(number) } != 0 {
                    return Err(failure::errno(&format!("close({number})"), Errno::last()));
                }
                Ok((
                    Reply::Fd { fd: number },
                    Some(Attach {
                        fd: copy,
                        keep: false,
                    }),
                ))
            }
            Command::ProxyExport { handle, context } => self.proxy_export(handle, context),
            Command::DeviceAttribute { attribute, device } => {
                let mut value: c_int = 0;
                // SAFETY: valid out-parameter.
                unsafe {
                    self.driver()?
                        .device_get_attribute(&mut value, attribute, device)?
                };
                reply(Reply::Attribute { value })
            }
            Command::PrimaryCtxReset { device } => {
                // SAFETY: integers only.
                unsafe { self.driver()?.primary_ctx_reset(device)? };
                done()
            }
            Command::DriverObjects => {
                #[repr(C)]
                #[derive(Default)]
                struct Objects {
                    allocations: u64,
                    mappings: u64,
                    reservations: u64,
                    multicast_objects: u64,
                    ipc_opened: u64,
                }
                let p = fakecuda_symbol(c"fakecuda_objects")?;
                let mut o = Objects::default();
                // SAFETY: fakecuda exports `CUresult fakecuda_objects(FakecudaObjects *)`, whose
                // layout `Objects` repeats; `o` is a valid out-parameter.
                let r = unsafe {
                    std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut Objects) -> u32>(p)(
                        &mut o,
                    )
                };
                if r != cuda::SUCCESS {
                    return Err(failure::cuda("fakecuda_objects", r));
                }
                reply(Reply::DriverObjects(DriverObjects {
                    allocations: o.allocations,
                    mappings: o.mappings,
                    reservations: o.reservations,
                    multicast_objects: o.multicast_objects,
                    ipc_opened: o.ipc_opened,
                }))
            }
            Command::DupFd { fd } => {
                // SAFETY: F_DUPFD_CLOEXEC on any number returns a new descriptor or -1.
                let n = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
                if n < 0 {
                    return Err(failure::errno(&format!("dup({fd})"), Errno::last()));
                }
                reply(Reply::Fd { fd: n })
            }
            other => unreachable!("{} is not dispatched to run_memory", other.name()),
        }
    }
}
