//! Appends N records of SIZE bytes and one checkpoint, for counting instructions per append
//! (`valgrind --tool=callgrind target/release/examples/append_profile 64 200000`).
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let size: usize = args.next().map_or(Ok(64), |a| a.parse())?;
    let n: usize = args.next().map_or(Ok(200_000), |a| a.parse())?;
    let dir = tempfile::tempdir()?;
    let (wal, _) = walsink::WalSink::open(dir.path(), walsink::Options::new("profile"))?;
    let rec = vec![0x5au8; size];
    for _ in 0..n {
        wal.append(&rec)?;
    }
    wal.checkpoint(1, b"")?;
    Ok(())
}
