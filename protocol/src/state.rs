//! The state file's integrity check: [`StateFile::seal`] computes the digest over the
//! participants, devices, carrier checksums and carrier, [`StateFile::check_digest`] recomputes it for
//! a file read back.
//!
//! The digest covers the MessagePack encoding of `[participants, devices, checksums, carrier]` exactly
//! as the envelope encoder writes those fields (struct maps, sorted records), so one changed
//! byte of any record, device or checksum is caught, while the envelope and the digest field
//! itself are not hashed.

use std::io::Write;

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::bounded::{BoundedMap, BoundedVec};
use crate::generated::{
    Carrier, CarrierChecksum, DeviceInventory, MAX_PARTICIPANTS, MAX_RECORDS, NamespacePid, Record,
    StateDigest, StateFile,
};

/// The type of [`StateFile::participants`] (the compiler checks it against the generated one).
pub type Participants = BoundedMap<NamespacePid, BoundedVec<Record, MAX_RECORDS>, MAX_PARTICIPANTS>;

/// The type of [`StateFile::checksums`].
pub type Checksums =
    BoundedMap<NamespacePid, BoundedVec<CarrierChecksum, MAX_RECORDS>, MAX_PARTICIPANTS>;

/// The digest in a state file does not match its participants.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "integrity check failed: the file's digest is {recorded} but its participants, devices, \
     checksums and carrier hash to {computed} (the file was edited or damaged after it was written)"
)]
pub struct DigestMismatch {
    pub recorded: StateDigest,
    pub computed: StateDigest,
}

/// A writer that feeds SHA-256, so the encoding is hashed without being held in memory.
struct Hashing(Sha256);

impl Write for Hashing {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.update(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn digest_of<T: Serialize>(participants: &T) -> StateDigest {
    let mut hashing = Hashing(Sha256::new());
    let mut serializer = rmp_serde::Serializer::new(&mut hashing).with_struct_map();
    // Writing into the hasher cannot fail, and every generated type serializes (the bounds
    // were checked when the collections were built).
    participants
        .serialize(&mut serializer)
        .expect("serializing into a hasher cannot fail");
    let bytes: [u8; 32] = hashing.0.finalize().into();
    // SHA-256 of anything is all zero with probability 2^-256; the identity refuses only that.
    StateDigest::new(bytes).expect("a SHA-256 digest is never all zero")
}

impl StateFile {
    /// A state file for `participants` with its digest.
    pub fn seal(
        participants: Participants,
        devices: DeviceInventory,
        checksums: Checksums,
        carrier: Carrier,
    ) -> Self {
        let digest = digest_of(&(&participants, &devices, &checksums, carrier));
        Self {
            digest,
            participants,
            devices,
            checksums,
            carrier,
        }
    }

    /// Recomputes the digest: an error names both values when they differ.
    pub fn check_digest(&self) -> Result<(), DigestMismatch> {
        let computed = digest_of(&(
            &self.participants,
            &self.devices,
            &self.checksums,
            self.carrier,
        ));
        if computed == self.digest {
            Ok(())
        } else {
            Err(DigestMismatch {
                recorded: self.digest,
                computed,
            })
        }
    }
}

impl DeviceInventory {
    /// No devices recorded (a state file written without a driver to ask, and test fixtures).
    pub fn empty() -> Self {
        Self {
            machine: BoundedVec::default(),
            participants: BoundedMap::default(),
        }
    }
}
