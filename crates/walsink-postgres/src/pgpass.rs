//! The password file, read as libpq reads it (`~/.pgpass`, `PGPASSFILE`, `passfile=`).
//!
//! Each line is `hostname:port:database:username:password`. A field that is exactly `*`
//! matches anything; `\:` is a colon and `\\` a backslash inside a field (a backslash escapes
//! the character after it); lines starting with `#` and empty lines are skipped; the first
//! line that matches wins. The password ends at the first unescaped `:` or at the end of the
//! line. A file that grants any access to its group or to others, or that is not a regular
//! file, is ignored with a warning (libpq: "permissions should be u=rw (0600) or less"); a file
//! that does not exist is ignored silently.

use std::path::{Path, PathBuf};

/// What a line of the password file is matched against: the connection walsink makes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lookup<'a> {
    /// The host name as given (`localhost` for a Unix socket in the default directory).
    pub host: &'a str,
    /// The port, as a decimal number.
    pub port: &'a str,
    /// The database name.
    pub database: &'a str,
    /// The user name.
    pub user: &'a str,
}

/// `buf` starts with a field matching `token` (libpq's `pwdfMatchesString`): the rest of
/// the line after the field's `:`, or `None`.
fn matches<'b>(buf: &'b [u8], token: &[u8]) -> Option<&'b [u8]> {
    if buf.starts_with(b"*:") {
        return Some(&buf[2..]);
    }
    let mut i = 0;
    let mut t = 0;
    let mut bslash = false;
    while i < buf.len() {
        if buf[i] == b'\\' && !bslash {
            i += 1;
            bslash = true;
            if i == buf.len() {
                return None;
            }
        }
        if buf[i] == b':' && t == token.len() && !bslash {
            return Some(&buf[i + 1..]);
        }
        bslash = false;
        if t == token.len() {
            return None;
        }
        if buf[i] == token[t] {
            i += 1;
            t += 1;
        } else {
            return None;
        }
    }
    None
}

/// The password of the first line of `text` (a password file's content) that matches `who`.
pub fn find(text: &str, who: &Lookup<'_>) -> Option<String> {
    for line in text.split('\n') {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let rest = [who.host, who.port, who.database, who.user]
            .iter()
            .try_fold(line.as_bytes(), |rest, field| {
                matches(rest, field.as_bytes())
            });
        let Some(rest) = rest else { continue };
        // De-escape the password; it ends at an unescaped ':'.
        let mut out = Vec::with_capacity(rest.len());
        let mut i = 0;
        while i < rest.len() && rest[i] != b':' {
            if rest[i] == b'\\' && i + 1 < rest.len() {
                i += 1;
            }
            out.push(rest[i]);
            i += 1;
        }
        // The line came from a `str` and escapes drop only ASCII backslashes.
        return Some(String::from_utf8_lossy(&out).into_owned());
    }
    None
}

/// The password file libpq would read: `passfile` (the URL parameter), else the environment
/// variable `PGPASSFILE`, else `$HOME/.pgpass`.
pub fn default_path(passfile: Option<&str>) -> Option<PathBuf> {
    if let Some(p) = passfile.filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    if let Some(p) = std::env::var_os("PGPASSFILE").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(|h| Path::new(&h).join(".pgpass"))
}

/// Why a password file was not used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Skipped {
    /// It does not exist (not worth a warning: libpq is silent too).
    Missing,
    /// It is not a regular file.
    NotAFile,
    /// Its group or others have access to it (mode shown in octal).
    Open(u32),
    /// It could not be read (the reason).
    Unreadable(String),
}

/// Reads the password file at `path`, or says why it is not used.
pub fn read(path: &Path) -> Result<String, Skipped> {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(Skipped::Missing),
        Err(e) => return Err(Skipped::Unreadable(e.to_string())),
    };
    if !meta.is_file() {
        return Err(Skipped::NotAFile);
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = meta.permissions().mode();
        if mode & 0o077 != 0 {
            return Err(Skipped::Open(mode & 0o777));
        }
    }
    std::fs::read(path)
        .map_err(|e| Skipped::Unreadable(e.to_string()))
        .map(|b| String::from_utf8_lossy(&b).into_owned())
}

