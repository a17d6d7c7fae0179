//! The registry: what this process holds of tracked allocations and multicast objects, the
//! logical handles the application sees, and every mapping of them.
//!
//! Logical handles carry [`HANDLE_TAG`] in their top 16 bits; the low 48 bits count from 1.
//! The registry translates them to the current driver handle, which changes across restore
//! while the logical value stays.

use crate::driver::api::BindRange;
use crate::sys::abi::RawAllocProp;
use crate::sys::error::{CuError, CuResult};
use cuinterpose_protocol::{
    AccessDescriptor, AllocationId, AllocationProperties, AllocationReference, BindingVersion,
    CapabilityToken, MulticastProperties, NamespacePid, Phase,
};
use std::collections::{BTreeMap, HashMap};

/// Tag of every logical handle: `0xC0DE` in bits 48..64.
pub const HANDLE_TAG: u64 = 0xC0DE << 48;
/// Bits that hold the tag.
pub const TAG_MASK: u64 = 0xFFFF << 48;

pub fn is_logical(handle: u64) -> bool {
    handle & TAG_MASK == HANDLE_TAG
}

/// How a memory pool of this process is shared.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolShare {
    /// `cuMemPoolExportToShareableHandle` calls on it.
    pub exports: u64,
    /// It came from another process (`cuMemPoolImportFromShareableHandle`).
    pub imported: bool,
}

/// A unicast VMM allocation this process created or imported.
#[derive(Debug)]
pub struct Allocation {
    pub reference: AllocationReference,
    /// The driver's handle; `None` between `prepare_unicast` and its restore.
    pub driver: Option<u64>,
    pub size: u64,
    pub properties: AllocationProperties,
    /// `CUmemAllocationProp::allocFlags` at creation, so restore recreates the same memory.
    pub alloc_flags: [u8; 8],
    /// Exported, imported, IPC-shared or bound into multicast; never goes back to false.
    pub shared: bool,
    /// The creator published an export of it (a ticket or an IPC handle), so importers may
    /// ask for its FD; restore republishes exactly these.
    pub published: bool,
    /// The context current at creation or import (0: none was); the lifecycle works in it.
    pub context: usize,
    /// Authorizes `export` requests for this allocation (the creator's token).
    pub capability: CapabilityToken,
    /// The logical handle `cuMemCreate` (or the first import) returned.
    pub primary_handle: u64,
    /// Live references over all logical handles of this allocation.
    pub handle_refs: u64,
    /// Recorded mappings of this allocation.
    pub mappings: u64,
    /// Set for `cuMemAlloc` conversions (memory IPC adapter): requested size and extent.
    pub malloc: Option<MallocInfo>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MallocInfo {
    pub requested: u64,
    /// IPC opens of an imported region (0 for the creator's own).
    pub opens: u64,
    /// Whether `cuIpcGetMemHandle` published it: its IPC handle carries no capability token,
    /// so the allocation id (random, and as secret as the handle) authorizes exports.
    /// Also set when `cuMemPoolExportPointer` exported it (the same holds for its bytes).
    pub ipc_exported: bool,
    /// The adapter pool it was allocated from or imported into (0: `cuMemAlloc` or
    /// `cuIpcOpenMemHandle`).
    pub pool: u64,
}

/// Where a new record of an allocation or a multicast object comes from: its identity, the
/// driver's handle `raw` in this process, whether it is shared from the start (imported), the
/// context it was made in, and the token that authorizes exports of it.
#[derive(Debug)]
pub struct Origin {
    pub reference: AllocationReference,
    pub raw: u64,
    pub shared: bool,
    pub context: usize,
    pub capability: CapabilityToken,
}

impl Origin {
    /// An object imported from its creator: shared from the start.
    pub fn imported(
        reference: AllocationReference,
        raw: u64,
        context: usize,
        capability: CapabilityToken,
    ) -> Self {
        Origin {
            reference,
            raw,
            shared: true,
            context,
            capability,
        }
    }
}

impl Allocation {
    /// A new record of the memory `origin` names, unpublished, with no handles or mappings yet.
    pub fn new(
        origin: Origin,
        size: u64,
        properties: AllocationProperties,
        alloc_flags: [u8; 8],
    ) -> Self {
        Self {
            reference: origin.reference,
            driver: Some(origin.raw),
            size,
            properties,
            alloc_flags,
            shared: origin.shared,
            published: false,
            context: origin.context,
            capability: origin.capability,
            primary_handle: 0,
            handle_refs: 0,
            mappings: 0,
            malloc: None,
        }
    }

