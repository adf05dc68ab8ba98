//! No file I/O bypasses the storage seam: outside `src/storage/fs.rs` (the real filesystem)
//! the library, the directory sink included, names no filesystem API. Together with every simulated-disk test, which would see files
//! that bypass the seam missing after a simulated crash, this keeps the crash tests honest.

#[test]
fn only_the_fs_backend_touches_the_filesystem() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let allowed = ["storage/fs.rs"];
    let forbidden = ["std::fs", "File::", "OpenOptions", "memmap", "libc::"];
    let mut stack = vec![root.clone()];
    let mut checked = 0;
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let rel = path
                .strip_prefix(&root)
                .unwrap()
                .to_string_lossy()
                .replace('\\', "/");
            if allowed.contains(&rel.as_str()) || path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            checked += 1;
            let text = std::fs::read_to_string(&path).unwrap();
            for (n, line) in text.lines().enumerate() {
                let code = line.split("//").next().unwrap();
                for f in forbidden {
                    assert!(
                        !code.contains(f),
                        "{rel}:{}: `{f}` bypasses the storage seam: {line}",
                        n + 1
                    );
                }
            }
        }
    }
    assert!(checked >= 10, "only {checked} files checked");
}
