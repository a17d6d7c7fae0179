//! What the coordinator's integration tests share: fake shims (threads serving a
//! [`FakeParticipant`]'s phase machine on a real participant socket,
//! `protocol::transport::Listener`, with scripted misbehaviour), real workloads under the shim
//! ([`sandbox`]), the `cuinterpose` binary ([`cli`]), CRIU ([`criu`]) and the `main` of the `harness = false`
//! binaries ([`harness`]), full disks ([`tmpfs`]).
#![allow(dead_code)]

pub mod cli;
pub mod criu;
pub mod harness;
pub mod sandbox;
pub mod tmpfs;

use std::collections::BTreeMap;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cuinterpose_protocol::transport::Listener;
use cuinterpose_protocol::{NamespacePid, Phase, Record, Request};
use cuinterpose_testkit::fixtures::FakeParticipant;

/// What a fake shim does wrong, and when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Misbehaviour {
    /// Reads the request, then closes the connection without replying (as a process that dies).
    Close,
    /// Reads the request and never replies (until the fake is stopped).
    Silent,
}

pub type Trigger = fn(&Request) -> bool;

/// A fake shim serving one participant.
pub struct FakeShim {
    pub pid: NamespacePid,
    socket: PathBuf,
    participant: Arc<Mutex<FakeParticipant>>,
    requests: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

fn describe(request: &Request) -> String {
    match request {
        Request::Execute(execute) => execute.operation.wire_name().to_string(),
        other => other.kind().to_string(),
    }
}

impl FakeShim {
    pub fn start(
        control_dir: &Path,
        participant: FakeParticipant,
        misbehaviour: Option<(Trigger, Misbehaviour)>,
    ) -> Self {
        let pid = participant.pid;
        let listener = Listener::bind(control_dir, pid).expect("bind the fake shim's socket");
        let socket = listener.endpoint().path().to_path_buf();
        let participant = Arc::new(Mutex::new(participant));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (participant, requests, stop) =
                (participant.clone(), requests.clone(), stop.clone());
            std::thread::spawn(move || {
                serve(&listener, &participant, &requests, &stop, misbehaviour);
            })
        };
        Self {
            pid,
            socket,
            participant,
            requests,
            stop,
            thread: Some(thread),
        }
    }

    pub fn phase(&self) -> Phase {
        self.participant.lock().expect("lock").phase
    }

    /// Requests received so far: `inspect`, `begin_checkpoint` or the operation's name.
    pub fn requests(&self) -> Vec<String> {
        self.requests.lock().expect("lock").clone()
    }
}

fn serve(
    listener: &Listener,
    participant: &Mutex<FakeParticipant>,
    requests: &Mutex<Vec<String>>,
    stop: &AtomicBool,
    misbehaviour: Option<(Trigger, Misbehaviour)>,
) {
    loop {
        let connection = listener.accept();
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(mut connection) = connection else {
            continue;
        };
        let Ok((request, _)) = connection.read_request() else {
            continue;
        };
        requests.lock().expect("lock").push(describe(&request));
        match misbehaviour {
            Some((trigger, Misbehaviour::Close)) if trigger(&request) => {
                drop(connection);
                continue;
            }
            Some((trigger, Misbehaviour::Silent)) if trigger(&request) => {
                let until = Instant::now() + Duration::from_secs(30);
                while !stop.load(Ordering::SeqCst) && Instant::now() < until {
                    std::thread::sleep(Duration::from_millis(20));
                }
                drop(connection);
                continue;
            }
            _ => {}
        }
        let reply = participant.lock().expect("lock").handle(&request);
        let _ = connection.send_reply(&reply, None);
    }
}

impl Drop for FakeShim {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept; a silent fake notices the flag by itself.
        let _ = UnixStream::connect(&self.socket);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// One fake shim per participant of `topology`, in `control_dir`.
pub fn start_all(
    control_dir: &Path,
    topology: &BTreeMap<NamespacePid, Vec<Record>>,
    misbehaving: Option<(u32, Trigger, Misbehaviour)>,
) -> Vec<FakeShim> {
    topology
        .iter()
        .map(|(pid, records)| {
            let misbehaviour = misbehaving
                .filter(|(target, _, _)| *target == pid.get())
                .map(|(_, trigger, what)| (trigger, what));
            FakeShim::start(
                control_dir,
                FakeParticipant::new(*pid, records.clone()),
                misbehaviour,
            )
        })
        .collect()
}

/// Sends `request` to the participant socket at `socket` and closes the connection without
/// reading the reply, as a coordinator killed right after sending.
pub fn send_and_vanish(socket: &Path, request: &Request) {
    use std::io::Write as _;
    let mut stream = UnixStream::connect(socket).expect("connect");
    let body = cuinterpose_protocol::encode(request).expect("encode");
    let mut frame = (body.len() as u32).to_le_bytes().to_vec();
    frame.extend_from_slice(&body);
    stream.write_all(&frame).expect("send");
}
