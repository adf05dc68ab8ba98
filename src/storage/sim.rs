//! A simulated disk that models power loss, for crash tests and fuzzing.
//!
//! Each file keeps its durable image apart from the writes made since its last sync. A
//! [`SimStorage::crash`] builds the image a power loss could leave: the durable image plus,
//! per 512-byte sector, any version the sector had since the last sync (so unsynced writes land
//! out of order), sometimes torn inside the sector; the file length of any point in its
//! unsynced history; and an arbitrary subset of the directory changes that no directory sync
//! followed. Handles from before the crash stop working, as the process that held them is gone.

use super::{Storage, StorageFile};
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::io;
use std::sync::Arc;

/// The size of the unit a simulated disk writes atomically (except when it tears one).
const SECTOR: u64 = 512;

/// An operation a fault can be injected into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FaultOp {
    /// [`StorageFile::write_at`] and [`StorageFile::set_len`].
    Write,
    /// [`StorageFile::sync_data`].
    SyncData,
    /// [`Storage::sync_dir`].
    SyncDir,
    /// [`Storage::create`].
    Create,
    /// [`Storage::rename`].
    Rename,
    /// [`Storage::remove`].
    Remove,
    /// [`StorageFile::read_at`].
    Read,
}

/// How a crash treats what was not synced.
#[derive(Debug, Clone, Copy)]
pub struct CrashOptions {
    /// Seed of the choices; the same seed over the same history gives the same image.
    pub seed: u64,
    /// Keep nothing that was not synced (the most pessimistic image).
    pub lose_all_unsynced: bool,
    /// Only the process dies, the machine stays up: everything written stays visible, but
    /// what was not synced is still not durable (a later power loss can drop it).
    pub process_only: bool,
}

impl CrashOptions {
    /// A power loss with seeded choices of what unsynced data survives.
    pub fn power_loss(seed: u64) -> Self {
        CrashOptions {
            seed,
            lose_all_unsynced: false,
            process_only: false,
        }
    }

    /// A process kill (`kill -9`): the page cache survives.
    pub fn process_kill() -> Self {
        CrashOptions {
            seed: 0,
            lose_all_unsynced: false,
            process_only: true,
        }
    }
}

/// Counters of operations, for asserting sync counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SimStats {
    /// Calls of `sync_data`, and of `write_durable` (a write and the sync of its range).
    pub data_syncs: u64,
    /// Calls of `write_durable` (each also counted in `writes` and `data_syncs`).
    pub durable_writes: u64,
    /// Calls of `sync_dir`.
    pub dir_syncs: u64,
    /// Calls of `write_at` and `set_len`.
    pub writes: u64,
    /// Bytes passed to `write_at`.
    pub bytes_written: u64,
    /// Calls of `create`.
    pub creates: u64,
    /// Calls of `rename` and `remove`.
    pub dir_changes: u64,
}

#[derive(Debug, Clone)]
enum Pending {
    Write { offset: u64, data: Vec<u8> },
    SetLen(u64),
}

#[derive(Debug, Default, Clone)]
struct Inode {
    data: Vec<u8>,
    durable: Vec<u8>,
    pending: Vec<Pending>,
}

#[derive(Debug, Clone)]
enum DirOp {
    Link(String, u64),
    Rename(String, String),
    Remove(String),
}

#[derive(Debug, Default)]
struct State {
    inodes: HashMap<u64, Inode>,
    next_ino: u64,
    dir: BTreeMap<String, u64>,
    durable_dir: BTreeMap<String, u64>,
    pending_dir: Vec<DirOp>,
    locked: bool,
    generation: u64,
    stats: SimStats,
    faults: Vec<(FaultOp, u64, io::ErrorKind)>,
    kill_after: Option<u64>,
    kill_at_sync: Option<u64>,
    dead: bool,
}

/// A simulated log directory. Clones share the same disk.
#[derive(Debug, Clone, Default)]
pub struct SimStorage {
    state: Arc<Mutex<State>>,
}

#[derive(Debug)]
struct SimFile {
    state: Arc<Mutex<State>>,
    ino: u64,
    generation: u64,
}

#[derive(Debug)]
struct SimLock(Arc<Mutex<State>>, u64);

