//! Fault injection during the lifecycle, over the real shim and fakecuda: three
//! `cuinterpose-worker` processes share one VMM allocation (A creates it, B and C import it),
//! and things go wrong at every phase: a participant killed, a participant that stops answering
//! (SIGSTOP), a reply lost after the work was done, the coordinator stopped or killed while it
//! publishes the state, a partial or corrupt state, a creator that dies under its importers.
//!
//! Expected every time: the coordinator fails within its timeout naming the participant and
//! the phase; a state file is complete or absent, never partial; `restore` refuses a partial or
//! corrupt state before touching anyone; a capture stopped before `prepare_unicast` is rolled
//! back; a second capture refuses clearly instead of repeating work, a second restore picks up
//! where each participant stands; a fail-stopped participant refuses further lifecycle
//! operations and says why.
//!
//! `harness = false`: the same executable is, with `CUI_FAULTS_ROLE=publish`, the child
//! process that publishes a state and is killed while doing so.

mod support;

// The scenarios and the workload they share, in tests/faults/ (an inline module, so that
// `support` above is still tests/support/).
mod faults {
    pub(crate) mod checksums;
    pub(crate) mod corrupt_state;
    pub(crate) mod fail_stop;
    pub(crate) mod participants;
    pub(crate) mod publication;
    pub(crate) mod settle;
    pub(crate) mod storage;
    pub(crate) mod workload;
}

use faults::checksums::checksums;
use faults::corrupt_state::corrupt_state;
use faults::fail_stop::{fail_stopped, survivors_are_told};
use faults::participants::{killed_in_each_phase, lost_reply, stops_answering};
use faults::publication::{ROLE, publication_interrupted, publisher, publisher_killed};
use faults::settle::{silent_in_a_restore_step, silent_in_prepare_unicast};
use faults::storage::storage_carrier;
use support::harness::Test;
use support::sandbox::Sandbox;

fn main() {
    if support::harness::as_child(ROLE, "publish", publisher) {
        return;
    }
    let tests: [Test<Sandbox>; 12] = [
        ("a_participant_killed_in_each_phase", killed_in_each_phase),
        ("a_participant_that_stops_answering", stops_answering),
        ("a_lost_reply_is_not_repeated", lost_reply),
        (
            "a_participant_silent_in_prepare_unicast_is_waited_for",
            silent_in_prepare_unicast,
        ),
        (
            "a_participant_silent_in_a_restore_step_is_waited_for",
            silent_in_a_restore_step,
        ),
        (
            "publication_interrupted_at_each_step",
            publication_interrupted,
        ),
        ("the_publisher_killed_at_each_step", publisher_killed),
        ("restore_refuses_partial_or_corrupt_state", corrupt_state),
        (
            "restore_refuses_bytes_that_do_not_match_their_checksums",
            checksums,
        ),
        (
            "the_storage_carrier_refuses_damaged_files_and_full_disks",
            storage_carrier,
        ),
        (
            "a_fail_stopped_participant_refuses_further_operations",
            fail_stopped,
        ),
        (
            "survivors_are_told_to_fail_stop_and_their_calls_fail",
            survivors_are_told,
        ),
    ];
    support::harness::run(&tests, || Sandbox::new("faults"));
}
