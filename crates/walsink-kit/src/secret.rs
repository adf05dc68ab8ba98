//! [`Secret`]: a password or token that never shows, and where it may come from.
//!
//! A secret on a command line shows in `ps` and in shell history, so every target takes its
//! password in one of three ways, at most one at a time:
//!
//! | source | URL | notes |
//! |---|---|---|
//! | the URL | `scheme://USER:PASSWORD@HOST/…` | percent-encoded; visible in `ps` |
//! | a file | `password_file=PATH` | the file's text, without one trailing newline (a Kubernetes or Docker secret mount) |
//! | the environment | `password_env=NAME` | the variable `NAME`, which must be set and not empty |
//!
//! Errors name the parameter, the file or the variable, never the text.

use std::fmt;
use std::path::Path;

use crate::{ConfigError, Params};

/// A secret text (a password or a token). `Debug` and `Display` show `***`; only
/// [`Secret::expose`] gives the text, for the one call that hands it to a client library.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps `text`.
    pub fn new(text: impl Into<String>) -> Secret {
        Secret(text.into())
    }

    /// The text, for the client library that sends it to the server.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// Reads a secret from the file at `path`: its text without one trailing `\n` or `\r\n`.
/// `param` names the URL parameter for the error; an empty file or one that is not UTF-8 is
/// refused. The error names the path and the reason, never the content.
pub fn from_file(target: &'static str, param: &str, path: &Path) -> Result<Secret, ConfigError> {
    let bytes = std::fs::read(path).map_err(|e| {
        ConfigError::new(
            target,
            param,
            format!("cannot read {}: {}", path.display(), io_reason(&e)),
        )
    })?;
    let mut text = String::from_utf8(bytes).map_err(|_| {
        ConfigError::new(
            target,
            param,
            format!("{} is not UTF-8 text", path.display()),
        )
    })?;
    if text.ends_with('\n') {
        text.pop();
        if text.ends_with('\r') {
            text.pop();
        }
    }
    if text.is_empty() {
        return Err(ConfigError::new(
            target,
            param,
            format!("{} is empty", path.display()),
        ));
    }
    Ok(Secret(text))
}

/// Reads a secret from the environment variable `var`, which must be set and not empty.
pub fn from_env(target: &'static str, param: &str, var: &str) -> Result<Secret, ConfigError> {
    match std::env::var(var) {
        Ok(v) if !v.is_empty() => Ok(Secret(v)),
        Ok(_) => Err(ConfigError::new(
            target,
            param,
            format!("the environment variable {var} is empty"),
        )),
        Err(std::env::VarError::NotPresent) => Err(ConfigError::new(
            target,
            param,
            format!("the environment variable {var} is not set"),
        )),
        Err(std::env::VarError::NotUnicode(_)) => Err(ConfigError::new(
            target,
            param,
            format!("the environment variable {var} is not UTF-8"),
        )),
    }
}

/// The secret of a URL: `inline` (the password part of the URL, already decoded) or one of
/// the parameters `file_param` (a path) and `env_param` (a variable name), taken from
/// `params`. Giving more than one is refused naming them; giving none is `Ok(None)`.
///
/// ```
/// use walsink_kit::{secret, Params};
///
/// let dir = tempfile::tempdir().unwrap();
/// let path = dir.path().join("pw");
/// std::fs::write(&path, "s3cret\n").unwrap();
/// let query = format!("password_file={}", path.display());
/// let mut p = Params::parse("redis", Some(&query)).unwrap();
/// let s = secret::resolve(&mut p, None, "password_file", "password_env").unwrap().unwrap();
/// assert_eq!(s.expose(), "s3cret");
/// assert_eq!(format!("{s:?} {s}"), "Secret(***) ***");
/// ```
pub fn resolve(
    params: &mut Params,
    inline: Option<String>,
    file_param: &str,
    env_param: &str,
) -> Result<Option<Secret>, ConfigError> {
    let file = params.non_empty(file_param)?;
    let env = params.non_empty(env_param)?;
    let given = [
        inline.is_some().then_some("a password in the URL"),
        file.is_some().then_some(file_param),
        env.is_some().then_some(env_param),
    ];
    let given: Vec<&str> = given.into_iter().flatten().collect();
    if given.len() > 1 {
        // Named by the parameter that makes the second way.
        let named = if file.is_some() {
            file_param
        } else {
            env_param
        };
        return Err(params.error(
            named,
            format!(
                "give the password one way only, not {}",
                given.join(" and ")
            ),
        ));
    }
    let target = params.target();
    if let Some(p) = file {
        return from_file(target, file_param, Path::new(&p)).map(Some);
    }
    if let Some(v) = env {
        return from_env(target, env_param, &v).map(Some);
    }
    Ok(inline.map(Secret))
}

fn io_reason(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::NotFound => "it does not exist".into(),
        std::io::ErrorKind::PermissionDenied => "permission denied".into(),
        _ => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(q: &str) -> Params {
        Params::parse("redis", Some(q)).unwrap()
    }

    #[test]
    fn a_secret_never_shows_in_debug_or_display() {
        let s = Secret::new("hunter2");
        assert!(!format!("{s:?}{s}{s:#?}").contains("hunter2"));
        assert_eq!(s.expose(), "hunter2");
    }

    #[test]
    fn a_password_file_loses_one_trailing_newline_only() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("pw");
        std::fs::write(&p, "a b\r\n").unwrap();
        assert_eq!(from_file("t", "password_file", &p).unwrap().expose(), "a b");
        std::fs::write(&p, "x\n\n").unwrap();
        assert_eq!(from_file("t", "password_file", &p).unwrap().expose(), "x\n");
    }

    #[test]
    fn a_missing_or_empty_file_is_named_without_its_content() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("absent");
        let e = from_file("t", "password_file", &p).unwrap_err().to_string();
        assert!(
            e.contains("password_file") && e.contains("does not exist"),
            "{e}"
        );
        std::fs::write(&p, "\n").unwrap();
        let e = from_file("t", "password_file", &p).unwrap_err().to_string();
        assert!(e.contains("is empty"), "{e}");
    }

    #[test]
    fn an_unset_variable_is_named() {
        let e = from_env("t", "password_env", "WALSINK_KIT_TEST_SURELY_UNSET")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("WALSINK_KIT_TEST_SURELY_UNSET is not set"),
            "{e}"
        );
    }

    #[test]
    fn two_sources_at_once_are_refused() {
        let mut p = params("password_env=X&password_file=/y");
        let e = resolve(&mut p, None, "password_file", "password_env").unwrap_err();
        assert!(e.to_string().contains("one way only"), "{e}");
        let mut p = params("password_env=X");
        let e = resolve(
            &mut p,
            Some("inline".into()),
            "password_file",
            "password_env",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("password in the URL") && !e.contains("inline"),
            "{e}"
        );
    }

    #[test]
    fn no_source_is_none_and_the_url_password_is_kept() {
        let mut p = params("key=k");
        assert_eq!(
            resolve(&mut p, None, "password_file", "password_env").unwrap(),
            None
        );
        let s = resolve(&mut p, Some("pw".into()), "password_file", "password_env").unwrap();
        assert_eq!(s.unwrap().expose(), "pw");
    }
}
