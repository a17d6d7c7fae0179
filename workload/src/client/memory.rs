//! Typed helpers for the driver's memory calls: identity and init, VMM, export and import,
//! descriptors.

use super::*;

impl Worker {
    /// `Ping`: the worker's identity.
    pub fn ping(&mut self) -> Result<WorkerIdentity, WorkloadError> {
        expect_reply!(self, Command::Ping,
            Reply::Hello { pid, nspid, ppid } => WorkerIdentity { pid, nspid, ppid })
    }

    /// `Init { device }`.
    pub fn init(&mut self, device: i32) -> Result<InitInfo, WorkloadError> {
        let info = expect_reply!(self, Command::Init { device },
            Reply::Init { pid, nspid, device_count } => InitInfo { pid, nspid, device_count })?;
        self.init = Some(info.clone());
        Ok(info)
    }

    /// `SetDevice { device }`: the primary context made current.
    pub fn set_device(&mut self, device: i32) -> Result<u64, WorkloadError> {
        expect_reply!(self, Command::SetDevice { device }, Reply::Context { ctx } => ctx)
    }

    pub fn driver_version(&mut self) -> Result<i32, WorkloadError> {
        expect_reply!(self, Command::DriverVersion, Reply::Version { version } => version)
    }

    pub fn granularity(
        &mut self,
        device: i32,
        handle_types: u32,
        option: u32,
    ) -> Result<u64, WorkloadError> {
        expect_reply!(self, Command::Granularity { device, handle_types, option },
            Reply::Size { size } => size)
    }

    /// `cuMemCreate` of pinned device memory.
    pub fn create(
        &mut self,
        size: u64,
        device: i32,
        handle_types: u32,
    ) -> Result<u64, WorkloadError> {
        self.create_at(
            size,
            crate::cuda::LOCATION_TYPE_DEVICE,
            device,
            handle_types,
        )
    }

    /// `cuMemCreate` of pinned memory at a location of any type.
    pub fn create_at(
        &mut self,
        size: u64,
        location_type: u32,
        id: i32,
        handle_types: u32,
    ) -> Result<u64, WorkloadError> {
        expect_reply!(self, Command::Create { size, device: id, handle_types, location_type },
            Reply::Handle { handle } => handle)
    }

    pub fn release(&mut self, handle: u64) -> Result<(), WorkloadError> {
        expect_reply!(self, Command::Release { handle }, Reply::Done => ())
    }

    /// `cuMemRetainAllocationHandle`.
    pub fn retain(&mut self, address: u64) -> Result<u64, WorkloadError> {
        expect_reply!(self, Command::Retain { address }, Reply::Handle { handle } => handle)
    }

    pub fn properties(&mut self, handle: u64) -> Result<AllocationProperties, WorkloadError> {
        expect_reply!(self, Command::Properties { handle }, Reply::Properties(p) => p)
    }

    /// `cuMemAddressReserve(size, 0, 0, 0)`.
    pub fn reserve(&mut self, size: u64) -> Result<u64, WorkloadError> {
        self.reserve_at(size, 0, 0)
    }

    /// `cuMemAddressReserve(size, alignment, hint, 0)`.
    pub fn reserve_at(
        &mut self,
        size: u64,
        alignment: u64,
        hint: u64,
    ) -> Result<u64, WorkloadError> {
        expect_reply!(self, Command::Reserve { size, alignment, hint, flags: 0 },
            Reply::Address { address } => address)
    }

    pub fn free_address(&mut self, address: u64, size: u64) -> Result<(), WorkloadError> {
        expect_reply!(self, Command::FreeAddress { address, size }, Reply::Done => ())
    }

    pub fn map(
        &mut self,
        address: u64,
        size: u64,
        offset: u64,
        handle: u64,
    ) -> Result<(), WorkloadError> {
        expect_reply!(self, Command::Map { address, size, offset, handle }, Reply::Done => ())
    }

    pub fn unmap(&mut self, address: u64, size: u64) -> Result<(), WorkloadError> {
        expect_reply!(self, Command::Unmap { address, size }, Reply::Done => ())
    }

