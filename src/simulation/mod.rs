//! Seeded crash simulation against a reference model, used by `tests/crash_consistency.rs`,
//! `tests/model.rs` and the fuzz targets. Public so that any harness can replay a seed.
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

pub use durable::run_durable;

/// The crash a workload asked for: a process kill (the machine stays up), unless a sync
/// failed, after which nothing since the last good sync is known durable and the machine
/// loses power; or a power loss with seeded choices of what survives.
fn crash_options(
    process_only: bool,
    poisoned: bool,
    rng: &mut fastrand::Rng,
) -> crate::storage::CrashOptions {
    if process_only && !poisoned {
        crate::storage::CrashOptions::process_kill()
    } else {
        crate::storage::CrashOptions::power_loss(rng.u64(..))
    }
}
pub use fuzz::{check_decode, check_ops, check_recovery};

use runner::Halt;
use std::sync::Arc;

/// One step of a workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Append a batch of `count` (1..=4) records, each padded by `pad` bytes (mod 400).
    Append {
        /// Records in the batch.
        count: u8,
        /// Padding of each record.
        pad: u16,
    },
    /// Checkpoint with the next id plus `skip` (mod 3) and `meta` (mod 20) metadata bytes.
    Checkpoint {
        /// Ids skipped.
        skip: u8,
        /// Metadata length.
        meta: u8,
    },
    /// Complete the newest durable checkpoint (or the one before it, if `older`).
    Complete {
        /// Complete an older one.
        older: bool,
    },
    /// Deliver what is ready; with `fail_at: Some(k)` the sink fails its `k`-th (mod 4)
    /// delivery of this call once, after the ones before it succeeded.
    Deliver {
        /// Which delivery of the call fails.
        fail_at: Option<u8>,
    },
    /// Restore from the oldest checkpoint the engine may restore from.
    Restore,
    /// Close and reopen the log cleanly.
    Reopen,
    /// Arm a kill at the `n`-th (mod 6) next sync.
    KillAtSync(u8),
    /// Arm a kill after `n` (mod 40) more mutating storage operations.
    KillAfter(u8),
    /// Arm a kill at the `n`-th next sync, unbounded (used to crash at every sync point).
    KillAtSyncAbsolute(u64),
    /// Make a sync fail: a data sync (`n` even) or a directory sync (`n` odd), the
    /// `(n / 2) % 3`-th next one. The process goes on with a poisoned log until it reopens
    /// after a power loss.
    FailSync(u8),
    /// Power loss, then damage to the disk (`kind` mod 6: the newest segment's header zeroed,
    /// the newest segment emptied, a bit flipped in a segment header, a bit flipped in synced
    /// data, the newest segment deleted, the newest segment cut short (at an 8-aligned offset or anywhere);
    /// `at` chooses where), then recovery.
    Damage {
        /// What is damaged.
        kind: u8,
        /// Where.
        at: u16,
    },
    /// The engine's checkpoint ids jump to the last `n` (mod 3) below `u64::MAX`.
    JumpIds(u8),
}

impl Op {
    /// Draws a random operation with the workload's weights.
    pub fn random(rng: &mut fastrand::Rng) -> Op {
        match rng.u16(0..1000) {
            0..=469 | 995.. => Op::Append {
                count: rng.u8(1..=4),
                pad: rng.u16(0..400),
            },
            470..=619 => Op::Checkpoint {
                skip: rng.u8(0..3),
                meta: rng.u8(0..20),
            },
            620..=739 => Op::Complete {
                older: rng.u8(0..4) == 0,
            },
            740..=879 => Op::Deliver {
                fail_at: (rng.u8(0..5) == 0).then(|| rng.u8(0..4)),
            },
            880..=919 => Op::Restore,
            920..=969 => Op::Reopen,
            970..=984 => Op::FailSync(rng.u8(..)),
            985..=992 => Op::Damage {
                kind: rng.u8(..),
                at: rng.u16(..),
            },
            // Rare: once the ids run out, the rest of the run seals nothing.
            _ => Op::JumpIds(rng.u8(..)),
        }
    }

    /// Decodes an operation from fuzzer bytes (three bytes an operation).
    pub fn from_bytes(b: [u8; 3]) -> Op {
        let arg = u16::from_le_bytes([b[1], b[2]]);
        match b[0] % 20 {
            0..=5 => Op::Append {
                count: 1 + b[1] % 4,
                pad: arg % 400,
            },
            6..=8 => Op::Checkpoint {
                skip: b[1] % 3,
                meta: b[2] % 20,
            },
            9 => Op::Complete {
                older: b[1] & 1 == 1,
            },
            10 | 11 => Op::Deliver {
                fail_at: (b[1] & 1 == 1).then_some(b[2] % 4),
            },
            12 => Op::Restore,
            13 => Op::Reopen,
            14 => Op::KillAtSync(b[1] % 6),
            15 => Op::KillAfter(b[1] % 40),
            16 => Op::FailSync(b[1]),
            17 => Op::Damage {
                kind: b[1],
                at: u16::from(b[2]) << 4 | u16::from(b[1] >> 4),
            },
            18 => Op::JumpIds(b[1]),
            _ => Op::Deliver { fail_at: None },
        }
    }
}

/// One simulation failure: the seed and what went wrong.
#[derive(Debug, Clone)]
pub struct SimFailure {
    /// The seed that reproduces it.
    pub seed: u64,
    /// The step at which the check failed.
    pub step: usize,
    /// What was expected and what was seen.
    pub message: String,
}

impl std::fmt::Display for SimFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "seed {} failed at step {}: {}\nreplay: WALSINK_SIM_SEED={} cargo test --test crash_consistency replay_one_seed -- --nocapture",
            self.seed, self.step, self.message, self.seed
        )
    }
}

/// Counters of one run, to show that the workload did what it claims.
#[derive(Debug, Clone, Copy, Default)]
pub struct RunStats {
    /// Operations executed.
    pub ops: usize,
    /// Simulated crashes, each followed by a reopen.
    pub crashes: usize,
    /// Checkpoints that returned `Ok`.
    pub checkpoints: usize,
    /// Epochs the sink received.
    pub delivered: usize,
    /// Most segment files seen after a recovery.
    pub max_segments: u64,
    /// Syncs that were made to fail.
    pub failed_syncs: usize,
    /// Damages applied to the disk.
    pub damages: usize,
    /// Recoveries that had to run in the lenient mode.
    pub lenient_recoveries: usize,
    /// Records whose append returned `Ok` (durable-mode runs).
    pub acknowledged: usize,
    /// Syncs done as one write durable on return (durable-mode runs; see
    /// [`crate::storage::StorageFile::write_durable`]).
    pub durable_writes: u64,
}

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

impl From<SimFailure> for Halt {
    fn from(f: SimFailure) -> Self {
        Halt::Violation(f)
    }
}
