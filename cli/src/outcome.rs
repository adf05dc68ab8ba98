//! What a command ends with: [`CliResult`], and the two failures the exit code tells apart
//! ([`Refused`]: exit 1, [`JsonShown`]: the JSON object is printed already).

/// The error type of the commands.
pub type CliResult<T> = Result<T, Box<dyn std::error::Error>>;

/// An operation refused for a reason the user can act on (exit code 1).
#[derive(Debug)]
pub struct Refused(pub String);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refused {}

/// A failure whose JSON object the command already printed (its summary carries the error):
/// the message still goes to stderr, and no second object to stdout.
#[derive(Debug)]
pub struct JsonShown(pub String);

impl std::fmt::Display for JsonShown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for JsonShown {}
