//! The export cache: the creator's real export FD per shared object, served to peers.
//!
//! It has its own lock, separate from the registry's, so the peer thread answers `export`
//! requests while an application thread holds the registry (for instance while that thread
//! imports from a peer that imports from us).

use cuinterpose_protocol::{
    AllocationId, BoundedString, CapabilityToken, ExportRequest, RefusalCode, RefusedReply, Reply,
    ResourceKind,
};
use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::{Mutex, MutexGuard};

#[derive(Debug)]
pub struct Entry {
    pub fd: OwnedFd,
    pub capability: CapabilityToken,
    pub reply: Reply,
    /// Also accept the allocation id as the token (memory IPC handles carry no token).
    pub id_authorizes: bool,
}

pub type Cache = HashMap<AllocationId, Entry>;

static CACHE: Mutex<Option<Cache>> = Mutex::new(None);

pub(crate) fn lock() -> MutexGuard<'static, Option<Cache>> {
    CACHE.lock().unwrap_or_else(|poison| poison.into_inner())
}

pub(crate) fn mutex() -> &'static Mutex<Option<Cache>> {
    &CACHE
}

pub fn contains(id: &AllocationId) -> bool {
    lock().as_ref().is_some_and(|c| c.contains_key(id))
}

pub fn insert(id: AllocationId, fd: OwnedFd, capability: CapabilityToken, reply: Reply) {
    lock().get_or_insert_with(HashMap::new).insert(
        id,
        Entry {
            fd,
            capability,
            reply,
            id_authorizes: false,
        },
    );
}

/// Lets the allocation id authorize exports of `id` (after `cuIpcGetMemHandle`).
pub fn authorize_by_id(id: &AllocationId) {
    if let Some(entry) = lock().as_mut().and_then(|c| c.get_mut(id)) {
        entry.id_authorizes = true;
    }
}

/// The token an IPC importer presents: the allocation id's bytes.
pub fn id_token(id: &AllocationId) -> CapabilityToken {
    CapabilityToken::new(*id.as_bytes()).expect("allocation ids are never all zero")
}

pub fn remove(id: &AllocationId) {
    if let Some(cache) = lock().as_mut() {
        cache.remove(id);
    }
}

/// Closes every cached export (before shared memory is released for checkpoint).
pub fn clear() {
    if let Some(cache) = lock().as_mut() {
        cache.clear();
    }
}

pub fn refused(code: RefusalCode, message: String) -> Reply {
    Reply::Refused(RefusedReply {
        code,
        message: BoundedString::truncating(&message),
    })
}

/// Answers a peer's `export` request from the cache: a duplicate of the FD, or a refusal.
pub fn serve(request: &ExportRequest, peer_pid: i32) -> (Reply, Option<OwnedFd>) {
    let id = request.allocation.id;
    let guard = lock();
    let Some(entry) = guard.as_ref().and_then(|c| c.get(&id)) else {
        return (
            refused(
                RefusalCode::UnknownAllocation,
                format!("allocation {id} is not exported by this process"),
            ),
            None,
        );
    };
    let by_id = entry.id_authorizes && request.capability == id_token(&id);
    if entry.capability != request.capability && !by_id {
        crate::sys::log::refusal(format_args!(
            "refused an export of {id} to pid {peer_pid}: wrong capability token"
        ));
        return (
            refused(
                RefusalCode::Unauthorized,
                format!("wrong capability token for allocation {id}"),
            ),
            None,
        );
    }
    let kind = match entry.reply {
        Reply::MulticastExport(_) => ResourceKind::Multicast,
        _ => ResourceKind::Unicast,
    };
    if kind != request.resource {
        return (
            refused(
                RefusalCode::WrongKind,
                format!("{id} is a {kind} object, not {}", request.resource),
            ),
            None,
        );
    }
    match entry.fd.try_clone() {
        Ok(fd) => (entry.reply.clone(), Some(fd)),
        Err(e) => (
            refused(
                RefusalCode::Busy,
                format!("cannot duplicate the export of {id}: {e}"),
            ),
            None,
        ),
    }
}
