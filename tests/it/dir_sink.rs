//! A directory sink's epoch files are whole or absent: faults injected into its writes,
//! renames and syncs on the simulated disk, kills in the middle of a delivery and power losses
//! afterwards never leave a torn or partly renamed epoch file, and every epoch arrives once.

use crate::support::frames::*;
use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::sync::Arc;
use walsink::storage::{CrashOptions, FaultOp, SimStorage};
use walsink::{DirSink, WalSink};

fn epoch_of_name(name: &str) -> u64 {
    name[..20]
        .parse()
        .unwrap_or_else(|_| panic!("unexpected target file name {name}"))
}

/// For many seeds: a log (simulated disk) with 4 epochs of random sizes (some multi-chunk,
/// some empty); one fault (SyncDir, SyncData, Rename, Write or Create, at a random call) in
/// the target's simulated disk; a few deliver_ready calls; then a power loss of the target.
/// Every epoch file in the target holds the whole epoch exactly, and every epoch walsink
/// counts as committed is in the target. Then the log also loses power, is reopened with a
/// new DirSink over the crashed target, and everything is delivered: the target then holds
/// every non-empty epoch exactly, nothing else.
#[test]
fn dir_sink_epoch_files_are_whole_or_absent_through_faults_and_power_loss() {
    let ops = [
        FaultOp::SyncDir,
        FaultOp::SyncData,
        FaultOp::Rename,
        FaultOp::Write,
        FaultOp::Create,
    ];
    let seeds: u64 = std::env::var("PROBE_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(150);
    let mut failures: Vec<String> = vec![];
    let (mut faults_hit, mut seeds_with_errors) = (0u64, 0u64);
    for seed in 0..seeds {
        let mut rng = fastrand::Rng::with_seed(seed);
        let wsim = Arc::new(SimStorage::new());
        let tsim = Arc::new(SimStorage::new());
        let o = small_opts("p20", 4096, 1024, 2000).salt_seed(seed);
        let (wal, _) = WalSink::open_with_storage(wsim.clone(), o.clone()).unwrap();
        let mut expected: BTreeMap<u64, Vec<Vec<u8>>> = BTreeMap::new();
        for ck in 1..=4u64 {
            let n = if rng.u8(0..5) == 0 {
                0
            } else {
                rng.usize(1..40)
            };
            let sizes: Vec<usize> = (0..n).map(|_| rng.usize(0..1800)).collect();
            expected.insert(ck, fill(&wal, ck, &sizes));
        }
        wal.checkpoint_complete(4).unwrap();
        let op = ops[rng.usize(0..ops.len())];
        let nth = rng.u64(0..10);
        let mut sink = DirSink::with_storage(tsim.clone())
            .unwrap()
            .keep_metadata(rng.bool());
        tsim.inject_fault(op, nth, io::ErrorKind::Other);
        let mut errs = vec![];
        for _ in 0..3 {
            if let Err(e) = wal.deliver_ready(&mut sink) {
                errs.push(
                    format!("{:?}", e.kind())
                        .chars()
                        .take(80)
                        .collect::<String>(),
                );
            }
        }
        let committed = wal.health().committed.unwrap_or(0);
        if tsim.pending_faults() == 0 {
            faults_hit += 1;
        }
        if !errs.is_empty() {
            seeds_with_errors += 1;
        }
        drop(sink);
        tsim.crash(CrashOptions::power_loss(seed));
        let ctx = format!("seed {seed} fault {op:?}#{nth} committed {committed} errs {errs:?}");
        let check = |phase: &str, tsim: &SimStorage, must_hold: u64, exact: bool| -> Vec<String> {
            let mut f = vec![];
            let epochs = match DirSink::read_epochs_in(tsim) {
                Ok(e) => e,
                Err(e) => return vec![format!("{phase}: read_epochs_in failed: {e}")],
            };
            let mut present = BTreeSet::new();
            for (name, recs) in &epochs {
                let ck = epoch_of_name(name);
                present.insert(ck);
                match expected.get(&ck) {
                    Some(exp) if exp == recs => {}
                    Some(exp) => f.push(format!(
                        "{phase}: {name} holds {} records, epoch has {}",
                        recs.len(),
                        exp.len()
                    )),
                    None => f.push(format!("{phase}: unknown file {name}")),
                }
            }
            for (ck, exp) in &expected {
                if !exp.is_empty() && *ck <= must_hold && !present.contains(ck) {
                    f.push(format!(
                        "{phase}: epoch {ck} counted committed but missing from the target"
                    ));
                }
                if exact && exp.is_empty() && present.contains(ck) {
                    f.push(format!("{phase}: empty epoch {ck} has a file"));
                }
            }
            f
        };
        for m in check("after target power loss", &tsim, committed, false) {
            failures.push(format!("{ctx}: {m}"));
        }
        // phase 2: the log loses power too; reopen and finish
        drop(wal);
        wsim.crash(CrashOptions::power_loss(seed ^ 0xabc));
        let (wal, rep) = match WalSink::open_with_storage(wsim.clone(), o) {
            Ok(x) => x,
            Err(e) => {
                failures.push(format!("{ctx}: reopen failed: {e}"));
                continue;
            }
        };
        if rep.last_checkpoint != Some(4) {
            failures.push(format!(
                "{ctx}: after log power loss last_checkpoint {:?}",
                rep.last_checkpoint
            ));
        }
        wal.checkpoint_complete(4).unwrap();
        let mut sink = DirSink::with_storage(tsim.clone()).unwrap();
        if let Err(e) = wal.deliver_ready(&mut sink) {
            failures.push(format!("{ctx}: final deliver_ready failed: {e}"));
            continue;
        }
        drop(sink);
        tsim.crash(CrashOptions::power_loss(seed + 1));
        for m in check("after final delivery and power loss", &tsim, 4, true) {
            failures.push(format!("{ctx}: {m}"));
        }
    }
    eprintln!("p20: {seeds} seeds, faults hit {faults_hit}, seeds with delivery errors {seeds_with_errors}");
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures[..failures.len().min(15)].join("\n")
    );
    assert!(
        faults_hit > seeds / 3,
        "test validity: only {faults_hit} of {seeds} injected faults were hit"
    );
}

