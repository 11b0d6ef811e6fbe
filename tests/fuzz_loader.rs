//! The loader fuzzing campaign (issue 13): the shipped scenarios, the examples and every
//! fixture, mutated structurally, through the real loader (`model::load`: read, parse,
//! validate, expand matrices). For every input:
//!
//! - no panic;
//! - no hang: each input gets [`TIME_BOUND`] on its own thread;
//! - bounded memory: a counting allocator measures the peak of each input, at most
//!   [`MEMORY_BOUND`];
//! - located: an invalid input gets at least one diagnostic, and every diagnostic points at a
//!   line and column inside the file (`file:line:col`).
//!
//! cargo-fuzz needs nightly, so this is a plain stable harness: a seeded generator
//! (SplitMix64), a YAML-aware mutator over the parsed seeds (delete, duplicate and swap keys
//! and items, graft subtrees, anchors and aliases, huge numbers and durations, deep nesting,
//! unicode, templates), text-level damage on top (tabs, stray indicators, cut lines), and an
//! emitter back to YAML. `FUZZ_CASES` (default 2000) and `FUZZ_SEED` (default 13) choose the
//! inputs; `scripts/reliability --long` runs a long campaign with a fresh seed. A failing
//! input is written to `target/fuzz-failures/` with the seed to replay it.

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use scenario_run::diag::Source;
use scenario_run::model::{self, LoadOptions};
use scenario_run::yaml::{self, Node, Value};

/// Longest any one input may take (debug build, a loaded 2-core machine): a hang, not a
/// benchmark. What counts is that none comes near it.
const TIME_BOUND: Duration = Duration::from_secs(20);
/// Most memory any one input may allocate at its peak.
const MEMORY_BOUND: usize = 256 << 20;

// ---- memory --------------------------------------------------------------------------------

struct Counting;

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = CURRENT.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        CURRENT.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

// ---- randomness ----------------------------------------------------------------------------

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

// ---- a YAML tree we can emit ----------------------------------------------------------------

#[derive(Clone, Debug)]
enum T {
    /// A scalar, emitted as this YAML text (plain or quoted).
    S(String),
    Seq(Vec<T>),
    Map(Vec<(T, T)>),
    Anchor(String, Box<T>),
    Alias(String),
}

fn quoted(s: &str) -> String {
    serde_json::to_string(s).unwrap()
}

fn from_node(n: &Node) -> T {
    match &n.value {
        Value::Null => T::S("null".into()),
        Value::Bool(b) => T::S(b.to_string()),
        Value::Int(i) => T::S(i.to_string()),
        Value::Float(f) if f.is_nan() => T::S(".nan".into()),
        Value::Float(f) => T::S(format!("{f:?}")),
        Value::Str(s) => T::S(quoted(s)),
        Value::Seq(items) => T::Seq(items.iter().map(from_node).collect()),
        Value::Map(m) => T::Map(m.iter().map(|(k, v)| (from_node(k), from_node(v))).collect()),
    }
}

fn emit(t: &T, indent: usize, flow: bool, out: &mut String) {
    let pad = " ".repeat(indent);
    match t {
        T::S(s) => out.push_str(s),
        T::Alias(a) => out.push_str(&format!("*{a}")),
        T::Anchor(a, inner) => {
            out.push_str(&format!("&{a} "));
            // Anchored collections go in flow style, so the anchor can share the line.
            emit(inner, indent, true, out);
        }
        T::Seq(items) if flow || items.is_empty() => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                emit(item, indent, true, out);
            }
            out.push(']');
        }
        T::Map(entries) if flow || entries.is_empty() => {
            out.push('{');
            for (i, (k, v)) in entries.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                emit(k, indent, true, out);
                out.push_str(": ");
                emit(v, indent, true, out);
            }
            out.push('}');
        }
        T::Seq(items) => {
            for item in items {
                out.push('\n');
                out.push_str(&pad);
                out.push_str("- ");
                emit_block_value(item, indent + 2, out);
            }
        }
        T::Map(entries) => {
            for (k, v) in entries {
                out.push('\n');
                out.push_str(&pad);
                emit(k, indent, true, out);
                out.push(':');
                match v {
                    T::Seq(items) if !items.is_empty() => emit(v, indent, false, out),
                    T::Map(entries) if !entries.is_empty() => emit(v, indent + 2, false, out),
                    _ => {
                        out.push(' ');
                        emit(v, indent + 2, true, out);
                    }
                }
            }
        }
    }
}

