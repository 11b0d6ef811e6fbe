//! How each step kind runs: the model's table of kinds ([`crate::model::kinds`]: fields,
//! outputs, docs) paired with the function that runs it. Adding a step kind means a row there
//! and one here.

use std::future::Future;
use std::pin::Pin;

use super::args::Args;
use super::{asserts, build, code, exec, files, host, http, lifecycle, misc, pty, scripted, watch};
use super::{StepCtx, StepResult};

pub use crate::model::kinds::{lookup, names, stops_itself, Field, FieldType, StepKind, COMMON_KEYS, REGISTRY};

pub type BoxFut<'a> = Pin<Box<dyn Future<Output = StepResult> + Send + 'a>>;
pub type RunFn = for<'a> fn(&'a mut StepCtx, &'a Args) -> BoxFut<'a>;

macro_rules! run_fn {
    ($path:path) => {{
        fn run<'a>(ctx: &'a mut StepCtx, args: &'a Args) -> BoxFut<'a> {
            Box::pin($path(ctx, args))
        }
        run as RunFn
    }};
}

/// Each kind of [`REGISTRY`] by name, with its function, in the table's order.
static RUNS: &[(&str, RunFn)] = &[
    ("create", run_fn!(lifecycle::create)),
    ("build", run_fn!(build::build)),
    ("deploy", run_fn!(build::deploy)),
    ("scripted-model", run_fn!(scripted::scripted_model)),
    ("connect", run_fn!(lifecycle::connect)),
    ("info", run_fn!(lifecycle::info)),
    ("list", run_fn!(lifecycle::list)),
    ("kill", run_fn!(lifecycle::kill)),
    ("set-timeout", run_fn!(lifecycle::set_timeout)),
    ("update-network", run_fn!(lifecycle::update_network)),
    ("pause", run_fn!(lifecycle::pause)),
    ("resume", run_fn!(lifecycle::resume)),
    ("snapshot", run_fn!(lifecycle::snapshot)),
    ("exec", run_fn!(exec::exec)),
    ("host", run_fn!(host::host)),
    ("process-list", run_fn!(exec::process_list)),
    ("signal", run_fn!(exec::signal)),
    ("send-stdin", run_fn!(exec::send_stdin)),
    ("wait", run_fn!(exec::wait)),
    ("pty", run_fn!(pty::pty)),
    ("write-file", run_fn!(files::write_file)),
    ("read-file", run_fn!(files::read_file)),
    ("files", run_fn!(files::files)),
    ("watch", run_fn!(watch::watch)),
    ("watch-events", run_fn!(watch::watch_events)),
    ("assert-stdout", run_fn!(asserts::assert_stdout)),
    ("assert-stderr", run_fn!(asserts::assert_stderr)),
    ("assert-exit", run_fn!(asserts::assert_exit)),
    ("assert-file", run_fn!(asserts::assert_file)),
    ("assert", run_fn!(asserts::assert)),
    ("http-get", run_fn!(http::http_get)),
    ("http", run_fn!(http::http)),
    ("set", run_fn!(misc::set)),
    ("bench", run_fn!(misc::bench)),
    ("sleep", run_fn!(misc::sleep)),
    ("skip", run_fn!(misc::skip)),
    ("run-code", run_fn!(code::run_code)),
];

/// The function that runs `kind`.
pub fn run_fn(kind: &StepKind) -> RunFn {
    RUNS.iter().find(|(name, _)| *name == kind.name).map(|(_, f)| *f).expect("every kind in the table has a function")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_its_function_and_no_other() {
        let kinds: Vec<&str> = REGISTRY.iter().map(|k| k.name).collect();
        let runs: Vec<&str> = RUNS.iter().map(|(n, _)| *n).collect();
        assert_eq!(kinds, runs);
    }
}
