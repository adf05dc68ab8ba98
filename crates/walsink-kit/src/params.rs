//! The parameter grammar of target URLs: one decoding rule, one duration grammar, one size
//! grammar and one boolean vocabulary for every target.
//!
//! | kind | accepted | examples |
//! |---|---|---|
//! | text | percent-decoded UTF-8; `+` is a plus sign, `%20` a space | `key=a%2Fb` |
//! | duration | [humantime](https://docs.rs/humantime): numbers with units, optionally spaced | `500ms`, `10s`, `1h30m` |
//! | size | bytes, or a number with `KiB`, `MiB`, `GiB` (powers of 1024) or `KB`, `MB`, `GB` (powers of 1000) | `65536`, `64KiB`, `1MB` |
//! | boolean | `true`/`false`, `yes`/`no`, `on`/`off`, `1`/`0` (any case) | `create=on` |
//!
//! A parameter given twice is refused, and [`Params::finish`] refuses every parameter that
//! the target did not take, naming it, so a misspelt option never passes silently.

use std::str::FromStr;
use std::time::Duration;

use crate::ConfigError;

/// Decodes `%XX` escapes; `+` stays a plus sign (URL query strings are not HTML forms, and a
/// password holding `+` must reach the server unchanged). A `%` that does not start a
/// two-digit hex escape is refused (write a literal `%` as `%25`), as libpq refuses it: taken
/// as it stands, it would reach the server as something the user did not mean.
pub fn percent_decode(s: &str) -> Result<String, String> {
    let b = s.as_bytes();
    if let Some(i) = (0..b.len()).find(|&i| {
        b[i] == b'%'
            && !(b.get(i + 1).is_some_and(u8::is_ascii_hexdigit)
                && b.get(i + 2).is_some_and(u8::is_ascii_hexdigit))
    }) {
        return Err(format!(
            "has a % at byte {i} that starts no two-digit hex escape (write a literal % as %25)"
        ));
    }
    percent_encoding::percent_decode_str(s)
        .decode_utf8()
        .map(|c| c.into_owned())
        .map_err(|_| "is not UTF-8 once percent-decoded".to_string())
}

/// Parses a duration: `500ms`, `10s`, `1h30m`, `2m 5s`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s.trim())
        .map_err(|e| format!("{s:?} is not a duration such as 500ms, 10s or 1h30m ({e})"))
}

/// Parses a byte size: `65536`, `64KiB`, `1MiB`, `2GiB`, `64KB`, `1MB`, `1GB`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let bad = || format!("{s:?} is not a size such as 65536, 64KiB or 1MiB");
    let n: u64 = num.parse().map_err(|_| bad())?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kib" | "k" => 1 << 10,
        "mib" | "m" => 1 << 20,
        "gib" | "g" => 1 << 30,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        _ => return Err(bad()),
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("{s:?} is larger than {} bytes", u64::MAX))
}

/// Parses a boolean: `true`/`false`, `yes`/`no`, `on`/`off`, `1`/`0`, in any case.
pub fn parse_bool(s: &str) -> Result<bool, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "true" | "yes" | "on" | "1" => Ok(true),
        "false" | "no" | "off" | "0" => Ok(false),
        _ => Err(format!(
            "{s:?} is not a boolean (true/false, yes/no, on/off or 1/0)"
        )),
    }
}

/// The parameters of one target URL's query string, decoded, each taken at most once.
///
/// ```
/// use walsink_kit::Params;
/// use std::time::Duration;
///
/// let mut p = Params::parse("redis", Some("key=jobs&timeout=1h30m&password=a+b")).unwrap();
/// assert_eq!(p.text("key").unwrap().as_deref(), Some("jobs"));
/// assert_eq!(p.duration("timeout").unwrap(), Some(Duration::from_secs(5400)));
/// assert_eq!(p.text("password").unwrap().as_deref(), Some("a+b"));
/// p.finish().unwrap();
///
/// let mut p = Params::parse("redis", Some("key=a&kye=b")).unwrap();
/// p.text("key").unwrap();
/// assert!(p.finish().unwrap_err().to_string().contains("kye"));
/// ```
#[derive(Clone)]
pub struct Params {
    target: &'static str,
    pairs: Vec<(String, Option<String>)>,
}

impl std::fmt::Debug for Params {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Values may be secrets: only the names are shown.
        let names: Vec<&str> = self.pairs.iter().map(|(k, _)| k.as_str()).collect();
        f.debug_struct("Params")
            .field("target", &self.target)
            .field("remaining", &names)
            .finish()
    }
}