impl Drop for SimLock {
    fn drop(&mut self) {
        let mut s = self.0.lock();
        if s.generation == self.1 {
            s.locked = false;
        }
    }
}

fn dead() -> io::Error {
    io::Error::other("simulated crash: the process is gone")
}

impl State {
    /// Applies fault injection and the kill countdown to one operation.
    fn check(&mut self, op: FaultOp, mutating: bool) -> io::Result<()> {
        if self.dead {
            return Err(dead());
        }
        if matches!(op, FaultOp::SyncData | FaultOp::SyncDir) {
            if let Some(n) = self.kill_at_sync.as_mut() {
                if *n == 0 {
                    self.dead = true;
                    return Err(dead());
                }
                *n -= 1;
            }
        }
        if mutating {
            if let Some(n) = self.kill_after.as_mut() {
                if *n == 0 {
                    self.dead = true;
                    return Err(dead());
                }
                *n -= 1;
            }
        }
        if let Some(i) = self.faults.iter().position(|f| f.0 == op) {
            if self.faults[i].1 == 0 {
                let kind = self.faults.remove(i).2;
                return Err(match kind {
                    io::ErrorKind::StorageFull => io::Error::from_raw_os_error(28),
                    k => io::Error::new(k, "injected fault"),
                });
            }
            self.faults[i].1 -= 1;
        }
        Ok(())
    }

    /// The process that used the disk is gone: its handles and lock die, pending faults and
    /// kills are cleared.
    fn new_process(&mut self) {
        self.locked = false;
        self.generation += 1;
        self.dead = false;
        self.kill_after = None;
        self.kill_at_sync = None;
        self.faults.clear();
    }

    fn link(&mut self, name: &str, ino: u64) {
        self.dir.insert(name.to_string(), ino);
        self.pending_dir.push(DirOp::Link(name.to_string(), ino));
    }
}

impl SimStorage {
    /// An empty simulated disk.
    pub fn new() -> Self {
        Self::default()
    }

    /// Operation counters since creation (or the last [`SimStorage::reset_stats`]).
    pub fn stats(&self) -> SimStats {
        self.state.lock().stats
    }

    /// Zeroes the operation counters.
    pub fn reset_stats(&self) {
        self.state.lock().stats = SimStats::default();
    }

    /// Makes the `nth` (0-based) next call of `op` fail with an error of `kind`
    /// (`StorageFull` gives a real `ENOSPC`).
    pub fn inject_fault(&self, op: FaultOp, nth: u64, kind: io::ErrorKind) {
        self.state.lock().faults.push((op, nth, kind));
    }

    /// Number of injected faults not yet hit.
    pub fn pending_faults(&self) -> usize {
        self.state.lock().faults.len()
    }

    /// Drops every fault injected and not yet hit.
    pub fn clear_faults(&self) {
        self.state.lock().faults.clear();
    }

    /// Kills the simulated process after `ops` more mutating operations (writes, syncs and
    /// directory changes): that operation and every later one fail as if the process died.
    /// Call [`SimStorage::crash`] afterwards to get the disk a restart would see.
    pub fn kill_after(&self, ops: u64) {
        self.state.lock().kill_after = Some(ops);
    }

    /// Kills the simulated process at the `nth` (0-based) next sync (data or directory): that
    /// sync does not happen, and every later operation fails.
    pub fn kill_at_sync(&self, nth: u64) {
        self.state.lock().kill_at_sync = Some(nth);
    }

    /// True once the kill countdown ran out.
    pub fn is_dead(&self) -> bool {
        self.state.lock().dead
    }

