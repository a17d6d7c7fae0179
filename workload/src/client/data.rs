//! Typed helpers for bytes, memory IPC, multicast, contexts, host registration, symbol
//! resolution and background traffic.

use super::*;

impl Worker {
    pub fn native_ipc_calls(&mut self) -> Result<u64, WorkloadError> {
        expect_reply!(self, Command::NativeIpcCalls, Reply::Count { count } => count)
    }

    pub fn open_fd_count(&mut self) -> Result<u64, WorkloadError> {
        expect_reply!(self, Command::OpenFdCount, Reply::Count { count } => count)
    }

    pub fn fd_targets(&mut self) -> Result<Vec<FdTarget>, WorkloadError> {
        expect_reply!(self, Command::FdTargets, Reply::FdTargets { fds } => fds)
    }

    /// Writes [`crate::pattern()`] for `seed`.
    pub fn fill(&mut self, address: u64, size: u64, seed: u64) -> Result<(), WorkloadError> {
        expect_reply!(self, Command::Fill { address, size, seed }, Reply::Done => ())
    }

    /// Checks the range holds the pattern for `seed` (see [`WorkloadError::mismatch`]).
    pub fn verify(&mut self, address: u64, size: u64, seed: u64) -> Result<(), WorkloadError> {
        expect_reply!(self, Command::Verify { address, size, seed }, Reply::Done => ())
    }

    pub fn read(&mut self, address: u64, size: u64) -> Result<Vec<u8>, WorkloadError> {
        expect_reply!(self, Command::Read { address, size }, Reply::Bytes { bytes } => bytes)
    }

    pub fn write(&mut self, address: u64, bytes: &[u8]) -> Result<(), WorkloadError> {
        expect_reply!(self, Command::Write { address, bytes: bytes.to_vec() }, Reply::Done => ())
    }

    /// FNV-1a of the range ([`crate::pattern::checksum`]).
    pub fn checksum(&mut self, address: u64, size: u64) -> Result<u64, WorkloadError> {
        expect_reply!(self, Command::Checksum { address, size },
            Reply::Checksum { checksum } => checksum)
    }

    pub fn memset(&mut self, address: u64, value: u8, size: u64) -> Result<(), WorkloadError> {
        expect_reply!(self, Command::Memset { address, value, size }, Reply::Done => ())
    }

    /// `cuMemAlloc_v2`.
    pub fn mem_alloc(&mut self, size: u64) -> Result<u64, WorkloadError> {
        expect_reply!(self, Command::MemAlloc { size }, Reply::Address { address } => address)
    }

    pub fn mem_free(&mut self, dptr: u64) -> Result<(), WorkloadError> {
        expect_reply!(self, Command::MemFree { dptr }, Reply::Done => ())
    }

    /// `cuMemGetAddressRange_v2`: (base, size).
    pub fn address_range(&mut self, dptr: u64) -> Result<(u64, u64), WorkloadError> {
        expect_reply!(self, Command::AddressRange { dptr }, Reply::Range { base, size } => (base, size))
    }

    /// `cuIpcGetMemHandle`.
    pub fn ipc_get(&mut self, dptr: u64) -> Result<[u8; 64], WorkloadError> {
        let cmd = Command::IpcGet { dptr };
        match self.call(&cmd)? {
            Reply::IpcHandle { handle } => {
                handle
                    .as_slice()
                    .try_into()
                    .map_err(|_| WorkloadError::Protocol {
                        pid: self.pid,
                        command: cmd.name(),
                        message: format!("an IPC handle of {} bytes", handle.len()),
                    })
            }
            other => Err(unexpected(self.pid, &cmd, &other)),
        }
    }

    /// `cuIpcOpenMemHandle_v2` with `CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS`.
    pub fn ipc_open(&mut self, handle: &[u8; 64]) -> Result<u64, WorkloadError> {
        expect_reply!(self,
            Command::IpcOpen { handle: handle.to_vec(), flags: crate::cuda::IPC_MEM_LAZY_ENABLE_PEER_ACCESS },
            Reply::Address { address } => address)
    }

    pub fn ipc_close(&mut self, dptr: u64) -> Result<(), WorkloadError> {
        expect_reply!(self, Command::IpcClose { dptr }, Reply::Done => ())
    }

    pub fn mc_granularity(
        &mut self,
        device_count: u32,
        size: u64,
        handle_types: u64,
        option: u32,
    ) -> Result<u64, WorkloadError> {
        expect_reply!(self, Command::McGranularity { device_count, size, handle_types, option },
            Reply::Size { size } => size)
    }

    pub fn mc_create(
        &mut self,
        device_count: u32,
        size: u64,
        handle_types: u64,
    ) -> Result<u64, WorkloadError> {
        expect_reply!(self, Command::McCreate { device_count, size, handle_types, flags: 0 },
            Reply::Handle { handle } => handle)
    }

