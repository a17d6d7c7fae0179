//! Test peer for the transport tests: a separate process that serves, calls, or misbehaves on
//! purpose (raw frames with bad lengths, versions or descriptors). It reports what happened as
//! one line per event on stdout. Not part of the product; it uses nix directly for the raw
//! frames so that the library is tested against an independent sender.

use std::io::{self, IoSlice, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::thread;
use std::time::{Duration, Instant};

use cuinterpose_protocol as p;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
use p::transport::{self, Endpoint, Listener};

/// How long the peer waits for the other side to close before giving up.
const HOLD_LIMIT: Duration = Duration::from_secs(20);
/// How long the peer waits for the descriptors it sent to be closed by the receiver.
const FD_CLOSE_LIMIT: Duration = Duration::from_secs(10);

fn say(line: &str) {
    let mut out = io::stdout().lock();
    // The test reads these lines; a broken pipe means it is gone and nothing matters.
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

fn usage() -> ExitCode {
    eprintln!(
        "usage: cuinterpose-transport-peer \
         send PATH SCENARIO | reply DIR PID SCENARIO KIND | \
         serve DIR PID CONNECTIONS threaded|sequential TIMEOUT_MS | \
         call PATH inspect|export TIMEOUT_MS | stuck PATH | timeouts"
    );
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let result = match args.as_slice() {
        ["send", path, scenario] => send(Path::new(path), scenario),
        ["reply", dir, pid, scenario, kind] => reply(Path::new(dir), pid, scenario, kind),
        ["serve", dir, pid, count, mode, timeout] => {
            serve(Path::new(dir), pid, count, mode, timeout)
        }
        ["call", path, request, timeout] => call(Path::new(path), request, timeout),
        ["stuck", path] => stuck(Path::new(path)),
        ["timeouts"] => {
            match transport::Timeouts::from_env() {
                Ok(timeouts) => say(&format!(
                    "ok control={} copy={}",
                    timeouts.control().as_secs(),
                    timeouts.copy().as_secs()
                )),
                Err(error) => say(&format!("error {} {error}", error.variant())),
            }
            Ok(())
        }
        _ => return usage(),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            say(&format!("failed {error}"));
            ExitCode::FAILURE
        }
    }
}

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn namespace_pid(text: &str) -> Result<p::NamespacePid> {
    p::NamespacePid::new(text.parse()?).ok_or_else(|| "zero pid".into())
}

fn millis(text: &str) -> Result<Duration> {
    Ok(Duration::from_millis(text.parse()?))
}

/// One raw write: bytes and how many descriptors ride on it.
struct Chunk {
    bytes: Vec<u8>,
    fds: usize,
    pause: Duration,
}

/// What the misbehaving side does after its chunks.
enum After {
    /// Keep the connection open until the other side closes it.
    Hold,
    /// Close at once.
    Close,
}

fn frame(body: &[u8]) -> Vec<u8> {
    let mut bytes = (body.len() as u32).to_le_bytes().to_vec();
    bytes.extend_from_slice(body);
    bytes
}

fn chunk(bytes: Vec<u8>, fds: usize) -> Chunk {
    Chunk {
        bytes,
        fds,
        pause: Duration::ZERO,
    }
}

/// The chunks of a scenario around a valid encoded message.
fn plan(scenario: &str, valid: &[u8]) -> Result<(Vec<Chunk>, After)> {
    let limit = p::MAX_MESSAGE_BYTES as u32;
    Ok(match scenario {
        "valid" => (vec![chunk(frame(valid), 0)], After::Hold),
        "fd" => (vec![chunk(frame(valid), 1)], After::Hold),
        "no-fd" => (vec![chunk(frame(valid), 0)], After::Hold),
        "two-fds" => (vec![chunk(frame(valid), 2)], After::Hold),
        "many-fds" => (vec![chunk(frame(valid), 16)], After::Hold),
        // The descriptor rides on the body, not on the frame's first bytes.
        "late-fd" => (
            vec![
                chunk(frame(valid)[..4].to_vec(), 0),
                chunk(valid.to_vec(), 1),
            ],
            After::Hold,
        ),
        "oversized" => (
            vec![chunk((limit + 1).to_le_bytes().to_vec(), 0)],
            After::Hold,
        ),
        "huge" => (vec![chunk(u32::MAX.to_le_bytes().to_vec(), 0)], After::Hold),
        "zero" => (vec![chunk(0u32.to_le_bytes().to_vec(), 0)], After::Hold),
        "garbage" => (
            vec![chunk(
                frame(&[0xde, 0xad, 0xbe, 0xef, 0xc1, 0xc1, 0xc1, 0xc1]),
                0,
            )],
            After::Hold,
        ),
        "bad-body" => {
            let mut body = valid[..p::envelope::PREFIX_LEN].to_vec();
            body.push(0xc1); // never valid MessagePack
            (vec![chunk(frame(&body), 0)], After::Hold)
        }
        "version" => {
            let mut body = valid.to_vec();
            body[9] = p::VERSION + 1;
            (vec![chunk(frame(&body), 0)], After::Hold)
        }
        "trailing" => {
            let mut body = valid.to_vec();
            body.push(0);
            (vec![chunk(frame(&body), 0)], After::Hold)
        }
        "half" => {
            let whole = frame(valid);
            (
                vec![chunk(whole[..4 + valid.len() / 2].to_vec(), 0)],
                After::Hold,
            )
        }
        "cut" => {
            let whole = frame(valid);
            (
                vec![chunk(whole[..4 + valid.len() / 2].to_vec(), 0)],
                After::Close,
            )
        }
        "fragmented" => (
            frame(valid)
                .into_iter()
                .map(|byte| Chunk {
                    bytes: vec![byte],
                    fds: 0,
                    pause: Duration::from_millis(2),
                })
                .collect(),
            After::Hold,
        ),
        "silent" => (Vec::new(), After::Hold),
        "close" => (Vec::new(), After::Close),
        other => return Err(format!("unknown scenario {other}").into()),
    })
}

/// Sends the chunks; descriptors are copies of one pipe's write end, so that the pipe's read
/// end sees EOF exactly when the receiver has closed every copy it got.
fn perform(socket: BorrowedFd<'_>, chunks: &[Chunk]) -> Result<Option<OwnedFd>> {
    let mut probe = None;
    for chunk in chunks {
        thread::sleep(chunk.pause);
        let mut fds: Vec<RawFd> = Vec::new();
        let mut write_end = None;
        if chunk.fds > 0 {
            let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
            fds = vec![write.as_raw_fd(); chunk.fds];
            write_end = Some(write);
            probe = Some(read);
        }
        let control = [ControlMessage::ScmRights(&fds)];
        let control: &[ControlMessage<'_>] = if fds.is_empty() { &[] } else { &control };
        let sent = sendmsg::<()>(
            socket.as_raw_fd(),
            &[IoSlice::new(&chunk.bytes)],
            control,
            MsgFlags::MSG_NOSIGNAL,
            None,
        )?;
        if sent < chunk.bytes.len() {
            nix::unistd::write(socket, &chunk.bytes[sent..])?;
        }
        drop(write_end);
    }
    Ok(probe)
}

/// Reports whether the receiver closed the descriptors it was sent.
fn report_fds(probe: Option<OwnedFd>) -> Result<()> {
    let Some(read_end) = probe else {
        return Ok(());
    };
    let mut fds = [PollFd::new(read_end.as_fd(), PollFlags::POLLIN)];
    let limit = PollTimeout::try_from(FD_CLOSE_LIMIT.as_millis() as i32)?;
    let ready = poll(&mut fds, limit)?;
    let hung_up = fds[0]
        .revents()
        .is_some_and(|events| events.contains(PollFlags::POLLHUP));
    say(if ready > 0 && hung_up {
        "fds-closed"
    } else {
        "fds-open"
    });
    Ok(())
}

/// Waits for the other side to close, reading (and discarding) whatever it sends.
fn hold(stream: &mut UnixStream) -> Result<()> {
    stream.set_read_timeout(Some(HOLD_LIMIT))?;
    let start = Instant::now();
    let mut buffer = [0u8; 4096];
    let mut received = 0usize;
    loop {
        match stream.read(&mut buffer) {
            Ok(0) => break,
            Ok(count) => received += count,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) if error.kind() == io::ErrorKind::ConnectionReset => break,
            Err(error) => {
                say(&format!("peer-still-open {error}"));
                return Ok(());
            }
        }
        if start.elapsed() > HOLD_LIMIT {
            say("peer-still-open");
            return Ok(());
        }
    }
    say(&format!("peer-closed received={received}"));
    Ok(())
}

fn misbehave(mut stream: UnixStream, scenario: &str, valid: &[u8]) -> Result<()> {
    let (chunks, after) = plan(scenario, valid)?;
    let probe = perform(stream.as_fd(), &chunks)?;
    say("sent");
    report_fds(probe)?;
    match after {
        After::Hold => hold(&mut stream),
        After::Close => Ok(()),
    }
}

/// Client side misbehaving: connects and sends a scenario's request bytes.
fn send(path: &Path, scenario: &str) -> Result<()> {
    let stream = UnixStream::connect(path)?;
    let valid = p::encode(&p::Request::Inspect)?;
    misbehave(stream, scenario, &valid)
}

fn memfd_with(bytes: &[u8]) -> Result<OwnedFd> {
    let fd = nix::sys::memfd::memfd_create(
        "cuinterpose-test-export",
        nix::sys::memfd::MFdFlags::MFD_CLOEXEC,
    )?;
    nix::sys::uio::pwrite(&fd, bytes, 0)?;
    Ok(fd)
}

fn export_bytes() -> Vec<u8> {
    format!("bytes from peer {}", std::process::id()).into_bytes()
}

fn inspection(pid: p::NamespacePid) -> p::Reply {
    p::Reply::Inspection(p::InspectionReply {
        namespace_pid: pid,
        phase: p::Phase::Active,
        raw_imports: 0,
        records: Vec::new().try_into().unwrap_or_default(),
        devices: p::BoundedVec::default(),
    })
}

fn refused(message: &str) -> p::Reply {
    p::Reply::Refused(p::RefusedReply {
        code: p::RefusalCode::OutOfOrder,
        message: p::BoundedString::truncating(message),
    })
}

/// Server side misbehaving: reads one request properly, then answers with a scenario's bytes.
fn reply(dir: &Path, pid: &str, scenario: &str, kind: &str) -> Result<()> {
    let pid = namespace_pid(pid)?;
    let listener = Listener::bind(dir, pid)?;
    say("ready");
    let mut connection = listener.accept()?;
    match connection.read_request() {
        Ok((request, _)) => say(&format!("request {}", request.kind())),
        Err(error) => say(&format!("error {}", error.variant())),
    }
    let valid = match kind {
        "inspection" => inspection(pid),
        "export" => p::Reply::UnicastExport(p::UnicastExportReply { size: 4096 }),
        "refused" => refused("not now"),
        other => return Err(format!("unknown reply kind {other}").into()),
    };
    let valid = p::encode(&valid)?;
    // A duplicate of the connection's socket, so raw frames can go on it.
    let stream = UnixStream::from(connection.as_fd().try_clone_to_owned()?);
    misbehave(stream, scenario, &valid)
}

fn answer(pid: p::NamespacePid, request: &p::Request) -> Result<(p::Reply, Option<OwnedFd>)> {
    Ok(match request {
        p::Request::Inspect => (inspection(pid), None),
        p::Request::Progress => (
            p::Reply::Progress(p::ProgressReply {
                namespace_pid: pid,
                operation: None,
                running: false,
                done: 0,
                total: 0,
                phase: p::Phase::Active,
                held: false,
            }),
            None,
        ),
        p::Request::Hold => (p::Reply::Held(p::HeldReply { namespace_pid: pid }), None),
        p::Request::FailStop(_) => (
            p::Reply::Stopped(p::StoppedReply { namespace_pid: pid }),
            None,
        ),
        p::Request::RollBack => (
            p::Reply::RolledBack(p::RolledBackReply {
                namespace_pid: pid,
                from: p::Phase::Active,
            }),
            None,
        ),
        p::Request::Export(export) => match export.resource {
            p::ResourceKind::Unicast => {
                let bytes = export_bytes();
                (
                    p::Reply::UnicastExport(p::UnicastExportReply {
                        size: bytes.len() as u64,
                    }),
                    Some(memfd_with(&bytes)?),
                )
            }
            // A ticket naming what was asked for, so the test checks a ticket that crossed
            // processes.
            p::ResourceKind::Multicast => {
                let ticket = p::Ticket {
                    handle: p::VirtualShareableHandle {
                        creator_pid: export.allocation.creator_pid,
                        allocation: export.allocation.id,
                    },
                    resource: export.resource,
                    capability: export.capability,
                };
                (
                    p::Reply::MulticastExport(p::MulticastExportReply {
                        properties: p::MulticastProperties {
                            device_count: 2,
                            size: 8192,
                            handle_types: p::HandleTypes::POSIX_FILE_DESCRIPTOR,
                            flags: 0,
                        },
                    }),
                    Some(p::ticket::create_ticket(&ticket)?),
                )
            }
            // Pools are never exported over the socket (their allocations are, as Unicast).
            p::ResourceKind::Pool => (refused("pools are not exported"), None),
        },
        p::Request::Execute(execute) => (
            p::Reply::Completed(p::CompletedReply {
                operation: execute.operation,
                bytes: 0,
                copy_ns: 0,
                peak_carrier_bytes: 0,
                checksums: Default::default(),
            }),
            None,
        ),
        p::Request::BeginCheckpoint => (
            refused("begin_checkpoint is refused by the test peer"),
            None,
        ),
    })
}

fn handle(pid: p::NamespacePid, mut connection: transport::Connection) {
    let request = match connection.read_request() {
        Ok((request, _)) => request,
        Err(error) => {
            say(&format!("error {}", error.variant()));
            return;
        }
    };
    let outcome = answer(pid, &request)
        .map_err(|error| error.to_string())
        .and_then(|(reply, fd)| {
            connection
                .send_reply(&reply, fd.as_ref().map(AsFd::as_fd))
                .map_err(|error| error.variant().to_string())
        });
    match outcome {
        Ok(()) => say(&format!("served {}", request.kind())),
        Err(error) => say(&format!("error {error}")),
    }
}

/// A well-behaved server: `threaded` hands each connection to its own thread, `sequential`
/// serves them one after another on the accepting thread.
fn serve(dir: &Path, pid: &str, count: &str, mode: &str, timeout: &str) -> Result<()> {
    let pid = namespace_pid(pid)?;
    let count: usize = count.parse()?;
    let listener = Listener::bind(dir, pid)?.with_request_timeout(millis(timeout)?)?;
    say("ready");
    let mut workers = Vec::new();
    for _ in 0..count {
        match listener.accept() {
            Ok(connection) if mode == "threaded" => {
                workers.push(thread::spawn(move || handle(pid, connection)));
            }
            Ok(connection) => handle(pid, connection),
            Err(error) => say(&format!("accept-error {} {error}", error.variant())),
        }
    }
    for worker in workers {
        worker.join().map_err(|_| "worker panicked")?;
    }
    say("done");
    Ok(())
}

fn call(path: &Path, request: &str, timeout: &str) -> Result<()> {
    let endpoint = Endpoint::new(PathBuf::from(path))?;
    let request = match request {
        "inspect" => p::Request::Inspect,
        other => return Err(format!("unknown request {other}").into()),
    };
    match transport::call(&endpoint, &request, None, millis(timeout)?) {
        Ok((reply, _)) => say(&format!("reply {}", reply.kind())),
        Err(error) => say(&format!("error {} {error}", error.variant())),
    }
    Ok(())
}

/// A listener with a queue of one that never accepts, until stdin closes.
fn stuck(path: &Path) -> Result<()> {
    use nix::sys::socket::{
        AddressFamily, Backlog, SockFlag, SockType, UnixAddr, bind, listen, socket,
    };
    let socket = socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    bind(socket.as_raw_fd(), &UnixAddr::new(path)?)?;
    listen(&socket, Backlog::new(0)?)?;
    say("ready");
    let mut sink = Vec::new();
    io::stdin().read_to_end(&mut sink)?;
    Ok(())
}