    /// Simulates a power loss now: keeps the durable images and an arbitrary, seeded part of
    /// what was not synced. Old handles and the lock are released.
    pub fn crash(&self, opts: CrashOptions) {
        let mut s = self.state.lock();
        if opts.process_only {
            s.new_process();
            return;
        }
        let mut rng = fastrand::Rng::with_seed(opts.seed);
        let keep = |rng: &mut fastrand::Rng| !opts.lose_all_unsynced && rng.bool();
        // Directory: the durable entries plus a subset of the later changes, in order.
        let mut dir = s.durable_dir.clone();
        for op in std::mem::take(&mut s.pending_dir) {
            if !keep(&mut rng) {
                continue;
            }
            match op {
                DirOp::Link(name, ino) => {
                    dir.insert(name, ino);
                }
                DirOp::Rename(from, to) => {
                    if let Some(ino) = dir.remove(&from) {
                        dir.insert(to, ino);
                    }
                }
                DirOp::Remove(name) => {
                    dir.remove(&name);
                }
            }
        }
        // Files: per sector, the durable version or any later one.
        let live: Vec<u64> = dir.values().copied().collect();
        let mut inodes = HashMap::new();
        for ino in live {
            let Some(node) = s.inodes.get(&ino) else {
                continue;
            };
            let image = if opts.lose_all_unsynced {
                node.durable.clone()
            } else {
                crash_image(node, &mut rng)
            };
            inodes.insert(
                ino,
                Inode {
                    data: image.clone(),
                    durable: image,
                    pending: Vec::new(),
                },
            );
        }
        s.inodes = inodes;
        s.durable_dir = dir.clone();
        s.dir = dir;
        s.new_process();
    }

    /// The names and current contents of all files (for tests and fuzzers).
    pub fn snapshot(&self) -> BTreeMap<String, Vec<u8>> {
        let s = self.state.lock();
        s.dir
            .iter()
            .map(|(n, ino)| (n.clone(), s.inodes[ino].data.clone()))
            .collect()
    }

    /// Writes a file directly and durably, bypassing the history (to build test inputs).
    pub fn put_file(&self, name: &str, data: &[u8]) {
        let mut s = self.state.lock();
        let ino = s.next_ino;
        s.next_ino += 1;
        s.inodes.insert(
            ino,
            Inode {
                data: data.to_vec(),
                durable: data.to_vec(),
                pending: Vec::new(),
            },
        );
        s.dir.insert(name.to_string(), ino);
        s.durable_dir.insert(name.to_string(), ino);
    }

    fn file(&self, ino: u64) -> Arc<dyn StorageFile> {
        let generation = self.state.lock().generation;
        Arc::new(SimFile {
            state: self.state.clone(),
            ino,
            generation,
        })
    }
}

/// The image of one file after a power loss.
fn crash_image(node: &Inode, rng: &mut fastrand::Rng) -> Vec<u8> {
    if node.pending.is_empty() {
        return node.durable.clone();
    }
    // Length: that of some point in the unsynced history (metadata changes stay ordered).
    let mut len = node.durable.len() as u64;
    let upto = rng.usize(0..=node.pending.len());
    for p in &node.pending[..upto] {
        len = match p {
            Pending::Write { offset, data } => len.max(offset + data.len() as u64),
            Pending::SetLen(l) => *l,
        };
    }
    let mut out = node.durable.clone();
    out.resize(len as usize, 0);
    // Contents: each sector independently takes the version after the first k pending
    // operations that touch it, k chosen at random; sometimes the k-th tears inside the sector.
    let mut touched: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
    for (i, p) in node.pending.iter().enumerate() {
        if let Pending::Write { offset, data } = p {
            if data.is_empty() {
                continue;
            }
            let first = offset / SECTOR;
            let last = (offset + data.len() as u64 - 1) / SECTOR;
            for sec in first..=last {
                touched.entry(sec).or_default().push(i);
            }
        }
    }
    for (sec, ops) in touched {
        let lo = sec * SECTOR;
        if lo >= len {
            continue;
        }
        let hi = (lo + SECTOR).min(len);
        let k = rng.usize(0..=ops.len());
        let tear = k > 0 && rng.u8(..) < 32;
        for (j, &i) in ops[..k].iter().enumerate() {
            let Pending::Write { offset, data } = &node.pending[i] else {
                continue;
            };
            let a = lo.max(*offset);
            let mut b = hi.min(offset + data.len() as u64);
            if tear && j + 1 == k && b > a {
                b = a + rng.u64(0..=(b - a));
            }
            for pos in a..b {
                out[pos as usize] = data[(pos - offset) as usize];
            }
        }
    }
    out
}

