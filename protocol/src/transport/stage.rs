//! What the transport was doing when an I/O call failed or timed out: one value per stage, so
//! callers (fail-stop above all) decide by matching, never by comparing message text.

use std::fmt;

/// A stage of setting up, connecting, sending or receiving.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IoStage {
    // A client, before any byte of its request is sent.
    CreatingSocket,
    SettingConnectTimeout,
    Connecting,
    /// A blocking `connect` waiting for room in the listener's full queue.
    ConnectQueueFull,
    // Any side, once connected.
    SettingSocketTimeout,
    SendingRequest,
    ReceivingReply,
    SendingSeriesExport,
    ReceivingSeriesReply,
    // A listener.
    AcceptingConnection,
    ReadingCredentials,
    ReceivingRequest,
    SendingReply,
    // Binding a listener: its control directory and socket file.
    CreatingControlDirectory,
    InspectingControlDirectory,
    InspectingExistingSocket,
    ProbingExistingSocket,
    RemovingStaleSocket,
    CreatingListenSocket,
    BuildingSocketAddress,
    Binding,
    SettingSocketMode,
    InspectingSocket,
    ChoosingBacklog,
    Listening,
}

impl IoStage {
    /// Whether a client's request cannot have left this process at this stage: the socket was
    /// not yet connected, so the peer never saw a byte of it.
    pub fn before_sending(self) -> bool {
        matches!(
            self,
            Self::CreatingSocket
                | Self::SettingConnectTimeout
                | Self::Connecting
                | Self::ConnectQueueFull
        )
    }

    pub fn describe(self) -> &'static str {
        match self {
            Self::CreatingSocket => "creating a socket",
            Self::SettingConnectTimeout => "setting the connect timeout",
            Self::Connecting => "connecting",
            Self::ConnectQueueFull => "connecting (the listen queue is full)",
            Self::SettingSocketTimeout => "setting the socket timeout",
            Self::SendingRequest => "sending the request",
            Self::ReceivingReply => "receiving the reply",
            Self::SendingSeriesExport => "sending an export request of a series",
            Self::ReceivingSeriesReply => "receiving a reply of a series of exports",
            Self::AcceptingConnection => "accepting a connection",
            Self::ReadingCredentials => "reading the peer's credentials",
            Self::ReceivingRequest => "receiving a request",
            Self::SendingReply => "sending the reply",
            Self::CreatingControlDirectory => "creating the control directory",
            Self::InspectingControlDirectory => "inspecting the control directory",
            Self::InspectingExistingSocket => "inspecting the existing socket path",
            Self::ProbingExistingSocket => "probing the existing socket",
            Self::RemovingStaleSocket => "removing the stale socket",
            Self::CreatingListenSocket => "creating the socket",
            Self::BuildingSocketAddress => "building the socket address",
            Self::Binding => "binding",
            Self::SettingSocketMode => "setting the socket's mode to 0600",
            Self::InspectingSocket => "inspecting the socket",
            Self::ChoosingBacklog => "choosing the backlog",
            Self::Listening => "listening",
        }
    }
}

impl fmt::Display for IoStage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.describe())
    }
}

#[cfg(test)]
mod tests {
    use super::IoStage;

    #[test]
    fn only_the_stages_before_connecting_are_before_sending() {
        let before = [
            IoStage::CreatingSocket,
            IoStage::SettingConnectTimeout,
            IoStage::Connecting,
            IoStage::ConnectQueueFull,
        ];
        for stage in before {
            assert!(stage.before_sending(), "{stage}");
        }
        for stage in [
            IoStage::SettingSocketTimeout,
            IoStage::SendingRequest,
            IoStage::ReceivingReply,
            IoStage::SendingSeriesExport,
            IoStage::ReceivingSeriesReply,
        ] {
            assert!(!stage.before_sending(), "{stage}");
        }
    }
}
