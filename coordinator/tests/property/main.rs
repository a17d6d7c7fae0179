//! Property-based end to end: random sharing topologies, built for real by worker processes
//! (`cuinterpose-worker` under the shim, over fakecuda), toggled in place by the `cuinterpose`
//! binary, then verified byte for byte at the same addresses, record by record against the
//! state captured at `begin_checkpoint`, for live sharing and for leaked descriptors.
//!
//! A topology: 1–6 processes; 1–20 VMM allocations (1–4 granules, random creator and device),
//! private ones (never exported, with or without a POSIX handle type), exported ones nobody
//! imports, and shared ones imported by random other processes (the same process possibly
//! several times, some tickets relayed through an importer's re-export), each import mapping
//! the whole allocation or a granule-aligned sub-range with random per-device access
//! (read-write or read-only), some importers releasing their handle right after mapping, some
//! creators releasing theirs once the imports are done, some creators mapping a second range;
//! legacy IPC (`cuMemAlloc` + `cuIpcGetMemHandle`, opened by others, possibly twice); and
//! multicast teams of 2–4 processes on distinct devices (four fakecuda devices when the case
//! asks for them), every member adding its device first, then binding each granule with
//! `cuMulticastBindMem`/`BindAddr`, v1 or v2, or leaving it unbound, some members mapping the
//! multicast object.
//!
//! Each case is toggled in place (`cuinterpose toggle --pid <this process> --dir ...`) twice by
//! default. After each toggle: the state captured at `begin_checkpoint` equals the inspection
//! taken before the first toggle and the inspection after restore equals the state, record by
//! record (multicast records included); the records match what the case built (each mapping at
//! its address with its range and access, one allocation id per allocation, host carriers on
//! the creators of shared allocations only, handle counts, each team's object, devices,
//! bindings and mappings); the host-carrier bytes are saved once and loaded once, between the
//! bytes of the allocations that must be carried and those that may be; every byte is where it
//! was (every mapping of every allocation, granule by granule, the IPC pointers and their
//! `cuMemGetAddressRange`, member memory and multicast views); the driver's access per device
//! is what was granted; a write through one process is seen by every other; and nothing
//! leaked: each worker keeps as many fakecuda memfds alive as before, its open descriptors
//! (by target) are those it had before the first toggle, except one more per multicast member
//! allocation after the first (a duplicate of the recreated backing, not the old one), and
//! exactly those of the previous toggle after later ones.
//!
//! Environment: `CUINTERPOSE_SOAK_CASES` (cases, default 12), `CUINTERPOSE_PROPTEST_SEED` (a
//! u64, decimal or 0x-hex; default fixed, so CI is reproducible), `CUINTERPOSE_PROPTEST_CASE=N`
//! (run case N of that seed only), `CUINTERPOSE_PROPTEST_SHRINK` (shrinking runs after a
//! failure, default 8, 0 turns shrinking off), `CUINTERPOSE_PROPTEST_TOGGLES` (toggles per
//! case, default 2), `CUINTERPOSE_PROPTEST_VERBOSE` (a line per case). Every case runs even
//! after a failure; the test then fails, printing each failing case (seed, index, topology,
//! error, the workers' stderr) and the smallest failing topology shrinking found. The last
//! line of output sums up: cases, failures, bytes verified, processes, allocations, IPC
//! allocations, multicast groups.
//!
//! One `#[test]` only: `toggle --pid <this process>` takes the whole process tree rooted here,
//! so two cases must never run at once.

use std::io::Write as _;
use std::time::Instant;

use cuinterpose_testkit::{build_shim, build_worker, fakecuda_lib_dir};
use cuinterpose_workload::pattern::splitmix64;
use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::{Config, RngSeed, TestRunner};

mod build;
mod case;
mod model;
mod observe;
mod run;
mod spec;
mod topology;

use case::{Env, Stats};
use run::attempt;
use spec::spec;
use topology::{Plan, describe};

const DEFAULT_CASES: u32 = 12;
const DEFAULT_SEED: u64 = 0x00c0_ffee_2024_0001;
const DEFAULT_SHRINK: u32 = 8;
const DEFAULT_TOGGLES: u32 = 2;

fn env_u64(name: &str) -> Option<u64> {
    let value = std::env::var(name).ok()?;
    let value = value.trim();
    let parsed = match value.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => value.parse(),
    };
    Some(parsed.unwrap_or_else(|_| panic!("{name}={value:?} is not a number")))
}