    pub fn is_creator(&self, me: NamespacePid) -> bool {
        self.reference.creator_pid == me
    }

    /// Whether this process saves the allocation's bytes in its host carrier.
    pub fn host_carrier(&self, me: NamespacePid) -> bool {
        self.shared && self.is_creator(me)
    }

    /// What the creator answers a peer's export request with.
    pub fn export_reply(&self) -> cuinterpose_protocol::Reply {
        cuinterpose_protocol::Reply::UnicastExport(cuinterpose_protocol::UnicastExportReply {
            size: self.size,
        })
    }

    pub fn raw_properties(&self) -> RawAllocProp {
        crate::sys::convert::raw_allocation_properties(&self.properties, self.alloc_flags)
    }
}

/// The fields an allocation and a multicast object both have, borrowed from one of them.
#[derive(Debug)]
pub struct Common<'a> {
    pub reference: &'a AllocationReference,
    pub driver: Option<u64>,
    pub shared: &'a mut bool,
    pub context: &'a mut usize,
}

/// The two counters that keep an allocation or multicast object alive in this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Count {
    /// Live application handles.
    HandleRefs,
    /// Recorded mappings.
    Mappings,
}

/// A multicast object this process created or imported.
#[derive(Debug)]
pub struct Multicast {
    pub reference: AllocationReference,
    pub driver: Option<u64>,
    pub properties: MulticastProperties,
    pub shared: bool,
    pub context: usize,
    pub capability: CapabilityToken,
    pub primary_handle: u64,
    pub handle_refs: u64,
    pub mappings: u64,
    /// Devices this process added, in order.
    pub devices: Vec<i32>,
    pub bindings: Vec<Binding>,
}

impl Multicast {
    /// A new record of the object `origin` names, with no handles, mappings, devices or
    /// bindings yet.
    pub fn new(origin: Origin, properties: MulticastProperties) -> Self {
        Self {
            reference: origin.reference,
            driver: Some(origin.raw),
            properties,
            shared: origin.shared,
            context: origin.context,
            capability: origin.capability,
            primary_handle: 0,
            handle_refs: 0,
            mappings: 0,
            devices: Vec::new(),
            bindings: Vec::new(),
        }
    }

