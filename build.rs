//! The release `scenario-run` is linked with its functions in the order a recorded client run
//! executes them (`link/scenario-run.order`, made by `bench/symbol-order`): together, they are
//! a few MiB of code the kernel maps instead of nearly all of the text, the largest part of a
//! client's resident memory (BENCHMARKS.md, "A lean client"). Only where the linker is rust-lld
//! (rustc 1.90 and later on x86_64 Linux, unless a linker is configured) and only for release
//! builds; `SCENARIO_RUN_NO_SYMBOL_ORDER=1` turns it off. A stale entry is ignored.

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=link/scenario-run.order");
    println!("cargo:rerun-if-env-changed=SCENARIO_RUN_NO_SYMBOL_ORDER");
    println!("cargo:rerun-if-env-changed=CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_LINKER");
    let env = |k: &str| std::env::var(k).unwrap_or_default();
    let order = std::path::Path::new(&env("CARGO_MANIFEST_DIR")).join("link/scenario-run.order");
    let wanted = env("PROFILE") == "release"
        && env("TARGET") == "x86_64-unknown-linux-gnu"
        && env("SCENARIO_RUN_NO_SYMBOL_ORDER").is_empty()
        && env("CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_LINKER").is_empty()
        && !env("CARGO_ENCODED_RUSTFLAGS").contains("linker")
        && rustc_minor().is_some_and(|m| m >= 90)
        && order.is_file();
    if wanted {
        let order = order.display();
        println!("cargo:rustc-link-arg-bin=scenario-run=-Wl,--symbol-ordering-file={order}");
        println!("cargo:rustc-link-arg-bin=scenario-run=-Wl,--no-warn-symbol-ordering");
    }
}

/// `1.95.0` → 95.
fn rustc_minor() -> Option<u32> {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let out = Command::new(rustc).arg("--version").output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    text.split_whitespace().nth(1)?.split('.').nth(1)?.parse().ok()
}
