//! POSIX-FD export and import of tracked objects.
//!
//! The application never sees the driver's export FD: it gets a sealed ticket memfd naming the
//! creator, the object and a capability token. Importing a ticket asks the creator's shim for
//! the real FD (over its socket, lock dropped), imports it and closes it.

use super::multicast;
use super::track;
use crate::driver::{Driver, context, driver};
use crate::log;
use crate::state::cache;
use crate::state::process;
use crate::state::registry::{Allocation, Kind, Origin, Registry, is_logical};
use crate::sys::abi::consts;
use crate::sys::convert;
use crate::sys::error::{CuError, CuResult};
use crate::sys::settings;
use cuinterpose_protocol::ticket::{TicketError, create_ticket, read_ticket};
use cuinterpose_protocol::transport::{Endpoint, Timeouts, call_with};
use cuinterpose_protocol::{
    AllocationId, AllocationReference, CapabilityToken, ExportRequest, NamespacePid, Reply,
    Request, ResourceKind, Ticket, VirtualShareableHandle,
};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

/// What an export hands back to the FFI edge.
#[derive(Debug)]
pub enum Exported {
    /// The driver wrote its own handle into the application's output.
    Native,
    /// A ticket FD for the application.
    Ticket(OwnedFd),
}

/// `native(raw)` is the FFI edge's driver export of handle `raw` into the application's own
/// output (the pass-through paths: untracked handles, and handle types other than POSIX FDs).
pub fn export(
    handle: u64,
    handle_type: u32,
    flags: u64,
    native: impl FnOnce(u64) -> CuResult<()>,
) -> CuResult<Exported> {
    let d = driver()?;
    if handle_type == consts::HANDLE_TYPE_FABRIC {
        refuse_fabric("cuMemExportToShareableHandle");
        return Err(CuError::NOT_SUPPORTED);
    }
    if !is_logical(handle) {
        native(handle)?;
        return Ok(Exported::Native);
    }
    let ticket = process::with(|r| {
        r.require_active()?;
        let entry = r.entry(handle)?;
        if handle_type != consts::HANDLE_TYPE_POSIX_FD {
            // Tracked objects are shared over POSIX FDs only: the driver answers (and refuses)
            // other kinds; FABRIC was refused above.
            native(driver_handle(r, entry.id, entry.kind)?)?;
            return Ok(None);
        }
        if flags != 0 {
            return Err(CuError::INVALID_VALUE);
        }
        if r.allocations
            .get(&entry.id)
            .is_some_and(|a| a.malloc.is_some())
        {
            // cuMemAlloc memory was not created exportable as far as the application knows.
            return Err(CuError::INVALID_VALUE);
        }
        publish(d, r, entry.id, entry.kind).map(Some)
    })?;
    match ticket {
        None => Ok(Exported::Native),
        Some(ticket) => create_ticket(&ticket).map(Exported::Ticket).map_err(|e| {
            log!("cuMemExportToShareableHandle: cannot create the ticket: {e}");
            CuError::OUT_OF_MEMORY
        }),
    }
}

/// Fabric handles cannot be ticketed or checkpointed: the shim answers every fabric export and
/// import as a driver without IMEX does, so clients fall back to POSIX FDs (and reports no
/// fabric support in `cuDeviceGetAttribute`).
fn refuse_fabric(function: &str) {
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| {
        log!(
            "{function}: fabric handles refused with CUDA_ERROR_NOT_SUPPORTED (as without IMEX): \
             they cannot be checkpointed; clients fall back to POSIX file descriptors"
        );
    });
}

fn driver_handle(r: &Registry, id: AllocationId, kind: Kind) -> CuResult<u64> {
    match kind {
        Kind::Unicast => r.allocations.get(&id).and_then(|a| a.driver),
        Kind::Multicast => r.multicasts.get(&id).and_then(|m| m.driver),
    }
    .ok_or(CuError::INVALID_HANDLE)
}

/// Makes sure the creator's real export FD is cached (exported once per object), marks the
/// object shared and returns the ticket that names it.
pub fn publish(d: &Driver, r: &mut Registry, id: AllocationId, kind: Kind) -> CuResult<Ticket> {
    let me = r.pid;
    let (reference, capability, resource) = match kind {
        Kind::Unicast => {
            let a = r.allocations.get_mut(&id).ok_or(CuError::INVALID_HANDLE)?;
            if a.is_creator(me) && !cache::contains(&id) {
                let raw = a.driver.ok_or(CuError::INVALID_HANDLE)?;
                cache_export(d, id, raw, a.capability, a.export_reply())?;
            }
            a.shared = true;
            a.published = true;
            (a.reference.clone(), a.capability, ResourceKind::Unicast)
        }
        Kind::Multicast => {
            let m = r.multicasts.get_mut(&id).ok_or(CuError::INVALID_HANDLE)?;
            if m.reference.creator_pid == me && !cache::contains(&id) {
                let raw = m.driver.ok_or(CuError::INVALID_HANDLE)?;
                cache_export(d, id, raw, m.capability, m.export_reply())?;
            }
            m.shared = true;
            (m.reference.clone(), m.capability, ResourceKind::Multicast)
        }
    };
    Ok(Ticket {
        handle: VirtualShareableHandle {
            creator_pid: reference.creator_pid,
            allocation: reference.id,
        },
        resource,
        capability,
    })
}

