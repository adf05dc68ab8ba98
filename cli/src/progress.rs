//! Progress on stderr: bars and spinners on a terminal, and for `pipe` a [`Reporter`] that
//! prints one-line reports when stderr is not a terminal; nothing with `--quiet`.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;

/// A bar of `len` units, or a hidden one when progress should not show.
pub fn bar(len: u64, quiet: bool, template: &str) -> ProgressBar {
    if quiet || !std::io::stderr().is_terminal() {
        return ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::hidden());
    }
    let pb = ProgressBar::new(len);
    if let Ok(style) = ProgressStyle::with_template(template) {
        pb.set_style(style.progress_chars("=> "));
    }
    pb
}

/// A spinner with a message, or a hidden one.
pub fn spinner(quiet: bool) -> ProgressBar {
    if quiet || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new_spinner();
    pb.enable_steady_tick(std::time::Duration::from_millis(120));
    pb
}

/// `1 epoch`, `2 epochs`.
pub fn plural(n: u64, word: &str) -> String {
    if n == 1 {
        format!("1 {word}")
    } else {
        format!("{n} {word}s")
    }
}

/// Where a run stands, for a progress report.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// Input bytes consumed so far (the bar's position).
    pub offset: u64,
    /// The input's size now, when it is a file (the bar's length; it grows with `--follow`).
    pub size: Option<u64>,
    /// Records read into the log in this run.
    pub read: u64,
    /// Records delivered to the target in this run.
    pub delivered: u64,
    /// The newest checkpoint the target committed.
    pub committed: Option<u64>,
    /// Records in the log not yet delivered.
    pub backlog: u64,
}

/// Progress of `pipe` (and `cdc --input`) on stderr: a bar on a terminal, a one-line report
/// every `interval` otherwise, and in both a line whenever delivery fails and is retried
/// (at the first failure of a streak, then once per interval while it lasts). `--quiet`
/// silences all of it.
pub struct Reporter {
    /// The command's name at the start of each line (`pipe`, `cdc`).
    name: &'static str,
    pb: indicatif::ProgressBar,
    quiet: bool,
    /// Lines instead of a bar (stderr is not a terminal).
    lines: bool,
    interval: std::time::Duration,
    last_line: std::time::Instant,
    last_bar: std::time::Instant,
    /// When the failure now being retried was last reported, and its attempt count.
    failure_noted: Option<(std::time::Instant, u32)>,
}

impl Reporter {
    /// A reporter for a run that starts at input offset `start` of an input of `size` bytes.
    pub fn new(
        name: &'static str,
        quiet: bool,
        interval: std::time::Duration,
        size: Option<u64>,
        start: u64,
    ) -> Reporter {
        let pb = bar(
            size.unwrap_or(0),
            quiet,
            &format!("{{spinner}} {name} [{{bar:40}}] {{bytes}}/{{total_bytes}} {{msg}}"),
        );
        pb.set_position(start);
        let now = std::time::Instant::now();
        Reporter {
            name,
            pb,
            quiet,
            lines: !std::io::stderr().is_terminal(),
            interval,
            last_line: now,
            last_bar: now,
            failure_noted: None,
        }
    }

    /// Brings the report up to date: cheap when nothing is due (`snap` is called only then).
    pub fn tick(&mut self, watch: &crate::deliver::Watch, snap: impl FnOnce() -> Snapshot) {
        if self.quiet {
            return;
        }
        let now = std::time::Instant::now();
        let line_due = self.lines && now.duration_since(self.last_line) >= self.interval;
        let bar_due = !self.lines && now.duration_since(self.last_bar).as_millis() >= 100;
        let failure = {
            let w = watch.lock().unwrap_or_else(|p| p.into_inner());
            match (&w.last_error, w.failing_since) {
                (Some(err), Some(since)) => Some((
                    err.clone(),
                    (w.last_class, w.last_code.clone()),
                    w.attempts,
                    since,
                )),
                _ => None,
            }
        };
        match failure {
            Some((err, (class, code), attempts, since)) => {
                let due = match self.failure_noted {
                    None => true,
                    Some((at, n)) => attempts > n && now.duration_since(at) >= self.interval,
                };
                if due {
                    let class = match class {
                        Some(walsink::SinkErrorClass::Permanent) => "permanent",
                        _ => "retryable",
                    };
                    let code = code.map_or(String::new(), |c| format!(" {c}"));
                    self.say(format!(
                        "{}: delivery is failing ({class} error{code}, attempt {attempts}, for {}); retrying: {}",
                        self.name,
                        humantime::format_duration(std::time::Duration::from_secs(
                            since.elapsed().as_secs()
                        )),
                        walsink::redact_url(&err)
                    ));
                    self.failure_noted = Some((now, attempts));
                }
            }
            None => self.failure_noted = None,
        }
        if !line_due && !bar_due {
            return;
        }
        let s = snap();
        if bar_due {
            self.last_bar = now;
            if let Some(size) = s.size {
                self.pb.set_length(size.max(s.offset));
            }
            self.pb.set_position(s.offset);
            self.pb
                .set_message(format!("{} delivered", plural(s.delivered, "record")));
        } else {
            self.last_line = now;
            let of_input = match s.size {
                Some(size) if size > 0 => format!(
                    " ({} of {}, {}%)",
                    indicatif::HumanBytes(s.offset),
                    indicatif::HumanBytes(size),
                    s.offset.min(size) * 100 / size
                ),
                _ => format!(" ({} of input)", indicatif::HumanBytes(s.offset)),
            };
            eprintln!(
                "{}: read {}{of_input}, delivered {}, {} waiting; committed through checkpoint {}",
                self.name,
                plural(s.read, "record"),
                plural(s.delivered, "record"),
                s.backlog,
                s.committed
                    .map_or("none yet".to_string(), |c| c.to_string())
            );
        }
    }

    /// Sets the bar's message (shown on a terminal only).
    pub fn set_message(&self, msg: &'static str) {
        self.pb.set_message(msg);
    }

    /// Removes the bar.
    pub fn finish(&self) {
        self.pb.finish_and_clear();
    }

    fn say(&self, line: String) {
        if self.lines {
            eprintln!("{line}");
        } else {
            self.pb.println(line);
        }
    }
}