    pub fn set_access(
        &mut self,
        address: u64,
        size: u64,
        grants: &[Grant],
    ) -> Result<(), WorkloadError> {
        expect_reply!(self, Command::SetAccess { address, size, grants: grants.to_vec() },
            Reply::Done => ())
    }

    /// Read-write access for `device`.
    pub fn grant_rw(&mut self, address: u64, size: u64, device: i32) -> Result<(), WorkloadError> {
        self.set_access(address, size, &[Grant::readwrite(device)])
    }

    /// `cuMemGetAccess` for device `device`.
    pub fn get_access(&mut self, address: u64, device: i32) -> Result<u64, WorkloadError> {
        expect_reply!(self,
            Command::GetAccess { address, device, location_type: crate::cuda::LOCATION_TYPE_DEVICE },
            Reply::Access { flags } => flags)
    }

    /// Reserve, map the whole of `handle` (`size` bytes) and grant `device` read-write.
    pub fn map_rw(&mut self, handle: u64, size: u64, device: i32) -> Result<u64, WorkloadError> {
        let address = self.reserve(size)?;
        self.map(address, size, 0, handle)?;
        self.grant_rw(address, size, device)?;
        Ok(address)
    }

    /// `cuMemExportToShareableHandle` with any handle type.
    pub fn export_with(
        &mut self,
        handle: u64,
        handle_type: u32,
        keep: bool,
    ) -> Result<Exported, WorkloadError> {
        let cmd = Command::Export {
            handle,
            handle_type,
            keep,
            flags: 0,
        };
        match self.call_with_fd(&cmd, None)? {
            (Reply::Exported { fd, shareable }, attached) => {
                if handle_type == crate::cuda::HANDLE_TYPE_POSIX_FD && attached.is_none() {
                    return Err(WorkloadError::Protocol {
                        pid: self.pid,
                        command: cmd.name(),
                        message: "a POSIX FD export arrived without a descriptor".to_owned(),
                    });
                }
                Ok(Exported {
                    fd: attached,
                    worker_fd: fd,
                    shareable,
                })
            }
            (other, _) => Err(unexpected(self.pid, &cmd, &other)),
        }
    }

    /// Exports `handle` as a POSIX FD; the worker closes its copy.
    pub fn export(&mut self, handle: u64) -> Result<OwnedFd, WorkloadError> {
        let e = self.export_with(handle, crate::cuda::HANDLE_TYPE_POSIX_FD, false)?;
        Ok(e.fd.expect("checked by export_with"))
    }

    /// Exports `handle` as a POSIX FD and keeps the worker's copy open: (our copy, the
    /// number in the worker, for `pidfd_getfd`).
    pub fn export_kept(&mut self, handle: u64) -> Result<(OwnedFd, i32), WorkloadError> {
        let e = self.export_with(handle, crate::cuda::HANDLE_TYPE_POSIX_FD, true)?;
        let number = e.worker_fd.unwrap_or(-1);
        Ok((e.fd.expect("checked by export_with"), number))
    }

    /// Imports a POSIX FD sent along (the worker closes its received copy).
    pub fn import(&mut self, fd: BorrowedFd<'_>) -> Result<u64, WorkloadError> {
        let cmd = Command::Import {
            handle_type: crate::cuda::HANDLE_TYPE_POSIX_FD,
            fd: None,
            shareable: None,
            keep: false,
        };
        match self.call_with_fd(&cmd, Some(fd))? {
            (Reply::Imported { handle, .. }, _) => Ok(handle),
            (other, _) => Err(unexpected(self.pid, &cmd, &other)),
        }
    }

    /// `Import` in full: returns (handle, the number the worker kept the FD under).
    pub fn import_with(
        &mut self,
        command: &Command,
        fd: Option<BorrowedFd<'_>>,
    ) -> Result<(u64, Option<i32>), WorkloadError> {
        match self.call_with_fd(command, fd)? {
            (Reply::Imported { handle, fd }, _) => Ok((handle, fd)),
            (other, _) => Err(unexpected(self.pid, command, &other)),
        }
    }

