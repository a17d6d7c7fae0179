//! Bytes (fill, verify, read, write, checksums, memsets), `cuMemAlloc` and memory IPC.

use super::*;

impl State {
    pub(super) fn run_data(&mut self, cmd: Command) -> Outcome {
        match cmd {
            Command::NativeIpcCalls => native_ipc_calls(),
            Command::OpenFdCount => reply(Reply::Count {
                count: open_fds()?.len() as u64,
            }),
            Command::FdTargets => fd_targets(),
            Command::Fill {
                address,
                size,
                seed,
            } => self.in_chunks(size, |d, at, buf| {
                pattern::fill_pattern(seed, at, buf);
                // SAFETY: `buf` holds `buf.len()` readable bytes.
                unsafe { d.memcpy_htod(address + at, buf.as_ptr().cast(), buf.len()) }
            }),
            Command::Verify {
                address,
                size,
                seed,
            } => self.in_chunks(size, |d, at, buf| {
                // SAFETY: `buf` holds `buf.len()` writable bytes.
                unsafe { d.memcpy_dtoh(buf.as_mut_ptr().cast(), address + at, buf.len())? };
                match pattern::first_mismatch(seed, at, buf) {
                    Some((off, want, found)) => {
                        Err(failure::mismatch(address, at + off, want, found))
                    }
                    None => Ok(()),
                }
            }),
            Command::Read { address, size } => {
                if size > MAX_TRANSFER {
                    return Err(failure::request(format!(
                        "read of {size} bytes exceeds the {MAX_TRANSFER}-byte limit"
                    )));
                }
                let mut buf = vec![0u8; size as usize];
                // SAFETY: `buf` holds `size` writable bytes.
                unsafe {
                    self.driver()?
                        .memcpy_dtoh(buf.as_mut_ptr().cast(), address, buf.len())?
                };
                reply(Reply::Bytes { bytes: buf })
            }
            Command::Write { address, bytes } => {
                if bytes.len() as u64 > MAX_TRANSFER {
                    return Err(failure::request(format!(
                        "write of {} bytes exceeds the {MAX_TRANSFER}-byte limit",
                        bytes.len()
                    )));
                }
                // SAFETY: `bytes` holds `bytes.len()` readable bytes.
                unsafe {
                    self.driver()?
                        .memcpy_htod(address, bytes.as_ptr().cast(), bytes.len())?
                };
                done()
            }
            Command::Checksum { address, size } => {
                let d = self.driver()?;
                let mut buf = vec![0u8; size.min(COPY_CHUNK) as usize];
                let mut h = pattern::Fnv1a::new();
                let mut at = 0u64;
                while at < size {
                    let n = (size - at).min(COPY_CHUNK) as usize;
                    // SAFETY: `buf` holds `n` writable bytes.
                    unsafe { d.memcpy_dtoh(buf.as_mut_ptr().cast(), address + at, n)? };
                    h.update(&buf[..n]);
                    at += n as u64;
                }
                reply(Reply::Checksum {
                    checksum: h.finish(),
                })
            }
            Command::Memset {
                address,
                value,
                size,
            } => {
                let size = usize_of(size, "size")?;
                // SAFETY: integers only.
                unsafe { self.driver()?.memset_d8(address, value, size)? };
                done()
            }
            Command::MemAlloc { size } => {
                let size = usize_of(size, "size")?;
                let mut p = 0u64;
                // SAFETY: valid out-parameter.
                unsafe { self.driver()?.mem_alloc(&mut p, size)? };
                reply(Reply::Address { address: p })
            }
            Command::MemFree { dptr } => {
                // SAFETY: integers only.
                unsafe { self.driver()?.mem_free(dptr)? };
                done()
            }
            Command::AddressRange { dptr } => {
                let (mut base, mut size) = (0u64, 0usize);
                // SAFETY: valid out-parameters.
                unsafe {
                    self.driver()?
                        .mem_get_address_range(&mut base, &mut size, dptr)?
                };
                reply(Reply::Range {
                    base,
                    size: size as u64,
                })
            }
            Command::IpcGet { dptr } => {
                let mut h = RawIpcMemHandle { reserved: [0; 64] };
                // SAFETY: valid out-parameter.
                unsafe { self.driver()?.ipc_get_mem_handle(&mut h, dptr)? };
                reply(Reply::IpcHandle {
                    handle: h.reserved.to_vec(),
                })
            }
            Command::IpcOpen { handle, flags } => {
                let reserved: [u8; 64] = handle.as_slice().try_into().map_err(|_| {
                    failure::request(format!("an IPC handle is 64 bytes, not {}", handle.len()))
                })?;
                let mut p = 0u64;
                // SAFETY: valid out-parameter; the handle is passed by value.
                unsafe {
                    self.driver()?.ipc_open_mem_handle(
                        &mut p,
                        RawIpcMemHandle { reserved },
                        flags,
                    )?
                };
                reply(Reply::Address { address: p })
            }
            Command::IpcClose { dptr } => {
                // SAFETY: integers only.
                unsafe { self.driver()?.ipc_close_mem_handle(dptr)? };
                done()
            }
            other => unreachable!("{} is not dispatched to run_data", other.name()),
        }
    }
}

/// The pieces a transfer of `size` bytes moves in: (offset, length), `COPY_CHUNK` at most.
impl State {
    /// Runs `step(driver, offset, chunk)` over `size` bytes in pieces of at most `COPY_CHUNK`,
    /// all in one buffer of that size; stops at the first error.
    fn in_chunks(
        &mut self,
        size: u64,
        mut step: impl FnMut(&DriverLibrary, u64, &mut [u8]) -> Result<(), ErrorReply>,
    ) -> Outcome {
        let d = self.driver()?;
        let mut buf = vec![0u8; size.min(COPY_CHUNK) as usize];
        for (at, n) in chunks(size) {
            step(d, at, &mut buf[..n])?;
        }
        done()
    }
}

fn chunks(size: u64) -> impl Iterator<Item = (u64, usize)> {
    (0..size.div_ceil(COPY_CHUNK)).map(move |i| {
        let at = i * COPY_CHUNK;
        (at, (size - at).min(COPY_CHUNK) as usize)
    })
}

/// How often fakecuda's native IPC functions were called in this process.
fn native_ipc_calls() -> Outcome {
    let p = fakecuda_symbol(c"fakecuda_native_ipc_calls")?;
    // SAFETY: fakecuda exports `uint64_t fakecuda_native_ipc_calls(void)`.
    let count =
        unsafe { std::mem::transmute::<*mut std::ffi::c_void, unsafe extern "C" fn() -> u64>(p)() };
    reply(Reply::Count { count })
}

/// Every open descriptor and what it points at.
fn fd_targets() -> Outcome {
    let fds = open_fds()?
        .into_iter()
        .map(|fd| FdTarget {
            fd,
            target: std::fs::read_link(format!("/proc/self/fd/{fd}"))
                .map(|p| p.display().to_string())
                .unwrap_or_else(|e| format!("<{e}>")),
        })
        .collect();
    reply(Reply::FdTargets { fds })
}