    /// What the creator answers a peer's export request with.
    pub fn export_reply(&self) -> cuinterpose_protocol::Reply {
        cuinterpose_protocol::Reply::MulticastExport(cuinterpose_protocol::MulticastExportReply {
            properties: self.properties.clone(),
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BindingTarget {
    /// `cuMulticastBindMem`: a tracked allocation and an offset into it.
    Memory {
        member: AllocationReference,
        offset: u64,
    },
    /// `cuMulticastBindAddr`: an address, inside a tracked mapping or not.
    Address {
        address: u64,
        member: Option<(AllocationReference, u64)>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binding {
    pub target: BindingTarget,
    pub multicast_offset: u64,
    pub size: u64,
    pub flags: u64,
    pub version: BindingVersion,
    pub device: i32,
}

impl Binding {
    /// A binding on `device` of `range` as the call passed it: made by the v2 entry point when
    /// the range names a device (v1 otherwise).
    pub fn new(target: BindingTarget, range: BindRange, device: i32) -> Binding {
        Binding {
            target,
            multicast_offset: range.multicast_offset as u64,
            size: range.size as u64,
            flags: range.flags,
            version: if range.device.is_some() {
                BindingVersion::V2
            } else {
                BindingVersion::V1
            },
            device,
        }
    }

    /// The range to bind again, through the entry point that made the binding.
    pub fn range(&self) -> BindRange {
        BindRange {
            device: (self.version == BindingVersion::V2).then_some(self.device),
            multicast_offset: self.multicast_offset as usize,
            size: self.size as usize,
            flags: self.flags,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Unicast,
    Multicast,
}

/// One `cuMemMap` of a tracked allocation or multicast object.
#[derive(Debug, Clone)]
pub struct Mapping {
    pub id: AllocationId,
    pub kind: Kind,
    /// The logical handle the application mapped (what `cuMemRetainAllocationHandle` gives
    /// back for an address inside); 0 for `cuMemAlloc` regions, which have none.
    pub handle: u64,
    pub size: u64,
    pub offset: u64,
    pub flags: u64,
    /// Granted access, sorted by location; a location appears at most once.
    pub access: Vec<AccessDescriptor>,
}

#[derive(Debug, Clone, Copy)]
pub struct HandleEntry {
    pub id: AllocationId,
    pub kind: Kind,
    pub refs: u64,
}

/// Everything the shim knows about this process's tracked CUDA memory.
#[derive(Debug)]
pub struct Registry {
    pub pid: NamespacePid,
    pub phase: Phase,
    /// Why the process is fail-stopped, once it is.
    pub failure: Option<String>,
    pub allocations: BTreeMap<AllocationId, Allocation>,
    pub multicasts: BTreeMap<AllocationId, Multicast>,
    pub handles: HashMap<u64, HandleEntry>,
    /// By base address.
    pub mappings: BTreeMap<u64, Mapping>,
    /// Driver handles of imports that were not tickets, with their live counts.
    pub raw_imports: HashMap<u64, u64>,
    /// The driver's own memory pools shared with other processes (driver pool handle →
    /// exports, imported): the shim cannot rebuild them, so inspection refuses while any is
    /// alive. The pool adapter's pools are in `pools`.
    pub pool_shares: std::collections::BTreeMap<usize, PoolShare>,
    /// The pool adapter's IPC pools.
    pub pools: super::pools::Pools,
    /// Driver calls in flight with the registry lock dropped (multicast collectives).
    pub unlocked_calls: u64,
    /// The carrier between `save_allocations` and `load_allocations`.
    pub carrier: Option<super::stored::Held>,
    /// Peer access the application enabled: (accessing context, peer context) → the
    /// accessing context's device, which the peer context's `cuMemAlloc` regions grant.
    pub peer_links: BTreeMap<(usize, usize), i32>,
    next_handle: u64,
}

impl Registry {
    pub fn new(pid: NamespacePid) -> Self {
        Registry {
            pid,
            phase: Phase::Active,
            failure: None,
            allocations: BTreeMap::new(),
            multicasts: BTreeMap::new(),
            handles: HashMap::new(),
            mappings: BTreeMap::new(),
            raw_imports: HashMap::new(),
            pool_shares: std::collections::BTreeMap::new(),
            pools: super::pools::Pools::default(),
            unlocked_calls: 0,
            carrier: None,
            peer_links: BTreeMap::new(),
            next_handle: 0,
        }
    }

    /// Moves the lifecycle to `phase`, and the copy that `progress` answers from with it.
    pub fn set_phase(&mut self, phase: Phase) {
        self.phase = phase;
        super::progress::set_phase(phase);
    }

    /// Tracked calls are allowed only while active.
    pub fn require_active(&self) -> CuResult<()> {
        if self.failure.is_some() {
            return Err(CuError::UNKNOWN);
        }
        if self.phase != Phase::Active {
            return Err(CuError::NOT_READY);
        }
        Ok(())
    }

    /// A fresh logical handle naming `id`, with one reference.
    pub fn mint(&mut self, id: AllocationId, kind: Kind) -> CuResult<u64> {
        if self.next_handle >= !TAG_MASK {
            return Err(CuError::OUT_OF_MEMORY);
        }
        self.next_handle += 1;
        let handle = HANDLE_TAG | self.next_handle;
        self.handles
            .insert(handle, HandleEntry { id, kind, refs: 1 });
        self.add_handle_ref(id, kind, 1);
        Ok(handle)
    }

    /// Adds a reference to `handle` (re-creating its entry if the last one was released).
    pub fn retain_handle(&mut self, handle: u64, id: AllocationId, kind: Kind) {
        self.handles
            .entry(handle)
            .or_insert(HandleEntry { id, kind, refs: 0 })
            .refs += 1;
        self.add_handle_ref(id, kind, 1);
    }

    fn add_handle_ref(&mut self, id: AllocationId, kind: Kind, delta: u64) {
        if let Some(refs) = self.count_mut(&id, kind, Count::HandleRefs) {
            *refs += delta;
        }
    }

    /// Object `id`'s counter `count`, when it is recorded.
    pub fn count_mut(&mut self, id: &AllocationId, kind: Kind, count: Count) -> Option<&mut u64> {
        match (kind, count) {
            (Kind::Unicast, Count::HandleRefs) => {
                self.allocations.get_mut(id).map(|a| &mut a.handle_refs)
            }
            (Kind::Unicast, Count::Mappings) => {
                self.allocations.get_mut(id).map(|a| &mut a.mappings)
            }
            (Kind::Multicast, Count::HandleRefs) => {
                self.multicasts.get_mut(id).map(|m| &mut m.handle_refs)
            }
            (Kind::Multicast, Count::Mappings) => {
                self.multicasts.get_mut(id).map(|m| &mut m.mappings)
            }
        }
    }

    pub fn entry(&self, handle: u64) -> CuResult<HandleEntry> {
        self.handles
            .get(&handle)
            .copied()
            .ok_or(CuError::INVALID_HANDLE)
    }

    /// Drops one reference of a logical handle; returns the object it named.
    pub fn drop_handle(&mut self, handle: u64) -> CuResult<HandleEntry> {
        let entry = self
            .handles
            .get_mut(&handle)
            .ok_or(CuError::INVALID_HANDLE)?;
        entry.refs -= 1;
        let entry = *entry;
        if entry.refs == 0 {
            self.handles.remove(&handle);
        }
        if let Some(refs) = self.count_mut(&entry.id, entry.kind, Count::HandleRefs) {
            *refs -= 1;
        }
        Ok(entry)
    }

    /// The unicast allocation behind a logical handle.
    pub fn allocation_of(&self, handle: u64) -> CuResult<&Allocation> {
        let entry = self.entry(handle)?;
        match entry.kind {
            Kind::Unicast => self
                .allocations
                .get(&entry.id)
                .ok_or(CuError::INVALID_HANDLE),
            Kind::Multicast => Err(CuError::INVALID_HANDLE),
        }
    }

    /// The mapping that contains `address`, with its base.
    pub fn mapping_at(&self, address: u64) -> Option<(u64, &Mapping)> {
        let (&base, mapping) = self.mappings.range(..=address).next_back()?;
        (address - base < mapping.size).then_some((base, mapping))
    }

    /// Bases of the mappings that start inside `[address, address + size)`.
    pub fn mappings_starting_in(&self, address: u64, size: u64) -> Vec<u64> {
        let end = address.saturating_add(size);
        self.mappings.range(address..end).map(|(&b, _)| b).collect()
    }

    /// Bases of the mappings that overlap `[address, address + size)`.
    pub fn mappings_overlapping(&self, address: u64, size: u64) -> Vec<u64> {
        let end = address.saturating_add(size);
        let mut bases: Vec<u64> = self.mappings.range(address..end).map(|(&b, _)| b).collect();
        if let Some((base, _)) = self.mapping_at(address)
            && base < address
        {
            bases.insert(0, base);
        }
        bases
    }

    /// What object `id` records of its identity and use, when it is recorded.
    pub fn common_mut(&mut self, id: &AllocationId, kind: Kind) -> Option<Common<'_>> {
        let (reference, driver, shared, context) = match kind {
            Kind::Unicast => {
                let a = self.allocations.get_mut(id)?;
                (&a.reference, a.driver, &mut a.shared, &mut a.context)
            }
            Kind::Multicast => {
                let m = self.multicasts.get_mut(id)?;
                (&m.reference, m.driver, &mut m.shared, &mut m.context)
            }
        };
        Some(Common {
            reference,
            driver,
            shared,
            context,
        })
    }

    /// Object `id`'s identity, when it is recorded.
    pub fn reference(&self, id: &AllocationId, kind: Kind) -> Option<&AllocationReference> {
        match kind {
            Kind::Unicast => self.allocations.get(id).map(|a| &a.reference),
            Kind::Multicast => self.multicasts.get(id).map(|m| &m.reference),
        }
    }

    /// Whether nothing keeps a unicast allocation's record alive any more.
    pub fn unicast_unused(&self, id: &AllocationId) -> bool {
        self.allocations
            .get(id)
            .is_some_and(|a| a.handle_refs == 0 && a.mappings == 0 && a.malloc.is_none())
    }

    pub fn multicast_unused(&self, id: &AllocationId) -> bool {
        self.multicasts
            .get(id)
            .is_some_and(|m| m.handle_refs == 0 && m.mappings == 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registry() -> Registry {
        Registry::new(NamespacePid::new(42).unwrap())
    }

    fn id(n: u8) -> AllocationId {
        AllocationId::new([n; 16]).unwrap()
    }

    fn map(r: &mut Registry, address: u64, size: u64) {
        r.mappings.insert(
            address,
            Mapping {
                id: id(1),
                kind: Kind::Unicast,
                handle: 0,
                size,
                offset: 0,
                flags: 0,
                access: Vec::new(),
            },
        );
    }

    #[test]
    fn logical_handles_carry_the_tag_and_count_references() {
        let mut r = registry();
        let h = r.mint(id(1), Kind::Unicast).unwrap();
        assert!(is_logical(h));
        assert_eq!(h & !TAG_MASK, 1);
        assert!(!is_logical(0x1234));
        r.retain_handle(h, id(1), Kind::Unicast);
        assert_eq!(r.entry(h).unwrap().refs, 2);
        r.drop_handle(h).unwrap();
        r.drop_handle(h).unwrap();
        assert_eq!(r.drop_handle(h).unwrap_err(), CuError::INVALID_HANDLE);
        assert_eq!(r.entry(h).unwrap_err(), CuError::INVALID_HANDLE);
    }

    #[test]
    fn mappings_are_found_by_any_address_inside() {
        let mut r = registry();
        map(&mut r, 0x1000, 0x1000);
        map(&mut r, 0x4000, 0x2000);
        assert_eq!(r.mapping_at(0x1fff).map(|(b, _)| b), Some(0x1000));
        assert!(r.mapping_at(0x2000).is_none());
        assert_eq!(r.mapping_at(0x5fff).map(|(b, _)| b), Some(0x4000));
        assert_eq!(r.mappings_overlapping(0x1800, 0x3000), vec![0x1000, 0x4000]);
        assert_eq!(r.mappings_overlapping(0x2000, 0x2000), Vec::<u64>::new());
        assert_eq!(r.mappings_starting_in(0x1800, 0x3000), vec![0x4000]);
    }

    #[test]
    fn tracked_calls_need_the_active_phase() {
        let mut r = registry();
        assert_eq!(r.require_active(), Ok(()));
        r.phase = Phase::Frozen;
        assert_eq!(r.require_active(), Err(CuError::NOT_READY));
        r.phase = Phase::Active;
        r.failure = Some("driver error".into());
        assert_eq!(r.require_active(), Err(CuError::UNKNOWN));
    }
}
