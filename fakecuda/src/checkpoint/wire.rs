//! The private wire format of the control socket: fixed 16-byte little-endian frames. It is
//! fakecuda's own (the real driver has its own private channel) and independent of
//! cuinterpose's protocol.

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
