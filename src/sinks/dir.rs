//! The directory sink: one file per epoch, where the rename is the commit marker.

use crate::sink::{Epoch, EpochKey, Sink, SinkError};
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

const TMP_PREFIX: &str = ".tmp-";

/// Writes each epoch as one file in a directory: to a temporary file, synced, renamed to its
/// final name, and the directory synced. The final name exists if and only if the whole epoch
/// is in the target, so the file itself is the commit marker and delivery is exactly-once.
///
/// Names sort by checkpoint id: `{checkpoint:020}-{sink_id}-{subtask:05}.txt`. When every
/// record is UTF-8 without a newline the file holds one record per line; otherwise it is
/// `.bin` with each record prefixed by its length (u32, little-endian).
#[derive(Debug, Clone)]
pub struct DirSink {
    dir: PathBuf,
}

impl DirSink {
    /// A sink writing into `dir`, created if missing. Temporary files left by a crash are removed.
    pub fn new(dir: impl AsRef<Path>) -> io::Result<Self> {
        let dir = dir.as_ref().to_path_buf();
        fs::create_dir_all(&dir)?;
        for entry in fs::read_dir(&dir)? {
            let entry = entry?;
            if entry.file_name().to_string_lossy().starts_with(TMP_PREFIX) {
                fs::remove_file(entry.path())?;
            }
        }
        Ok(DirSink { dir })
    }

    /// The target directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn stem(key: &EpochKey) -> String {
        format!("{:020}-{}-{:05}", key.checkpoint, key.sink_id, key.subtask)
    }

    /// Reads back every record of every epoch file in `dir`, in file-name order.
    pub fn read_records(dir: impl AsRef<Path>) -> io::Result<Vec<Vec<u8>>> {
        let mut names: Vec<PathBuf> = fs::read_dir(dir)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                !p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with(TMP_PREFIX))
            })
            .collect();
        names.sort();
        let mut out = Vec::new();
        for p in names {
            let data = fs::read(&p)?;
            match p.extension().and_then(|e| e.to_str()) {
                Some("txt") => {
                    for line in data.split(|&b| b == b'\n') {
                        out.push(line.to_vec());
                    }
                    // The file ends with a newline: the last split is empty.
                    out.pop();
                }
                Some("bin") => {
                    let mut at = 0;
                    while at + 4 <= data.len() {
                        let len = u32::from_le_bytes(data[at..at + 4].try_into().expect("4 bytes"))
                            as usize;
                        let end = (at + 4).saturating_add(len).min(data.len());
                        out.push(data[at + 4..end].to_vec());
                        at = end;
                    }
                }
                _ => {}
            }
        }
        Ok(out)
    }
}

impl Sink for DirSink {
    fn deliver(&mut self, epoch: &Epoch) -> Result<(), SinkError> {
        let text = epoch
            .records()
            .all(|r| !r.data.contains(&b'\n') && std::str::from_utf8(r.data).is_ok());
        let name = format!(
            "{}.{}",
            Self::stem(epoch.key()),
            if text { "txt" } else { "bin" }
        );
        let tmp = self.dir.join(format!("{TMP_PREFIX}{name}"));
        let mut f = io::BufWriter::with_capacity(1 << 20, File::create(&tmp)?);
        for r in epoch.records() {
            if text {
                f.write_all(r.data)?;
                f.write_all(b"\n")?;
            } else {
                f.write_all(&(r.data.len() as u32).to_le_bytes())?;
                f.write_all(r.data)?;
            }
        }
        let f = f.into_inner().map_err(|e| e.into_error())?;
        f.sync_all()?;
        drop(f);
        fs::rename(&tmp, self.dir.join(&name))?;
        File::open(&self.dir)?.sync_all()?;
        Ok(())
    }

    fn stores_marker(&self) -> bool {
        true
    }

    fn is_committed(&mut self, key: &EpochKey) -> Result<bool, SinkError> {
        let stem = Self::stem(key);
        Ok(self.dir.join(format!("{stem}.txt")).exists()
            || self.dir.join(format!("{stem}.bin")).exists())
    }
}
