//! Running one case: build it, inspect it, toggle it again and again, and check after each
//! toggle the bytes, the records, the host-carrier bytes and that nothing leaked.

use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Duration;

use cuinterpose_coordinator::state;
use cuinterpose_protocol::{NamespacePid, Record};
use cuinterpose_testkit::fixtures::TempDir;

use crate::case::{Case, CaseResult, Env, Stats, ensure};
use crate::model::{check_model, records_diff, render_records};
use crate::observe::Resources;
use crate::topology::{AllocPlan, GRAN, IpcPlan, Plan};

/// Builds the case's workload, toggles it and checks everything.
pub(crate) fn run_case(env: &Env, plan: &Plan, tag: u64, toggles: u32) -> CaseResult<Stats> {
    let dir = TempDir::new("property").map_err(|e| format!("sandbox: {e}"))?;
    let workers = Case::spawn(env, plan, dir.path())?;
    let mut case = Case {
        plan,
        tag,
        dir,
        workers,
        seeds: vec![Vec::new(); plan.allocations.len()],
        held: Vec::new(),
        creator_handles: vec![None; plan.allocations.len()],
        import_handles: vec![BTreeMap::new(); plan.allocations.len()],
        ipc: Vec::new(),
        groups: Vec::new(),
        group_seeds: Vec::new(),
        generation: 0,
        stats: Stats {
            processes: plan.processes,
            allocations: plan.allocations.len(),
            shared_allocations: plan.allocations.iter().filter(|a| a.shared()).count(),
            ipc: plan.ipc.len(),
            groups: plan.groups.len(),
            ..Stats::default()
        },
    };
    let result = check_case(env, &mut case, toggles);
    match result {
        Ok(()) => Ok(case.stats),
        Err(error) => Err(format!("{error}\n{}", case.logs())),
    }
}

pub(crate) fn check_case(env: &Env, case: &mut Case<'_>, toggles: u32) -> CaseResult<()> {
    case.build_vmm()?;
    case.build_ipc()?;
    case.build_groups()?;
    case.verify_all()?;
    let before = case.inspect()?;
    check_model(case, &before).map_err(|e| format!("{e}\n{}", render_records(&before)))?;
    let resources_before = case.settled_resources()?;
    let mut resources_previous = resources_before.clone();
    for round in 1..=toggles {
        toggle_and_check(env, case, round, &before).map_err(|e| format!("toggle {round}: {e}"))?;
        // A control connection the shim just served may still be closing: look again for a
        // while before calling a difference a leak.
        let mut attempts = 0;
        let resources = loop {
            let resources = case.resources()?;
            attempts += 1;
            match check_resources(
                case,
                round,
                &resources_before,
                &resources_previous,
                &resources,
            ) {
                Ok(()) => break resources,
                Err(e) if attempts >= 40 => return Err(format!("after toggle {round}: {e}")),
                Err(_) => std::thread::sleep(Duration::from_millis(25)),
            }
        };
        resources_previous = resources;
        case.check_live_sharing()
            .map_err(|e| format!("after toggle {round}: {e}"))?;
    }
    Ok(())
}

