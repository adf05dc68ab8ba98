//! Target URLs made safe to print: the one masking rule every target crate and the command
//! line use for errors, logs and reports (in the core, which has no dependencies, so that
//! every crate and every build of the command line has it).

/// `text` with its password (and a bare token in the user part, except PostgreSQL's user name)
/// replaced by `***`, and the values of query parameters that look secret (`password`,
/// `token`, `secret`, `apikey`, `auth`, `credential`) too.
///
/// It works on text that is not a valid URL as well, which is where it matters most: a
/// password holding `#`, `?`, `/` or `@` unencoded makes the URL unparsable (and ends up in
/// the parse error). When it cannot tell a password holding such characters from an `@` in
/// the path, it masks more rather than less: everything from the user name's `:` to the last
/// `@` of the text.
///
/// ```
/// use walsink::redact_url;
/// assert_eq!(redact_url("http://alice:PW#x@h:9/in"), "http://alice:***@h:9/in");
/// assert_eq!(redact_url("nats://s3cr3t@h:4222/?stream=s"), "nats://***@h:4222/?stream=s");
/// assert_eq!(redact_url("postgres://alice@db/app"), "postgres://alice@db/app");
/// assert_eq!(redact_url("http://h/p?token=abc&n=1"), "http://h/p?token=***&n=1");
/// ```
pub fn redact_url(text: &str) -> String {
    let Some((scheme, rest)) = text.split_once("://") else {
        return text.to_string();
    };
    let (userinfo, after) = match userinfo_end(rest) {
        Some(at) => (Some(&rest[..at]), &rest[at + 1..]),
        None => (None, rest),
    };
    let masked = userinfo.map(|u| match u.split_once(':') {
        Some((user, _)) if !has_delimiter(user) => format!("{user}:***@"),
        Some(_) => "***@".to_string(),
        None if matches!(scheme, "postgres" | "postgresql") && !has_delimiter(u) => {
            format!("{u}@")
        }
        None => "***@".to_string(),
    });
    format!(
        "{scheme}://{}{}",
        masked.unwrap_or_default(),
        mask_query(after)
    )
}

/// Where the user information of `rest` (the text after `://`) ends: the `@` before the host.
fn userinfo_end(rest: &str) -> Option<usize> {
    let last = rest.rfind('@')?;
    let candidate = &rest[..last];
    if !has_delimiter(candidate) {
        return Some(last);
    }
    // A delimiter before the last `@`: either a password holding it, or an `@` in the path or
    // query. The user information is what comes before the first delimiter (as a URL parser
    // reads it); if that part holds `:` or `@`, a password may run on past the delimiter, so
    // all of it up to the last `@` is treated as user information.
    let first = candidate.find(['/', '?', '#']).unwrap_or(candidate.len());
    if candidate[..first].contains([':', '@']) {
        Some(last)
    } else {
        None
    }
}

fn has_delimiter(s: &str) -> bool {
    s.contains(['/', '?', '#'])
}

/// The host, path, query and fragment with secret query values masked.
fn mask_query(after: &str) -> String {
    let Some((path, query)) = after.split_once('?') else {
        return after.to_string();
    };
    let (query, fragment) = match query.split_once('#') {
        Some((q, f)) => (q, format!("#{f}")),
        None => (query, String::new()),
    };
    let params: Vec<String> = query
        .split('&')
        .map(|kv| match kv.split_once('=') {
            Some((k, _)) if secret_param(k) => format!("{k}=***"),
            _ => kv.to_string(),
        })
        .collect();
    format!("{path}?{}{fragment}", params.join("&"))
}

/// Query parameter names that carry secrets.
fn secret_param(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    [
        "pass",
        "secret",
        "token",
        "apikey",
        "api_key",
        "auth",
        "credential",
    ]
    .iter()
    .any(|s| n.contains(s))
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn passwords_tokens_and_secret_parameters_never_show() {
        let cases = [
            (
                "postgres://alice:s3cret@db:5432/app?table=t",
                "postgres://alice:***@db:5432/app?table=t",
            ),
            ("redis://:pw@h:6379/0", "redis://:***@h:6379/0"),
            ("redis://:p@ss@h:6379/0", "redis://:***@h:6379/0"),
            ("nats://h:4222/?stream=s", "nats://h:4222/?stream=s"),
            (
                "nats://s3cr3t@h:4222/?stream=s",
                "nats://***@h:4222/?stream=s",
            ),
            ("postgres://alice@db/app", "postgres://alice@db/app"),
            (
                "http://h/p?max_records=5&token=abc&password=x#f",
                "http://h/p?max_records=5&token=***&password=***#f",
            ),
            ("redis://h/0?key=orders", "redis://h/0?key=orders"),
            // Passwords holding URL delimiters: the URL does not parse, and nothing of the
            // password may show.
            (
                "http://alice:PW#SECRETtail@127.0.0.1:9/in",
                "http://alice:***@127.0.0.1:9/in",
            ),
            ("http://alice:PW?SECRET@h/in", "http://alice:***@h/in"),
            ("http://alice:a/SECRET@h/in", "http://alice:***@h/in"),
            (
                "postgres://bob:x#SECRET@db/app",
                "postgres://bob:***@db/app",
            ),
            ("http://alice:p@SECRET/rest@h/in", "http://alice:***@h/in"),
            // An `@` in the path or query only, without user information: nothing to mask.
            ("http://h/p?email=a@b.com", "http://h/p?email=a@b.com"),
            ("not a url", "not a url"),
        ];
        for (input, want) in cases {
            let got = redact_url(input);
            assert_eq!(got, want, "{input}");
            for secret in ["s3cret", "SECRET", "s3cr3t", "abc"] {
                assert!(!got.contains(secret), "{got} shows {secret}");
            }
        }
    }
}