    /// `Import` of the worker's own descriptor `fd` (POSIX FD), which stays open there.
    pub fn import_number(&mut self, fd: i32) -> Result<u64, WorkloadError> {
        self.import_with(
            &Command::Import {
                handle_type: crate::cuda::HANDLE_TYPE_POSIX_FD,
                fd: Some(fd),
                shareable: None,
                keep: false,
            },
            None,
        )
        .map(|(handle, _)| handle)
    }

    /// `Import` of the bytes of a FABRIC handle.
    pub fn import_fabric(&mut self, shareable: Vec<u8>) -> Result<u64, WorkloadError> {
        self.import_with(
            &Command::Import {
                handle_type: crate::cuda::HANDLE_TYPE_FABRIC,
                fd: None,
                shareable: Some(shareable),
                keep: false,
            },
            None,
        )
        .map(|(handle, _)| handle)
    }

    /// Takes descriptor `fd` of process `pid` with `pidfd_getfd` and imports it (POSIX FD).
    pub fn import_from_pid(&mut self, pid: i32, fd: i32) -> Result<u64, WorkloadError> {
        expect_reply!(self,
            Command::ImportFromPid { pid, fd, handle_type: crate::cuda::HANDLE_TYPE_POSIX_FD },
            Reply::Imported { handle, .. } => handle)
    }

    /// `pidfd_getfd`: the number of the copy the worker now holds.
    pub fn pid_get_fd(&mut self, pid: i32, fd: i32) -> Result<i32, WorkloadError> {
        expect_reply!(self, Command::PidGetFd { pid, fd }, Reply::Fd { fd } => fd)
    }

    pub fn close_fd(&mut self, fd: i32) -> Result<(), WorkloadError> {
        expect_reply!(self, Command::CloseFd { fd }, Reply::Done => ())
    }

    /// Keeps `fd` open in the worker without importing it: the number it has there.
    pub fn hold_fd(&mut self, fd: BorrowedFd<'_>) -> Result<i32, WorkloadError> {
        match self.call_with_fd(&Command::HoldFd, Some(fd))? {
            (Reply::Fd { fd }, _) => Ok(fd),
            (other, _) => Err(unexpected(self.pid, &Command::HoldFd, &other)),
        }
    }

    /// A copy of the worker's descriptor `fd`, sent back by `SCM_RIGHTS`; the worker closes
    /// its own when `close`.
    pub fn send_fd(&mut self, fd: i32, close: bool) -> Result<OwnedFd, WorkloadError> {
        let cmd = Command::SendFd { fd, close };
        match self.call_with_fd(&cmd, None)? {
            (Reply::Fd { .. }, Some(copy)) => Ok(copy),
            (other, _) => Err(unexpected(self.pid, &cmd, &other)),
        }
    }

    /// Exports `handle` as a POSIX FD on a new thread of the worker (which first makes the
    /// worker's current context current there, if `context`); the worker closes its copy.
    pub fn proxy_export(&mut self, handle: u64, context: bool) -> Result<OwnedFd, WorkloadError> {
        let cmd = Command::ProxyExport { handle, context };
        match self.call_with_fd(&cmd, None)? {
            (Reply::Exported { .. }, Some(fd)) => Ok(fd),
            (other, _) => Err(unexpected(self.pid, &cmd, &other)),
        }
    }

    /// `cuDeviceGetAttribute`.
    pub fn device_attribute(&mut self, attribute: i32, device: i32) -> Result<i32, WorkloadError> {
        expect_reply!(self, Command::DeviceAttribute { attribute, device },
            Reply::Attribute { value } => value)
    }

    /// `cuDevicePrimaryCtxReset_v2`.
    pub fn primary_ctx_reset(&mut self, device: i32) -> Result<(), WorkloadError> {
        expect_reply!(self, Command::PrimaryCtxReset { device }, Reply::Done => ())
    }

    /// What fakecuda holds for the worker.
    pub fn driver_objects(&mut self) -> Result<DriverObjects, WorkloadError> {
        expect_reply!(self, Command::DriverObjects, Reply::DriverObjects(o) => o)
    }

    pub fn dup_fd(&mut self, fd: i32) -> Result<i32, WorkloadError> {
        expect_reply!(self, Command::DupFd { fd }, Reply::Fd { fd } => fd)
    }
}
