//! Small logs on the real filesystem for the loss-reporting and delivery-bookkeeping tests:
//! options with 4 KiB segments, records that name their checkpoint, and the segment files.

#![allow(dead_code)]

use std::path::Path;
use std::time::Duration;
use walsink::storage::FsStorage;
use walsink::{Options, RecoveryReport, RetryPolicy};

pub fn opts() -> Options {
    Options::new("probe")
        .segment_size(4096)
        .max_record_size(512)
        .max_metadata_size(256)
        .retry(RetryPolicy::new(
            Duration::from_millis(1),
            Duration::from_millis(10),
        ))
}

pub fn rec(ck: u64, i: u64) -> Vec<u8> {
    format!("ck{ck:04}-rec{i:04}-{}", "x".repeat(60)).into_bytes()
}

pub fn verify_ok(dir: &Path) -> bool {
    walsink::verify(&FsStorage::new(dir).unwrap()).unwrap().ok
}

pub fn loss_reported(r: &RecoveryReport) -> bool {
    r.torn_tail.is_some() || r.corruption.is_some() || !r.checkpoints_dropped.is_empty()
}
