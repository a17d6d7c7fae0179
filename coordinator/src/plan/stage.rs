//! What a run is and where it stands: capture or restore ([`RunKind`]), and the phase it is
//! in ([`Stage`]) as reports and errors name it, with the request each phase broadcasts.

use std::fmt;

use cuinterpose_protocol::{Carrier, ExecuteRequest, Operation, Request};

/// The staging window of the storage carrier unless set: four 64 MiB chunks, so the device
/// copy and three writers (or readers) are busy at once.
pub const DEFAULT_STAGING_BYTES: u64 = 256 << 20;

/// How a run's copies move the shared bytes: the host carrier, or the storage carrier (files
/// in the checkpoint directory) through a staging window of `staging_bytes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Carriage {
    #[default]
    Host,
    Storage {
        staging_bytes: u64,
    },
}

impl Carriage {
    pub fn carrier(self) -> Carrier {
        match self {
            Self::Host => Carrier::Host,
            Self::Storage { .. } => Carrier::Storage,
        }
    }

    /// A restore's carriage: the carrier its state was saved with, and (storage) the staging
    /// window this restore uses, `staging_bytes` when set.
    pub fn of_state(carrier: Carrier, staging_bytes: Option<u64>) -> Self {
        match carrier {
            Carrier::Host => Self::Host,
            Carrier::Storage => Self::Storage {
                staging_bytes: staging_bytes.unwrap_or(DEFAULT_STAGING_BYTES),
            },
        }
    }

    /// The staging window, when there is one.
    pub fn staging_bytes(self) -> Option<u64> {
        match self {
            Self::Host => None,
            Self::Storage { staging_bytes } => Some(staging_bytes),
        }
    }

    /// The request of `operation` with this carriage (the carrier only matters to the copies).
    pub fn execute(self, operation: Operation) -> ExecuteRequest {
        match self {
            Self::Storage { staging_bytes }
                if matches!(
                    operation,
                    Operation::SaveAllocations | Operation::LoadAllocations
                ) =>
            {
                ExecuteRequest::storage(operation, staging_bytes)
            }
            _ => ExecuteRequest::host(operation),
        }
    }
}

/// Capture, restore, or restore's read-only checks alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunKind {
    Capture,
    Restore,
    /// The state checked against the live, still checkpointed participants (before a native
    /// restore): never mutates.
    Check,
}

impl RunKind {
    /// The CLI command that runs it.
    pub fn command(self) -> &'static str {
        match self {
            Self::Capture => "prepare",
            Self::Restore => "restore",
            Self::Check => "restore",
        }
    }
}

/// A phase of a run, as reports and errors name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Restore's checks of the state file and the participant set, before any request.
    CheckState,
    Inspect,
    BeginCheckpoint,
    Execute(Operation),
    PublishState,
    /// The state is published: every participant is told to stay released for a restore
    /// from it, instead of rolling back on its own when its coordinator goes quiet.
    Hold,
    /// A capture stopped before `prepare_unicast`: every participant puts itself back.
    RollBack,
    /// A participant did not answer a step in time (a capture's `prepare_unicast`, a
    /// restore's operation): everyone's phase is asked (`progress`, which also keeps them from
    /// rolling back on their own) until every participant is through the step. A capture is
    /// then put back from the state in memory; a restore goes on.
    Settle,
    /// While a restore settles: an inspection of those that did not answer its step, which
    /// their control worker runs only once the step is done there.
    Confirm,
    /// The final inspect, compared with the saved records (a restore's, or a rollback's).
    Verify,
}

impl Stage {
    pub fn name(self) -> &'static str {
        match self {
            Self::CheckState => "check_state",
            Self::Inspect => "inspect",
            Self::BeginCheckpoint => "begin_checkpoint",
            Self::Execute(operation) => operation.wire_name(),
            Self::PublishState => "publish_state",
            Self::Hold => "hold",
            Self::RollBack => "roll_back",
            Self::Settle => "settle",
            Self::Confirm => "confirm",
            Self::Verify => "verify",
        }
    }

    /// The name reports and errors give the stage in a run of `kind`: a check's inspect is
    /// part of `check_state` (before the native restore), not the restore's own inspect.
    pub fn name_in(self, kind: RunKind) -> &'static str {
        match (kind, self) {
            (RunKind::Check, Self::Inspect) => Self::CheckState.name(),
            _ => self.name(),
        }
    }

    /// The request this stage broadcasts with the host carrier (see [`Stage::request_with`]);
    /// `None` for stages that send nothing.
    pub fn request(self) -> Option<Request> {
        self.request_with(Carriage::Host)
    }

    /// The request this stage broadcasts when the copies use `carriage`.
    pub fn request_with(self, carriage: Carriage) -> Option<Request> {
        match self {
            Self::Inspect | Self::Verify | Self::Confirm => Some(Request::Inspect),
            Self::BeginCheckpoint => Some(Request::BeginCheckpoint),
            Self::RollBack => Some(Request::RollBack),
            Self::Hold => Some(Request::Hold),
            Self::Settle => Some(Request::Progress),
            Self::Execute(operation) => Some(Request::Execute(carriage.execute(operation))),
            Self::CheckState | Self::PublishState => None,
        }
    }

    /// Whether the request changes the participant (a failure after it is fail-stop).
    pub fn mutates(self) -> bool {
        matches!(
            self,
            Self::BeginCheckpoint | Self::Execute(_) | Self::RollBack
        )
    }

    /// Whether a capture that fails here is put back from the state in memory by the restore's
    /// phases (every participant is released and holds its carrier), not told to fail-stop.
    pub fn resumes_from_state(self) -> bool {
        matches!(self, Self::PublishState | Self::Hold)
    }

    /// Whether a capture that fails here is rolled back (`roll_back`): nothing of the unicast
    /// sharing has been given up before `prepare_unicast`.
    pub fn rolls_back(self) -> bool {
        matches!(
            self,
            Self::BeginCheckpoint
                | Self::Execute(Operation::PrepareMulticast | Operation::SaveAllocations)
        )
    }
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
