//! Platform faults (issue 40): defects serve can be told to have, so that the scenario library
//! can be judged by the defects it catches (`scripts/mutation`, `MUTATION.md`).
//!
//! Each fault is modeled on a class of defect that users of sandbox platforms report, and
//! says which. They are host-side configuration only: `serve --fault NAME[,NAME]` turns them
//! on for the whole server, nothing a client sends (header, query, metadata, body) can turn
//! one on or off, and none is on unless named. `serve --fault list` prints the catalog.
//!
//! A fault is hooked at the smallest seam of the handler it breaks, as a one-line test of
//! [`Mutants::has`], so the faithful path is the code that runs without it. Unlike the
//! transport faults ([`super::Faults`]: latency, 429/503, cut streams), which a correct
//! client must survive, these are wrong answers a correct suite must notice.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// One fault of the catalog; see [`CATALOG`] for what each does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fault {
    ResumeLosesFiles,
    SecondResumeFails,
    ConnectPausedNewId,
    KillKeepsSandbox,
    PauseKeepsRunning,
    SetTimeoutIgnored,
    ListOmitsNewest,
    ExitCodeZero,
    StderrAsStdout,
    EnvIgnored,
    CwdIgnored,
    StdinDropped,
    OutputTailLost,
    OutputStopsAfterResume,
    BackgroundDiesWithRequest,
    RenameCopies,
    RemoveKeepsFile,
    WatchMissesRemoves,
    ReadTruncates,
    ListHidesDotfiles,
    DenyAllLeaks,
    AllowMerged,
    PortRoutesToOldest,
    ProxyDropsQuery,
    RateLimit500,
    AnyApiKey,
    UnknownSandbox500,
    ReadyCmdFailureOk,
    StaleBuildCache,
    CodeContextLost,
}

/// A fault's entry in the catalog.
#[derive(Debug)]
pub struct Entry {
    pub fault: Fault,
    /// What `--fault` names it by.
    pub name: &'static str,
    /// commands, files, lifecycle, network, ports, platform, templates, code-interpreter.
    pub area: &'static str,
    /// The reported class of defect it stands for.
    pub stands_for: &'static str,
    /// What serve does wrong with it.
    pub does: &'static str,
}

const fn e(
    fault: Fault,
    name: &'static str,
    area: &'static str,
    stands_for: &'static str,
    does: &'static str,
) -> Entry {
    Entry { fault, name, area, stands_for, does }
}