/// The password for `who` from the password file at `path`, with libpq's warnings (through
/// `tracing`) for a file that is ignored. Never logs the content.
pub fn lookup(path: &Path, who: &Lookup<'_>) -> Option<String> {
    match read(path) {
        Ok(text) => find(&text, who),
        Err(Skipped::Missing) => None,
        Err(Skipped::NotAFile) => {
            tracing::warn!(
                "password file {} is not a plain file: ignored",
                path.display()
            );
            None
        }
        Err(Skipped::Open(mode)) => {
            tracing::warn!(
                "password file {} has group or world access (mode {mode:o}): ignored; permissions should be u=rw (0600) or less (chmod 0600 {})",
                path.display(),
                path.display()
            );
            None
        }
        Err(Skipped::Unreadable(why)) => {
            tracing::warn!("password file {} cannot be read: {why}", path.display());
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn who<'a>(host: &'a str, port: &'a str, db: &'a str, user: &'a str) -> Lookup<'a> {
        Lookup {
            host,
            port,
            database: db,
            user,
        }
    }

    #[test]
    fn the_first_matching_line_wins() {
        let text = "db1:5432:app:alice:first\n*:*:*:alice:second\n*:*:*:*:third\n";
        assert_eq!(
            find(text, &who("db1", "5432", "app", "alice")).as_deref(),
            Some("first")
        );
        assert_eq!(
            find(text, &who("db2", "5432", "app", "alice")).as_deref(),
            Some("second")
        );
        assert_eq!(
            find(text, &who("db2", "6543", "x", "bob")).as_deref(),
            Some("third")
        );
        assert_eq!(
            find(
                "db1:5432:app:alice:p\n",
                &who("db1", "5433", "app", "alice")
            ),
            None
        );
    }

    #[test]
    fn a_star_matches_only_as_a_whole_field() {
        let text = "db*:5432:app:alice:p\n";
        assert_eq!(find(text, &who("db1", "5432", "app", "alice")), None);
        assert_eq!(
            find(text, &who("db*", "5432", "app", "alice")).as_deref(),
            Some("p")
        );
        // An escaped star is a literal star.
        let text = "\\*:5432:app:alice:q\n";
        assert_eq!(find(text, &who("h", "5432", "app", "alice")), None);
        assert_eq!(
            find(text, &who("*", "5432", "app", "alice")).as_deref(),
            Some("q")
        );
    }

    #[test]
    fn escapes_hold_colons_and_backslashes() {
        let text = "h:5432:my\\:db:us\\\\er:pa\\:ss\\\\word:ignored\n";
        assert_eq!(
            find(text, &who("h", "5432", "my:db", "us\\er")).as_deref(),
            Some("pa:ss\\word")
        );
        // Unescaped, the colon ends the field.
        assert_eq!(find(text, &who("h", "5432", "my", "us\\er")), None);
    }

    #[test]
    fn comments_blank_lines_and_crlf_are_handled() {
        let text = "# h:5432:app:alice:commented\r\n\r\nh:5432:app:alice:real\r\n";
        assert_eq!(
            find(text, &who("h", "5432", "app", "alice")).as_deref(),
            Some("real")
        );
    }

    #[test]
    fn a_short_line_or_an_empty_password_field() {
        assert_eq!(
            find("h:5432:app:alice\n", &who("h", "5432", "app", "alice")),
            None
        );
        assert_eq!(
            find("h:5432:app\n", &who("h", "5432", "app", "alice")),
            None
        );
        assert_eq!(
            find("h:5432:app:alice:\n", &who("h", "5432", "app", "alice")).as_deref(),
            Some("")
        );
        // The last line needs no newline.
        assert_eq!(
            find("h:5432:app:alice:pw", &who("h", "5432", "app", "alice")).as_deref(),
            Some("pw")
        );
    }

    #[test]
    fn passfile_beats_pgpassfile_beats_home() {
        // The process environment is shared by the tests: only the parameter is checked
        // here; the variables are covered by the integration test.
        assert_eq!(
            default_path(Some("/x/pass")),
            Some(PathBuf::from("/x/pass"))
        );
    }

    #[cfg(unix)]
    #[test]
    fn a_file_open_to_others_is_ignored_and_a_private_one_read() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("pgpass");
        std::fs::write(&p, "*:*:*:*:pw\n").unwrap();
        let w = who("h", "5432", "d", "u");
        for mode in [0o644, 0o640, 0o604, 0o610] {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
            assert_eq!(read(&p), Err(Skipped::Open(mode)), "{mode:o}");
            assert_eq!(lookup(&p, &w), None, "{mode:o}");
        }
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(lookup(&p, &w).as_deref(), Some("pw"));
        assert_eq!(read(&dir.path().join("absent")), Err(Skipped::Missing));
        assert_eq!(read(dir.path()), Err(Skipped::NotAFile));
    }
}
