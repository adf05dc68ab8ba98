//! What a workload is made of: its operations, the counters a run reports and the failure it
//! returns, and the crash a workload asks for. Shared by the runners ([`super::runner`],
//! [`super::durable`]) and the public entry points in [`super`].

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
            "seed {} failed at step {}: {}\nreplay: WALSINK_SIM_SEED={} cargo test --features simulation --test it crash_consistency::replay_one_seed -- --nocapture",
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

/// The crash a workload asked for: a process kill (the machine stays up), unless a sync
/// failed, after which nothing since the last good sync is known durable and the machine
/// loses power; or a power loss with seeded choices of what survives.
pub(super) fn crash_options(
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