impl Params {
    /// Decodes `query` (the part of the URL after `?`, without it) for `target` (`redis`,
    /// `nats`, … as error messages start). Refuses a parameter given twice, an empty name
    /// and text that is not UTF-8 once decoded.
    pub fn parse(target: &'static str, query: Option<&str>) -> Result<Params, ConfigError> {
        let mut pairs: Vec<(String, Option<String>)> = Vec::new();
        for part in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (k, v) = match part.split_once('=') {
                Some((k, v)) => (k, Some(v)),
                None => (part, None),
            };
            let name = percent_decode(k).map_err(|e| ConfigError::new(target, k, e))?;
            if name.is_empty() {
                return Err(ConfigError::new(target, "URL", "a parameter has no name"));
            }
            let value = match v {
                Some(v) => Some(percent_decode(v).map_err(|e| ConfigError::new(target, &name, e))?),
                None => None,
            };
            if pairs.iter().any(|(n, _)| *n == name) {
                return Err(ConfigError::new(
                    target,
                    &name,
                    "is given more than once; give it once",
                ));
            }
            pairs.push((name, value));
        }
        Ok(Params { target, pairs })
    }

    /// The target these parameters belong to.
    pub fn target(&self) -> &'static str {
        self.target
    }

    /// An error about parameter `name`, for checks the target makes itself.
    pub fn error(&self, name: &str, reason: impl Into<String>) -> ConfigError {
        ConfigError::new(self.target, name, reason)
    }

    /// Whether `name` is still there to take.
    pub fn contains(&self, name: &str) -> bool {
        self.pairs.iter().any(|(n, _)| n == name)
    }

    /// Takes `name` as text; `Ok(None)` when it is absent. `name` alone (no `=`) is refused:
    /// every parameter of a target URL has a value.
    pub fn text(&mut self, name: &str) -> Result<Option<String>, ConfigError> {
        let Some(i) = self.pairs.iter().position(|(n, _)| n == name) else {
            return Ok(None);
        };
        match self.pairs.remove(i).1 {
            Some(v) => Ok(Some(v)),
            None => Err(self.error(name, "has no value (write NAME=VALUE)")),
        }
    }

    /// Takes `name` as non-empty text.
    pub fn non_empty(&mut self, name: &str) -> Result<Option<String>, ConfigError> {
        match self.text(name)? {
            Some(v) if v.is_empty() => Err(self.error(name, "is empty")),
            other => Ok(other),
        }
    }

    /// Takes `name` and converts it with `parse`, whose error becomes the reason.
    pub fn parsed<T>(
        &mut self,
        name: &str,
        parse: impl FnOnce(&str) -> Result<T, String>,
    ) -> Result<Option<T>, ConfigError> {
        match self.text(name)? {
            None => Ok(None),
            Some(v) => parse(&v).map(Some).map_err(|e| self.error(name, e)),
        }
    }

    /// Takes `name` as a number of type `T` (`usize`, `u16`, …).
    pub fn number<T: FromStr>(&mut self, name: &str) -> Result<Option<T>, ConfigError> {
        self.parsed(name, |v| {
            v.trim()
                .parse::<T>()
                .map_err(|_| format!("{v:?} is not a whole number in range"))
        })
    }

    /// Takes `name` as a positive number of type `T`.
    pub fn positive<T: FromStr + Default + PartialEq>(
        &mut self,
        name: &str,
    ) -> Result<Option<T>, ConfigError> {
        match self.number::<T>(name)? {
            Some(v) if v == T::default() => Err(self.error(name, "must be at least 1")),
            other => Ok(other),
        }
    }

    /// Takes `name` as a duration ([`parse_duration`]).
    pub fn duration(&mut self, name: &str) -> Result<Option<Duration>, ConfigError> {
        self.parsed(name, parse_duration)
    }

    /// Takes `name` as a byte size ([`parse_size`]).
    pub fn size(&mut self, name: &str) -> Result<Option<u64>, ConfigError> {
        self.parsed(name, parse_size)
    }

    /// Takes `name` as a boolean ([`parse_bool`]).
    pub fn bool(&mut self, name: &str) -> Result<Option<bool>, ConfigError> {
        self.parsed(name, parse_bool)
    }

    /// Takes `name` as one of `choices`, returning its index.
    pub fn choice(&mut self, name: &str, choices: &[&str]) -> Result<Option<usize>, ConfigError> {
        self.parsed(name, |v| {
            choices
                .iter()
                .position(|c| c.eq_ignore_ascii_case(v))
                .ok_or_else(|| format!("{v:?} is not one of {}", choices.join(", ")))
        })
    }

    /// Refuses every parameter that was not taken, naming the first (`known` lists the
    /// target's parameters for the message).
    pub fn finish_known(self, known: &[&str]) -> Result<(), ConfigError> {
        match self.pairs.first() {
            None => Ok(()),
            Some((name, _)) => Err(ConfigError::new(
                self.target,
                name,
                if known.is_empty() {
                    "is not a parameter of this target".to_string()
                } else {
                    format!(
                        "is not a parameter of this target (known: {})",
                        known.join(", ")
                    )
                },
            )),
        }
    }

    /// Refuses every parameter that was not taken, naming the first.
    pub fn finish(self) -> Result<(), ConfigError> {
        self.finish_known(&[])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plus_stays_plus_and_percent_escapes_decode() {
        let mut p = Params::parse("t", Some("a=x+y%20z%2B%25")).unwrap();
        assert_eq!(p.text("a").unwrap().unwrap(), "x+y z+%");
    }

    #[test]
    fn a_percent_that_starts_no_escape_is_refused_naming_the_parameter() {
        for bad in ["a=50%", "a=%zz", "a=%2", "a=x%g1"] {
            let e = Params::parse("t", Some(bad)).unwrap_err().to_string();
            assert!(e.contains(": a: ") && e.contains("%25"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_parameter_given_twice_is_refused_by_name() {
        let e = Params::parse("redis", Some("key=a&key=b")).unwrap_err();
        assert_eq!(e.parameter, "key");
        assert!(e.to_string().starts_with("redis sink URL: key:"), "{e}");
    }

    #[test]
    fn the_duration_grammar_takes_compound_units_and_refuses_bare_numbers() {
        assert_eq!(parse_duration("1h30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2m 5s").unwrap(), Duration::from_secs(125));
        assert!(parse_duration("10").is_err());
        assert!(parse_duration("soon").is_err());
    }

    #[test]
    fn the_size_grammar_takes_binary_and_decimal_units() {
        assert_eq!(parse_size("65536").unwrap(), 65536);
        assert_eq!(parse_size("64KiB").unwrap(), 65536);
        assert_eq!(parse_size("1MiB").unwrap(), 1 << 20);
        assert_eq!(parse_size("1MB").unwrap(), 1_000_000);
        assert_eq!(parse_size("2gib").unwrap(), 2 << 30);
        assert!(parse_size("1.5MiB").is_err());
        assert!(parse_size("KiB").is_err());
        assert!(parse_size("99999999999999999999GiB").is_err());
        assert!(parse_size("18446744073709551615GiB").is_err());
    }

    #[test]
    fn the_boolean_vocabulary_is_the_same_everywhere() {
        for t in ["true", "YES", "on", "1"] {
            assert!(parse_bool(t).unwrap(), "{t}");
        }
        for f in ["false", "No", "OFF", "0"] {
            assert!(!parse_bool(f).unwrap(), "{f}");
        }
        assert!(parse_bool("maybe").is_err());
    }

    #[test]
    fn unknown_parameters_are_refused_and_values_never_shown_in_debug() {
        let mut p = Params::parse("nats", Some("stream=s&password=hunter2&bogus=1")).unwrap();
        p.text("stream").unwrap();
        let dbg = format!("{p:?}");
        assert!(!dbg.contains("hunter2"), "{dbg}");
        p.text("password").unwrap();
        let e = p.finish_known(&["stream", "password"]).unwrap_err();
        assert_eq!(e.parameter, "bogus");
        assert!(e.to_string().contains("known: stream, password"), "{e}");
    }

    #[test]
    fn a_parameter_without_a_value_is_refused_when_taken() {
        let mut p = Params::parse("t", Some("create")).unwrap();
        assert!(p
            .bool("create")
            .unwrap_err()
            .to_string()
            .contains("no value"));
    }

    #[test]
    fn numbers_choices_and_positive_values_name_the_parameter() {
        let mut p = Params::parse("t", Some("n=0&m=x&mode=HASH&k=7")).unwrap();
        assert_eq!(p.positive::<usize>("n").unwrap_err().parameter, "n");
        assert_eq!(p.number::<u16>("m").unwrap_err().parameter, "m");
        assert_eq!(p.choice("mode", &["list", "hash"]).unwrap(), Some(1));
        assert_eq!(p.number::<u16>("k").unwrap(), Some(7));
        assert_eq!(p.number::<u16>("absent").unwrap(), None);
        p.finish().unwrap();
    }
}