/// Exports `raw` and caches the FD as this creator's answer to peers asking for `id`.
pub fn cache_export(
    d: &Driver,
    id: AllocationId,
    raw: u64,
    capability: CapabilityToken,
    reply: Reply,
) -> CuResult<()> {
    let fd = d.export_posix_fd(raw)?;
    cache::insert(id, fd, capability, reply);
    Ok(())
}

/// `cuMemImportFromShareableHandle`. `fd` is the application's POSIX FD when the handle type
/// is POSIX FD and the number is an open descriptor (the FFI edge borrows it for the call);
/// `native()` is the driver's import of the application's own argument.
pub fn import(
    handle_type: u32,
    fd: Option<BorrowedFd<'_>>,
    native: impl FnOnce() -> CuResult<u64>,
) -> CuResult<u64> {
    let d = driver()?;
    if handle_type == consts::HANDLE_TYPE_FABRIC {
        refuse_fabric("cuMemImportFromShareableHandle");
        return Err(CuError::NOT_SUPPORTED);
    }
    let Some(fd) = fd.filter(|_| handle_type == consts::HANDLE_TYPE_POSIX_FD) else {
        return native();
    };
    match read_ticket(fd) {
        Ok(ticket) => import_ticket(d, &ticket),
        Err(TicketError::NotATicket(why)) => {
            let raw = native()?;
            process::note_raw_import(raw);
            log!(
                "cuMemImportFromShareableHandle: fd {} is not a cuinterpose ticket ({why}); \
                 imported natively as a raw import: checkpoint is refused while it is held",
                std::os::fd::AsRawFd::as_raw_fd(&fd)
            );
            Ok(raw)
        }
        Err(e) => {
            log!(
                "cuMemImportFromShareableHandle: fd {}: {e}; refused with CUDA_ERROR_INVALID_HANDLE",
                std::os::fd::AsRawFd::as_raw_fd(&fd)
            );
            Err(CuError::INVALID_HANDLE)
        }
    }
}

/// A handle for an object already in the registry (same allocation imported again, or an
/// exporter importing its own export).
fn known(r: &mut Registry, ticket: &Ticket) -> CuResult<Option<u64>> {
    let id = ticket.handle.allocation;
    let creator = ticket.handle.creator_pid;
    let kind = match ticket.resource {
        ResourceKind::Unicast => Kind::Unicast,
        ResourceKind::Multicast => Kind::Multicast,
        ResourceKind::Pool => {
            log!(
                "cuMemImportFromShareableHandle: the ticket names memory pool {id}; import it \
                 with cuMemPoolImportFromShareableHandle"
            );
            return Err(CuError::INVALID_HANDLE);
        }
    };
    let Some(object) = r.common_mut(&id, kind) else {
        return Ok(None);
    };
    if object.reference.creator_pid != creator {
        return Err(CuError::INVALID_HANDLE);
    }
    *object.shared = true;
    r.mint(id, kind).map(Some)
}

fn import_ticket(d: &Driver, ticket: &Ticket) -> CuResult<u64> {
    if let Some(handle) = process::with(|r| {
        r.require_active()?;
        known(r, ticket)
    })? {
        return Ok(handle);
    }
    let reference = AllocationReference {
        id: ticket.handle.allocation,
        creator_pid: ticket.handle.creator_pid,
    };
    let (reply, fd) = request_export(&reference, ticket.resource, ticket.capability)?;
    process::with(|r| {
        r.require_active()?;
        if let Some(handle) = known(r, ticket)? {
            return Ok(handle);
        }
        match reply {
            Reply::UnicastExport(export) => {
                let context = context::current(d);
                let raw = track::import_fd(d, fd.as_fd())?;
                drop(fd);
                let allocation = imported_allocation(
                    d,
                    raw,
                    reference,
                    export.size,
                    ticket.capability,
                    context,
                )?;
                track::adopt(d, r, allocation)
            }
            Reply::MulticastExport(export) => {
                multicast::adopt_import(d, r, reference, export.properties, ticket.capability, fd)
            }
            other => {
                log!(
                    "import of {}: the creator answered {} instead of an export",
                    reference.id,
                    other.kind()
                );
                Err(CuError::INVALID_HANDLE)
            }
        }
    })
}