/// A value after `- `: a mapping's first key stays on the dash's line.
fn emit_block_value(t: &T, indent: usize, out: &mut String) {
    match t {
        T::Map(entries) if !entries.is_empty() => {
            let mut text = String::new();
            emit(t, indent, false, &mut text);
            let pad = format!("\n{}", " ".repeat(indent));
            out.push_str(text.strip_prefix(&pad).unwrap_or(&text));
        }
        T::Seq(items) if !items.is_empty() => emit(t, indent, true, out),
        _ => emit(t, indent, true, out),
    }
}

fn to_yaml(t: &T) -> String {
    let mut out = String::new();
    match t {
        T::Map(entries) if !entries.is_empty() => {
            emit(t, 0, false, &mut out);
            out.remove(0);
        }
        _ => emit(t, 0, true, &mut out),
    }
    out.push('\n');
    out
}

// ---- the mutator ---------------------------------------------------------------------------

const HUGE: &[&str] = &[
    "99999999999999999999",
    "-99999999999999999999",
    "9223372036854775807",
    "-9223372036854775808",
    "18446744073709551616",
    "1e300",
    "-1e300",
    "1e-300",
    ".inf",
    "-.inf",
    ".nan",
    "0",
    "-1",
    "4294967296",
    "\"99999999999999999999h\"",
    "\"1e300s\"",
    "\"9999999999999ms\"",
    "\"8785h\"",
    "\"-5s\"",
    "\"1m-1s\"",
    "\"0.0000001ms\"",
    "\"1.5.5s\"",
    "\"h\"",
    "\"30 s\"",
    "0x7fffffffffffffff",
    "0o777777777777777777777777",
    "1_000",
];

const STRINGS: &[&str] = &[
    "\"é\"",
    "\"日本語のテキスト\"",
    "\"🦀🦀🦀\"",
    "\"\\u202e\\u200b\\u00a0\"",
    "\"a\\tb\"",
    "\"\\t\"",
    "\"line\\nbreak\"",
    "\"{{ vars.x }}\"",
    "\"{{ steps.a.stdout }}\"",
    "\"{{\"",
    "\"{% for x in y %}\"",
    "\"{{ env.HOME | b64encode }}\"",
    "\"{{ sandbox.url(99999) }}\"",
    "\"{{ sandboxes.x.host(8000) }}\"",
    "\"{{ matrix.nope }}\"",
    "\"{{ 1/0 }}\"",
    "\"2024-02-30\"",
    "\"9999-99-99\"",
    "\"2024-01-01T00:00:00+aé00\"",
    "\"\"",
    "\"   \"",
    "\"&anchor\"",
    "\"*alias\"",
    "\"!!str\"",
    "\"key: value\"",
    "\"- item\"",
    "\"#comment\"",
    "\"%YAML\"",
    "true",
    "null",
    "~",
    "yes",
    "\"exce\"",
];

/// Keys that lead the mutator into the validator's branches.
const KEYS: &[&str] = &[
    "name",
    "description",
    "tags",
    "timeout",
    "requires",
    "known_issue",
    "vars",
    "secrets",
    "matrix",
    "setup",
    "steps",
    "finally",
    "id",
    "sandbox",
    "retry",
    "eventually",
    "if",
    "continue_on_error",
    "expect_error",
    "attempts",
    "delay",
    "backoff",
    "within",
    "every",
    "env",
    "providers",
    "capabilities",
    "reason",
    "strict",
    "until",
    "create",
    "exec",
    "assert",
    "assert-stdout",
    "http-get",
    "files",
    "set",
    "sleep",
    "build",
    "deploy",
    "run-code",
    "write-file",
    "template",
    "as",
    "cmd",
    "equals",
    "contains",
    "json",
    "path",
    "port",
    "expect",
    "status",
    "matches",
    "lines",
    "not",
    "all",
    "any",
    "of",
    "op",
    "to",
    "content",
    "mode",
    "cwd",
    "background",
    "exit_code",
];

