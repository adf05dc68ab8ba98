//! Seeded crash simulation against a reference model, used by `tests/it/crash_consistency.rs`,
//! `tests/it/model.rs` and the fuzz targets. Public so that any harness can replay a seed.
//!
//! A run drives a log on a [`SimStorage`](crate::storage::SimStorage) with a random workload
//! and checks it against a model of what the contract promises. The workload has:
//!
//! - the embedder's calls: append, checkpoint with metadata (ids may jump, up to `u64::MAX`),
//!   complete, restore, delivery with a sink that fails at a chosen epoch, clean reopen, and
//!   after each reopen a restore from a checkpoint the engine may restore from (or none at all,
//!   as on a first start, so the first segment's header may stay unsynced);
//! - process kills at a sync point or after a number of storage operations, each followed by a
//!   power-loss (or process-kill) image and recovery, which may itself be killed;
//! - failed syncs (data or directory): the log is poisoned, delivery and clean-up go on while a
//!   restore or checkpoint is not durable, then the machine loses power;
//! - damage a crash cannot leave but a disk can: a newest segment deleted, emptied, cut short
//!   or without its header, a bit flipped in a segment header or in synced data; recovery then runs in the default
//!   mode and, if it refuses, in the lenient one, and the workload goes on after it;
//! - per seed: small segments with or without recycling; a sink with or without its own
//!   marker, or the real [`DirSink`](crate::DirSink) on a simulated disk of its own, whose
//!   syncs can fail too and which loses power with the machine; and a local commit store or
//!   one that forgets everything at each restart.
//!
//! The checks after every reopen and delivery:
//!
//! - every checkpoint whose `checkpoint` call returned `Ok`, and that no completed `restore`
//!   voided, is still there (pending or committed) with its records and metadata, unless
//!   recovery reported damage (a torn tail or corruption) that covers its loss;
//! - nothing else is: no unsealed record and no voided epoch comes back (except behind
//!   reported damage); the newest surviving checkpoint and its metadata are reported, and the
//!   stored commit mark is what `health` shows;
//! - ids are never reused: the next allowed id is above every id recovery saw or dropped;
//! - a sink that keeps its own marker receives every epoch exactly once, in checkpoint order;
//!   a sink without one at least once, and twice only across a crash or restart;
//! - `health` has no error left after a delivery that succeeded;
//! - files set aside by lenient recovery are never changed or removed;
//! - recovery never fails on an image a crash produced.
//!
//! Durable-buffer mode has a workload of its own ([`run_durable`]): the four ways to append
//! (one record, a batch, and the two-step `try_append_batch`/`append_batch_unsynced` with
//! `make_durable` later), deliveries that may fail, kills, failed syncs, process kills and
//! power losses, checked per record: what an append acknowledged arrives exactly once and in
//! order, and what was cut short arrives at most once, in order.

mod durable;
mod fuzz;
mod runner;
mod workload;

pub use durable::run_durable;
pub use workload::{Op, RunStats, SimFailure};

pub use fuzz::{check_decode, check_ops, check_recovery};

use std::sync::Arc;

/// Runs seed `seed`: `ops` random operations, with up to `crashes` kills armed at random.
pub fn run(seed: u64, ops: usize, crashes: usize) -> Result<RunStats, SimFailure> {
    let mut rng = fastrand::Rng::with_seed(seed ^ 0x9e37_79b9_7f4a_7c15);
    let mut list = Vec::with_capacity(ops + crashes);
    let mut left = crashes;
    for _ in 0..ops {
        if left > 0 && rng.u8(0..8) == 0 {
            left -= 1;
            list.push(if rng.bool() {
                Op::KillAtSync(rng.u8(0..6))
            } else {
                Op::KillAfter(rng.u8(0..40))
            });
        }
        list.push(Op::random(&mut rng));
    }
    run_ops(seed, &list)
}

/// Runs an explicit list of operations (from a property test or a fuzzer) on a log whose
/// options and sink kind are drawn from `seed`, then checks the final state.
pub fn run_ops(seed: u64, ops: &[Op]) -> Result<RunStats, SimFailure> {
    runner::Run::new(seed).execute(ops, |_| {})
}

/// Crashes one workload at every sync point in turn: a dry run counts the syncs the workload
/// issues, then for each `k` the workload runs again with the process killed at sync `k`
/// (that sync does not happen), followed by a power loss, recovery, the rest of the workload
/// and the final checks. Returns how many sync points were crashed at.
pub fn run_every_sync_point(seed: u64, ops: usize) -> Result<usize, SimFailure> {
    let mut rng = fastrand::Rng::with_seed(seed ^ 0x5151_5151);
    let list: Vec<Op> = (0..ops).map(|_| Op::random(&mut rng)).collect();
    let syncs = count_syncs(seed, &list)?;
    for k in 0..syncs {
        let mut with_kill = Vec::with_capacity(list.len() + 1);
        with_kill.push(Op::KillAtSyncAbsolute(k));
        with_kill.extend_from_slice(&list);
        run_ops(seed, &with_kill).map_err(|mut f| {
            f.message = format!("killed at sync point {k} of {syncs}: {}", f.message);
            f
        })?;
    }
    Ok(syncs as usize)
}

fn count_syncs(seed: u64, ops: &[Op]) -> Result<u64, SimFailure> {
    let counter = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let c = counter.clone();
    runner::Run::new(seed).execute(ops, move |sim| {
        let s = sim.stats();
        c.store(
            s.data_syncs + s.dir_syncs,
            std::sync::atomic::Ordering::Relaxed,
        );
    })?;
    Ok(counter.load(std::sync::atomic::Ordering::Relaxed))
}