/// The record of a freshly imported unicast allocation; releases `raw` when it cannot be
/// tracked.
pub fn imported_allocation(
    d: &Driver,
    raw: u64,
    reference: AllocationReference,
    size: u64,
    capability: CapabilityToken,
    context: usize,
) -> CuResult<Allocation> {
    let prop = d.allocation_properties(raw);
    let properties = prop.and_then(|prop| convert::allocation_properties(&prop).map(|p| (prop, p)));
    let (prop, properties) = match properties {
        Ok((prop, p)) if track::trackable(&p) => (prop, p),
        _ => {
            let _ = d.mem_release(raw);
            log!(
                "import of {}: memory of this kind cannot be checkpointed; refused",
                reference.id
            );
            return Err(CuError::NOT_SUPPORTED);
        }
    };
    let origin = Origin::imported(reference, raw, context, capability);
    Ok(Allocation::new(origin, size, properties, prop.alloc_flags))
}

/// Asks the creator's shim for the real export FD of `reference` (registry lock not held);
/// a failure is logged, naming the creator.
pub fn request_export(
    reference: &AllocationReference,
    resource: ResourceKind,
    capability: CapabilityToken,
) -> CuResult<(Reply, OwnedFd)> {
    try_request_export(reference, resource, capability).map_err(|what| {
        log!(
            "import of {} from creator pid {}: {what}",
            reference.id,
            reference.creator_pid
        );
        CuError::INVALID_HANDLE
    })
}

/// [`request_export`] without the log line, for a caller that asks again until the creator
/// is ready (a rollback waiting for its creators to recreate their objects).
pub fn try_request_export(
    reference: &AllocationReference,
    resource: ResourceKind,
    capability: CapabilityToken,
) -> Result<(Reply, OwnedFd), String> {
    let request = Request::Export(ExportRequest {
        allocation: reference.clone(),
        resource,
        capability,
    });
    export_answer(call_participant(reference.creator_pid, &request)?)
}

/// A creator's answer to an export: the export and its descriptor, or why there is none.
fn export_answer((reply, fd): (Reply, Option<OwnedFd>)) -> Result<(Reply, OwnedFd), String> {
    match (reply, fd) {
        (Reply::Refused(refused), _) => Err(format!(
            "refused ({}): {}",
            refused.code,
            refused.message.as_str()
        )),
        (reply, Some(fd)) => Ok((reply, fd)),
        (reply, None) => Err(format!("{} reply without a descriptor", reply.kind())),
    }
}

/// Why a series of exports from a creator stopped on the creator's side (or the connection).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportFailure(pub String);

/// Asks `creator` for the export of each of `allocations` over one connection (a series) and
/// hands each answer, in order, to `each` with its index: the export and its descriptor, or
/// why the creator refused. Stops at the first error `each` returns or the connection gives.
pub fn for_each_export<E: From<ExportFailure>>(
    creator: NamespacePid,
    allocations: &[(AllocationReference, CapabilityToken)],
    resource: ResourceKind,
    mut each: impl FnMut(usize, Result<(Reply, OwnedFd), String>) -> Result<(), E>,
) -> Result<(), E> {
    let requests: Vec<Request> = allocations
        .iter()
        .map(|(reference, capability)| {
            Request::Export(ExportRequest {
                allocation: reference.clone(),
                resource,
                capability: *capability,
            })
        })
        .collect();
    let failed = |e: &dyn std::fmt::Display| {
        ExportFailure(format!("asking creator {creator} for its allocations: {e}"))
    };
    let (endpoint, timeouts) = participant(creator).map_err(|e| failed(&e))?;
    let replies = cuinterpose_protocol::transport::export_all(&endpoint, &requests, &timeouts)
        .map_err(|e| failed(&e))?;
    for (index, reply) in replies.enumerate() {
        each(index, export_answer(reply.map_err(|e| failed(&e))?))?;
    }
    Ok(())
}

/// One exchange with another participant's shim (its socket in the control directory), with
/// the control timeouts; the registry lock must not be held.
pub fn call_participant(
    pid: NamespacePid,
    request: &Request,
) -> Result<(Reply, Option<OwnedFd>), String> {
    let (endpoint, timeouts) = participant(pid)?;
    call_with(&endpoint, request, None, &timeouts).map_err(|e| e.to_string())
}

/// Another participant's socket in the control directory, and the control timeouts.
fn participant(pid: NamespacePid) -> Result<(Endpoint, Timeouts), String> {
    let settings = settings::current().map_err(|e| e.to_string())?;
    let endpoint = Endpoint::for_pid(&settings.control_dir, pid).map_err(|e| e.to_string())?;
    Ok((endpoint, settings.timeouts))
}
