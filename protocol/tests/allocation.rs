//! Memory bounds of the codec, measured with a counting global allocator: a forged length
//! does not allocate, an oversized encoding never holds more than the limit, and a maximal
//! inspection fits.

mod examples;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use cuinterpose_protocol as p;

struct Counting;

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards every call to the system allocator unchanged; only counts sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same contract as the caller's.
        let pointer = unsafe { System.alloc(layout) };
        if !pointer.is_null() {
            let now = CURRENT.fetch_add(layout.size(), Ordering::SeqCst) + layout.size();
            PEAK.fetch_max(now, Ordering::SeqCst);
        }
        pointer
    }
    unsafe fn dealloc(&self, pointer: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(pointer, layout) };
        CURRENT.fetch_sub(layout.size(), Ordering::SeqCst);
    }
    unsafe fn realloc(&self, pointer: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: same contract as the caller's.
        let new = unsafe { System.realloc(pointer, layout, new_size) };
        if !new.is_null() {
            if new_size >= layout.size() {
                let now = CURRENT.fetch_add(new_size - layout.size(), Ordering::SeqCst)
                    + (new_size - layout.size());
                PEAK.fetch_max(now, Ordering::SeqCst);
            } else {
                CURRENT.fetch_sub(layout.size() - new_size, Ordering::SeqCst);
            }
        }
        new
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Tests in this binary run on parallel threads; measurements must not overlap.
static MEASURE: Mutex<()> = Mutex::new(());

/// Bytes allocated at the peak of `work`, above what was live before it.
fn peak_during<T>(work: impl FnOnce() -> T) -> (T, usize) {
    let baseline = CURRENT.load(Ordering::SeqCst);
    PEAK.store(baseline, Ordering::SeqCst);
    let result = work();
    (result, PEAK.load(Ordering::SeqCst) - baseline)
}

fn body_with_records_header(count: u32) -> Vec<u8> {
    let mut bytes = p::encode(&p::Reply::Inspection(p::InspectionReply {
        namespace_pid: examples::pid(1),
        phase: p::Phase::Active,
        raw_imports: 0,
        records: p::BoundedVec::new(),
        devices: p::BoundedVec::new(),
    }))
    .expect("encodes");
    // The empty records array is the last byte (0x90); replace it by an array32 header.
    assert_eq!(bytes.pop(), Some(0x90));
    bytes.push(0xdd);
    bytes.extend_from_slice(&count.to_be_bytes());
    bytes
}

#[test]
fn forged_length_of_four_billion_does_not_allocate() {
    let _guard = MEASURE.lock().unwrap_or_else(|poison| poison.into_inner());
    let bytes = body_with_records_header(u32::MAX);
    let (result, peak) = peak_during(|| p::decode::<p::Reply>(&bytes));
    assert!(
        matches!(&result, Err(p::DecodeError::Malformed { reason, .. }) if reason.contains("list holds 4294967295")),
        "{result:?}"
    );
    assert!(
        peak < 64 * 1024,
        "decoding a forged length allocated {peak} bytes"
    );
}

#[test]
fn declared_length_within_bound_but_missing_elements_allocates_little() {
    let _guard = MEASURE.lock().unwrap_or_else(|poison| poison.into_inner());
    let bytes = body_with_records_header(p::MAX_RECORDS as u32);
    let (result, peak) = peak_during(|| p::decode::<p::Reply>(&bytes));
    assert!(matches!(result, Err(p::DecodeError::Malformed { .. })));
    // Preallocation is capped, whatever the declared length.
    assert!(peak < 1024 * 1024, "a lying length allocated {peak} bytes");
}

fn mapping(index: u32, grants: usize) -> p::Record {
    let access: Vec<(i32, p::AccessFlags)> = (0..grants as i32)
        .map(|device| (device, p::AccessFlags::ProtReadWrite))
        .collect();
    p::Record::Mapping(p::MappingRecord {
        allocation: examples::reference(1 + (index % 200) as u8, 1 + index),
        address: u64::MAX - u64::from(index),
        size: u64::MAX,
        offset: u64::MAX,
        access: examples::access(&access),
    })
}

fn maximal_records() -> p::BoundedVec<p::Record, { p::MAX_RECORDS }> {
    (0..p::MAX_RECORDS as u32)
        .map(|index| mapping(index, p::MAX_ACCESS))
        .collect::<Vec<_>>()
        .try_into()
        .expect("MAX_RECORDS records")
}

/// MAX_DEVICES devices with names of MAX_TEXT_BYTES.
fn maximal_devices() -> p::BoundedVec<p::Device, { p::MAX_DEVICES }> {
    (0..p::MAX_DEVICES as i32)
        .map(|i| p::Device {
            ordinal: i,
            uuid: p::DeviceUuid::new([0xff; 16]).expect("nonzero"),
            name: "x"
                .repeat(p::MAX_TEXT_BYTES)
                .as_str()
                .try_into()
                .expect("at the limit"),
            memory: u64::MAX,
        })
        .collect::<Vec<_>>()
        .try_into()
        .expect("MAX_DEVICES devices")
}

#[test]
fn maximal_inspection_fits_the_message_limit() {
    let _guard = MEASURE.lock().unwrap_or_else(|poison| poison.into_inner());
    let reply = p::Reply::Inspection(p::InspectionReply {
        namespace_pid: examples::pid(u32::MAX),
        phase: p::Phase::MulticastDevicesRestored,
        raw_imports: u64::MAX,
        records: maximal_records(),
        devices: maximal_devices(),
    });
    let bytes = p::encode(&reply).expect("a maximal inspection encodes");
    assert!(bytes.len() <= p::MAX_MESSAGE_BYTES, "{} bytes", bytes.len());
    assert_eq!(p::decode::<p::Reply>(&bytes), Ok(reply));
}

#[test]
fn oversized_encoding_never_holds_more_than_the_limit() {
    let _guard = MEASURE.lock().unwrap_or_else(|poison| poison.into_inner());
    // Three participants of maximal records: about three times the message limit.
    let mut participants = p::BoundedMap::new();
    for pid in 1..=3 {
        participants
            .insert(examples::pid(pid), maximal_records())
            .expect("within MAX_PARTICIPANTS");
    }
    let state = p::StateFile::seal(
        participants,
        p::DeviceInventory::empty(),
        Default::default(),
        p::Carrier::Host,
    );
    let (result, peak) = peak_during(|| p::encode(&state));
    assert!(
        matches!(result, Err(p::EncodeError::Oversized { message: "StateFile", limit }) if limit == p::MAX_MESSAGE_BYTES)
    );
    assert!(
        peak <= p::MAX_MESSAGE_BYTES + 64 * 1024,
        "encoding held {peak} bytes, limit {}",
        p::MAX_MESSAGE_BYTES
    );
}