fn key(rng: &mut Rng) -> T {
    T::S(quoted(KEYS[rng.below(KEYS.len())]))
}

fn random_scalar(rng: &mut Rng) -> T {
    match rng.below(5) {
        0 | 1 => T::S(rng.pick(HUGE).to_string()),
        2 | 3 => T::S(rng.pick(STRINGS).to_string()),
        _ => key(rng),
    }
}

fn deep(rng: &mut Rng, depth: usize) -> T {
    let mut t = random_scalar(rng);
    for _ in 0..depth {
        t = if rng.chance(50) { T::Seq(vec![t]) } else { T::Map(vec![(key(rng), t)]) };
    }
    t
}

/// Every node, as a path of child indices (a map entry's value is its index).
fn paths(t: &T, at: &mut Vec<usize>, out: &mut Vec<Vec<usize>>) {
    out.push(at.clone());
    let children: Vec<&T> = match t {
        T::Seq(items) => items.iter().collect(),
        T::Map(entries) => entries.iter().map(|(_, v)| v).collect(),
        T::Anchor(_, inner) => vec![inner],
        _ => Vec::new(),
    };
    for (i, c) in children.into_iter().enumerate() {
        at.push(i);
        paths(c, at, out);
        at.pop();
    }
}

fn node_mut<'a>(t: &'a mut T, path: &[usize]) -> &'a mut T {
    match path.split_first() {
        None => t,
        Some((i, rest)) => match t {
            T::Seq(items) => node_mut(&mut items[*i], rest),
            T::Map(entries) => node_mut(&mut entries[*i].1, rest),
            T::Anchor(_, inner) => node_mut(inner, rest),
            _ => unreachable!("paths only lead into collections"),
        },
    }
}

fn mutate(t: &mut T, rng: &mut Rng, anchors: &mut usize) {
    let mut all = Vec::new();
    paths(t, &mut Vec::new(), &mut all);
    let path = rng.pick(&all).clone();
    let donor = {
        let p = rng.pick(&all).clone();
        node_mut(t, &p).clone()
    };
    let node = node_mut(t, &path);
    match rng.below(12) {
        // Delete, duplicate or swap entries and items.
        0..=2 => match node {
            T::Seq(items) if !items.is_empty() => {
                let i = rng.below(items.len());
                match rng.below(3) {
                    0 => {
                        items.remove(i);
                    }
                    1 => items.insert(i, items[i].clone()),
                    _ => {
                        let j = rng.below(items.len());
                        items.swap(i, j);
                    }
                }
            }
            T::Map(entries) if !entries.is_empty() => {
                let i = rng.below(entries.len());
                match rng.below(3) {
                    0 => {
                        entries.remove(i);
                    }
                    1 => entries.insert(i, entries[i].clone()),
                    _ => {
                        let j = rng.below(entries.len());
                        entries.swap(i, j);
                    }
                }
            }
            _ => *node = random_scalar(rng),
        },
        // Swap a value between two keys, or rename a key.
        3 => {
            if let T::Map(entries) = node {
                if !entries.is_empty() {
                    let i = rng.below(entries.len());
                    entries[i].0 = key(rng);
                }
            }
        }
        // Add a known key with a random value, or an item.
        4 => match node {
            T::Map(entries) => entries.push((key(rng), random_scalar(rng))),
            T::Seq(items) => items.push(T::Map(vec![(key(rng), random_scalar(rng))])),
            _ => *node = T::Seq(vec![node.clone(), random_scalar(rng)]),
        },
        // Replace with an interesting scalar.
        5 | 6 => *node = random_scalar(rng),
        // Graft another part of the tree here.
        7 => *node = donor,
        // Deep nesting.
        8 => {
            let depth = *rng.pick(&[10, 50, 150, 199, 200, 201, 250, 400]);
            *node = deep(rng, depth);
        }
        // Anchor this node, and refer to it from elsewhere (maybe many times, maybe nested).
        9 | 10 => {
            *anchors += 1;
            let name = format!("a{anchors}");
            *node = T::Anchor(name.clone(), Box::new(node.clone()));
            let copies = *rng.pick(&[1, 2, 9, 50]);
            let target = rng.pick(&all).clone();
            if !target.starts_with(&path) && !path.starts_with(&target) {
                // Neither inside the anchored node nor around it: the paths still hold.
                let t2 = node_mut(t, &target);
                *t2 = T::Seq(vec![T::Alias(name); copies]);
            }
        }
        // Change a collection into a scalar or the other way round.
        _ => {
            let replacement = match &*node {
                T::Seq(_) | T::Map(_) => random_scalar(rng),
                other => T::Map(vec![(other.clone(), random_scalar(rng))]),
            };
            *node = replacement;
        }
    }
}