/// For many seeds: the process dies (SimStorage::kill_after on the target's disk) at a random
/// operation during delivery into a DirSink; both disks then lose power. Epochs walsink
/// counted committed are in the target; after reopen and delivery every non-empty epoch is in
/// the target exactly (whole), and no epoch file is torn.
#[test]
fn a_dir_sink_killed_mid_delivery_then_a_power_loss_keeps_epoch_files_whole() {
    let seeds: u64 = std::env::var("PROBE_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(150);
    let mut failures: Vec<String> = vec![];
    let mut killed = 0;
    for seed in 0..seeds {
        let mut rng = fastrand::Rng::with_seed(seed ^ 0x5555);
        let wsim = Arc::new(SimStorage::new());
        let tsim = Arc::new(SimStorage::new());
        let o = small_opts("p21", 4096, 1024, 2000).salt_seed(seed);
        let (wal, _) = WalSink::open_with_storage(wsim.clone(), o.clone()).unwrap();
        let mut expected: BTreeMap<u64, Vec<Vec<u8>>> = BTreeMap::new();
        for ck in 1..=4u64 {
            let n = if rng.u8(0..6) == 0 {
                0
            } else {
                rng.usize(1..30)
            };
            let sizes: Vec<usize> = (0..n).map(|_| rng.usize(0..1800)).collect();
            expected.insert(ck, fill(&wal, ck, &sizes));
        }
        wal.checkpoint_complete(4).unwrap();
        let mut sink = DirSink::with_storage(tsim.clone())
            .unwrap()
            .keep_metadata(rng.bool());
        tsim.kill_after(rng.u64(0..30));
        for _ in 0..2 {
            let _ = wal.deliver_ready(&mut sink);
        }
        if tsim.is_dead() {
            killed += 1;
        }
        let committed = wal.health().committed.unwrap_or(0);
        drop(sink);
        drop(wal);
        tsim.crash(CrashOptions::power_loss(seed));
        wsim.crash(CrashOptions::power_loss(seed + 99));
        let ctx = format!("seed {seed} committed {committed}");
        let epochs = DirSink::read_epochs_in(&*tsim).unwrap();
        for (name, recs) in &epochs {
            let ck = epoch_of_name(name);
            if expected.get(&ck) != Some(recs) {
                failures.push(format!(
                    "{ctx}: after kill+power loss {name} is not the whole epoch ({} records)",
                    recs.len()
                ));
            }
        }
        for (ck, exp) in &expected {
            if *ck <= committed
                && !exp.is_empty()
                && !epochs.iter().any(|(n, _)| epoch_of_name(n) == *ck)
            {
                failures.push(format!(
                    "{ctx}: epoch {ck} counted committed, missing after power loss"
                ));
            }
        }
        let (wal, rep) = match WalSink::open_with_storage(wsim.clone(), o) {
            Ok(x) => x,
            Err(e) => {
                failures.push(format!("{ctx}: reopen: {e}"));
                continue;
            }
        };
        if rep.last_checkpoint != Some(4) {
            failures.push(format!("{ctx}: last_checkpoint {:?}", rep.last_checkpoint));
        }
        wal.checkpoint_complete(4).unwrap();
        let mut sink = DirSink::with_storage(tsim.clone()).unwrap();
        if let Err(e) = wal.deliver_ready(&mut sink) {
            failures.push(format!("{ctx}: final delivery: {e}"));
            continue;
        }
        let epochs = DirSink::read_epochs_in(&*tsim).unwrap();
        let got: BTreeMap<u64, Vec<Vec<u8>>> = epochs
            .into_iter()
            .map(|(n, r)| (epoch_of_name(&n), r))
            .collect();
        let want: BTreeMap<u64, Vec<Vec<u8>>> = expected
            .iter()
            .filter(|(_, r)| !r.is_empty())
            .map(|(k, v)| (*k, v.clone()))
            .collect();
        if got != want {
            failures.push(format!(
                "{ctx}: final target epochs {:?} != {:?}",
                got.keys().collect::<Vec<_>>(),
                want.keys().collect::<Vec<_>>()
            ));
        }
    }
    eprintln!("p21: {seeds} seeds, killed {killed}");
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures[..failures.len().min(15)].join("\n")
    );
    assert!(killed > seeds / 3, "test validity: only {killed} kills");
}