impl SimFile {
    fn with<R>(
        &self,
        op: FaultOp,
        mutating: bool,
        f: impl FnOnce(&mut State, &mut Inode) -> R,
    ) -> io::Result<R> {
        let mut s = self.state.lock();
        if s.generation != self.generation {
            return Err(dead());
        }
        s.check(op, mutating)?;
        let mut node = s.inodes.remove(&self.ino).unwrap_or_default();
        let r = f(&mut s, &mut node);
        s.inodes.insert(self.ino, node);
        Ok(r)
    }
}

impl StorageFile for SimFile {
    fn len(&self) -> io::Result<u64> {
        self.with(FaultOp::Read, false, |_, n| n.data.len() as u64)
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        self.with(FaultOp::Read, false, |_, n| {
            let start = (offset as usize).min(n.data.len());
            let end = start.saturating_add(buf.len()).min(n.data.len());
            buf[..end - start].copy_from_slice(&n.data[start..end]);
            end - start
        })
    }

    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.with(FaultOp::Write, true, |s, n| {
            s.stats.writes += 1;
            s.stats.bytes_written += data.len() as u64;
            let end = offset as usize + data.len();
            if n.data.len() < end {
                n.data.resize(end, 0);
            }
            n.data[offset as usize..end].copy_from_slice(data);
            n.pending.push(Pending::Write {
                offset,
                data: data.to_vec(),
            });
        })
    }

    fn sync_data(&self) -> io::Result<()> {
        self.with(FaultOp::SyncData, true, |s, n| {
            s.stats.data_syncs += 1;
            n.durable = n.data.clone();
            n.pending.clear();
        })
    }

    /// Two steps, so a crash can fall between them: the write (unsynced, may tear), then the
    /// range made durable (a sync point, counted as a data sync). Unsynced writes elsewhere
    /// in the file stay unsynced; older unsynced writes inside the range can no longer show.
    fn write_durable(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.write_at(offset, data)?;
        self.with(FaultOp::SyncData, true, |s, n| {
            s.stats.data_syncs += 1;
            s.stats.durable_writes += 1;
            let (lo, hi) = (offset, offset + data.len() as u64);
            if (n.durable.len() as u64) < hi {
                n.durable.resize(hi as usize, 0);
            }
            n.durable[lo as usize..hi as usize].copy_from_slice(data);
            let mut kept = Vec::with_capacity(n.pending.len());
            for p in n.pending.drain(..) {
                match p {
                    Pending::Write { offset: o, data: d } if o < hi && o + d.len() as u64 > lo => {
                        let end = o + d.len() as u64;
                        if o < lo {
                            kept.push(Pending::Write {
                                offset: o,
                                data: d[..(lo - o) as usize].to_vec(),
                            });
                        }
                        if end > hi {
                            kept.push(Pending::Write {
                                offset: hi,
                                data: d[(hi - o) as usize..].to_vec(),
                            });
                        }
                    }
                    other => kept.push(other),
                }
            }
            n.pending = kept;
        })
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.with(FaultOp::Write, true, |s, n| {
            s.stats.writes += 1;
            n.data.resize(len as usize, 0);
            n.pending.push(Pending::SetLen(len));
        })
    }
}

impl Storage for SimStorage {
    fn list(&self) -> io::Result<Vec<String>> {
        let mut s = self.state.lock();
        s.check(FaultOp::Read, false)?;
        Ok(s.dir.keys().cloned().collect())
    }

    fn open(&self, name: &str) -> io::Result<Arc<dyn StorageFile>> {
        let ino = {
            let mut s = self.state.lock();
            s.check(FaultOp::Read, false)?;
            *s.dir.get(name).ok_or_else(|| {
                io::Error::new(io::ErrorKind::NotFound, format!("{name}: no such file"))
            })?
        };
        Ok(self.file(ino))
    }

