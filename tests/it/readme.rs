//! The README's two commands stay true: the first runs the demo, the second is the test
//! command that `.ci/run` calls.

#[test]
fn readme_commands_match_ci() {
    let root = env!("CARGO_MANIFEST_DIR");
    let readme = std::fs::read_to_string(format!("{root}/README.md")).unwrap();
    let ci = std::fs::read_to_string(format!("{root}/.ci/run")).unwrap();
    let block = readme
        .split("```bash\n")
        .nth(1)
        .expect("a bash block")
        .split("```")
        .next()
        .unwrap();
    let commands: Vec<&str> = block
        .lines()
        .map(|l| l.split('#').next().unwrap().trim())
        .collect();
    assert_eq!(commands[0], "cargo run --release -p walsink-cli -- demo");
    let test = commands[1];
    assert!(test.starts_with("cargo test"), "{test}");
    assert!(
        ci.lines().any(|l| l.trim() == test),
        ".ci/run must call `{test}`"
    );
}
