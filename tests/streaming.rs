//! Streaming delivery: epochs larger than one read chunk (8 MiB) are read in bounded chunks,
//! every record arrives once with its position, the epoch can be read twice, a record larger
//! than a chunk comes through whole, and damage met half-way through an epoch is the log's
//! error (not the sink's), with nothing committed.

mod common;
use common::*;
use std::sync::Arc;
use walsink::storage::{CrashOptions, SimStorage};
use walsink::{DirSink, Epoch, ErrorKind, MemorySink, Sink, SinkError, WalSink};

fn big_opts(sink: &str) -> walsink::Options {
    opts(sink).segment_size(16 << 20).max_record_size(12 << 20)
}

fn record(i: u32, size: usize) -> Vec<u8> {
    let mut r = format!("{i:08}:").into_bytes();
    r.resize(size, b'a' + (i % 26) as u8);
    r
}

/// Checks every record's position and content, reading the epoch twice.
struct Checking {
    sizes: Vec<usize>,
    passes: u32,
    chunks: usize,
}

impl Sink for Checking {
    fn deliver(&mut self, epoch: &Epoch) -> Result<(), SinkError> {
        for _ in 0..2 {
            let mut n = 0u32;
            let mut chunks = 0;
            for chunk in epoch.chunks() {
                let chunk = chunk?;
                assert!(!chunk.is_empty());
                assert_eq!(chunk.first_index(), n as u64);
                chunks += 1;
                for r in chunk.records() {
                    assert_eq!(r.position.index, n as u64);
                    assert_eq!(r.position.checkpoint, epoch.checkpoint());
                    assert_eq!(r.data, record(n, self.sizes[n as usize]));
                    n += 1;
                }
            }
            assert_eq!(n as u64, epoch.len());
            // The record iterator sees the same.
            let mut m = 0u32;
            for r in epoch.records() {
                let r = r?;
                assert_eq!(r.position.index, m as u64);
                assert_eq!(r.data.len(), self.sizes[m as usize]);
                m += 1;
            }
            assert_eq!(m, n);
            self.chunks = chunks;
            self.passes += 1;
        }
        Ok(())
    }
}

#[test]
fn an_epoch_larger_than_a_chunk_is_read_in_chunks_twice() {
    let sim = SimStorage::new();
    let wal = open_sim(&sim, big_opts("big"));
    // 40 MiB over several segments, with a 10 MiB record in the middle (larger than a chunk).
    let mut sizes: Vec<usize> = (0..8000).map(|i| 1000 + (i * 37) % 7000).collect();
    sizes[4500] = 10 << 20;
    for (i, &size) in sizes.iter().enumerate() {
        wal.append(&record(i as u32, size)).unwrap();
    }
    wal.checkpoint(1, b"m").unwrap();
    wal.checkpoint_complete(1).unwrap();
    let mut sink = Checking {
        sizes,
        passes: 0,
        chunks: 0,
    };
    assert_eq!(wal.deliver_ready(&mut sink).unwrap(), 1);
    assert_eq!(sink.passes, 2);
    assert!(sink.chunks >= 4, "read in {} chunks", sink.chunks);
    assert_eq!(wal.health().committed, Some(1));
}

#[test]
fn small_epochs_are_one_verified_chunk() {
    let sim = SimStorage::new();
    let wal = open_sim(&sim, opts("small"));
    append_values(&wal, 1, 100);
    wal.checkpoint(1, b"").unwrap();
    wal.checkpoint_complete(1).unwrap();
    let sizes = vec![0; 100];
    struct One(Vec<usize>);
    impl Sink for One {
        fn deliver(&mut self, epoch: &Epoch) -> Result<(), SinkError> {
            let n: Vec<usize> = epoch
                .chunks()
                .map(|c| c.map(|c| c.len() as usize))
                .collect::<Result<_, _>>()?;
            self.0 = n;
            Ok(())
        }
    }
    let mut s = One(sizes);
    wal.deliver_ready(&mut s).unwrap();
    assert_eq!(s.0, vec![100]);
}

