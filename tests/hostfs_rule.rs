//! Rule 1 of the threat model, kept: the modules that handle paths a sandbox or a client can
//! write make no path-based file-system call (`std::fs` by name, `canonicalize`, `exists`, …)
//! outside `src/hostfs.rs`'s descriptor-based helpers, unless the line (or the one above it)
//! carries a `// trusted:` note saying why the path is the tool's own. Test modules
//! (`#[cfg(test)]` to the end of the file) are not held to it.
//!
//! A new module that handles such paths joins `SCOPE`.

use std::path::Path;

/// Files whose code acts on sandbox- or client-writable paths.
const SCOPE: &[&str] = &["src/hostfs.rs", "src/server/opensandbox/volumes.rs", "src/server/build_dir.rs"];

/// Calls that look a path up by name.
const BY_NAME: &[&str] = &[
    "std::fs::",
    "fs::create_dir",
    "fs::set_permissions",
    "fs::remove_",
    "fs::rename",
    "fs::metadata",
    "fs::read",
    "fs::write",
    "File::open(",
    "File::create(",
    "OpenOptions",
    ".canonicalize(",
    ".exists()",
    ".is_dir()",
    ".is_file()",
    ".metadata()",
    ".symlink_metadata()",
    ".read_link()",
];

/// Descriptor-based uses that merely name `std::fs` types.
const ALLOWED: &[&str] = &["std::fs::File::from(", "std::fs::Permissions"];

fn offences(text: &str) -> Vec<(usize, String)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        if line.trim_start().starts_with("#[cfg(test)]") {
            break;
        }
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code.to_string();
        for a in ALLOWED {
            rest = rest.replace(a, "");
        }
        if !BY_NAME.iter().any(|p| rest.contains(p)) {
            continue;
        }
        // A `HostDir` method of the same name acts on a descriptor.
        if rest.contains("m.host.is_dir()") {
            continue;
        }
        let noted = |l: &str| l.contains("// trusted:");
        if noted(line)
            || (i > 0 && noted(lines[i - 1]))
            || (i > 1 && lines[i - 1].trim_start().starts_with("//") && noted(lines[i - 2]))
        {
            continue;
        }
        out.push((i + 1, line.trim().to_string()));
    }
    out
}

#[test]
fn no_path_based_call_on_what_a_sandbox_can_write() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut all = Vec::new();
    for f in SCOPE {
        let text = std::fs::read_to_string(root.join(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
        for (n, line) in offences(&text) {
            all.push(format!("{f}:{n}: {line}"));
        }
    }
    assert!(all.is_empty(), "path-based calls without a `// trusted:` note (use crate::hostfs):\n{}", all.join("\n"));
}

#[test]
fn the_rule_catches_what_it_names() {
    assert_eq!(offences("fn f(p: &Path) {\n    std::fs::create_dir_all(p).unwrap();\n}\n").len(), 1);
    assert_eq!(offences("let real = wanted.canonicalize()?;\n").len(), 1);
    assert_eq!(offences("if !wanted.exists() {}\n").len(), 1);
    assert!(offences("// trusted: serve's own\nstd::fs::create_dir_all(p)?;\n").is_empty());
    assert!(offences("let f = std::fs::File::from(fd);\n").is_empty());
    assert!(offences("#[cfg(test)]\nmod tests { fn t() { std::fs::write(p, \"x\").unwrap(); } }\n").is_empty());
}