/// One toggle: host-carrier bytes within bounds, the captured state equal to the inspection
/// before, the inspection after equal to the captured state, every byte where it was.
pub(crate) fn toggle_and_check(
    env: &Env,
    case: &mut Case<'_>,
    round: u32,
    before: &BTreeMap<NamespacePid, Vec<Record>>,
) -> CaseResult<()> {
    let checkpoint = case.dir.path().join(format!("checkpoint-{round}"));
    let report = case.toggle(env, &checkpoint)?;
    let phase_bytes = |name: &str| {
        report["phases"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|phase| phase["phase"] == name)
            .filter_map(|phase| phase["bytes"].as_u64())
            .sum::<u64>()
    };
    let (saved, loaded) = (
        phase_bytes("save_allocations"),
        phase_bytes("load_allocations"),
    );
    ensure!(
        saved == loaded,
        "saved {saved} bytes, loaded {loaded}: {report}"
    );
    // One content copy: every shared allocation's bytes, once; what else goes through host
    // carriers (exported but never imported, multicast members) is the shim's choice.
    let plan = case.plan;
    let vmm = |filter: &dyn Fn(&AllocPlan) -> bool| -> u64 {
        plan.allocations
            .iter()
            .filter(|a| filter(a))
            .map(|a| a.granules * GRAN)
            .sum()
    };
    let ipc = |filter: &dyn Fn(&IpcPlan) -> bool| -> u64 {
        plan.ipc
            .iter()
            .filter(|i| filter(i))
            .map(|i| i.size.div_ceil(GRAN) * GRAN)
            .sum()
    };
    let least = vmm(&|a| a.shared()) + ipc(&|i| !i.opens.is_empty());
    let most = vmm(&|a| a.export)
        + ipc(&|i| i.get)
        + plan
            .groups
            .iter()
            .map(|g| g.granules * GRAN * g.members.len() as u64)
            .sum::<u64>();
    ensure!(
        (least..=most).contains(&saved),
        "saved {saved} bytes, expected between {least} and {most}: {report}"
    );
    case.stats.carried += saved;

    let saved_state = state::load(&checkpoint).map_err(|e| format!("load the state: {e}"))?;
    let captured: BTreeMap<NamespacePid, Vec<Record>> = saved_state
        .participants
        .iter()
        .map(|(pid, records)| (*pid, records.to_vec()))
        .collect();
    records_diff(
        "the state captured at begin_checkpoint differs from the inspection before",
        before,
        &captured,
    )?;
    let after = case.inspect()?;
    records_diff(
        "the inspection after restore differs from the captured state",
        &captured,
        &after,
    )?;
    check_model(case, &after).map_err(|e| format!("{e}\n{}", render_records(&after)))?;
    case.verify_all()
}

/// Targets `more` holds more often than `fewer`, with the excess.
pub(crate) fn target_excess(
    more: &BTreeMap<String, usize>,
    fewer: &BTreeMap<String, usize>,
) -> BTreeMap<String, usize> {
    more.iter()
        .filter_map(|(target, &n)| {
            let m = fewer.get(target).copied().unwrap_or(0);
            (n > m).then(|| (target.clone(), n - m))
        })
        .collect()
}

/// Nothing leaks: every toggle leaves exactly the descriptors the process had before the
/// first one, and the device memory kept alive never changes.
pub(crate) fn check_resources(
    case: &Case<'_>,
    round: u32,
    before: &[Resources],
    previous: &[Resources],
    now: &[Resources],
) -> CaseResult<()> {
    let mut problems = Vec::new();
    for p in 0..now.len() {
        let name = case.name(p);
        if now[p].backing != before[p].backing {
            problems.push(format!(
                "{name}: keeps {} fakecuda memfds alive, {} before the first toggle",
                now[p].backing, before[p].backing
            ));
        }
        let fewer = target_excess(&before[p].descriptors, &now[p].descriptors);
        let more = target_excess(&now[p].descriptors, &before[p].descriptors);
        if !fewer.is_empty() || !more.is_empty() {
            problems.push(format!(
                "{name}: descriptors by target, more than before the first toggle: {more:?}, \
                 fewer: {fewer:?}"
            ));
        }
        if round > 1 && now[p].descriptors != previous[p].descriptors {
            problems.push(format!(
                "{name}: descriptors by target, more than after toggle {}: {:?}, fewer: {:?}",
                round - 1,
                target_excess(&now[p].descriptors, &previous[p].descriptors),
                target_excess(&previous[p].descriptors, &now[p].descriptors),
            ));
        }
    }
    ensure!(problems.is_empty(), "{}", problems.join("\n"));
    Ok(())
}

/// Runs `plan`, turning a panic into a failure.
pub(crate) fn attempt(env: &Env, plan: &Plan, tag: u64, toggles: u32) -> CaseResult<Stats> {
    catch_unwind(AssertUnwindSafe(|| run_case(env, plan, tag, toggles))).unwrap_or_else(|panic| {
        let message = panic
            .downcast_ref::<&str>()
            .map(ToString::to_string)
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        Err(format!("panicked: {message}"))
    })
}
