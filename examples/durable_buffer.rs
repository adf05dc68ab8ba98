//! walsink as a durable buffer: several producer threads append records that are acknowledged
//! only once on disk (group commit), and a committer thread delivers them to a directory.
//!
//! `cargo run --release --example durable_buffer -- [threads] [records per thread] [dir]`

use std::sync::Arc;
use std::time::{Duration, Instant};
use walsink::{DirSink, Mode, Options, WalSink};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let threads: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(4);
    let per_thread: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(2000);
    let tmp = tempfile::tempdir()?;
    let dir = args
        .next()
        .map(Into::into)
        .unwrap_or_else(|| tmp.path().to_path_buf());
    let (wal, report) = WalSink::open(dir.join("wal"), Options::new("buffer").mode(Mode::Durable))?;
    println!("recovered {} pending records", report.pending_records);
    let wal = Arc::new(wal);
    let committer = wal.spawn_committer(DirSink::new(dir.join("out"))?)?;
    let start = Instant::now();
    let producers: Vec<_> = (0..threads)
        .map(|t| {
            let wal = wal.clone();
            std::thread::spawn(move || -> walsink::Result<()> {
                for i in 0..per_thread {
                    // Returns once the record is durable.
                    wal.append(
                        format!("producer {t} event {i:08} {}", "x".repeat(220)).as_bytes(),
                    )?;
                }
                Ok(())
            })
        })
        .collect();
    for p in producers {
        p.join().expect("producer thread")?;
    }
    let secs = start.elapsed().as_secs_f64();
    let total = threads * per_thread;
    println!(
        "{total} durable appends from {threads} threads in {secs:.2} s: {:.0} appends/s, {:.1} µs each on average",
        total as f64 / secs,
        secs * 1e6 / per_thread as f64
    );
    let h = wal.health();
    let last = h.completed.unwrap_or(0);
    wal.wait_committed(last, Duration::from_secs(60));
    committer.shutdown();
    let h = wal.health();
    println!(
        "delivered {} records in {} epochs (one epoch per group-commit sync); backlog {} epochs",
        h.delivered_records, h.delivered_epochs, h.backlog_epochs
    );
    Ok(())
}