/// Every fault, by area.
#[rustfmt::skip]
pub static CATALOG: &[Entry] = &[
    e(Fault::ResumeLosesFiles, "resume-loses-files", "lifecycle",
      "E2B #884: changes lost after a resume",
      "a resume deletes the files under /home/user written since the sandbox was made"),
    e(Fault::SecondResumeFails, "second-resume-fails", "lifecycle",
      "E2B: the second resume of a sandbox answers 500",
      "every resume of a sandbox after its first answers 500"),
    e(Fault::ConnectPausedNewId, "connect-paused-new-id", "lifecycle",
      "E2B: connect to a paused sandbox returns another sandbox's id",
      "connect to a paused sandbox resumes it but answers a new, unknown sandboxID"),
    e(Fault::KillKeepsSandbox, "kill-keeps-sandbox", "lifecycle",
      "kill answers success and the sandbox runs (and bills) on",
      "kill answers 204 and does nothing"),
    e(Fault::PauseKeepsRunning, "pause-keeps-running", "lifecycle",
      "pause answers success and the sandbox runs on",
      "pause answers 204 and does nothing"),
    e(Fault::SetTimeoutIgnored, "set-timeout-ignored", "lifecycle",
      "setTimeout accepted, the sandbox still dies at its old end",
      "set-timeout answers 204 and does nothing"),
    e(Fault::ListOmitsNewest, "list-omits-newest", "lifecycle",
      "a new sandbox missing from the list (list lags behind create)",
      "the sandbox list leaves out the most recently created sandbox"),
    e(Fault::ExitCodeZero, "exit-code-zero", "commands",
      "a failing command reported as exit 0",
      "every process end reports exit status 0"),
    e(Fault::StderrAsStdout, "stderr-as-stdout", "commands",
      "stderr merged into stdout",
      "a process's stderr is streamed as stdout"),
    e(Fault::EnvIgnored, "env-ignored", "commands",
      "envs of a command silently dropped",
      "a process start ignores its envs"),
    e(Fault::CwdIgnored, "cwd-ignored", "commands",
      "cwd of a command ignored (runs in the home directory)",
      "a process start ignores its cwd"),
    e(Fault::StdinDropped, "stdin-dropped", "commands",
      "input sent to a process lost",
      "SendInput answers success and writes nothing"),
    e(Fault::OutputTailLost, "output-tail-lost", "commands",
      "large command output truncated",
      "a process's output stream sends no data past its first 64 KiB"),
    e(Fault::OutputStopsAfterResume, "output-stops-after-resume", "commands",
      "E2B #1587: stdout stops after a resume",
      "output streams send no data once their sandbox has been resumed"),
    e(Fault::BackgroundDiesWithRequest, "background-dies-with-request", "commands",
      "a background process dies when its request ends",
      "a process is killed when the stream that started or connected to it closes"),
    e(Fault::RenameCopies, "rename-copies", "files",
      "a rename copies and leaves the source",
      "Move copies the source to the destination and keeps the source"),
    e(Fault::RemoveKeepsFile, "remove-keeps-file", "files",
      "remove answers success and the file stays",
      "Remove answers success and removes nothing"),
    e(Fault::WatchMissesRemoves, "watch-misses-removes", "files",
      "E2B: watch events miss removes",
      "directory watchers drop remove events"),
    e(Fault::ReadTruncates, "read-truncates", "files",
      "large file downloads cut short",
      "a download of more than 64 KiB leaves out its last byte"),
    e(Fault::ListHidesDotfiles, "list-hides-dotfiles", "files",
      "directory listings miss hidden files",
      "ListDir leaves out entries whose name starts with a dot"),
    e(Fault::DenyAllLeaks, "deny-all-leaks", "network",
      "deny-all egress still resolves and reaches names",
      "a create that denies all egress gets the default (open) network"),
    e(Fault::AllowMerged, "allow-merged", "network",
      "a network update's allow rule merged instead of replacing",
      "a network update keeps the allow and deny lists it replaces, adding the new ones"),
    e(Fault::PortRoutesToOldest, "port-routes-to-oldest", "ports",
      "a sandbox's port answered by another sandbox",
      "a port request reaches the oldest live sandbox, whichever it names"),
    e(Fault::ProxyDropsQuery, "proxy-drops-query", "agent-sandbox-server",
      "the port proxy drops the query string (agent-sandbox-server's routes break)",
      "requests forwarded to a sandbox port lose their query string"),
    e(Fault::RateLimit500, "rate-limit-500", "platform",
      "rate limiting answers 500 instead of 429",
      "a create past --max-sandboxes or the memory admission answers 500 instead of 429"),
    e(Fault::AnyApiKey, "any-api-key", "platform",
      "an invalid API key accepted",
      "the control plane accepts any API key, and none"),
    e(Fault::UnknownSandbox500, "unknown-sandbox-500", "platform",
      "an unknown sandbox answered 500 without naming it",
      "an unknown sandbox answers 500 \"internal error\" instead of 404 naming it"),
    e(Fault::ReadyCmdFailureOk, "ready-cmd-failure-ok", "templates",
      "a template's failing ready command reported as success",
      "a template's ready command is replaced by /bin/true: ready at once, whatever it would say"),
    e(Fault::StaleBuildCache, "stale-build-cache", "templates",
      "a template build ignores a changed file (stale cache)",
      "template file uploads are always answered present, so changed files are never sent"),
    e(Fault::CodeContextLost, "code-context-lost", "code-interpreter",
      "the code interpreter loses a context's state",
      "code run in a named context runs in a fresh default context"),
];

/// An unknown name given to `--fault`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown fault {name:?}; known faults: {}", CATALOG.iter().map(|e| e.name).collect::<Vec<_>>().join(", "))]
pub struct UnknownFault {
    pub name: String,
}

/// The faults serve was started with, and what the stateful ones remember. Off by default.
#[derive(Debug, Clone, Default)]
pub struct Mutants {
    on: Arc<Vec<Fault>>,
    /// Resumes per sandbox id (`second-resume-fails`, `output-stops-after-resume`).
    resumes: Arc<Mutex<HashMap<String, u32>>>,
}

