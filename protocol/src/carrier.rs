//! What the schema says in prose about carriers, as code both sides call: which requests
//! carry the storage carrier's folder descriptor, and the execute requests of each carrier.

use crate::generated::{CARRIER_CHUNK_BYTES, Carrier, ExecuteRequest, Operation, Request};

/// The folder of a checkpoint directory that holds a storage carrier's files.
pub const CARRIER_FOLDER: &str = "carrier";

/// The name of allocation `id`'s file in the storage carrier's folder: the one place both
/// the shim (which writes and reads it) and the coordinator (which names it) take it from.
pub fn carrier_file_name(id: &crate::generated::AllocationId) -> String {
    id.to_string()
}

impl ExecuteRequest {
    /// `operation` with the host carrier (or none: every operation but the copies).
    pub fn host(operation: Operation) -> Self {
        Self {
            operation,
            carrier: Carrier::Host,
            staging_bytes: 0,
        }
    }

    /// `operation` with the storage carrier and a staging window of `staging_bytes`.
    pub fn storage(operation: Operation, staging_bytes: u64) -> Self {
        Self {
            operation,
            carrier: Carrier::Storage,
            staging_bytes,
        }
    }

    /// Whether this request copies through the storage carrier (and so carries the folder's
    /// descriptor).
    pub fn uses_storage(&self) -> bool {
        self.carrier == Carrier::Storage
            && matches!(
                self.operation,
                Operation::SaveAllocations | Operation::LoadAllocations
            )
    }
}

impl Request {
    /// Whether the frame of this request carries exactly one descriptor (the storage
    /// carrier's folder); every other request carries none.
    pub fn carries_fd(&self) -> bool {
        matches!(self, Request::Execute(execute) if execute.uses_storage())
    }
}

/// [`CARRIER_CHUNK_BYTES`] as the byte counts of the wire (`u64`) count.
pub const CHUNK_BYTES: u64 = CARRIER_CHUNK_BYTES as u64;

/// Why a staging window cannot be used: it must hold at least one whole chunk.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "a staging window of {bytes} bytes is too small: the storage carrier stages whole \
     {CARRIER_CHUNK_BYTES}-byte chunks, so it needs at least {CARRIER_CHUNK_BYTES} bytes (64 MiB)"
)]
pub struct WindowTooSmall {
    pub bytes: u64,
}

/// The chunks a staging window of `bytes` holds (it is used in whole chunks).
pub fn window_chunks(bytes: u64) -> Result<u64, WindowTooSmall> {
    match bytes / CHUNK_BYTES {
        0 => Err(WindowTooSmall { bytes }),
        chunks => Ok(chunks),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_storage_copies_carry_a_descriptor() {
        let save = Operation::SaveAllocations;
        assert!(Request::Execute(ExecuteRequest::storage(save, CHUNK_BYTES)).carries_fd());
        assert!(
            Request::Execute(ExecuteRequest::storage(Operation::LoadAllocations, 1)).carries_fd()
        );
        assert!(!Request::Execute(ExecuteRequest::host(save)).carries_fd());
        assert!(
            !Request::Execute(ExecuteRequest::storage(Operation::PrepareUnicast, 1)).carries_fd()
        );
        assert!(!Request::Inspect.carries_fd());
    }

    #[test]
    fn a_window_holds_whole_chunks() {
        assert_eq!(window_chunks(CHUNK_BYTES), Ok(1));
        assert_eq!(window_chunks(5 * CHUNK_BYTES - 1), Ok(4));
        let error = window_chunks(CHUNK_BYTES - 1).unwrap_err();
        assert!(error.to_string().contains("too small"), "{error}");
    }
}