    fn create(&self, name: &str) -> io::Result<Arc<dyn StorageFile>> {
        let ino = {
            let mut s = self.state.lock();
            s.check(FaultOp::Create, true)?;
            s.stats.creates += 1;
            if let Some(&ino) = s.dir.get(name) {
                let node = s.inodes.entry(ino).or_default();
                node.data.clear();
                node.pending.push(Pending::SetLen(0));
                ino
            } else {
                let ino = s.next_ino;
                s.next_ino += 1;
                s.inodes.insert(ino, Inode::default());
                s.link(name, ino);
                ino
            }
        };
        Ok(self.file(ino))
    }

    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        let mut s = self.state.lock();
        s.check(FaultOp::Rename, true)?;
        s.stats.dir_changes += 1;
        let ino = s.dir.remove(from).ok_or_else(|| {
            io::Error::new(io::ErrorKind::NotFound, format!("{from}: no such file"))
        })?;
        s.dir.insert(to.to_string(), ino);
        s.pending_dir
            .push(DirOp::Rename(from.to_string(), to.to_string()));
        Ok(())
    }

    fn remove(&self, name: &str) -> io::Result<()> {
        let mut s = self.state.lock();
        s.check(FaultOp::Remove, true)?;
        s.stats.dir_changes += 1;
        s.dir.remove(name).ok_or_else(|| {
            io::Error::new(io::ErrorKind::NotFound, format!("{name}: no such file"))
        })?;
        s.pending_dir.push(DirOp::Remove(name.to_string()));
        Ok(())
    }

    fn sync_dir(&self) -> io::Result<()> {
        let mut s = self.state.lock();
        s.check(FaultOp::SyncDir, true)?;
        s.stats.dir_syncs += 1;
        s.durable_dir = s.dir.clone();
        s.pending_dir.clear();
        Ok(())
    }

    fn lock(&self, _name: &str) -> io::Result<Box<dyn Send + Sync + std::fmt::Debug>> {
        let mut s = self.state.lock();
        if s.dead {
            return Err(dead());
        }
        if s.locked {
            return Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                "log directory is locked",
            ));
        }
        s.locked = true;
        Ok(Box::new(SimLock(self.state.clone(), s.generation)))
    }

    fn describe(&self) -> String {
        "<simulated disk>".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synced_data_survives_any_crash() {
        for seed in 0..50 {
            let sim = SimStorage::new();
            let f = sim.create("a").unwrap();
            f.write_at(0, &[1; 1000]).unwrap();
            f.sync_data().unwrap();
            sim.sync_dir().unwrap();
            f.write_at(1000, &[2; 3000]).unwrap();
            f.write_at(0, &[3; 10]).unwrap();
            sim.crash(CrashOptions::power_loss(seed));
            let img = &sim.snapshot()["a"];
            assert!(img.len() >= 1000);
            assert!(img[10..1000].iter().all(|&b| b == 1));
            assert!(img[..10].iter().all(|&b| b == 1 || b == 3));
        }
    }

    #[test]
    fn unsynced_create_can_vanish_and_old_handles_die() {
        let sim = SimStorage::new();
        let f = sim.create("x").unwrap();
        f.write_at(0, b"hello").unwrap();
        f.sync_data().unwrap();
        sim.crash(CrashOptions {
            seed: 1,
            lose_all_unsynced: true,
            process_only: false,
        });
        assert!(sim.snapshot().is_empty());
        assert!(f.write_at(0, b"x").is_err());
    }

    #[test]
    fn crash_images_vary_with_seed() {
        let mut images = std::collections::HashSet::new();
        for seed in 0..64 {
            let sim = SimStorage::new();
            let f = sim.create("a").unwrap();
            sim.sync_dir().unwrap();
            f.write_at(0, &[7; 2048]).unwrap();
            sim.crash(CrashOptions::power_loss(seed));
            images.insert(sim.snapshot()["a"].clone());
        }
        assert!(images.len() > 4, "only {} distinct images", images.len());
    }

    #[test]
    fn lock_is_exclusive_until_dropped() {
        let sim = SimStorage::new();
        let g = sim.lock("LOCK").unwrap();
        assert_eq!(
            sim.lock("LOCK").unwrap_err().kind(),
            io::ErrorKind::WouldBlock
        );
        drop(g);
        assert!(sim.lock("LOCK").is_ok());
    }

    #[test]
    fn faults_and_kill() {
        let sim = SimStorage::new();
        sim.inject_fault(FaultOp::SyncData, 1, io::ErrorKind::StorageFull);
        let f = sim.create("a").unwrap();
        f.sync_data().unwrap();
        assert_eq!(f.sync_data().unwrap_err().raw_os_error(), Some(28));
        sim.kill_after(1);
        f.write_at(0, b"a").unwrap();
        assert!(f.write_at(0, b"b").is_err());
        assert!(sim.is_dead());
    }
}
