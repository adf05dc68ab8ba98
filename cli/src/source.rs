//! `pipe`'s input: a regular file (resettable: a resume seeks back to the last checkpoint's
//! offset) or standard input (cannot be replayed). Lines are handed out only when complete,
//! and every byte of a complete line goes into a running hash, so a checkpoint can record
//! a fingerprint of exactly the input it consumed.

use crate::CliResult;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use xxhash_rust::xxh3::Xxh3;

/// Where the records come from, as given by `--input`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InputSpec {
    /// A regular file, by its canonical path.
    File(PathBuf),
    /// `--input -`.
    Stdin,
}

impl InputSpec {
    /// Checks `--input` before anything is created: `-`, or an existing regular file.
    pub fn parse(arg: &Path) -> CliResult<InputSpec> {
        if arg == Path::new("-") {
            return Ok(InputSpec::Stdin);
        }
        let md = std::fs::metadata(arg)
            .map_err(|e| format!("cannot read --input {}: {e}", arg.display()))?;
        let ft = md.file_type();
        if ft.is_dir() {
            return Err(format!(
                "--input {} is a directory; it takes a file of newline-delimited records, or - for standard input",
                arg.display()
            )
            .into());
        }
        if ft.is_fifo() || ft.is_char_device() || ft.is_socket() || !ft.is_file() {
            return Err(format!(
                "--input {} is not a regular file: a pipe or device cannot be read again after a crash, so it cannot be resumed; use --input - to read a stream from standard input (its guarantee is weaker, see --help)",
                arg.display()
            )
            .into());
        }
        let canonical = std::fs::canonicalize(arg)
            .map_err(|e| format!("cannot resolve --input {}: {e}", arg.display()))?;
        Ok(InputSpec::File(canonical))
    }
}

/// What [`Source::next_line`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Next {
    /// A complete record is in the caller's buffer (without its newline).
    Line,
    /// The line being read is longer than the record limit.
    TooLong {
        /// Its 1-based line number in the input.
        line: u64,
        /// Byte offset of its start.
        offset: u64,
    },
    /// A file being followed has no complete line right now.
    Idle,
    /// The final line that an earlier run shipped without a newline was continued since: the
    /// input is not the one the log consumed.
    Continued {
        /// Where that line ended.
        offset: u64,
    },
    /// The input ended. `partial` bytes of a last line without a newline were not handed out.
    End {
        /// Bytes after the last newline.
        partial: u64,
    },
}

/// A line reader over the input that tracks the offset, line count and hash of what it
/// handed out.
pub struct Source {
    reader: BufReader<Box<dyn Read + Send>>,
    /// The file (for follow-mode checks), when the input is one.
    file: Option<(PathBuf, File)>,
    hasher: Xxh3,
    offset: u64,
    lines: u64,
    /// Bytes of the line being assembled (they are not counted until it is complete).
    partial: Vec<u8>,
    follow: bool,
    ship_final_line: bool,
    /// True once a final line without a newline was handed out.
    unterminated: bool,
    /// The previous run shipped a final line without a newline: the next byte, if any, must
    /// be the newline that ends it, or the line was continued after it was shipped.
    after_unterminated: bool,
}

/// What [`Source`] had consumed at one moment: offset, lines, the fingerprint's state.
#[derive(Clone)]
pub struct SourceMark {
    /// Input bytes consumed.
    pub offset: u64,
    /// Lines consumed.
    pub lines: u64,
    hasher: Xxh3,
    /// The last line consumed had no newline.
    pub unterminated: bool,
}

impl SourceMark {
    /// Fingerprint of the bytes before [`SourceMark::offset`].
    pub fn hash(&self) -> String {
        hex(self.hasher.digest())
    }
}

/// Fingerprint of a prefix: hex of its xxh3-64.
pub fn hex(h: u64) -> String {
    format!("{h:016x}")
}

/// The fingerprint of the input's bytes `[0, offset)`, for checking a resume.
pub struct Prefix {
    /// Fingerprint of the prefix.
    pub hash: String,
}

