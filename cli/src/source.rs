//! `pipe`'s input: a regular file (resettable: a resume seeks back to the last checkpoint's
//! offset) or standard input (cannot be replayed). Lines are handed out only when complete,
//! and every byte of a complete line goes into a running hash, so a checkpoint can record
//! a fingerprint of exactly the input it consumed.
//!
//! A followed file is read across rotations. Rename and create: when the path names another
//! file (or none), the old file is read to its end through the open descriptor, and once it
//! has not changed for [`ROTATED_QUIET`] the file at the path is read from its start.
//! Copytruncate: a file shorter than what was read, or whose first bytes changed, was
//! truncated in place; a copy beside it that holds what was read is finished first, then the
//! file is read from its start. Offset, lines and hash always describe the file being read,
//! named by its identity ([`FileId`]), so a restart finds it again ([`Source::resume_file`]).

mod rotated;

use crate::outcome::{CliResult, Refused};
pub use rotated::FileId;
use rotated::{parse_hex, read_prefix, unchanged_for, Found, Prefixed, Wanted, HEAD_BYTES};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::time::Duration;
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
    /// Checks `--input` before anything is created: `-`, or an existing regular file. With
    /// `follow` the file may be missing for now (between the rename and the create of a
    /// rotation) when its directory exists: a resume may still have a rotated file to finish.
    ///
    /// # Errors
    /// The argument names no regular file, or cannot be resolved.
    pub fn parse(arg: &Path, follow: bool) -> CliResult<InputSpec> {
        if arg == Path::new("-") {
            return Ok(InputSpec::Stdin);
        }
        let md = match std::fs::metadata(arg) {
            Err(e) if follow && e.kind() == std::io::ErrorKind::NotFound => {
                let (Some(dir), Some(name)) = (arg.parent(), arg.file_name()) else {
                    return Err(format!("cannot read --input {}: {e}", arg.display()).into());
                };
                let dir = if dir.as_os_str().is_empty() {
                    Path::new(".")
                } else {
                    dir
                };
                let dir = std::fs::canonicalize(dir)
                    .map_err(|e| format!("cannot read --input {}: {e}", arg.display()))?;
                return Ok(InputSpec::File(dir.join(name)));
            }
            r => r.map_err(|e| format!("cannot read --input {}: {e}", arg.display()))?,
        };
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

/// How long a rotated file must stay unchanged (no write, no rename) before the reader, at
/// its end, goes on to the new file: the writing program may still write through its old
/// descriptor until it reopens its log.
pub const ROTATED_QUIET: Duration = Duration::from_secs(2);

/// The file being read.
struct Open {
    file: File,
    id: FileId,
    /// The name it was opened by, for messages (a renamed file is not at it any more).
    shown: PathBuf,
    /// Its bytes `[0, head.len())` as read (at most [`HEAD_BYTES`]).
    head: Vec<u8>,
}

impl Open {
    fn new(file: File, shown: PathBuf, head: Vec<u8>) -> std::io::Result<Open> {
        let id = FileId::of(&file.metadata()?);
        Ok(Open {
            file,
            id,
            shown,
            head,
        })
    }
}

enum Input {
    Stdin(crate::stop::StdinReader),
    File(Open),
}

/// A line reader over the input that tracks the offset, line count and hash of what it
/// handed out. A file input is followed by its path: after a rotation the reader finishes
/// the old file (by its descriptor, or by the name it was found under after a restart) and
/// goes on with the file at the path from its start; offset, lines and hash then describe
/// the file being read.
pub struct Source {
    input: Input,
    buf: Box<[u8]>,
    /// `buf[pos..end]` is read but not yet consumed.
    pos: usize,
    end: usize,
    /// Bytes pulled from the file being read (its position).
    read_pos: u64,
    /// The input's path (files only).
    path: Option<PathBuf>,
    /// The file being read is no longer the one at `path` (it was rotated): at its end, once
    /// it stopped changing, the file at `path` is read from its start.
    finishing: bool,
    /// The file left at the last switch and where it was left, to warn once about bytes
    /// written to it afterwards.
    left: Option<(File, u64, PathBuf)>,
    hasher: Xxh3,
    offset: u64,
    lines: u64,
    /// Bytes of the line being assembled (they are not counted until it is complete).
    partial: Vec<u8>,
    follow: bool,
    ship_final_line: bool,
    quiet: bool,
    rotated_quiet: Duration,
    /// Notices (`false`) and warnings (`true`) not yet printed.
    said: Vec<(bool, String)>,
    /// True once a final line without a newline was handed out.
    unterminated: bool,
    /// The previous run shipped a final line without a newline: the next byte, if any, must
    /// be the newline that ends it, or the line was continued after it was shipped.
    after_unterminated: bool,
}

/// What [`Source`] had consumed at one moment: file, offset, lines, the fingerprint's state.
#[derive(Clone)]
pub struct SourceMark {
    /// Identity of the file being read (files only).
    pub file: Option<FileId>,
    /// Bytes consumed of the file being read (of the stream, for standard input).
    pub offset: u64,
    /// Lines consumed of the file being read.
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

/// Where a checkpoint left a file input (from its [`crate::resume::PipeMeta`]).
pub struct Saved<'a> {
    /// Identity of the file that was being read; `None` in metadata of earlier versions.
    pub file: Option<FileId>,
    /// Bytes consumed of it.
    pub offset: u64,
    /// Fingerprint of those bytes; `None` in the oldest metadata.
    pub hash: Option<&'a str>,
    /// The last line consumed was shipped without a newline.
    pub unterminated: bool,
}

impl Source {
    fn over(input: Input, path: Option<PathBuf>, offset: u64, p: Prefixed) -> Source {
        Source {
            input,
            buf: vec![0u8; 1 << 20].into_boxed_slice(),
            pos: 0,
            end: 0,
            read_pos: offset,
            path,
            finishing: false,
            left: None,
            hasher: p.hasher,
            offset,
            lines: p.lines,
            partial: Vec::new(),
            follow: false,
            ship_final_line: false,
            quiet: false,
            rotated_quiet: ROTATED_QUIET,
            said: Vec::new(),
            unterminated: false,
            after_unterminated: false,
        }
    }

    /// Opens a file and reads its first `offset` bytes into the hash (a resume checks them
    /// against the checkpoint's fingerprint before reading on).
    ///
    /// # Errors
    /// The file cannot be opened or read, or ends before `offset`.
    pub fn open_file(path: &Path, offset: u64) -> CliResult<(Source, Prefix)> {
        let shown = path.display();
        let mut f = File::open(path).map_err(|e| format!("cannot open --input {shown}: {e}"))?;
        let p = read_prefix(&mut f, offset)
            .map_err(|e| format!("cannot read --input {shown}: {e}"))?
            .ok_or_else(|| {
                format!("--input {shown} ends before offset {offset}, where the log's last checkpoint stopped reading it")
            })?;
        let prefix = Prefix {
            hash: hex(p.hasher.digest()),
        };
        let head = p.head.clone();
        let open = Open::new(f, path.to_path_buf(), head)
            .map_err(|e| format!("cannot read --input {shown}: {e}"))?;
        let src = Source::over(Input::File(open), Some(path.to_path_buf()), offset, p);
        Ok((src, prefix))
    }

    /// Opens the file input where a checkpoint left it (`at` names that checkpoint in
    /// messages), after checking that it holds what the checkpoint consumed:
    /// - the file at `path`, when it is the one recorded (or no identity was recorded);
    /// - else, after a rotation, the recorded file found in `path`'s directory by its inode
    ///   (or, for metadata without an identity and with `follow`, by its prefix), finished
    ///   before the file at `path` is read from its start;
    /// - with `follow`, a file at `path` that is shorter than the offset or whose prefix
    ///   differs was truncated in place (`copytruncate`): its copy beside it is finished
    ///   first when there is one, then it is read from its start.
    ///
    /// # Errors
    /// A [`Refused`] error when no file holds what the checkpoint consumed (the messages say
    /// what to restore or to start anew); an I/O error as such.
    pub fn resume_file(
        path: &Path,
        saved: Option<&Saved>,
        follow: bool,
        at: &str,
    ) -> CliResult<Source> {
        let shown = path.display();
        let Some(s) = saved else {
            return Ok(Source::open_file(path, 0)?.0);
        };
        let here = match std::fs::metadata(path) {
            Ok(md) => Some(md),
            Err(e) if follow && e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(format!("cannot read --input {shown}: {e}").into()),
        };
        let digest = s.hash.and_then(parse_hex);
        let (offset, hash) = (s.offset, s.hash);
        if let Some(md) = here
            .as_ref()
            .filter(|md| s.file.is_none_or(|id| id == FileId::of(md)))
        {
            let len = md.len();
            if len >= offset {
                let (src, prefix) = Source::open_file(path, offset)?;
                if hash.is_none_or(|h| h == prefix.hash) {
                    return Ok(src.after_unterminated(s.unterminated));
                }
                if !follow {
                    return Err(Refused(format!(
                        "--input {shown} changed under the log: its first {offset} bytes are not the bytes that {at} consumed (fingerprint {} instead of {}). The target holds records of the earlier content; restore that file, or use a new --wal and sink directory for the new one (with --follow, a file rewritten in place is taken as truncated and read from its start)",
                        prefix.hash,
                        hash.unwrap_or_default()
                    ))
                    .into());
                }
            } else if !follow {
                return Err(Refused(format!(
                    "--input {shown} has {len} bytes, but {at} consumed {offset}: it is not the input the log read (or it was truncated). Restore it, or use a new --wal and sink directory (with --follow, a truncated file is read from its start)"
                ))
                .into());
            }
            // Truncated or rewritten in place since the checkpoint (copytruncate).
            let here_id = FileId::of(md);
            if let Some(d) = digest {
                let want = Wanted {
                    id: None,
                    offset,
                    digest: d,
                    head: &[],
                    not: Some(here_id),
                };
                if let Some(found) = rotated::find(path, &want) {
                    let mut src = Source::finish_found(path, found, s)?;
                    src.note(format!(
                        "{shown} no longer holds the {offset} bytes {at} read (truncated by copytruncate, or rotated); {} holds them: finishing it from offset {offset} first, then reading {shown} from its start",
                        src.current_shown()
                    ));
                    return Ok(src);
                }
            }
            let mut src = Source::open_file(path, 0)?.0;
            src.note(format!(
                "{shown} is shorter than, or differs from, the {offset} bytes {at} read: it was truncated (copytruncate?) and is read from its start; lines it held after offset {offset} were not read and no copy of them was found beside it"
            ));
            return Ok(src);
        }
        // The file at the path is another one (or none): the recorded file was rotated.
        let id = s.file;
        let found = digest.and_then(|d| {
            rotated::find(
                path,
                &Wanted {
                    id,
                    offset,
                    digest: d,
                    head: &[],
                    not: here.as_ref().map(FileId::of),
                },
            )
        });
        let Some(found) = found else {
            let dir = path.parent().unwrap_or(Path::new("/")).display();
            let which = id.map_or(String::new(), |i| {
                format!(" (device {}, inode {})", i.dev, i.ino)
            });
            return Err(Refused(format!(
                "the file {at} was reading{which}, {offset} bytes into it, is no longer at {shown}, and no file in {dir} holds those bytes (was it compressed, moved to another directory or deleted by a rotation?). Put it back into {dir} uncompressed under any name starting with {} and re-run; or use a new --wal and sink directory to start with the file now at {shown}",
                path.file_name().map_or(String::new(), |n| n.to_string_lossy().into_owned())
            ))
            .into());
        };
        let mut src = Source::finish_found(path, found, s)?;
        src.note(format!(
            "{shown} was rotated since {at}: finishing the old file, now {}, from offset {offset}, then reading {shown} from its start",
            src.current_shown()
        ));
        Ok(src)
    }

    /// A source over a rotated file found beside `path`, to be finished before `path`.
    fn finish_found(path: &Path, found: Found, s: &Saved) -> CliResult<Source> {
        let Found {
            path: fpath,
            file,
            id,
            prefix,
        } = found;
        let open = Open {
            file,
            id,
            shown: fpath,
            head: prefix.head.clone(),
        };
        let mut src = Source::over(
            Input::File(open),
            Some(path.to_path_buf()),
            s.offset,
            prefix,
        );
        src.finishing = true;
        src.after_unterminated = s.unterminated;
        Ok(src)
    }

    /// Standard input, from its current position; `offset` and `lines` count what earlier
    /// runs consumed.
    pub fn stdin(offset: u64, lines: u64) -> Source {
        let p = Prefixed {
            hasher: Xxh3::new(),
            lines,
            head: Vec::new(),
        };
        // Polled, so that a stop signal is seen while no line arrives (crate::stop).
        let stdin = Input::Stdin(crate::stop::StdinReader::new());
        let mut src = Source::over(stdin, None, offset, p);
        // A stream that ended is complete: its last line is a record.
        src.ship_final_line = true;
        src
    }

    /// The resume point ends with a final line that was shipped without a newline.
    pub fn after_unterminated(mut self, on: bool) -> Self {
        self.after_unterminated = on;
        self
    }

    /// Keep reading a file as it grows (`--follow`), across rotations.
    pub fn follow(mut self, on: bool) -> Self {
        self.follow = on && self.path.is_some();
        self
    }

    /// Hand out a last line without a newline at the end of a file (`--ship-final-line`),
    /// and at the end of a rotated file.
    pub fn ship_final_line(mut self, on: bool) -> Self {
        if self.path.is_some() {
            self.ship_final_line = on;
        }
        self
    }

    /// No notices on standard error (warnings still).
    pub fn quiet(mut self, on: bool) -> Self {
        self.quiet = on;
        self
    }

    #[cfg(test)]
    fn rotated_quiet(mut self, d: Duration) -> Self {
        self.rotated_quiet = d;
        self
    }

    /// Bytes of the lines handed out of the file being read (plus any bytes skipped at the
    /// start).
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Lines handed out of the file being read (plus those before the start offset).
    pub fn lines(&self) -> u64 {
        self.lines
    }

    /// Where the input stands now, to describe it after a line was read but not shipped.
    pub fn mark(&self) -> SourceMark {
        SourceMark {
            file: self.open().map(|o| o.id),
            offset: self.offset,
            lines: self.lines,
            hasher: self.hasher.clone(),
            unterminated: self.unterminated,
        }
    }

    /// Current size of the file being read.
    pub fn size(&self) -> Option<u64> {
        self.open()
            .and_then(|o| o.file.metadata().ok())
            .map(|m| m.len())
    }

    fn open(&self) -> Option<&Open> {
        match &self.input {
            Input::File(o) => Some(o),
            Input::Stdin(_) => None,
        }
    }

    fn current_shown(&self) -> String {
        self.open()
            .map_or(String::new(), |o| o.shown.display().to_string())
    }

    fn shown(&self) -> String {
        self.path
            .as_ref()
            .map_or("standard input".into(), |p| p.display().to_string())
    }

    fn note(&mut self, s: String) {
        self.said.push((false, s));
    }

    fn warn(&mut self, s: String) {
        self.said.push((true, s));
    }

    /// Prints the notices and warnings gathered so far.
    fn say(&mut self) {
        for (warning, s) in self.said.drain(..) {
            if warning {
                eprintln!("warning: {s}");
            } else if !self.quiet {
                eprintln!("pipe: {s}");
            }
        }
    }

    /// Makes bytes available in the buffer; 0 at the end of what there is now.
    fn fill(&mut self) -> std::io::Result<usize> {
        if self.pos < self.end {
            return Ok(self.end - self.pos);
        }
        if self.follow && !self.finishing && self.rewritten_in_place()? {
            self.after_truncation()?;
        }
        let n = match &mut self.input {
            Input::Stdin(s) => s.read(&mut self.buf)?,
            Input::File(o) => {
                let n = o.file.read(&mut self.buf)?;
                // Keep the file's first bytes, as long as they come in order from its start.
                if self.read_pos == o.head.len() as u64 && o.head.len() < HEAD_BYTES {
                    let take = (HEAD_BYTES - o.head.len()).min(n);
                    o.head.extend_from_slice(&self.buf[..take]);
                }
                n
            }
        };
        self.read_pos += n as u64;
        self.pos = 0;
        self.end = n;
        Ok(n)
    }

    fn consume(&mut self, n: usize) {
        debug_assert!(self.pos + n <= self.end);
        self.pos += n;
    }

    /// The file being read is shorter than what was read from it, or its first bytes are
    /// not the ones read: it was truncated (and maybe written again) in place.
    fn rewritten_in_place(&self) -> std::io::Result<bool> {
        let Some(o) = self.open() else {
            return Ok(false);
        };
        if o.file.metadata()?.len() < self.read_pos {
            return Ok(true);
        }
        let mut got = vec![0u8; o.head.len()];
        match std::os::unix::fs::FileExt::read_exact_at(&o.file, &mut got, 0) {
            Ok(()) => Ok(got != o.head),
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(true),
            Err(e) => Err(e),
        }
    }

    /// After a truncation in place: finishes the copy beside the file, if one holds what was
    /// read, else reads the file again from its start.
    fn after_truncation(&mut self) -> std::io::Result<()> {
        let Some(path) = self.path.clone() else {
            return Ok(());
        };
        let Input::File(o) = &self.input else {
            return Ok(());
        };
        let shown = path.display().to_string();
        let want = Wanted {
            id: None,
            offset: self.offset,
            digest: self.hasher.digest(),
            head: &o.head,
            not: Some(o.id),
        };
        let found = rotated::find(&path, &want);
        let (offset, partial) = (self.offset, self.partial.len());
        if let Some(found) = found {
            // The copy goes on where the consumed lines end; the partial line is read again
            // from it.
            let copy = found.path.display().to_string();
            let open = Open {
                file: found.file,
                id: found.id,
                shown: found.path,
                head: found.prefix.head,
            };
            let old = std::mem::replace(&mut self.input, Input::File(open));
            self.left = None;
            drop(old);
            self.partial.clear();
            self.read_pos = offset;
            self.finishing = true;
            self.note(format!(
                "{shown} was truncated (copytruncate?) after {offset} bytes were read; finishing its copy {copy} first, then reading {shown} from its start"
            ));
            return Ok(());
        }
        if partial > 0 {
            self.warn(format!(
                "{shown} was truncated in the middle of a line: its {partial} bytes read after offset {offset} end without a newline and the rest of the line is gone, so they were not shipped"
            ));
        }
        self.warn(format!(
            "{shown} was truncated (copytruncate?) after {offset} bytes were read and no copy holding them was found beside it: whatever was written past byte {offset} before the truncation was not read and is lost; reading it again from its start"
        ));
        if let Input::File(o) = &mut self.input {
            o.file.seek(SeekFrom::Start(0))?;
            o.head.clear();
        }
        self.restart_position();
        Ok(())
    }

    /// Position at the start of the file being read.
    fn restart_position(&mut self) {
        self.hasher = Xxh3::new();
        self.offset = 0;
        self.lines = 0;
        self.read_pos = 0;
        self.partial.clear();
        self.pos = 0;
        self.end = 0;
        self.unterminated = false;
        self.after_unterminated = false;
    }

    /// At the end of the file being read, following: notices a rotation, and after one, once
    /// the old file stopped changing, goes on with the file at the path. `true` when it
    /// switched (read on), `false` to wait.
    fn at_end_following(&mut self) -> std::io::Result<bool> {
        let (Some(path), Some(o)) = (self.path.clone(), self.open()) else {
            return Ok(false);
        };
        let cur = o.id;
        let now = match std::fs::metadata(&path) {
            Ok(md) => Some(FileId::of(&md)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(e),
        };
        if !self.finishing {
            if now != Some(cur) {
                self.finishing = true;
                self.note(format!(
                    "{} was rotated (renamed away{}); finishing the old file through its open descriptor, then reading the new one from its start",
                    path.display(),
                    if now.is_none() { ", no new file yet" } else { "" }
                ));
            }
            self.check_left()?;
            return Ok(false);
        }
        if now == Some(cur) {
            // Renamed back: it is the input again.
            self.finishing = false;
            return Ok(false);
        }
        let settled = unchanged_for(&o.file.metadata()?) >= self.rotated_quiet;
        if now.is_none() || !settled {
            return Ok(false);
        }
        self.switch(&path)
    }

    /// The finished file's partial line, then the file at `path` from its start.
    fn switch(&mut self, path: &Path) -> std::io::Result<bool> {
        let file = match File::open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(e),
        };
        let (old_shown, offset) = (self.current_shown(), self.offset);
        if !self.partial.is_empty() {
            self.warn(format!(
                "the rotated file {old_shown} ends with {} bytes without a newline after offset {offset}; they were not shipped (--ship-final-line ships such a line)",
                self.partial.len()
            ));
        }
        let open = Open::new(file, path.to_path_buf(), Vec::new())?;
        let Input::File(old) = std::mem::replace(&mut self.input, Input::File(open)) else {
            unreachable!("only a file input switches")
        };
        let left_at = self.read_pos;
        self.left = Some((old.file, left_at, old.shown));
        self.finishing = false;
        self.restart_position();
        self.note(format!(
            "finished the rotated file {old_shown} at offset {offset}; reading {} from its start",
            path.display()
        ));
        Ok(true)
    }

    /// Warns once when the file left at the last switch grew since: those bytes came too
    /// late (after [`ROTATED_QUIET`]) and are not shipped.
    fn check_left(&mut self) -> std::io::Result<()> {
        let Some((f, at, shown)) = &self.left else {
            return Ok(());
        };
        let len = f.metadata()?.len();
        if len > *at {
            let s = format!(
                "{} bytes were written to the rotated file {} after walsink finished it (it had not changed for {}s) and went on to the new one; they are not shipped. Make the writing program reopen its log sooner after a rotation",
                len - at,
                shown.display(),
                ROTATED_QUIET.as_secs()
            );
            self.left = None;
            self.warn(s);
        }
        Ok(())
    }

    /// Reads the next complete line into `line` (without its newline), refusing lines longer
    /// than `max` bytes before they are read whole.
    ///
    /// # Errors
    /// Reading the input (or, following, looking at its path) failed.
    pub fn next_line(&mut self, line: &mut Vec<u8>, max: usize) -> std::io::Result<Next> {
        line.clear();
        let r = self.next_line_inner(line, max);
        self.say();
        r
    }

    fn next_line_inner(&mut self, line: &mut Vec<u8>, max: usize) -> std::io::Result<Next> {
        loop {
            if self.fill()? == 0 {
                if self.follow {
                    if self.finishing && self.ship_final_line && !self.partial.is_empty() {
                        if self.ready_to_switch()? {
                            return Ok(self.final_line(line));
                        }
                        return Ok(Next::Idle);
                    }
                    if self.at_end_following()? {
                        continue;
                    }
                    return Ok(Next::Idle);
                }
                if self.finishing {
                    // Not following: a rotated file is finished at its end.
                    if self.ship_final_line && !self.partial.is_empty() {
                        return Ok(self.final_line(line));
                    }
                    if let Some(path) = self.path.clone() {
                        if self.switch(&path)? {
                            continue;
                        }
                    }
                }
                if self.partial.is_empty() || !self.ship_final_line {
                    return Ok(Next::End {
                        partial: self.partial.len() as u64,
                    });
                }
                // The input is complete: its last line is a record although no newline ends it.
                return Ok(self.final_line(line));
            }
            let buf = &self.buf[self.pos..self.end];
            if self.after_unterminated {
                if buf[0] != b'\n' {
                    return Ok(Next::Continued {
                        offset: self.offset,
                    });
                }
                // The newline that ends the line shipped earlier: consumed, not a new line.
                self.consume(1);
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
                    self.consume(i + 1);
                    self.hasher.update(&self.partial);
                    self.hasher.update(b"\n");
                    self.offset += self.partial.len() as u64 + 1;
                    self.lines += 1;
                    self.unterminated = false;
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
                    self.consume(n);
                }
            }
        }
    }

    /// Following a rotated file at its end: it is finished (quiet long enough) and a file
    /// waits at the path.
    fn ready_to_switch(&self) -> std::io::Result<bool> {
        let (Some(path), Some(o)) = (&self.path, self.open()) else {
            return Ok(false);
        };
        let there = match std::fs::metadata(path) {
            Ok(md) => FileId::of(&md) != o.id,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
            Err(e) => return Err(e),
        };
        Ok(there && unchanged_for(&o.file.metadata()?) >= self.rotated_quiet)
    }

    /// Hands out the partial line as a record of its own.
    fn final_line(&mut self, line: &mut Vec<u8>) -> Next {
        self.hasher.update(&self.partial);
        self.offset += self.partial.len() as u64;
        self.lines += 1;
        self.unterminated = true;
        std::mem::swap(line, &mut self.partial);
        self.partial.clear();
        Next::Line
    }

    fn too_long(&self) -> Next {
        Next::TooLong {
            line: self.lines + 1,
            offset: self.offset,
        }
    }

    /// In follow mode, while idle: prints what changed about the input (a rotation, a
    /// truncation, bytes written to a rotated file after it was finished).
    ///
    /// # Errors
    /// The file left at the last rotation cannot be looked at.
    pub fn check_followed(&mut self) -> CliResult<()> {
        if self.follow && !self.finishing {
            self.check_left().map_err(|e| {
                format!("cannot look at the rotated input of {}: {e}", self.shown())
            })?;
        }
        self.say();
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

    fn drain(s: &mut Source) -> Vec<String> {
        let mut out = Vec::new();
        let mut line = Vec::new();
        while let Next::Line = s.next_line(&mut line, 100).unwrap() {
            out.push(String::from_utf8(line.clone()).unwrap());
        }
        out
    }

    #[test]
    fn a_renamed_file_is_finished_then_the_new_one_read_from_its_start() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("app.log");
        std::fs::write(&p, b"a\nb\n").unwrap();
        let (s, _) = Source::open_file(&p, 0).unwrap();
        let mut s = s.follow(true).quiet(true).rotated_quiet(Duration::ZERO);
        assert_eq!(drain(&mut s), ["a", "b"]);
        let old_id = s.mark().file;
        let mut old = std::fs::OpenOptions::new().append(true).open(&p).unwrap();
        std::fs::rename(&p, d.path().join("app.log.1")).unwrap();
        std::io::Write::write_all(&mut old, b"c\ntorn").unwrap();
        // No new file yet: the old one is read on, and nothing more happens.
        assert_eq!(drain(&mut s), ["c"]);
        assert_eq!(drain(&mut s), Vec::<String>::new());
        assert_eq!(s.mark().file, old_id);
        std::fs::write(&p, b"new\n").unwrap();
        // The torn last line of the rotated file is not shipped without --ship-final-line.
        assert_eq!(drain(&mut s), ["new"]);
        assert_ne!(s.mark().file, old_id);
        assert_eq!((s.offset(), s.lines()), (4, 1));
    }

    #[test]
    fn a_truncated_file_is_read_again_from_its_start() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("app.log");
        std::fs::write(&p, b"one\ntwo\n").unwrap();
        let (s, _) = Source::open_file(&p, 0).unwrap();
        let mut s = s.follow(true).quiet(true);
        assert_eq!(drain(&mut s), ["one", "two"]);
        // Rewritten in place past the old end: the first bytes tell.
        std::fs::write(&p, b"three\nfour\nfive\n").unwrap();
        assert_eq!(drain(&mut s), ["three", "four", "five"]);
        assert_eq!(s.offset(), 16);
        let (again, prefix) = Source::open_file(&p, 16).unwrap();
        assert_eq!(prefix.hash, s.mark().hash());
        assert_eq!(again.lines(), 3);
    }
}
