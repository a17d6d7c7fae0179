//! Multicast, contexts, host registration, symbol resolution, synchronization and traffic,
//! and the worker's own commands (sleep, panic, exit).

use super::*;

/// The properties of a multicast object of `device_count` devices and `size` bytes.
fn multicast_prop(
    device_count: u32,
    size: u64,
    handle_types: u64,
    flags: u64,
) -> Result<RawMulticastProp, ErrorReply> {
    Ok(RawMulticastProp {
        num_devices: device_count,
        size: usize_of(size, "size")?,
        handle_types,
        flags,
    })
}

/// A range of a multicast object, `size` bytes at `mc_offset`, as the driver takes it.
fn multicast_range(mc_offset: u64, size: u64) -> Result<(usize, usize), ErrorReply> {
    Ok((usize_of(mc_offset, "mc_offset")?, usize_of(size, "size")?))
}

impl State {
    pub(super) fn run_objects(&mut self, cmd: Command) -> Outcome {
        match cmd {
            Command::McGranularity {
                device_count,
                size,
                handle_types,
                option,
            } => {
                let prop = multicast_prop(device_count, size, handle_types, 0)?;
                let d = self.driver()?;
                // SAFETY: valid property input and out-parameter.
                size_reply(|g| unsafe { d.multicast_get_granularity(g, &prop, option) })
            }
            Command::McCreate {
                device_count,
                size,
                handle_types,
                flags,
            } => {
                let prop = multicast_prop(device_count, size, handle_types, flags)?;
                let mut h = 0u64;
                // SAFETY: valid property input and out-parameter.
                unsafe { self.driver()?.multicast_create(&mut h, &prop)? };
                reply(Reply::Handle { handle: h })
            }
            Command::McAddDevice { handle, device } => {
                // SAFETY: integers only.
                unsafe { self.driver()?.multicast_add_device(handle, device)? };
                done()
            }
            Command::McBindMem {
                mc,
                mc_offset,
                mem_handle,
                mem_offset,
                size,
                flags,
                device,
            } => {
                let (mc_offset, mem_offset, size) = (
                    usize_of(mc_offset, "mc_offset")?,
                    usize_of(mem_offset, "mem_offset")?,
                    usize_of(size, "size")?,
                );
                let d = self.driver()?;
                // SAFETY: integers only.
                unsafe {
                    match device {
                        None => d.multicast_bind_mem(
                            mc, mc_offset, mem_handle, mem_offset, size, flags,
                        )?,
                        Some(dev) => d.multicast_bind_mem_v2(
                            mc, dev, mc_offset, mem_handle, mem_offset, size, flags,
                        )?,
                    }
                };
                done()
            }
            Command::McBindAddr {
                mc,
                mc_offset,
                address,
                size,
                flags,
                device,
            } => {
                let (mc_offset, size) = multicast_range(mc_offset, size)?;
                let d = self.driver()?;
                // SAFETY: integers only.
                unsafe {
                    match device {
                        None => d.multicast_bind_addr(mc, mc_offset, address, size, flags)?,
                        Some(dev) => {
                            d.multicast_bind_addr_v2(mc, dev, mc_offset, address, size, flags)?
                        }
                    }
                };
                done()
            }
            Command::McUnbind {
                mc,
                device,
                mc_offset,
                size,
            } => {
                let (mc_offset, size) = multicast_range(mc_offset, size)?;
                // SAFETY: integers only.
                unsafe {
                    self.driver()?
                        .multicast_unbind(mc, device, mc_offset, size)?
                };
                done()
            }
            Command::CtxCreate { device, flags } => {
                let d = self.driver()?;
                let v = d.ctx_create_version();
                let mut ctx: *mut c_void = std::ptr::null_mut();
                // SAFETY: valid out-parameter; no creation parameters (null, 0).
                unsafe {
                    if v >= 12050 {
                        d.ctx_create_v4(&mut ctx, std::ptr::null_mut(), flags, device)?;
                    } else if v >= 11040 {
                        d.ctx_create_v3(&mut ctx, std::ptr::null_mut(), 0, flags, device)?;
                    } else {
                        d.ctx_create_v2(&mut ctx, flags, device)?;
                    }
                }
                reply(Reply::Context {
                    ctx: ctx as usize as u64,
                })
            }
            Command::CtxDestroy { ctx } => {
                // SAFETY: the context value comes from the driver (CtxCreate); the driver
                // validates it.
                unsafe { self.driver()?.ctx_destroy(ptr_of(ctx))? };
                done()
            }
            Command::PrimaryCtxRelease { device } => {
                // SAFETY: integers only.
                unsafe { self.driver()?.primary_ctx_release(device)? };
                done()
            }
            Command::HostRegister { size, flags } => {
                let len = usize_of(size, "size")?;
                if len == 0 {
                    return Err(failure::request("host register of 0 bytes"));
                }
                self.driver()?;
                // SAFETY: a fresh private anonymous mapping; no existing memory is touched.
                let p = unsafe {
                    libc::mmap(
                        std::ptr::null_mut(),
                        len,
                        libc::PROT_READ | libc::PROT_WRITE,
                        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                        -1,
                        0,
                    )
                };
                if p == libc::MAP_FAILED {
                    return Err(failure::errno("mmap", Errno::last()));
                }
                // SAFETY: `p..p+len` is the mapping just made.
                if let Err(e) = unsafe { self.driver()?.mem_host_register(p, len, flags) } {
                    // SAFETY: unmapping the mapping just made, which nothing else uses.
                    unsafe { libc::munmap(p, len) };
                    return Err(e);
                }
                self.host_regions.insert(p as usize as u64, len);
                reply(Reply::Address {
                    address: p as usize as u64,
                })
            }
            Command::HostUnregister { address } => {
                // SAFETY: the driver validates the address.
                unsafe { self.driver()?.mem_host_unregister(ptr_of(address))? };
                if let Some(len) = self.host_regions.remove(&address) {
                    // SAFETY: HostRegister mapped exactly this range, now unregistered.
                    unsafe { libc::munmap(ptr_of(address), len) };
                }
                done()
            }
            Command::Resolve { name } => {
                let p = self
                    .driver()?
                    .lookup(&name)
                    .map_err(|(code, msg)| failure::unresolved(&name, code, msg))?;
                let (library, symbol) = dladdr(p);
                reply(Reply::Resolved {
                    address: p as usize as u64,
                    library,
                    symbol,
                })
            }
            Command::Synchronize => {
                // SAFETY: no arguments.
                unsafe { self.driver()?.ctx_synchronize()? };
                done()
            }
            Command::TrafficStart { device, threads } => {
                if self.traffic.is_some() {
                    return Err(failure::request("traffic is already running"));
                }
                let traffic =
                    crate::worker::traffic::Traffic::start(self.driver()?, device, threads)?;
                self.traffic = Some(traffic);
                done()
            }
            Command::TrafficStop => match self.traffic.take() {
                Some(traffic) => reply(Reply::Traffic {
                    threads: traffic.stop()?,
                }),
                None => Err(failure::request("no traffic is running")),
            },
            Command::SynchronizeInThread { device } => {
                crate::worker::traffic::synchronize_in_thread(self.driver()?, device)?;
                done()
            }
            Command::Sleep { ms } => {
                std::thread::sleep(std::time::Duration::from_millis(ms));
                done()
            }
            Command::Panic { message } => panic!("{message}"),
            Command::Exit { .. } => done(),
            Command::Detach { .. } => Err(failure::request(
                "detach is handled by the control loop, not as a command",
            )),
            other => unreachable!("{} is not dispatched to run_objects", other.name()),
        }
    }
}