impl Source {
    /// Opens a file and reads its first `offset` bytes into the hash (a resume checks them
    /// against the checkpoint's fingerprint before reading on).
    pub fn open_file(path: &Path, offset: u64) -> CliResult<(Source, Prefix)> {
        let mut f =
            File::open(path).map_err(|e| format!("cannot open --input {}: {e}", path.display()))?;
        let mut hasher = Xxh3::new();
        let mut lines = 0u64;
        let mut left = offset;
        let mut buf = vec![0u8; 1 << 20];
        while left > 0 {
            let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
            let n = f
                .read(&mut buf[..want])
                .map_err(|e| format!("cannot read --input {}: {e}", path.display()))?;
            if n == 0 {
                return Err(format!(
                    "--input {} ends before offset {offset}, where the log's last checkpoint stopped reading it",
                    path.display()
                )
                .into());
            }
            hasher.update(&buf[..n]);
            lines += buf[..n].iter().filter(|&&b| b == b'\n').count() as u64;
            left -= n as u64;
        }
        f.seek(SeekFrom::Start(offset))
            .map_err(|e| format!("cannot seek in --input {}: {e}", path.display()))?;
        let clone = f
            .try_clone()
            .map_err(|e| format!("cannot open --input {}: {e}", path.display()))?;
        let prefix = Prefix {
            hash: hex(hasher.digest()),
        };
        let src = Source {
            reader: BufReader::with_capacity(1 << 20, Box::new(clone)),
            file: Some((path.to_path_buf(), f)),
            hasher,
            offset,
            lines,
            partial: Vec::new(),
            follow: false,
            ship_final_line: false,
            unterminated: false,
            after_unterminated: false,
        };
        Ok((src, prefix))
    }

    /// Standard input, from its current position; `offset` and `lines` count what earlier
    /// runs consumed.
    pub fn stdin(offset: u64, lines: u64) -> Source {
        Source {
            // Polled, so that a stop signal is seen while no line arrives (crate::stop).
            reader: BufReader::with_capacity(1 << 20, Box::new(crate::stop::StdinReader::new())),
            file: None,
            hasher: Xxh3::new(),
            offset,
            lines,
            partial: Vec::new(),
            follow: false,
            // A stream that ended is complete: its last line is a record.
            ship_final_line: true,
            unterminated: false,
            after_unterminated: false,
        }
    }

    /// The resume point ends with a final line that was shipped without a newline.
    pub fn after_unterminated(mut self, on: bool) -> Self {
        self.after_unterminated = on;
        self
    }

    /// Keep reading a file as it grows (`--follow`).
    pub fn follow(mut self, on: bool) -> Self {
        self.follow = on && self.file.is_some();
        self
    }

    /// Hand out a last line without a newline at the end of a file (`--ship-final-line`).
    pub fn ship_final_line(mut self, on: bool) -> Self {
        if self.file.is_some() {
            self.ship_final_line = on;
        }
        self
    }

    /// Input bytes of the lines handed out (plus any bytes skipped at the start).
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Lines handed out (plus those before the start offset).
    pub fn lines(&self) -> u64 {
        self.lines
    }

    /// Where the input stands now, to describe it after a line was read but not shipped.
    pub fn mark(&self) -> SourceMark {
        SourceMark {
            offset: self.offset,
            lines: self.lines,
            hasher: self.hasher.clone(),
            unterminated: self.unterminated,
        }
    }

    /// Current size of the input file.
    pub fn size(&self) -> Option<u64> {
        self.file
            .as_ref()
            .and_then(|(_, f)| f.metadata().ok())
            .map(|m| m.len())
    }