/// Builds a committed-to-be epoch of ~40 MiB over 16 MiB segments and damages its middle.
fn damaged_big_epoch(sim: &SimStorage) -> WalSink {
    let wal = open_sim(sim, big_opts("damaged"));
    for i in 0..10_000u32 {
        wal.append(&record(i, 4000)).unwrap();
    }
    wal.checkpoint(1, b"").unwrap();
    wal.checkpoint_complete(1).unwrap();
    // Flip a byte in the second segment, well inside the epoch.
    let files = sim.snapshot();
    let (name, mut bytes) = files
        .into_iter()
        .filter(|(n, _)| n.ends_with(".wseg"))
        .nth(1)
        .unwrap();
    bytes[1_000_000] ^= 0x20;
    sim.put_file(&name, &bytes);
    wal
}

#[test]
fn damage_met_half_way_is_the_logs_error_and_nothing_is_committed() {
    let sim = SimStorage::new();
    let wal = damaged_big_epoch(&sim);
    let mut sink = MemorySink::with_marker();
    let e = wal.deliver_ready(&mut sink).unwrap_err();
    assert!(
        matches!(e.kind(), ErrorKind::Corruption(_)),
        "expected the log's corruption, got {e}"
    );
    assert!(sink.checkpoints().is_empty());
    assert_eq!(wal.health().committed, None);
    assert!(wal.health().last_error.unwrap().contains("corruption"));
}

#[test]
fn damage_met_half_way_leaves_no_file_in_a_directory_target() {
    let sim = SimStorage::new();
    let wal = damaged_big_epoch(&sim);
    let target = SimStorage::new();
    let mut sink = DirSink::with_storage(Arc::new(target.clone())).unwrap();
    let e = wal.deliver_ready(&mut sink).unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::Corruption(_)), "{e}");
    assert!(DirSink::read_epochs_in(&target).unwrap().is_empty());
    target.crash(CrashOptions::process_kill());
    assert!(DirSink::read_epochs_in(&target).unwrap().is_empty());
}

/// Large chunks are read and verified in two halves on two threads. Damage anywhere in them
/// (before the middle, in the frame across it, in a length field that would send the walk to
/// the middle astray, after it, in a frame the chunk's end cuts) is reported at the frame it is
/// in, as a read on one thread reports it, and nothing is committed.
#[test]
fn damage_around_the_middle_of_a_large_chunk_is_found_at_its_frame() {
    const MIB: usize = 1 << 20;
    let frame = walsink::format::FRAME_HEADER_LEN + 4000;
    let first = walsink::format::SEGMENT_HEADER_LEN;
    // (byte to flip, bit) in the first segment; chunks are 8 MiB, so halves meet near 4 MiB.
    let straddling = first + (4 * MIB - first) / frame * frame;
    let cases = [
        (100_000, 0x01),
        (4 * MIB - 10, 0x08),
        (4 * MIB + 10, 0x08),
        (straddling + 4, 0x40),
        (straddling + 4 + frame, 0x40),
        (6 * MIB, 0x02),
        (8 * MIB - 5, 0x10),
        (11 * MIB + 77, 0x80),
    ];
    for (at, bit) in cases {
        let sim = SimStorage::new();
        let wal = open_sim(&sim, big_opts("halves"));
        for i in 0..5_000u32 {
            wal.append(&record(i, 4000)).unwrap();
        }
        wal.checkpoint(1, b"").unwrap();
        wal.checkpoint_complete(1).unwrap();
        let name = "00000000000000000001.wseg";
        let mut bytes = sim.snapshot()[name].clone();
        bytes[at] ^= bit;
        sim.put_file(name, &bytes);
        let mut sink = MemorySink::with_marker();
        let e = wal.deliver_ready(&mut sink).unwrap_err();
        let ErrorKind::Corruption(d) = e.kind() else {
            panic!("byte {at}: expected corruption, got {e}");
        };
        let expected = (first + (at - first) / frame * frame) as u64;
        assert_eq!(
            (d.segment.as_str(), d.offset),
            (name, expected),
            "byte {at}: {e}"
        );
        assert!(sink.checkpoints().is_empty(), "byte {at}");
        assert_eq!(wal.health().committed, None, "byte {at}");
    }
}
