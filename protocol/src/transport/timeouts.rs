//! How long one exchange may take, per kind of request.

use std::ffi::OsString;
use std::time::Duration;

use super::error::TransportError;
use crate::generated::{Operation, Request};

/// Overrides the control timeout, in whole seconds.
pub const CONTROL_TIMEOUT_VARIABLE: &str = "CUINTERPOSE_CONTROL_TIMEOUT_SECONDS";
/// Overrides the copy timeout (`save_allocations`, `load_allocations`), in whole seconds.
pub const COPY_TIMEOUT_VARIABLE: &str = "CUINTERPOSE_COPY_TIMEOUT_SECONDS";
/// Largest timeout accepted (7 days): anything longer is a typo, and it keeps deadlines far
/// from `Instant` overflow.
pub const MAX_TIMEOUT_SECONDS: u64 = 7 * 24 * 3600;

/// Timeouts for one exchange (connect, send, receive), chosen by what the request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    control: Duration,
    copy: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            control: Self::DEFAULT_CONTROL,
            copy: Self::DEFAULT_COPY,
        }
    }
}

impl Timeouts {
    /// Inspect, begin_checkpoint, export and every operation that copies no bytes.
    pub const DEFAULT_CONTROL: Duration = Duration::from_secs(10);
    /// `save_allocations` and `load_allocations`, which copy every shared allocation.
    pub const DEFAULT_COPY: Duration = Duration::from_secs(3600);

    /// Both must be at least one microsecond and at most [`MAX_TIMEOUT_SECONDS`].
    pub fn new(control: Duration, copy: Duration) -> Result<Self, TransportError> {
        check_duration("control timeout", control)?;
        check_duration("copy timeout", copy)?;
        Ok(Self { control, copy })
    }

    /// The defaults, overridden by [`CONTROL_TIMEOUT_VARIABLE`] and [`COPY_TIMEOUT_VARIABLE`].
    /// A set but invalid value is an error naming the variable, never a silent default.
    pub fn from_env() -> Result<Self, TransportError> {
        Self::from_lookup(|name| std::env::var_os(name))
    }

    /// [`Timeouts::from_env`] over any source of variables (tests, configuration files).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<OsString>) -> Result<Self, TransportError> {
        let control = parse_seconds(CONTROL_TIMEOUT_VARIABLE, lookup(CONTROL_TIMEOUT_VARIABLE))?
            .unwrap_or(Self::DEFAULT_CONTROL);
        let copy = parse_seconds(COPY_TIMEOUT_VARIABLE, lookup(COPY_TIMEOUT_VARIABLE))?
            .unwrap_or(Self::DEFAULT_COPY);
        Ok(Self { control, copy })
    }

    pub fn control(&self) -> Duration {
        self.control
    }

    pub fn copy(&self) -> Duration {
        self.copy
    }

    /// The copy timeout for the two operations that move allocation bytes, else the control one.
    pub fn for_operation(&self, operation: Operation) -> Duration {
        match operation {
            Operation::SaveAllocations | Operation::LoadAllocations => self.copy,
            _ => self.control,
        }
    }

    pub fn for_request(&self, request: &Request) -> Duration {
        match request {
            Request::Execute(execute) => self.for_operation(execute.operation),
            Request::BeginCheckpoint => self.begin_checkpoint(),
            Request::RollBack => self.roll_back(),
            Request::Inspect
            | Request::Progress
            | Request::Export(_)
            | Request::FailStop(_)
            | Request::Hold => self.control,
        }
    }

    /// `roll_back`: it may wait for an operation still running in the participant (up to the
    /// control timeout), then for its creators to rebuild their multicast objects (the shim
    /// asks for up to three control timeouts): six control timeouts.
    pub fn roll_back(&self) -> Duration {
        self.control.saturating_mul(6)
    }

    /// How long a shim waits in `begin_checkpoint` for application threads to leave their
    /// driver calls before it refuses: the control timeout.
    pub fn drain(&self) -> Duration {
        self.control
    }

    /// The reply timeout of `begin_checkpoint`: the drain, then as long again for the
    /// synchronization and the inspection, so a drain that gives up is still answered.
    pub fn begin_checkpoint(&self) -> Duration {
        self.control.saturating_mul(2)
    }

    /// How long a shim's coordinator may be silent mid-capture before the shim rolls back on
    /// its own: longer than anything a live coordinator waits for without sending
    /// (`begin_checkpoint`'s reply takes up to twice the control timeout, every other step's
    /// up to once; copies are polled every 250 ms).
    pub fn quiet_window(&self) -> Duration {
        self.begin_checkpoint().saturating_add(self.control)
    }
}

fn parse_seconds(
    variable: &'static str,
    value: Option<OsString>,
) -> Result<Option<Duration>, TransportError> {
    let Some(value) = value else {
        return Ok(None);
    };
    let invalid = |reason| TransportError::InvalidTimeout {
        setting: variable.to_string(),
        value: value.to_string_lossy().into_owned(),
        reason,
    };
    let text = value.to_str().ok_or_else(|| invalid("not valid UTF-8"))?;
    // Strict: no sign, no spaces, no unit; `u64::from_str` would accept a leading `+`.
    if text.is_empty() || !text.bytes().all(|byte| byte.is_ascii_digit()) {
        return Err(invalid("expected a whole number of seconds"));
    }
    let seconds: u64 = text
        .parse()
        .map_err(|_| invalid("exceeds the maximum of 604800 seconds (7 days)"))?;
    if seconds == 0 {
        return Err(invalid("must be at least 1 second"));
    }
    if seconds > MAX_TIMEOUT_SECONDS {
        return Err(invalid("exceeds the maximum of 604800 seconds (7 days)"));
    }
    Ok(Some(Duration::from_secs(seconds)))
}

/// A timeout given in code: zero would mean "block forever" to `SO_RCVTIMEO`, so it is refused.
pub(crate) fn check_duration(setting: &str, timeout: Duration) -> Result<(), TransportError> {
    let reason = if timeout.is_zero() {
        "a zero timeout is not allowed"
    } else if timeout > Duration::from_secs(MAX_TIMEOUT_SECONDS) {
        "exceeds the maximum of 604800 seconds (7 days)"
    } else {
        return Ok(());
    };
    Err(TransportError::InvalidTimeout {
        setting: setting.to_string(),
        value: format!("{timeout:?}"),
        reason,
    })
}