    /// Reads the next complete line into `line` (without its newline), refusing lines longer
    /// than `max` bytes before they are read whole.
    pub fn next_line(&mut self, line: &mut Vec<u8>, max: usize) -> std::io::Result<Next> {
        line.clear();
        loop {
            let buf = self.reader.fill_buf()?;
            if buf.is_empty() {
                if self.follow {
                    return Ok(Next::Idle);
                }
                if self.partial.is_empty() || !self.ship_final_line {
                    return Ok(Next::End {
                        partial: self.partial.len() as u64,
                    });
                }
                // The input is complete: its last line is a record although no newline ends it.
                self.hasher.update(&self.partial);
                self.offset += self.partial.len() as u64;
                self.lines += 1;
                self.unterminated = true;
                std::mem::swap(line, &mut self.partial);
                self.partial.clear();
                return Ok(Next::Line);
            }
            if self.after_unterminated {
                if buf[0] != b'\n' {
                    return Ok(Next::Continued {
                        offset: self.offset,
                    });
                }
                // The newline that ends the line shipped earlier: consumed, not a new line.
                self.reader.consume(1);
                self.hasher.update(b"\n");
                self.offset += 1;
                self.after_unterminated = false;
                continue;
            }
            match buf.iter().position(|&b| b == b'\n') {
                Some(i) => {
                    if self.partial.len() + i > max {
                        return Ok(self.too_long());
                    }
                    self.partial.extend_from_slice(&buf[..i]);
                    self.reader.consume(i + 1);
                    self.hasher.update(&self.partial);
                    self.hasher.update(b"\n");
                    self.offset += self.partial.len() as u64 + 1;
                    self.lines += 1;
                    std::mem::swap(line, &mut self.partial);
                    self.partial.clear();
                    return Ok(Next::Line);
                }
                None => {
                    let n = buf.len();
                    if self.partial.len() + n > max {
                        return Ok(self.too_long());
                    }
                    self.partial.extend_from_slice(buf);
                    self.reader.consume(n);
                }
            }
        }
    }

    fn too_long(&self) -> Next {
        Next::TooLong {
            line: self.lines + 1,
            offset: self.offset,
        }
    }

    /// In follow mode: fails when the file was truncated below what was read, or replaced.
    pub fn check_followed(&self) -> CliResult<()> {
        let Some((path, f)) = &self.file else {
            return Ok(());
        };
        let open = f.metadata()?;
        let read = self.offset + self.partial.len() as u64;
        if open.len() < read {
            return Err(format!(
                "--input {} shrank to {} bytes while it was followed ({read} bytes were read): it was truncated, which a resumable source must not be",
                path.display(),
                open.len()
            )
            .into());
        }
        if let Ok(now) = std::fs::metadata(path) {
            if (now.dev(), now.ino()) != (open.dev(), open.ino()) {
                return Err(format!(
                    "--input {} was replaced by another file while it was followed (rotated?); the log continues the old file: start a new --wal for the new one",
                    path.display()
                )
                .into());
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines_of(text: &[u8], ship_final: bool) -> (Vec<Vec<u8>>, Next, u64) {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("in");
        std::fs::write(&p, text).unwrap();
        let (mut s, _) = Source::open_file(&p, 0).unwrap();
        s = s.ship_final_line(ship_final);
        let mut out = Vec::new();
        let mut line = Vec::new();
        loop {
            match s.next_line(&mut line, 8).unwrap() {
                Next::Line => out.push(line.clone()),
                other => return (out, other, s.offset()),
            }
        }
    }

    #[test]
    fn only_complete_lines_unless_the_final_line_is_shipped() {
        let (l, end, off) = lines_of(b"a\nb\nc", false);
        assert_eq!(l, vec![b"a".to_vec(), b"b".to_vec()]);
        assert_eq!(end, Next::End { partial: 1 });
        assert_eq!(off, 4);
        let (l, end, off) = lines_of(b"a\nb\nc", true);
        assert_eq!(l.len(), 3);
        assert_eq!(end, Next::End { partial: 0 });
        assert_eq!(off, 5);
    }

    #[test]
    fn a_long_line_is_named_before_it_is_read_whole() {
        let (l, end, _) = lines_of(b"ok\n0123456789\n", false);
        assert_eq!(l, vec![b"ok".to_vec()]);
        assert_eq!(end, Next::TooLong { line: 2, offset: 3 });
    }

    #[test]
    fn the_prefix_hash_matches_the_running_hash() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("in");
        std::fs::write(&p, b"one\ntwo\nthree\n").unwrap();
        let (mut s, _) = Source::open_file(&p, 0).unwrap();
        let mut line = Vec::new();
        s.next_line(&mut line, 100).unwrap();
        s.next_line(&mut line, 100).unwrap();
        let (resumed, prefix) = Source::open_file(&p, s.offset()).unwrap();
        assert_eq!(prefix.hash, s.mark().hash());
        assert_eq!(resumed.lines(), 2);
        assert_eq!(resumed.mark().hash(), s.mark().hash());
    }
}
