fn main() {
    println!("cargo::rustc-check-cfg=cfg(servers)");
    println!("cargo::rerun-if-env-changed=WALSINK_TEST_SERVERS");
    if std::env::var("WALSINK_TEST_SERVERS").as_deref() == Ok("1") {
        println!("cargo::rustc-cfg=servers");
    }
}