    pub fn mc_add_device(&mut self, handle: u64, device: i32) -> Result<(), WorkloadError> {
        expect_reply!(self, Command::McAddDevice { handle, device }, Reply::Done => ())
    }

    /// `cuMulticastBindMem` (`device: None`) or `cuMulticastBindMem_v2`.
    pub fn mc_bind_mem(
        &mut self,
        mc: u64,
        mc_offset: u64,
        mem_handle: u64,
        mem_offset: u64,
        size: u64,
        device: Option<i32>,
    ) -> Result<(), WorkloadError> {
        expect_reply!(self,
            Command::McBindMem { mc, mc_offset, mem_handle, mem_offset, size, flags: 0, device },
            Reply::Done => ())
    }

    /// `cuMulticastBindAddr` (`device: None`) or `cuMulticastBindAddr_v2`.
    pub fn mc_bind_addr(
        &mut self,
        mc: u64,
        mc_offset: u64,
        address: u64,
        size: u64,
        device: Option<i32>,
    ) -> Result<(), WorkloadError> {
        expect_reply!(self,
            Command::McBindAddr { mc, mc_offset, address, size, flags: 0, device },
            Reply::Done => ())
    }

    pub fn mc_unbind(
        &mut self,
        mc: u64,
        device: i32,
        mc_offset: u64,
        size: u64,
    ) -> Result<(), WorkloadError> {
        expect_reply!(self, Command::McUnbind { mc, device, mc_offset, size }, Reply::Done => ())
    }

    pub fn ctx_create(&mut self, device: i32, flags: u32) -> Result<u64, WorkloadError> {
        expect_reply!(self, Command::CtxCreate { device, flags }, Reply::Context { ctx } => ctx)
    }

    pub fn ctx_destroy(&mut self, ctx: u64) -> Result<(), WorkloadError> {
        expect_reply!(self, Command::CtxDestroy { ctx }, Reply::Done => ())
    }

    pub fn primary_ctx_release(&mut self, device: i32) -> Result<(), WorkloadError> {
        expect_reply!(self, Command::PrimaryCtxRelease { device }, Reply::Done => ())
    }

    /// Maps and registers `size` bytes of host memory: its address.
    pub fn host_register(&mut self, size: u64, flags: u32) -> Result<u64, WorkloadError> {
        expect_reply!(self, Command::HostRegister { size, flags }, Reply::Address { address } => address)
    }

    pub fn host_unregister(&mut self, address: u64) -> Result<(), WorkloadError> {
        expect_reply!(self, Command::HostUnregister { address }, Reply::Done => ())
    }

    /// Where the worker's entry path finds `name`.
    pub fn resolve(&mut self, name: &str) -> Result<Resolved, WorkloadError> {
        expect_reply!(self, Command::Resolve { name: name.to_owned() },
            Reply::Resolved { address, library, symbol } => Resolved { address, library, symbol })
    }

    pub fn synchronize(&mut self) -> Result<(), WorkloadError> {
        expect_reply!(self, Command::Synchronize, Reply::Done => ())
    }

    /// Starts traffic threads (see [`Command::TrafficStart`]).
    pub fn traffic_start(
        &mut self,
        device: i32,
        threads: Vec<crate::proto::TrafficThread>,
    ) -> Result<(), WorkloadError> {
        expect_reply!(self, Command::TrafficStart { device, threads }, Reply::Done => ())
    }

    /// Stops the traffic threads: what each saw.
    pub fn traffic_stop(&mut self) -> Result<Vec<crate::proto::TrafficReport>, WorkloadError> {
        expect_reply!(self, Command::TrafficStop, Reply::Traffic { threads } => threads)
    }

    /// A `cuStreamSynchronize(0)` on a thread of its own, not waited for.
    pub fn synchronize_in_thread(&mut self, device: i32) -> Result<(), WorkloadError> {
        expect_reply!(self, Command::SynchronizeInThread { device }, Reply::Done => ())
    }

    /// Whether the reply to the command [`Worker::send`] sent arrives within `within` (it is
    /// left for [`Worker::receive`]).
    pub fn reply_ready(&self, within: Duration) -> bool {
        let Some(sock) = self.sock.as_ref() else {
            return true;
        };
        let mut fds = [nix::poll::PollFd::new(
            sock.as_fd(),
            nix::poll::PollFlags::POLLIN,
        )];
        let ms = u16::try_from(within.as_millis()).unwrap_or(u16::MAX);
        matches!(nix::poll::poll(&mut fds, ms), Ok(n) if n > 0)
    }

    pub fn sleep(&mut self, ms: u64) -> Result<(), WorkloadError> {
        expect_reply!(self, Command::Sleep { ms }, Reply::Done => ())
    }
}
