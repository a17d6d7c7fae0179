//! The worker's control protocol: one [`Command`] in, one [`Response`] out, each a JSON
//! document in a length-prefixed frame (see [`crate::wire`]), with at most one file
//! descriptor attached.
//!
//! Numbers are exact: addresses, sizes and handles are `u64` JSON integers. Byte strings
//! (`Write`, `Read`, IPC handles, non-FD shareable handles) travel as lowercase hex.

use serde::{Deserialize, Serialize};

/// The most bytes one `Read` or `Write` moves (16 MiB).
pub const MAX_TRANSFER: u64 = 16 << 20;
/// The largest frame either side accepts (64 MiB).
pub const MAX_FRAME: usize = 64 << 20;
/// The chunk size of `Fill`, `Verify` and `Checksum` copies (4 MiB).
pub const COPY_CHUNK: u64 = 4 << 20;

/// One access grant of `SetAccess` (a `CUmemAccessDesc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    /// `CUmemLocationType` (1 device, 3 host NUMA).
    pub location_type: u32,
    /// Device ordinal or NUMA node.
    pub id: i32,
    /// `CUmemAccess_flags`: 0 none, 1 read, 3 read-write.
    pub flags: u32,
}

impl Grant {
    /// Read-write access for device `device`.
    pub fn readwrite(device: i32) -> Grant {
        Grant {
            location_type: crate::cuda::LOCATION_TYPE_DEVICE,
            id: device,
            flags: crate::cuda::ACCESS_READWRITE,
        }
    }

    /// Read-only access for device `device`.
    pub fn read(device: i32) -> Grant {
        Grant {
            location_type: crate::cuda::LOCATION_TYPE_DEVICE,
            id: device,
            flags: crate::cuda::ACCESS_READ,
        }
    }
}

mod command;
mod reply;

pub use command::*;
pub use reply::*;

/// Lowercase hex for `Vec<u8>`.
pub mod hex {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn encode(bytes: &[u8]) -> String {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut s = String::with_capacity(bytes.len() * 2);
        for b in bytes {
            s.push(char::from(DIGITS[usize::from(b >> 4)]));
            s.push(char::from(DIGITS[usize::from(b & 15)]));
        }
        s
    }

    pub fn decode(s: &str) -> Result<Vec<u8>, String> {
        fn nibble(c: u8) -> Result<u8, String> {
            match c {
                b'0'..=b'9' => Ok(c - b'0'),
                b'a'..=b'f' => Ok(c - b'a' + 10),
                b'A'..=b'F' => Ok(c - b'A' + 10),
                _ => Err(format!("not a hex digit: {:?}", char::from(c))),
            }
        }
        let s = s.as_bytes();
        if !s.len().is_multiple_of(2) {
            return Err("odd number of hex digits".to_owned());
        }
        s.chunks_exact(2)
            .map(|p| Ok(nibble(p[0])? << 4 | nibble(p[1])?))
            .collect()
    }

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        decode(&s).map_err(serde::de::Error::custom)
    }
}

/// Lowercase hex for `Option<Vec<u8>>`.
pub mod hex_opt {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &Option<Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
        match bytes {
            Some(b) => s.serialize_some(&super::hex::encode(b)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<u8>>, D::Error> {
        Option::<std::borrow::Cow<'de, str>>::deserialize(d)?
            .map(|s| super::hex::decode(&s).map_err(serde::de::Error::custom))
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_round_trip_as_json() {
        let cmds = [
            Command::Ping,
            Command::Create {
                size: 2 << 20,
                device: 1,
                handle_types: 1,
                location_type: 1,
            },
            Command::Write {
                address: u64::MAX - 7,
                bytes: vec![0, 1, 0xab, 0xff],
            },
            Command::Import {
                handle_type: 8,
                fd: None,
                shareable: Some(vec![9; 64]),
                keep: true,
            },
            Command::SetAccess {
                address: 1 << 40,
                size: 4096,
                grants: vec![Grant::readwrite(0), Grant::read(1)],
            },
        ];
        for c in cmds {
            let text = serde_json::to_string(&c).expect("encode");
            let back: Command = serde_json::from_str(&text).expect("decode");
            assert_eq!(back, c, "{text}");
        }
        let w = serde_json::to_string(&Command::Write {
            address: 1,
            bytes: vec![0xab, 0x01],
        })
        .expect("encode");
        assert_eq!(w, r#"{"cmd":"write","address":1,"bytes":"ab01"}"#);
        let c: Command =
            serde_json::from_str(r#"{"cmd":"create","size":4096,"device":0,"handle_types":1}"#)
                .expect("defaults");
        assert_eq!(
            c,
            Command::Create {
                size: 4096,
                device: 0,
                handle_types: 1,
                location_type: 1
            }
        );
        assert_eq!(c.name(), "create");
        assert!(serde_json::from_str::<Command>(r#"{"cmd":"init","device":0,"x":1}"#).is_err());
        assert!(serde_json::from_str::<Command>(r#"{"cmd":"nope"}"#).is_err());
    }

    /// One command per group: where the table sends it, and the reply it declares.
    #[test]
    fn the_table_names_each_commands_group_and_reply() {
        let check = |command: Command, group: Group, reply: Reply, kind: &str| {
            assert_eq!(command.group(), group, "{command:?}");
            assert!(command.answers()(&reply), "{command:?} answers {reply:?}");
            assert!(
                !command.answers()(&Reply::Count { count: 1 }),
                "{command:?}"
            );
            assert_eq!(
                (command.kind(), command.reply_name()),
                kind.split_once(' ').unwrap()
            );
        };
        check(
            Command::Ping,
            Group::Memory,
            Reply::Hello {
                pid: 1,
                nspid: vec![1],
                ppid: 0,
            },
            "Ping Hello",
        );
        check(
            Command::Write {
                address: 1,
                bytes: vec![1],
            },
            Group::Data,
            Reply::Done,
            "Write Done",
        );
        check(
            Command::McCreate {
                device_count: 2,
                size: 2 << 20,
                handle_types: 1,
                flags: 0,
            },
            Group::Objects,
            Reply::Handle { handle: 7 },
            "McCreate Handle",
        );
    }

    #[test]
    fn responses_round_trip() {
        let rs: [Response; 3] = [
            Ok(Reply::IpcHandle {
                handle: (0..64).collect(),
            }),
            Ok(Reply::Exported {
                fd: Some(7),
                shareable: None,
            }),
            Err(ErrorReply {
                kind: ErrorKind::Mismatch,
                code: -1,
                name: "MISMATCH".into(),
                message: "x".into(),
                mismatch: Some(Mismatch {
                    offset: 3,
                    expected: 1,
                    found: 2,
                }),
            }),
        ];
        for r in rs {
            let text = serde_json::to_string(&r).expect("encode");
            let back: Response = serde_json::from_str(&text).expect("decode");
            assert_eq!(back, r, "{text}");
        }
        assert!(hex::decode("abc").is_err());
        assert!(hex::decode("zz").is_err());
    }
}
