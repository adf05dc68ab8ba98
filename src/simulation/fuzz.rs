//! The fuzz targets' logic, callable from cargo-fuzz (`fuzz/`) and from ordinary tests
//! (`tests/it/fuzz_targets.rs`): decoding hostile bytes, recovering damaged directories, and
//! operation sequences checked against the model.

use super::{run_ops, Op, SimFailure};
use crate::storage::{CrashOptions, SimStorage};
use crate::{MemorySink, Options, RecoveryMode, WalSink};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Fuzz target logic: decodes arbitrary bytes as segment headers, frames at every offset,
/// control payloads and small files. Must never panic or allocate from a length field.
pub fn check_decode(data: &[u8]) {
    use crate::log::format;
    let seq = data.first().copied().unwrap_or(0) as u64;
    let seed = format::Seed { seq, salt: 7 };
    let _ = format::decode_segment_header(data, seq);
    let mut at = 0;
    while at < data.len() {
        if let Ok(f) = format::decode_frame(data, seed, at) {
            let _ = format::Barrier::decode(f.payload);
            let _ = format::Restore::decode(f.payload);
        }
        let _ = format::peek_frame(data, at);
        at += 1;
    }
    let _ = format::Barrier::decode(data);
    let _ = format::Restore::decode(data);
    let _ = format::decode_identity(data);
    let _ = format::decode_commit(data);
}

/// A small valid log: four checkpoints over several 4 KiB segments, the first committed, an
/// unsealed tail. Returns its files (built once per process).
fn base_log() -> BTreeMap<String, Vec<u8>> {
    static BASE: std::sync::OnceLock<BTreeMap<String, Vec<u8>>> = std::sync::OnceLock::new();
    BASE.get_or_init(build_base_log).clone()
}

fn build_base_log() -> BTreeMap<String, Vec<u8>> {
    let sim = SimStorage::new();
    let opts = Options::new("fuzz")
        .segment_size(4096)
        .max_record_size(512)
        .max_metadata_size(32)
        .salt_seed(3);
    let (wal, _) = WalSink::open_with_storage(Arc::new(sim.clone()), opts).expect("open base log");
    for cp in 1..=4u64 {
        for i in 0..12 {
            let r = format!("record {cp}-{i} {}", "q".repeat((i * 17) % 90));
            wal.append(r.as_bytes()).expect("append");
        }
        wal.checkpoint(cp, format!("m{cp}").as_bytes())
            .expect("checkpoint");
    }
    wal.checkpoint_complete(1).expect("complete");
    wal.deliver_ready(&mut MemorySink::new()).expect("deliver");
    wal.append(b"tail").expect("append");
    drop(wal);
    sim.crash(CrashOptions::process_kill());
    sim.snapshot()
}

fn fuzz_options() -> Options {
    Options::new("fuzz")
        .segment_size(4096)
        .max_record_size(512)
        .max_metadata_size(32)
}

/// Fuzz target logic: damages a valid log directory as the bytes say (flip, set, truncate,
/// extend, delete, add files), then verifies and opens it in every recovery mode and delivers
/// what it can. Any outcome but a panic is acceptable; errors must be typed.
pub fn check_recovery(data: &[u8]) {
    let mut files = base_log();
    let names: Vec<String> = files.keys().cloned().collect();
    for edit in data.chunks(4) {
        let [op, file, a, b] = [
            edit[0],
            *edit.get(1).unwrap_or(&0),
            *edit.get(2).unwrap_or(&0),
            *edit.get(3).unwrap_or(&0),
        ];
        let name = names[file as usize % names.len()].clone();
        let Some(bytes) = files.get_mut(&name) else {
            continue;
        };
        let pos = ((a as usize) << 5 | (b as usize & 31)) % (bytes.len().max(1));
        match op % 8 {
            0 | 1 => {
                if let Some(x) = bytes.get_mut(pos) {
                    *x ^= 1 << (b % 8);
                }
            }
            2 => {
                if let Some(x) = bytes.get_mut(pos) {
                    *x = b;
                }
            }
            3 => bytes.truncate(pos),
            4 => bytes.extend(std::iter::repeat_n(b, a as usize)),
            5 => {
                files.remove(&name);
            }
            6 => {
                files.insert(format!("{:020}.wseg", a % 8), vec![b; (a as usize) * 16]);
            }
            _ => {
                let at = pos.min(bytes.len());
                bytes.splice(at..at, std::iter::repeat_n(b, 8));
            }
        }
    }
    let sim = SimStorage::new();
    for (name, bytes) in &files {
        sim.put_file(name, bytes);
    }
    let _ = crate::verify(&sim);
    let _ = crate::dump(Arc::new(sim.clone()), |_, _, e| {
        for r in e.records() {
            std::hint::black_box(r.map_err(std::io::Error::other)?.data);
        }
        Ok(())
    });
    for mode in [
        RecoveryMode::Strict,
        RecoveryMode::TolerateTornTail,
        RecoveryMode::TruncateAtCorruption,
    ] {
        let storage = sim.clone();
        match WalSink::open_with_storage(Arc::new(storage), fuzz_options().recovery_mode(mode)) {
            Ok((wal, report)) => {
                let _ = wal.restore(report.pending.last().copied());
                let _ = wal.deliver_ready(&mut MemorySink::new());
                let _ = wal.append(b"after");
                let _ = wal.checkpoint(report.next_checkpoint_id, b"");
            }
            Err(e) => {
                let _ = e.to_string();
            }
        }
    }
}

/// Fuzz target logic: the first 8 bytes are a seed, every further 3 bytes an [`Op`]; runs them
/// against the model. Returns the failure, if the log broke its contract.
pub fn check_ops(data: &[u8]) -> Result<(), SimFailure> {
    let mut seed = [0u8; 8];
    let n = data.len().min(8);
    seed[..n].copy_from_slice(&data[..n]);
    let ops: Vec<Op> = data
        .get(8..)
        .unwrap_or(&[])
        .chunks_exact(3)
        .take(400)
        .map(|c| Op::from_bytes([c[0], c[1], c[2]]))
        .collect();
    run_ops(u64::from_le_bytes(seed), &ops).map(|_| ())
}
