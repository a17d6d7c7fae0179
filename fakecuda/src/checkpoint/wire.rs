//! The private wire format of the control socket: fixed 16-byte little-endian frames. It is
//! fakecuda's own (the real driver has its own private channel) and independent of
//! cuinterpose's protocol.

/// The name of the thread that accepts on the control socket: the "restore thread" that
/// `cuCheckpointProcessGetRestoreThreadId` reports (within the kernel's 15 bytes of `comm`).
pub const THREAD_NAME: &str = "fakecuda-ctl";

pub const MAGIC: u32 = 0x4643_4b31; // "FCK1"

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Op {
    GetState = 1,
    Lock = 2,
    Checkpoint = 3,
    Restore = 4,
    Unlock = 5,
    /// The FD behind a native IPC handle; `arg` is the creator's allocation handle.
    IpcFd = 6,
}

impl Op {
    fn from_u32(v: u32) -> Option<Op> {
        Some(match v {
            1 => Op::GetState,
            2 => Op::Lock,
            3 => Op::Checkpoint,
            4 => Op::Restore,
            5 => Op::Unlock,
            6 => Op::IpcFd,
            _ => return None,
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub op: Op,
    /// Lock: timeout in ms; IpcFd: allocation handle.
    pub arg: u64,
}

impl Request {
    pub fn encode(&self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4..8].copy_from_slice(&(self.op as u32).to_le_bytes());
        b[8..].copy_from_slice(&self.arg.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; 16]) -> Option<Request> {
        let word = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        if word(0) != MAGIC {
            return None;
        }
        let op = Op::from_u32(word(4))?;
        let mut a = [0u8; 8];
        a.copy_from_slice(&b[8..]);
        Some(Request {
            op,
            arg: u64::from_le_bytes(a),
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reply {
    /// A raw CUresult.
    pub result: u32,
    /// The process state after the operation (a raw CUprocessState).
    pub state: u32,
    pub value: u64,
}

impl Reply {
    pub fn encode(&self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[..4].copy_from_slice(&self.result.to_le_bytes());
        b[4..8].copy_from_slice(&self.state.to_le_bytes());
        b[8..].copy_from_slice(&self.value.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; 16]) -> Reply {
        let word = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let mut v = [0u8; 8];
        v.copy_from_slice(&b[8..]);
        Reply {
            result: word(0),
            state: word(4),
            value: u64::from_le_bytes(v),
        }
    }
}

/// Where a process's control socket lives: `$FAKECUDA_CONTROL_DIR` (default `/tmp/fakecuda`),
/// named by the pid as the process itself sees it.
pub fn socket_path(ns_pid: u32) -> std::path::PathBuf {
    let dir = std::env::var_os("FAKECUDA_CONTROL_DIR").unwrap_or_else(|| "/tmp/fakecuda".into());
    std::path::Path::new(&dir).join(format!("fakecuda-{ns_pid}.sock"))
}

/// What a restore request carries after its frame (whose `arg` is this body's length): the
/// devices of the machine the restorer runs on, and the old→new UUID pairs it was given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestoreBody {
    pub machine: Vec<crate::device::Physical>,
    pub pairs: Vec<([u8; 16], [u8; 16])>,
}

/// Largest restore body a process reads: 64 devices and 64 pairs with the longest names.
pub const MAX_RESTORE_BODY: usize =
    8 + 64 * (16 + 8 + 4 + 1 + crate::device::MAX_MODEL_LEN) + 64 * 32;

impl RestoreBody {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&(self.machine.len() as u32).to_le_bytes());
        for d in &self.machine {
            b.extend_from_slice(&d.uuid);
            b.extend_from_slice(&d.memory.to_le_bytes());
            b.extend_from_slice(&d.index.to_le_bytes());
            b.push(d.model.len() as u8);
            b.extend_from_slice(d.model.as_bytes());
        }
        b.extend_from_slice(&(self.pairs.len() as u32).to_le_bytes());
        for (old, new) in &self.pairs {
            b.extend_from_slice(old);
            b.extend_from_slice(new);
        }
        b
    }

    /// `None` for a body that is cut short, too long, or names more than 64 of anything.
    pub fn decode(b: &[u8]) -> Option<RestoreBody> {
        let mut r = Reader(b);
        let devices = r.u32()?;
        if devices > crate::device::MAX_DEVICES {
            return None;
        }
        let mut machine = Vec::with_capacity(devices as usize);
        for _ in 0..devices {
            let uuid = r.array()?;
            let memory = u64::from_le_bytes(r.array()?);
            let index = r.u32()?;
            let len = r.take(1)?[0] as usize;
            if len > crate::device::MAX_MODEL_LEN {
                return None;
            }
            let model = String::from_utf8(r.take(len)?.to_vec()).ok()?;
            machine.push(crate::device::Physical {
                index,
                uuid,
                model,
                memory,
            });
        }
        let count = r.u32()?;
        if count > crate::device::MAX_DEVICES {
            return None;
        }
        let mut pairs = Vec::with_capacity(count as usize);
        for _ in 0..count {
            pairs.push((r.array()?, r.array()?));
        }
        r.0.is_empty().then_some(RestoreBody { machine, pairs })
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }

    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N)?.try_into().ok()
    }

    fn u32(&mut self) -> Option<u32> {
        self.array().map(u32::from_le_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restore_body_round_trips_and_a_damaged_one_is_refused() {
        let machine = crate::device::Machine::parse("H200,A100:64", 1 << 30, "b").unwrap();
        let body = RestoreBody {
            machine: machine.devices.clone(),
            pairs: vec![(machine.devices[0].uuid, machine.devices[1].uuid)],
        };
        let bytes = body.encode();
        assert!(bytes.len() <= MAX_RESTORE_BODY);
        assert_eq!(RestoreBody::decode(&bytes), Some(body));
        for cut in 0..bytes.len() {
            assert_eq!(RestoreBody::decode(&bytes[..cut]), None, "cut at {cut}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert_eq!(RestoreBody::decode(&longer), None);
        let mut many = bytes;
        many[..4].copy_from_slice(&65u32.to_le_bytes());
        assert_eq!(RestoreBody::decode(&many), None);
    }
}