/// Damage the text itself: what a careless edit does.
fn damage(text: &mut String, rng: &mut Rng) {
    let lines: Vec<&str> = text.lines().collect();
    if lines.is_empty() {
        return;
    }
    let i = rng.below(lines.len());
    let mut lines: Vec<String> = lines.iter().map(|s| s.to_string()).collect();
    match rng.below(8) {
        0 => lines[i].insert(0, '\t'),
        1 => {
            let line = lines[i].clone();
            lines.insert(i, line);
        }
        2 => {
            lines.remove(i);
        }
        3 => {
            let j = rng.below(lines.len());
            lines.swap(i, j);
        }
        4 => {
            let chars: Vec<char> = lines[i].chars().collect();
            let at = rng.below(chars.len() + 1);
            let c = *rng.pick(&[
                ':', '-', '[', ']', '{', '}', '&', '*', '!', '|', '>', '\'', '"', '%', '@', '`', '#', '\t', 'é',
            ]);
            lines[i] = chars[..at].iter().chain(std::iter::once(&c)).chain(&chars[at..]).collect();
        }
        5 => {
            let keep = rng.below(lines[i].chars().count() + 1);
            lines[i] = lines[i].chars().take(keep).collect();
            lines.truncate(i + 1);
        }
        6 => {
            // A billion laughs at the top, used by nothing.
            let mut bomb = vec!["lol0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]".to_string()];
            for k in 1..10 {
                bomb.push(format!("lol{k}: &l{k} [{}]", vec![format!("*l{}", k - 1); 9].join(", ")));
            }
            lines.splice(0..0, bomb);
        }
        _ => lines.insert(i, "---".into()),
    }
    *text = lines.join("\n");
    text.push('\n');
}

// ---- the campaign --------------------------------------------------------------------------

fn seeds() -> Vec<(String, String)> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in ["scenarios", "examples", "tests/fixtures"] {
        collect(&root.join(dir), &mut files);
    }
    files.sort();
    files
        .into_iter()
        .filter_map(|p| {
            Some((p.strip_prefix(&root).ok()?.to_string_lossy().into_owned(), std::fs::read_to_string(&p).ok()?))
        })
        .collect()
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            collect(&p, out);
        } else if p.extension().is_some_and(|x| x == "yaml" || x == "yml") {
            out.push(p);
        }
    }
}

/// One generated input from a seed file.
fn generate(seed_text: &str, rng: &mut Rng) -> String {
    let source = Source::new("seed.yaml", seed_text);
    let mut text = match yaml::parse(&source) {
        Ok(docs) if !docs.is_empty() && rng.chance(90) => {
            let mut anchors = 0;
            let mut docs: Vec<T> = docs.iter().map(from_node).collect();
            let rounds = 1 + rng.below(6);
            for _ in 0..rounds {
                let d = rng.below(docs.len());
                mutate(&mut docs[d], rng, &mut anchors);
            }
            docs.iter().map(to_yaml).collect::<Vec<_>>().join("---\n")
        }
        _ => seed_text.to_string(),
    };
    if rng.chance(35) {
        for _ in 0..1 + rng.below(3) {
            damage(&mut text, rng);
        }
    }
    text
}

#[derive(Default, Debug)]
struct Figures {
    inputs: usize,
    valid: usize,
    invalid: usize,
    panics: usize,
    hangs: usize,
    over_memory: usize,
    unlocated: usize,
    peak_bytes: usize,
}

enum Verdict {
    Ok { valid: bool, peak: usize },
    Panic(String),
    Unlocated(String),
}