impl Mutants {
    /// The faults named in `names` (each may hold several, comma-separated).
    pub fn parse<S: AsRef<str>>(names: &[S]) -> Result<Self, UnknownFault> {
        let mut on = Vec::new();
        for name in names.iter().flat_map(|n| n.as_ref().split(',')).map(str::trim).filter(|n| !n.is_empty()) {
            let entry = CATALOG.iter().find(|e| e.name == name).ok_or(UnknownFault { name: name.to_string() })?;
            if !on.contains(&entry.fault) {
                on.push(entry.fault);
            }
        }
        Ok(Self { on: Arc::new(on), ..Default::default() })
    }

    pub fn has(&self, f: Fault) -> bool {
        self.on.contains(&f)
    }

    pub fn is_empty(&self) -> bool {
        self.on.is_empty()
    }

    /// The names of the faults that are on.
    pub fn names(&self) -> Vec<&'static str> {
        CATALOG.iter().filter(|e| self.has(e.fault)).map(|e| e.name).collect()
    }

    /// Counts a resume of sandbox `id`; how many it has had, this one included.
    pub(crate) fn resumed(&self, id: &str) -> u32 {
        if self.is_empty() {
            return 0;
        }
        let mut m = self.resumes.lock().expect("resumes");
        let n = m.entry(id.to_string()).or_default();
        *n += 1;
        *n
    }

    /// Whether sandbox `id` has been resumed.
    pub(crate) fn was_resumed(&self, id: &str) -> bool {
        self.resumes.lock().expect("resumes").get(id).is_some_and(|n| *n > 0)
    }
}

/// `allow-merged`: a network update's lists added to the ones it should replace.
pub(crate) fn merged(
    old: &crate::provider::NetworkPolicy,
    new: crate::provider::NetworkPolicy,
) -> crate::provider::NetworkPolicy {
    let mut out = old.clone();
    out.allow_out.extend(new.allow_out.into_iter().filter(|a| !old.allow_out.contains(a)));
    out.deny_out.extend(new.deny_out.into_iter().filter(|d| !old.deny_out.contains(d)));
    out
}

/// The catalog as a table, for `serve --fault list`.
pub fn catalog_table() -> String {
    let mut out = String::from("NAME\tAREA\tSTANDS FOR\tDOES\n");
    for e in CATALOG {
        out += &format!("{}\t{}\t{}\t{}\n", e.name, e.area, e.stands_for, e.does);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_unknown_names_are_refused_with_the_list() {
        let m = Mutants::parse(&["exit-code-zero, rename-copies", "exit-code-zero"]).unwrap();
        assert!(m.has(Fault::ExitCodeZero) && m.has(Fault::RenameCopies) && !m.has(Fault::EnvIgnored));
        assert_eq!(m.names(), ["exit-code-zero", "rename-copies"]);
        assert!(Mutants::parse::<&str>(&[]).unwrap().is_empty());
        let e = Mutants::parse(&["exit-code-zero,no-such-fault"]).unwrap_err();
        assert_eq!(e.name, "no-such-fault");
        let text = e.to_string();
        assert!(text.starts_with("unknown fault \"no-such-fault\"; known faults: resume-loses-files, "), "{text}");
        assert!(CATALOG.iter().all(|c| text.contains(c.name)), "{text}");
    }

    #[test]
    fn the_catalog_is_whole_and_unambiguous() {
        assert!(CATALOG.len() >= 25);
        let mut names: Vec<_> = CATALOG.iter().map(|e| e.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), CATALOG.len(), "names are unique");
        let mut faults: Vec<_> = CATALOG.iter().map(|e| format!("{:?}", e.fault)).collect();
        faults.sort_unstable();
        faults.dedup();
        assert_eq!(faults.len(), CATALOG.len(), "each fault has one entry");
        for e in CATALOG {
            assert!(!e.stands_for.is_empty() && !e.does.is_empty() && !e.area.is_empty(), "{}", e.name);
            // Not to be confused with the transport faults' flags (--fault-latency, ...).
            assert!(!["latency", "429-every", "5xx-every", "cut-stream-after", "control-plane-only"].contains(&e.name));
        }
    }
}
