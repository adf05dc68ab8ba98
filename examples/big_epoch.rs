//! One checkpoint far larger than memory should allow, delivered in bounded memory: builds a
//! log holding a single epoch of `GIB` GiB of 4 KiB records, then delivers it to a sink that
//! touches every byte and keeps nothing (`null`) or to a directory (`dir`), and prints the
//! process's peak resident memory. Run it under `/usr/bin/time -v` for an outside measurement.
//!
//! `cargo run --release --example big_epoch -- [GIB] [null|dir] [work dir]`

use std::time::Instant;
use walsink::{DirSink, Epoch, Options, Sink, SinkError, WalSink};

/// Peak resident set size of this process so far, in MiB (Linux `VmHWM`).
fn peak_rss_mib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<u64>().ok())
        .map_or(0, |kb| kb / 1024)
}

/// Reads every byte of every record and keeps nothing.
struct Null(u64);

impl Sink for Null {
    fn deliver(&mut self, epoch: &Epoch) -> Result<(), SinkError> {
        for chunk in epoch.chunks() {
            for r in chunk?.records() {
                self.0 = self
                    .0
                    .wrapping_add(r.data.iter().map(|&b| b as u64).sum::<u64>());
            }
        }
        Ok(())
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let gib: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(1);
    let sink = args.next().unwrap_or_else(|| "null".into());
    let tmp = tempfile::tempdir()?;
    let dir = args
        .next()
        .map(Into::into)
        .unwrap_or_else(|| tmp.path().to_path_buf());
    let opts = Options::new("big");
    let records = gib * (1 << 30) / 4096;

    let start = Instant::now();
    {
        let (wal, _) = WalSink::open(dir.join("wal"), opts.clone())?;
        let mut r = vec![0u8; 4096];
        for i in 0..records {
            r[..8].copy_from_slice(&i.to_le_bytes());
            wal.append(&r)?;
        }
        wal.checkpoint(1, b"one big checkpoint")?;
    }
    println!(
        "built one checkpoint of {records} records ({gib} GiB) in {:.1} s, peak RSS {} MiB",
        start.elapsed().as_secs_f64(),
        peak_rss_mib()
    );

    let (wal, report) = WalSink::open(dir.join("wal"), opts)?;
    assert_eq!(report.pending_records, records);
    wal.checkpoint_complete(1)?;
    let start = Instant::now();
    let delivered = match sink.as_str() {
        "dir" => wal.deliver_ready(&mut DirSink::new(dir.join("out"))?)?,
        _ => wal.deliver_ready(&mut Null(0))?,
    };
    let secs = start.elapsed().as_secs_f64();
    assert_eq!(delivered, 1);
    assert_eq!(wal.health().committed, Some(1));
    println!(
        "delivered {gib} GiB to the {sink} sink in {secs:.1} s ({:.2} GB/s), peak RSS {} MiB",
        (gib << 30) as f64 / secs / 1e9,
        peak_rss_mib()
    );
    Ok(())
}