#[test]
fn random_topologies_toggled_and_verified() {
    let cases = env_u64("CUINTERPOSE_SOAK_CASES").map_or(DEFAULT_CASES, |n| n as u32);
    let seed = env_u64("CUINTERPOSE_PROPTEST_SEED").unwrap_or(DEFAULT_SEED);
    let only = env_u64("CUINTERPOSE_PROPTEST_CASE");
    let shrink = env_u64("CUINTERPOSE_PROPTEST_SHRINK").map_or(DEFAULT_SHRINK, |n| n as u32);
    let toggles = env_u64("CUINTERPOSE_PROPTEST_TOGGLES").map_or(DEFAULT_TOGGLES, |n| n as u32);
    let env = Env {
        shim: build_shim().to_path_buf(),
        worker: build_worker().to_path_buf(),
        fakecuda: fakecuda_lib_dir().to_path_buf(),
    };
    let config = Config {
        cases,
        rng_seed: RngSeed::Fixed(seed),
        failure_persistence: None,
        max_shrink_iters: shrink,
        ..Config::default()
    };
    let mut runner = TestRunner::new(config);
    let strategy = spec();
    let started = Instant::now();
    let mut total = Stats::default();
    let (mut ran, mut failures) = (0u64, Vec::new());
    let mut groups_built = 0usize;
    for index in 0..u64::from(cases) {
        let mut tree = strategy.new_tree(&mut runner).expect("generate a topology");
        if only.is_some_and(|only| only != index) {
            continue;
        }
        let tag = splitmix64(seed ^ index);
        let plan = Plan::new(&tree.current());
        let case_started = Instant::now();
        ran += 1;
        match attempt(&env, &plan, tag, toggles) {
            Ok(stats) => {
                total.bytes_verified += stats.bytes_verified;
                total.processes += stats.processes;
                total.allocations += stats.allocations;
                total.shared_allocations += stats.shared_allocations;
                total.ipc += stats.ipc;
                groups_built += stats.groups;
                total.carried += stats.carried;
                if std::env::var_os("CUINTERPOSE_PROPTEST_VERBOSE").is_some() {
                    println!(
                        "case {index}: ok in {:?}: {} processes, {} allocations ({} shared), \
                         {} IPC, {} groups, {} bytes verified",
                        case_started.elapsed(),
                        stats.processes,
                        stats.allocations,
                        stats.shared_allocations,
                        stats.ipc,
                        stats.groups,
                        stats.bytes_verified
                    );
                }
            }
            Err(error) => {
                eprintln!(
                    "case {index} FAILED (CUINTERPOSE_PROPTEST_SEED={seed} \
                     CUINTERPOSE_PROPTEST_CASE={index}) after {:?}:\n{error}\ntopology: {}",
                    case_started.elapsed(),
                    describe(&plan)
                );
                // Shrink within the budget: simplify while it fails, complicate when it passes.
                let mut smallest = (plan, error);
                let mut runs = 0;
                if tree.simplify() {
                    while runs < shrink {
                        runs += 1;
                        let candidate = Plan::new(&tree.current());
                        let outcome = attempt(&env, &candidate, tag, toggles);
                        let more = match outcome {
                            Err(error) => {
                                smallest = (candidate, error);
                                tree.simplify()
                            }
                            Ok(_) => tree.complicate(),
                        };
                        if !more {
                            break;
                        }
                    }
                }
                failures.push((index, smallest));
            }
        }
    }
    // Straight to stderr, past the harness's capture: CI logs always show the summary.
    let _ = writeln!(
        std::io::stderr(),
        "property: {ran} cases, {} failures, {} bytes verified, {} processes, {} VMM \
         allocations ({} shared), {} IPC allocations, {groups_built} multicast groups, {} \
         host-carrier bytes saved, seed {seed}, {:.1} s",
        failures.len(),
        total.bytes_verified,
        total.processes,
        total.allocations,
        total.shared_allocations,
        total.ipc,
        total.carried,
        started.elapsed().as_secs_f64()
    );
    if let Some((index, (plan, error))) = failures.first() {
        panic!(
            "{} of {ran} cases failed (first: case {index}, CUINTERPOSE_PROPTEST_SEED={seed} \
             CUINTERPOSE_PROPTEST_CASE={index}); smallest failing topology found:\n{}\n{error}",
            failures.len(),
            describe(plan)
        );
    }
}