fn check_one(path: PathBuf, shown: String, text: String) -> Verdict {
    let lines = text.lines().count().max(1) as u32;
    std::fs::write(&path, &text).unwrap();
    let base = CURRENT.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let opts = LoadOptions { today: "2026-01-01".into(), ..Default::default() };
    let result = std::panic::catch_unwind(|| model::load(std::slice::from_ref(&path), &opts).map(|l| l.cases.len()));
    let peak = PEAK.load(Ordering::Relaxed).saturating_sub(base);
    match result {
        Err(p) => Verdict::Panic(
            p.downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_default(),
        ),
        Ok(Ok(_)) => Verdict::Ok { valid: true, peak },
        Ok(Err(diags)) => {
            if diags.is_empty() {
                return Verdict::Unlocated("invalid, but no diagnostic".into());
            }
            for d in &diags {
                let l = &d.location;
                let inside = l.file == shown && l.line >= 1 && l.line <= lines + 1 && l.col >= 1;
                let rendered = d.render();
                if !inside || !rendered.contains(&format!("--> {l}")) {
                    return Verdict::Unlocated(format!("{l}: {}", d.message));
                }
            }
            Verdict::Ok { valid: false, peak }
        }
    }
}

fn campaign(cases: usize, seed: u64) -> (Figures, Vec<String>) {
    let seeds = seeds();
    assert!(seeds.len() >= 50, "seed files missing: {}", seeds.len());
    let dir = tempfile::tempdir().unwrap();
    let fail_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/fuzz-failures");
    let mut rng = Rng(seed);
    let mut f = Figures::default();
    let mut problems = Vec::new();
    // Panics are counted, not printed by the hook for each one.
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    for i in 0..cases {
        let (name, seed_text) = rng.pick(&seeds).clone();
        let text = generate(&seed_text, &mut rng);
        let path = dir.path().join(format!("case{i}.yaml"));
        let shown = path.to_string_lossy().trim_start_matches("./").to_string();
        let (tx, rx) = mpsc::channel();
        let input = text.clone();
        std::thread::Builder::new()
            .stack_size(8 << 20)
            .spawn(move || {
                let _ = tx.send(check_one(path, shown, input));
            })
            .unwrap();
        f.inputs += 1;
        let why = match rx.recv_timeout(TIME_BOUND) {
            Ok(Verdict::Ok { valid, peak }) => {
                f.peak_bytes = f.peak_bytes.max(peak);
                if valid {
                    f.valid += 1;
                } else {
                    f.invalid += 1;
                }
                (peak > MEMORY_BOUND).then(|| {
                    f.over_memory += 1;
                    format!("used {} MiB", peak >> 20)
                })
            }
            Ok(Verdict::Panic(m)) => {
                f.panics += 1;
                Some(format!("panicked: {m}"))
            }
            Ok(Verdict::Unlocated(m)) => {
                f.unlocated += 1;
                Some(format!("not located: {m}"))
            }
            Err(_) => {
                f.hangs += 1;
                Some(format!("took more than {TIME_BOUND:?}"))
            }
        };
        if let Some(why) = why {
            std::fs::create_dir_all(&fail_dir).unwrap();
            let file = fail_dir.join(format!("seed{seed}-case{i}.yaml"));
            std::fs::write(&file, &text).unwrap();
            problems.push(format!("{}: {why} (from {name}; FUZZ_SEED={seed})", file.display()));
            if f.hangs > 0 {
                break; // the stuck thread keeps its core: stop here
            }
        }
    }
    std::panic::set_hook(hook);
    (f, problems)
}

#[test]
fn loader_fuzzing_finds_no_panic_hang_blowup_or_unlocated_error() {
    let cases = std::env::var("FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(2000);
    let seed = std::env::var("FUZZ_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(13);
    let (f, problems) = campaign(cases, seed);
    println!(
        "loader fuzz: {} inputs ({} valid, {} invalid), {} panics, {} hangs, {} over {} MiB, {} unlocated; \
         peak {:.1} MiB per input; seed {seed}",
        f.inputs,
        f.valid,
        f.invalid,
        f.panics,
        f.hangs,
        f.over_memory,
        MEMORY_BOUND >> 20,
        f.unlocated,
        f.peak_bytes as f64 / (1 << 20) as f64
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    // The mutator reaches both sides of the validator.
    assert!(f.valid > 0 && f.invalid > 0, "{f:?}");
}
