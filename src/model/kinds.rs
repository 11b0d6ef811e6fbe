//! The one table of step kinds, as the model knows them: each kind's fields and their types,
//! its outputs, its docs and an example.
//!
//! [`REGISTRY`] is the single source for validation (fields, types, did-you-mean),
//! `scenario-run steps` and the JSON Schema; [`crate::steps::registry`] pairs each row with
//! the function that runs it. It lives here, below the steps, so that loading and validating
//! a scenario needs no async runtime, provider or HTTP client. Adding a step kind means a row
//! here and its function there (a test checks that each row has one).

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FieldType {
    Str,
    Int,
    /// An integer from the first bound to the second (a port, a terminal's size).
    Range(i64, i64),
    Bool,
    /// `30s`, `2m`, or a number of seconds.
    Duration,
    /// Map of string to string (scalars are accepted and turned into strings).
    StrMap,
    /// A list of strings (scalars turned into strings); one string is a list of one.
    StrList,
    /// A list of integers; one integer is a list of one.
    IntList,
    /// A matcher (§3): a mapping, or a scalar meaning `equals`.
    Matcher,
    /// One of a fixed set of strings.
    Enum(&'static [&'static str]),
    /// A signal: a number, or a name (`TERM`, `SIGKILL`, `kill`).
    Signal,
    /// An expression (no braces needed), like `if:`.
    Expr,
    /// Anything (request bodies, `set` values).
    Any,
    /// A nested mapping with its own fields.
    Object(&'static [Field]),
}

impl FieldType {
    pub fn describe(&self) -> String {
        match self {
            FieldType::Str => "string".into(),
            FieldType::Int => "integer".into(),
            FieldType::Range(lo, hi) => format!("integer from {lo} to {hi}"),
            FieldType::Bool => "boolean".into(),
            FieldType::Duration => "duration".into(),
            FieldType::StrMap => "map of strings".into(),
            FieldType::StrList => "list of strings".into(),
            FieldType::IntList => "integer or list of integers".into(),
            FieldType::Matcher => "matcher".into(),
            FieldType::Enum(v) => v.join("|"),
            FieldType::Signal => "signal name or number".into(),
            FieldType::Any => "any".into(),
            FieldType::Expr => "expression".into(),
            FieldType::Object(_) => "mapping".into(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Field {
    pub name: &'static str,
    pub ty: FieldType,
    pub required: bool,
    pub doc: &'static str,
}

/// An exit code: 0 to 255, or negative as some platforms report a signal (envd's -1).
const EXIT_CODE: FieldType = FieldType::Range(-255, 255);
/// A process id (`pid_t`).
const PID: FieldType = FieldType::Range(1, i32::MAX as i64);

const fn f(name: &'static str, ty: FieldType, doc: &'static str) -> Field {
    Field { name, ty, required: false, doc }
}

const fn req(name: &'static str, ty: FieldType, doc: &'static str) -> Field {
    Field { name, ty, required: true, doc }
}

pub struct StepKind {
    pub name: &'static str,
    pub summary: &'static str,
    /// The field a scalar argument stands for (`exec: echo hi` = `exec: { cmd: echo hi }`).
    pub main: Option<&'static str>,
    pub fields: &'static [Field],
    /// Besides `fields`, the step's mapping is a matcher (assert-stdout and friends).
    pub matcher: bool,
    /// Arbitrary keys (the `set` step binds any names).
    pub free_keys: bool,
    pub outputs: &'static [(&'static str, &'static str)],
    /// Works on a sandbox (so `sandbox:` applies and one must exist).
    pub uses_sandbox: bool,
    /// May be polled with `eventually:`.
    pub eventual: bool,
    /// Sets the scenario's "last command" that assert-stdout/-stderr/-exit read.
    pub sets_last: bool,
    pub example: &'static str,
}

impl std::fmt::Debug for StepKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

impl StepKind {
    pub fn field(&self, name: &str) -> Option<&'static Field> {
        self.fields.iter().find(|f| f.name == name)
    }
}

/// Keys every step may carry beside its kind.
pub const COMMON_KEYS: &[(&str, &str)] = &[
    ("id", "name for its outputs: {{ steps.<id>.stdout }}"),
    ("name", "display name in reports"),
    ("sandbox", "which sandbox (alias from `create … as:`); default: the most recently created"),
    ("timeout", "per-step limit (`30s`, `2m`)"),
    ("retry", "{ attempts: 5, delay: 1s, backoff: 2.0 }: re-run the step on failure"),
    ("eventually", "`30s` or { within: 30s, every: 500ms }: poll until the step passes"),
    ("if", "expression; false => the step is SKIPPED"),
    ("continue_on_error", "record the failure and carry on: a soft failure, shown beside PASSED, in the totals, the reports and as a GitHub warning; the run stays green"),
    (
        "requires",
        "{ env: [NAME, ...] }: run only when these variables are set and non-empty (a model's key); else the step is SKIPPED with `missing credentials [NAME]`, counted in every report, and the scenario goes on",
    ),
    ("expect_error", "the step's operation must fail: `true`, or a matcher for the error message, e.g. { contains: not found }, and `kind:` (failed, not-found, invalid, timeout, infra, auth, unsupported, capacity; default failed); a timeout or an ERROR of the platform meets it only if `kind` names it, and an argument the step refuses never does"),
];

const MATCHER_OF: Field = f("of", FieldType::Str, "id of the exec step to check (default: the most recent)");

/// `expect: { duration_ms: { lt: 500 } }`: Hurl's `duration < 500`.
const DURATION_BOUNDS: &[Field] = &[
    f("lt", FieldType::Int, "the response (status, headers and body) took less than this many milliseconds"),
    f("le", FieldType::Int, "at most this many milliseconds"),
];

const HTTP_EXPECT: &[Field] = &[
    f("status", FieldType::IntList, "expected status code, or a list of allowed codes"),
    f(
        "duration_ms",
        FieldType::Object(DURATION_BOUNDS),
        "bounds on the response's time, as Hurl's `duration`: `{ lt: 500 }`",
    ),
    f("body", FieldType::Matcher, "matcher for the response body"),
    f("json", FieldType::Any, "list of { path: \"$.a\", <matcher> } checks on the JSON body"),
    f("headers", FieldType::StrMap, "headers that must be present; values are substrings to find"),
];

/// What a network policy says, on a create and in `update-network`.
const NETWORK_RULES: [Field; 4] = [
    f("allow_internet_access", FieldType::Bool, "E2B's internet access switch (default true); false is `deny_out: [0.0.0.0/0]`"),
    f("allow_out", FieldType::StrList, "addresses, CIDR ranges or domain names (`*.example.com`; matched for HTTP on 80 and TLS on 443), each with an optional `:port` or `:lo-hi`, the sandbox may reach: allow beats deny"),
    f("deny_out", FieldType::StrList, "addresses or CIDR ranges (with optional ports) denied unless allowed (`0.0.0.0/0`: all)"),
    f("dns_servers", FieldType::StrList, "E2B's `dnsServers`: IPv4 nameservers reachable while allow_out names a domain (default 8.8.8.8; `[]`: none)"),
];

const CREATE_NETWORK: &[Field] = &{
    let mut fields = [f(
        "allow_public_traffic",
        FieldType::Bool,
        "E2B's `allowPublicTraffic`: false makes the sandbox's ports private, reached only with its traffic access token (which HTTP steps send; `traffic_token: false` leaves it out); refused where the provider has no token",
    ); 5];
    let mut i = 0;
    while i < NETWORK_RULES.len() {
        fields[i] = NETWORK_RULES[i];
        i += 1;
    }
    fields
};

const CREATE_LIFECYCLE: &[Field] = &[
    f("on_timeout", FieldType::Enum(&["kill", "pause"]), "at its end time the sandbox is killed (default) or paused, as E2B's `lifecycle.on_timeout` (`autoPause`); `connect` resumes it"),
    f("memory", FieldType::Bool, "with `pause`: keep its memory and processes (default true), or only its files (`autoPauseMemory: false`)"),
    f("auto_resume", FieldType::Bool, "E2B's `autoResume`: traffic to the paused sandbox wakes it (the clouds and serve; refused on local)"),
];

const HTTP_FIELDS_COMMON: [Field; 9] = [
    f("port", FieldType::Range(1, 65535), "port inside the sandbox; resolved to the sandbox's host for that port"),
    f("path", FieldType::Str, "path (and query) appended to the port's URL, default `/`"),
    f("url", FieldType::Str, "full URL instead of port + path"),
    f("headers", FieldType::StrMap, "request headers"),
    f("body", FieldType::Any, "request body: a string, or a mapping/list sent as JSON"),
    f("expect", FieldType::Object(HTTP_EXPECT), "expectations on the response"),
    f(
        "request_timeout",
        FieldType::Duration,
        "limit for one request (default 30s; 5s for each attempt under `eventually`)",
    ),
    f(
        "capture",
        FieldType::Any,
        "variables from the response, as Hurl's captures: `{ name: { header: X-Token } }`, `{ name: { regex: 'id=(\\d+)' } }` (the body; the first group), or both (a header's value by regex)",
    ),    f(
        "traffic_token",
        FieldType::Bool,
        "send the headers the provider gives its port URLs (E2B's `e2b-traffic-access-token`, OpenSandbox's secure access; default true); false sends the request as a stranger to the sandbox would",
    ),
];

const HTTP_OUTPUTS: &[(&str, &str)] = &[
    ("status", "status code"),
    ("body", "response body as text"),
    ("headers", "response headers (lowercase names)"),
    ("json", "the body parsed as JSON, or null"),
    ("body_dropped", "bytes of the body beyond --max-output, read but not kept (0 normally)"),
    ("url", "the URL requested"),
    ("duration_ms", "milliseconds from sending the request to the end of the body"),
    ("captures", "the values `capture` bound (also under `vars`)"),
    ("request", "what was sent: method, url, headers (credentials masked), body (cut at 2 KiB)"),
];

/// The types of change `watch-events { expect: [{ type }] }` names (checked by `check`).
pub const WATCH_TYPES: &[&str] = &["create", "write", "remove", "rename", "chmod"];

const EXEC_OUTPUTS: &[(&str, &str)] = &[
    ("stdout", "standard output"),
    ("stderr", "standard error"),
    ("exit_code", "exit code (null if killed by a signal)"),
    ("signal", "signal number that ended it, or null"),
    ("timed_out", "true if the command's timeout killed it"),
    ("pid", "process id in the sandbox"),
    ("duration_ms", "wall time"),
    ("stdout_dropped", "bytes of stdout beyond --max-output, not kept (0 normally)"),
    ("stderr_dropped", "bytes of stderr beyond --max-output, not kept"),
];

const HOST_OUTPUTS: &[(&str, &str)] = &[
    ("stdout", "standard output"),
    ("stderr", "standard error"),
    ("exit_code", "exit code (null if killed by a signal)"),
    ("signal", "signal number that ended it, or null"),
    ("timed_out", "true if the step's timeout killed it"),
    ("pid", "process id on the runner's machine (its process group id too)"),
    ("duration_ms", "wall time"),
    ("stdout_dropped", "bytes of stdout beyond --max-output, not kept (0 normally)"),
    ("stderr_dropped", "bytes of stderr beyond --max-output, not kept"),
];

const BUILD_FIELDS: &[Field] = &[
    req("template", FieldType::Str, "template name: the folder `templates/<name>` nearest above the scenario file (or $SCENARIO_RUN_TEMPLATES_DIR/<name>)"),
    f("path", FieldType::Str, "the template folder instead, relative to the scenario file"),
    f("args", FieldType::StrMap, "values for the Dockerfile's ARGs"),
    f("keep", FieldType::Bool, "pin the build after the run (also SCENARIO_RUN_KEEP_BUILDS=1); default: on the local provider it is cached by content (`scenario-run cache`), elsewhere removed at the end of the run"),
    f("skip_cache", FieldType::Bool, "build again, reusing no earlier build: not this run's, not the local layer cache, not the platform's (E2B's `force`); the step's `cached` output is false"),
];

const INFO_OUTPUTS: &[(&str, &str)] = &[
    ("id", "sandbox id"),
    ("template", "template"),
    ("metadata", "metadata map"),
    ("started_at", "unix seconds"),
    ("end_at", "unix seconds when it expires"),
    ("state", "running or paused"),
];

pub static REGISTRY: &[StepKind] = &[
    StepKind {
        name: "create",
        summary: "create a sandbox from a template; it is destroyed when the scenario ends unless `keep: true`",
        main: Some("template"),
        fields: &[
            f("template", FieldType::Str, "template name or id (default `base`); a name whose folder's template.yaml has `ids.<provider>` sends that id (the official templates in the cloud)"),
            f("as", FieldType::Str, "alias for `sandbox:` and `{{ sandboxes.<alias> }}`"),
            f("timeout", FieldType::Duration, "sandbox lifetime before it expires by itself (default `E2E_SANDBOX_TTL`, else 300 s)"),
            f("metadata", FieldType::StrMap, "metadata; always gains the run tag e2e=<run id>"),
            f("envs", FieldType::StrMap, "environment of every process in the sandbox"),
            f("keep", FieldType::Bool, "do not destroy at the end of the scenario"),
            f("cpu", FieldType::Range(1, 1024), "CPU count, where the provider supports it"),
            f("memory", FieldType::Range(1, 1_048_576), "memory in MiB, where the provider supports it"),
            f("disk", FieldType::Range(16, 1 << 20), "disk in MiB (local; Alibaba's `diskSizeMB`): writes past it fail with ENOSPC inside; default the template's `disk`, else 10240"),
            f("network", FieldType::Object(CREATE_NETWORK), "egress policy (E2B's `allow_internet_access`, `network.allowOut`/`denyOut`/`dnsServers`); enforced on local and the clouds, refused on docker"),
            f("lifecycle", FieldType::Object(CREATE_LIFECYCLE), "what happens at its end time: `{ on_timeout: pause }` pauses it instead of killing it (E2B's `lifecycle`); refused where the provider cannot pause"),
        ],
        matcher: false,
        free_keys: false,
        outputs: &[
            ("id", "sandbox id"),
            ("template", "template"),
            ("template_id", "the template id sent (after template.yaml `ids`)"),
            ("alias", "alias or null"),
        ],
        uses_sandbox: false,
        eventual: false,
        sets_last: false,
        example: "- create: { template: base, as: sb, envs: { FOO: bar } }",
    },
    StepKind {
        name: "build",
        summary: "build a template folder (Dockerfile + template.yaml) on the provider; once per folder content per run",
        main: Some("template"),
        fields: BUILD_FIELDS,
        matcher: false,
        free_keys: false,
        outputs: &[
            ("name", "the template's name"),
            ("image", "what was built: an image, or on local the layer's path"),
            ("digest", "content hash of the template folder (sha256:…)"),
            ("cached", "true if this run (or a kept earlier build) had built it already"),
            ("log", "the build log"),
        ],
        uses_sandbox: false,
        eventual: false,
        sets_last: false,
        example: "- build: { template: python-hello }\n  id: built\n  timeout: 10m",
    },
    StepKind {
        name: "deploy",
        summary: "build if needed and register a template, so `create` starts it (start command, then the ready command)",
        main: Some("template"),
        fields: BUILD_FIELDS,
        matcher: false,
        free_keys: false,
        outputs: &[
            ("template_id", "what `create { template: }` takes"),
            ("image", "what was built"),
            ("digest", "content hash of the template folder"),
            ("cached", "true if the build was reused"),
            ("log", "the build and registration log"),
        ],
        uses_sandbox: false,
        eventual: false,
        sets_last: false,
        example: "- deploy: python-hello\n  id: deployed\n  timeout: 10m\n- create: { template: \"{{ steps.deployed.template_id }}\" }",
    },
    StepKind {
        name: "scripted-model",
        summary: "serve a scripted model endpoint reachable inside the sandbox (OpenAI Chat Completions and Responses, Anthropic Messages; whole or streamed), so an agent CLI runs a real turn without a model or key: a request offering tools gets one tool call writing `file` with the agent's own write or shell tool, later requests the final `reply`",
        main: None,
        fields: &[
            req("file", FieldType::Str, "absolute path in the sandbox the tool call writes"),
            req("content", FieldType::Str, "what it writes there"),
            f("reply", FieldType::Str, "the final message (default `done`)"),
            f("port", FieldType::Range(1, 65535), "port inside the sandbox (default 8787); on a provider sharing the host's network the endpoint's own port is used"),
            f("model", FieldType::Str, "the model name it lists (default `scripted`; any name a CLI sends is answered)"),
        ],
        matcher: false,
        free_keys: false,
        outputs: &[
            ("url", "base URL inside the sandbox (`http://127.0.0.1:8787`)"),
            ("openai_base_url", "`<url>/v1`, for OPENAI_BASE_URL"),
            ("anthropic_base_url", "`<url>`, for ANTHROPIC_BASE_URL"),
            ("host_url", "where the run reaches it: `GET <host_url>/_log` lists every request and answer"),
            ("model", "the model name"),
        ],
        uses_sandbox: true,
        eventual: false,
        sets_last: false,
        example: "- scripted-model: { file: /home/user/workspace/hello.txt, content: hi }\n  id: model\n- exec:\n    cmd: qwen -p 'write the file' --yolo\n    env: { OPENAI_BASE_URL: \"{{ steps.model.openai_base_url }}\", OPENAI_API_KEY: none }\n- assert-file: { path: /home/user/workspace/hello.txt, equals: hi }",
    },
    StepKind {
        name: "connect",
        summary: "attach to an existing sandbox by id (it is not destroyed at the end unless `owned: true`)",
        main: Some("id"),
        fields: &[
            req("id", FieldType::Str, "sandbox id"),
            f("as", FieldType::Str, "alias"),
            f("timeout", FieldType::Duration, "new lifetime from now"),
            f("owned", FieldType::Bool, "destroy it at the end of the scenario like a created one"),
        ],
        matcher: false,
        free_keys: false,
        outputs: INFO_OUTPUTS,
        uses_sandbox: false,
        eventual: true,
        sets_last: false,
        example: "- connect: { id: \"{{ steps.made.id }}\", as: again }",
    },
    StepKind {
        name: "info",
        summary: "read a sandbox's info",
        main: Some("id"),
        fields: &[f("id", FieldType::Str, "sandbox id (default: the step's sandbox)")],
        matcher: false,
        free_keys: false,
        outputs: INFO_OUTPUTS,
        uses_sandbox: true,
        eventual: true,
        sets_last: false,
        example: "- info: {}\n  id: about",
    },
    StepKind {
        name: "list",
        summary: "list sandboxes whose metadata matches (default: this run's tag)",
        main: None,
        fields: &[
            f("metadata", FieldType::StrMap, "metadata filter; every pair must match"),
            f("all", FieldType::Bool, "no filter at all, not even the run tag"),
            f("api_key", FieldType::Str, "ask with this API key instead of the configured one (e2b, alicloud): the invalid-key check"),
        ],
        matcher: false,
        free_keys: false,
        outputs: &[("ids", "list of sandbox ids"), ("count", "number of sandboxes"), ("sandboxes", "list of info objects")],
        uses_sandbox: false,
        eventual: true,
        sets_last: false,
        example: "- list: { metadata: { team: qa } }\n  id: mine",
    },
    StepKind {
        name: "kill",
        summary: "destroy a sandbox now",
        main: Some("id"),
        fields: &[f("id", FieldType::Str, "sandbox id (default: the step's sandbox)")],
        matcher: false,
        free_keys: false,
        outputs: &[("killed", "false if it did not exist")],
        uses_sandbox: true,
        eventual: false,
        sets_last: false,
        example: "- kill: {}",
    },
    StepKind {
        name: "set-timeout",
        summary: "change when the sandbox expires, counted from now",
        main: Some("timeout"),
        fields: &[req("timeout", FieldType::Duration, "new lifetime from now")],
        matcher: false,
        free_keys: false,
        outputs: &[("end_at", "unix seconds when it now expires")],
        uses_sandbox: true,
        eventual: false,
        sets_last: false,
        example: "- set-timeout: 10m",
    },
    StepKind {
        name: "update-network",
        summary: "replace the running sandbox's egress policy (E2B's `update_network`, OpenSandbox's network policy `PUT`): the rules given are the whole policy from now on, `{}` opens it again (capability `egress`)",
        main: None,
        fields: &NETWORK_RULES,
        matcher: false,
        free_keys: false,
        outputs: &[],
        uses_sandbox: true,
        eventual: false,
        sets_last: false,
        example: "- update-network: { allow_out: [registry.npmjs.org], deny_out: [0.0.0.0/0] }",
    },
    StepKind {
        name: "pause",
        summary: "pause the sandbox: its processes stop where they are and it no longer expires; its files stay (capability `pause`)",
        main: None,
        fields: &[f(
            "memory",
            FieldType::Bool,
            "keep the processes' memory (default true); false keeps only the files: the processes end and `resume` boots the sandbox again",
        )],
        matcher: false,
        free_keys: false,
        outputs: &[("id", "sandbox id"), ("state", "the state the provider reports now: paused")],
        uses_sandbox: true,
        eventual: false,
        sets_last: false,
        example: "- pause: {}\n  id: paused\n- assert: { that: \"steps.paused.state == 'paused'\" }",
    },
    StepKind {
        name: "resume",
        summary: "resume a paused sandbox: its processes run on from where they stopped (capability `pause`)",
        main: Some("timeout"),
        fields: &[f("timeout", FieldType::Duration, "lifetime from now (default `E2E_SANDBOX_TTL`, else 300 s)")],
        matcher: false,
        free_keys: false,
        outputs: &[("id", "sandbox id"), ("state", "the state now: running"), ("end_at", "unix seconds when it now expires")],
        uses_sandbox: true,
        eventual: false,
        sets_last: false,
        example: "- resume: { timeout: 5m }",
    },
    StepKind {
        name: "snapshot",
        summary: "capture the sandbox's filesystem as a template `create` starts (processes are not captured); deleted when the scenario ends, after its sandboxes, unless `keep: true` (capability `snapshot`)",
        main: Some("name"),
        fields: &[
            f("name", FieldType::Str, "the snapshot's name (default: one made from the run id)"),
            f("keep", FieldType::Bool, "do not delete it at the end of the scenario (local keeps templates for the run only)"),
        ],
        matcher: false,
        free_keys: false,
        outputs: &[
            ("id", "what `create { template: }` takes to start a sandbox from it"),
            ("name", "its name"),
            ("sandbox", "the sandbox it was taken of"),
        ],
        uses_sandbox: true,
        eventual: false,
        sets_last: false,
        example: "- snapshot: {}\n  id: snap\n- create: { template: \"{{ steps.snap.id }}\", as: copy }",
    },
    StepKind {
        name: "exec",
        summary: "run a command through `/bin/bash -l -c` in the sandbox; a non-zero exit is recorded, not a failure (use assert-exit or `exit_code:`)",
        main: Some("cmd"),
        fields: &[
            req("cmd", FieldType::Str, "shell command"),
            f("cwd", FieldType::Str, "working directory (default /home/user)"),
            f("env", FieldType::StrMap, "extra environment variables"),
            f("user", FieldType::Str, "user to run as, where the provider supports it"),
            f("stdin", FieldType::Str, "text fed to standard input"),
            f("timeout", FieldType::Duration, "kill the command after this long (the step fails)"),
            f("background", FieldType::Bool, "start it and go on; outputs `pid` for wait/signal"),
            f("open_stdin", FieldType::Bool, "with `background`: keep its stdin open for `send-stdin` by pid (E2B's `commands.run(stdin=True)`; capability `open-stdin`)"),
            f("exit_code", EXIT_CODE, "expected exit code; the step fails otherwise"),
        ],
        matcher: false,
        free_keys: false,
        outputs: EXEC_OUTPUTS,
        uses_sandbox: true,
        eventual: true,
        sets_last: true,
        example: "- exec: echo hello; echo oops >&2; exit 3\n  id: first",
    },
    StepKind {
        name: "host",
        summary: "run a command on the runner's own machine (not in a sandbox) through `/bin/bash -c`, to drive real clients (an SDK, a CLI) against the provider: `{{ provider.env }}` points them at it and carries the run tag; outputs, matchers and masking as `exec`, and no process it started outlives the step",
        main: Some("cmd"),
        fields: &[
            req("cmd", FieldType::Str, "shell command"),
            f("cwd", FieldType::Str, "working directory, relative to the scenario file's folder (the default)"),
            f("env", FieldType::StrMap, "variables over the run's environment (process and .env), e.g. `\"{{ provider.env }}\"`"),
            f("stdin", FieldType::Str, "text fed to standard input"),
            f("timeout", FieldType::Duration, "kill its process group after this long (the step fails); default --exec-timeout"),
            f("exit_code", EXIT_CODE, "expected exit code; the step fails otherwise"),
        ],
        matcher: false,
        free_keys: false,
        outputs: HOST_OUTPUTS,
        uses_sandbox: false,
        eventual: true,
        sets_last: true,
        example: "- host:\n    cmd: python3 sdk_check.py\n    env: \"{{ provider.env }}\"\n    timeout: 2m\n  id: sdk\n- assert-stdout: { contains: ok }",
    },
    StepKind {
        name: "process-list",
        summary: "list the processes started by exec in the sandbox",
        main: None,
        fields: &[],
        matcher: false,
        free_keys: false,
        outputs: &[("pids", "pids of running processes"), ("processes", "list of { pid, cmd, running, exit_code }"), ("count", "number running")],
        uses_sandbox: true,
        eventual: true,
        sets_last: false,
        example: "- process-list: {}\n  id: procs",
    },
    StepKind {
        name: "signal",
        summary: "send a signal to a background process",
        main: Some("pid"),
        fields: &[
            req("pid", PID, "process id (from a background exec)"),
            f("signal", FieldType::Signal, "TERM (default), KILL, INT, HUP, USR1, USR2, STOP, CONT, or a number"),
        ],
        matcher: false,
        free_keys: false,
        outputs: &[("pid", "pid"), ("signal", "signal number sent")],
        uses_sandbox: true,
        eventual: false,
        sets_last: false,
        example: "- signal: { pid: \"{{ steps.server.pid }}\", signal: TERM }",
    },
    StepKind {
        name: "send-stdin",
        summary: "write to the stdin of a background process started with `open_stdin`, by pid, from any connection to its sandbox (E2B's `send_stdin`, `close_stdin`; capability `open-stdin`)",
        main: Some("data"),
        fields: &[
            req("pid", PID, "process id (from a background exec with `open_stdin: true`)"),
            f("data", FieldType::Str, "text written to its stdin"),
            f("close", FieldType::Bool, "then close its stdin: the process reads end-of-file"),
        ],
        matcher: false,
        free_keys: false,
        outputs: &[("pid", "pid"), ("bytes", "bytes written")],
        uses_sandbox: true,
        eventual: false,
        sets_last: false,
        example: "- send-stdin: { pid: \"{{ steps.reader.pid }}\", data: \"one\\n\", close: true }",
    },
    StepKind {
        name: "wait",
        summary: "wait for a background process to end; its output becomes the last command's",
        main: Some("pid"),
        fields: &[
            req("pid", PID, "process id"),
            f("timeout", FieldType::Duration, "how long to wait (default 30s); the step fails after"),
        ],
        matcher: false,
        free_keys: false,
        outputs: EXEC_OUTPUTS,
        uses_sandbox: true,
        eventual: false,
        sets_last: true,
        example: "- wait: \"{{ steps.job.pid }}\"",
    },
    StepKind {
        name: "pty",
        summary: "run a command in a pseudo-terminal and drive it: type `input`, wait for the output to match `expect`, then each `script` item; the command is killed at the end unless `exit_code` waits for it to end (capability `pty`)",
        main: Some("cmd"),
        fields: &[
            f("cmd", FieldType::Str, "shell command (default `exec /bin/bash -i -l`, an interactive shell as the E2B SDK starts)"),
            f("cols", FieldType::Range(1, 65535), "terminal width (default 80)"),
            f("rows", FieldType::Range(1, 65535), "terminal height (default 24)"),
            f("cwd", FieldType::Str, "working directory (default /home/user)"),
            f("env", FieldType::StrMap, "extra environment variables"),
            f("input", FieldType::Str, "text typed first (end a line with \\n)"),
            f("expect", FieldType::Matcher, "what the output after `input` must match, within `within`: a matcher such as { contains: ... } (a scalar means `equals`)"),
            f("script", FieldType::Any, "then, in order, a list of { send: <text>, resize: { cols, rows }, expect: <matcher> }: each resizes, types, and waits for its output to match"),
            f("within", FieldType::Duration, "how long each `expect` (and the end, with `exit_code`) waits (default 10s)"),
            f("exit_code", EXIT_CODE, "wait for the command to end by itself and expect this code; without it the command is killed"),
        ],
        matcher: false,
        free_keys: false,
        outputs: &[
            ("output", "everything the terminal showed (with the terminal's \\r\\n and escapes)"),
            ("exit_code", "exit code when `exit_code` was asked for, else null (killed)"),
            ("pid", "process id in the sandbox"),
            ("cols", "initial width"),
            ("rows", "initial height"),
            ("duration_ms", "wall time"),
        ],
        uses_sandbox: true,
        eventual: false,
        sets_last: false,
        example: "- pty:\n    input: \"tty\\n\"\n    expect: { matches: /dev/pts/[0-9]+ }\n    script:\n      - { resize: { cols: 120, rows: 40 }, send: \"stty size\\n\", expect: { contains: 40 120 } }\n      - { send: \"exit 3\\n\" }\n    exit_code: 3",
    },
    StepKind {
        name: "write-file",
        summary: "write a file in the sandbox (parents are created)",
        main: None,
        fields: &[
            req("path", FieldType::Str, "path; relative paths are under /home/user"),
            f("content", FieldType::Str, "text content"),
            f("content_base64", FieldType::Str, "binary content, base64"),
            f("from", FieldType::Str, "a local file, relative to the scenario file"),
            f("mode", FieldType::Str, "permission bits in octal, e.g. \"0755\""),
        ],
        matcher: false,
        free_keys: false,
        outputs: &[("path", "absolute path"), ("size", "bytes written")],
        uses_sandbox: true,
        eventual: false,
        sets_last: false,
        example: "- write-file: { path: /tmp/hello.txt, content: \"hi\\n\" }",
    },
    StepKind {
        name: "read-file",
        summary: "read a file from the sandbox",
        main: Some("path"),
        fields: &[
            req("path", FieldType::Str, "path"),
            f("encoding", FieldType::Enum(&["text", "base64"]), "`text` (default) or `base64` for binary content"),
        ],
        matcher: false,
        free_keys: false,
        outputs: &[("content", "the content (text, or base64)"), ("size", "bytes")],
        uses_sandbox: true,
        eventual: true,
        sets_last: false,
        example: "- read-file: /tmp/hello.txt\n  id: hello",
    },
    StepKind {
        name: "files",
        summary: "filesystem operations: list, stat, mkdir, move, remove, exists",
        main: None,
        fields: &[
            req("op", FieldType::Enum(&["list", "stat", "mkdir", "move", "remove", "exists"]), "operation"),
            req("path", FieldType::Str, "path"),
            f("to", FieldType::Str, "destination for `move`"),
        ],
        matcher: false,
        free_keys: false,
        outputs: &[
            ("entries", "list: entries { name, path, type, size, mode, modified }"),
            ("names", "list: entry names, sorted"),
            ("exists", "exists: true or false"),
            ("type", "stat/mkdir/move: file, dir or symlink"),
            ("size", "stat: size in bytes"),
            ("mode", "stat: permission bits as octal text, e.g. \"0644\""),
            ("path", "the (new) absolute path"),
        ],
        uses_sandbox: true,
        eventual: true,
        sets_last: false,
        example: "- files: { op: list, path: /tmp }\n  id: tmp",
    },
    StepKind {
        name: "watch",
        summary: "watch a sandbox directory for changes; `watch-events { of: <this step's id> }` checks what it saw; it stops when the scenario ends (capability `watch`)",
        main: Some("path"),
        fields: &[
            req("path", FieldType::Str, "directory; relative paths are under /home/user"),
            f("recursive", FieldType::Bool, "also the directories below it, including those made later"),
        ],
        matcher: false,
        free_keys: false,
        outputs: &[("name", "the watch's name in the scenario (watch-1, watch-2, …)"), ("path", "the directory"), ("recursive", "true or false")],
        uses_sandbox: true,
        eventual: false,
        sets_last: false,
        example: "- watch: { path: /home/user/inbox, recursive: true }\n  id: inbox",
    },
    StepKind {
        name: "watch-events",
        summary: "wait until a watch has reported the expected changes since the previous watch-events on it (or, with `none: true`, check that it reports none)",
        main: None,
        fields: &[
            f("of", FieldType::Str, "id of the `watch` step (default: the most recent watch)"),
            f("expect", FieldType::Any, "a list of { name: <path relative to the watched directory>, type: create|write|remove|rename|chmod }, or names; every one must be reported"),
            f("none", FieldType::Bool, "expect no change at all during `within`"),
            f("within", FieldType::Duration, "how long to wait (default 10s); without `expect` or `none`, it collects for this long"),
        ],
        matcher: false,
        free_keys: false,
        outputs: &[
            ("events", "list of { name, type } in the order reported"),
            ("names", "the names, consecutive repeats removed"),
            ("count", "number of events"),
        ],
        uses_sandbox: false,
        eventual: false,
        sets_last: false,
        example: "- watch-events: { of: inbox, expect: [{ name: a.txt, type: write }], within: 5s }",
    },
    StepKind {
        name: "assert-stdout",
        summary: "check a command's stdout with a matcher (a scalar means `equals`)",
        main: Some("equals"),
        fields: &[MATCHER_OF],
        matcher: true,
        free_keys: false,
        outputs: &[],
        uses_sandbox: false,
        eventual: false,
        sets_last: false,
        example: "- assert-stdout: { equals: \"hello\\n\" }",
    },
    StepKind {
        name: "assert-stderr",
        summary: "check a command's stderr with a matcher (a scalar means `equals`)",
        main: Some("equals"),
        fields: &[MATCHER_OF],
        matcher: true,
        free_keys: false,
        outputs: &[],
        uses_sandbox: false,
        eventual: false,
        sets_last: false,
        example: "- assert-stderr: { contains: oops }",
    },
    StepKind {
        name: "assert-exit",
        summary: "check a command's exit code",
        main: Some("code"),
        fields: &[req("code", EXIT_CODE, "expected exit code"), MATCHER_OF],
        matcher: false,
        free_keys: false,
        outputs: &[],
        uses_sandbox: false,
        eventual: false,
        sets_last: false,
        example: "- assert-exit: 3",
    },
    StepKind {
        name: "assert-file",
        summary: "check a file in the sandbox with a matcher, against a file beside the scenario, or that it does not exist",
        main: Some("path"),
        fields: &[
            req("path", FieldType::Str, "path"),
            f("exists", FieldType::Bool, "false: the file must not exist"),
            f("equals_file", FieldType::Str, "a local file, relative to the scenario file's folder (and inside it), that the sandbox file must equal byte for byte"),
            f("sha256", FieldType::Str, "the SHA-256 of the file's bytes, 64 hex digits (for a binary file)"),
            f("size", FieldType::Int, "the file's size in bytes"),
        ],
        matcher: true,
        free_keys: false,
        outputs: &[("content", "the file's text"), ("size", "bytes"), ("sha256", "the SHA-256 of its bytes, hex")],
        uses_sandbox: true,
        eventual: true,
        sets_last: false,
        example: "- assert-file: { path: /tmp/hello.txt, contains: hi }\n- assert-file: { path: /srv/report.json, equals_file: expected/report.json }\n- assert-file: { path: /tmp/chart.png, size: 5120, sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08 }",
    },
    StepKind {
        name: "assert",
        summary: "check any expression",
        main: Some("that"),
        fields: &[req("that", FieldType::Expr, "expression, e.g. `steps.a.exit_code == 0`"), f("message", FieldType::Str, "message shown when it is false")],
        matcher: false,
        free_keys: false,
        outputs: &[],
        uses_sandbox: false,
        eventual: false,
        sets_last: false,
        example: "- assert: { that: \"steps.tmp.names | length > 0\", message: no files in /tmp }",
    },
    StepKind {
        name: "http-get",
        summary: "GET a URL, or a port inside the sandbox, and check the response",
        main: Some("url"),
        fields: &HTTP_FIELDS_COMMON,
        matcher: false,
        free_keys: false,
        outputs: HTTP_OUTPUTS,
        uses_sandbox: true,
        eventual: true,
        sets_last: false,
        example: "- http-get: { port: 8000, path: /health, expect: { status: 200, body: { contains: ok } } }\n  eventually: 10s",
    },
    StepKind {
        name: "http",
        summary: "an HTTP request with any method",
        main: None,
        fields: &{
            let mut fields = [req("method", FieldType::Enum(&["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]), "HTTP method"); 10];
            let mut i = 0;
            while i < HTTP_FIELDS_COMMON.len() {
                fields[i + 1] = HTTP_FIELDS_COMMON[i];
                i += 1;
            }
            fields
        },
        matcher: false,
        free_keys: false,
        outputs: HTTP_OUTPUTS,
        uses_sandbox: true,
        eventual: true,
        sets_last: false,
        example: "- http: { method: POST, port: 8000, path: /echo, body: { a: 1 }, expect: { status: 201 } }",
    },
    StepKind {
        name: "set",
        summary: "bind variables (under `vars`) from values or expressions",
        main: None,
        fields: &[],
        matcher: false,
        free_keys: true,
        outputs: &[],
        uses_sandbox: false,
        eventual: false,
        sets_last: false,
        example: "- set: { who: \"{{ steps.me.stdout | trim }}\" }",
    },
    StepKind {
        name: "bench",
        summary: "measure the provider as `scenario-run bench` does (time to interactive, a command's round trip: trimmed percentiles, the success rate), for a budget asserted after it (`steps.b.tti.p95 < 800`)",
        main: Some("iterations"),
        fields: &[
            f("iterations", FieldType::Range(1, 1000), "sandboxes created, each running `true` twice, then killed (default 10)"),
            f("mode", FieldType::Enum(&["sequential", "staggered", "burst"]), "one after another (default), one started every `stagger`, or all at once"),
            f("stagger", FieldType::Duration, "the time between two starts in the staggered mode (default 200ms)"),
            f("template", FieldType::Str, "the template each sandbox starts from (default `base`)"),
        ],
        matcher: false,
        free_keys: false,
        outputs: &[
            ("tti", "time to interactive, ms: `{ p50, p95, p99, min, max, mean, kept }` (null if no iteration succeeded)"),
            ("round_trip", "a second command's round trip, ms, the same shape"),
            ("success_rate", "the share of iterations whose create and both commands succeeded (0 to 1)"),
            ("succeeded", "how many succeeded"),
            ("failed", "how many did not"),
            ("errors", "each failure's reason and how many times it was seen"),
        ],
        uses_sandbox: false,
        eventual: false,
        sets_last: false,
        example: "- bench: { iterations: 20 }\n  id: speed\n- assert: { that: \"steps.speed.success_rate == 1 and steps.speed.tti.p95 < 800\" }",
    },
    StepKind {
        name: "sleep",
        summary: "wait a fixed time (prefer `eventually` on the step that waits for something)",
        main: Some("duration"),
        fields: &[req("duration", FieldType::Duration, "how long")],
        matcher: false,
        free_keys: false,
        outputs: &[],
        uses_sandbox: false,
        eventual: false,
        sets_last: false,
        example: "- sleep: 500ms",
    },
    StepKind {
        name: "skip",
        summary: "end the scenario as SKIPPED with this reason (give it an `if:`): for what shows only while running, e.g. that a client cannot reach this endpoint; later steps are skipped, `finally` and cleanup still run",
        main: Some("reason"),
        fields: &[req("reason", FieldType::Str, "why the scenario cannot run here, shown as its SKIPPED reason")],
        matcher: false,
        free_keys: false,
        outputs: &[],
        uses_sandbox: false,
        eventual: false,
        sets_last: false,
        example: "- host: command -v npm || true\n  id: npm\n- skip: npm is not installed here, so the E2B CLI cannot be\n  if: \"not steps.npm.stdout\"",
    },
    StepKind {
        name: "run-code",
        summary: "run code through the template's code interpreter as the platform's clients do (E2B's protocol on port 49999: POST /execute, streamed results): state is kept per context, errors are data; `via: exec` runs Python with the sandbox's python3 instead, for templates without the interpreter",
        main: Some("code"),
        fields: &[
            req("code", FieldType::Str, "source code"),
            f("language", FieldType::Str, "python (default), javascript (js), typescript (ts), bash, r: the interpreter's default context of that language; a language it has no kernel for fails with its answer"),
            f("context", FieldType::Str, "a context of this scenario, by a name of your choice: made on first use in the sandbox (of `language`, in `cwd`) and used again by later steps naming it; without it, the language's default context"),
            f("cwd", FieldType::Str, "working directory of a new `context` (default /home/user)"),
            f("env", FieldType::StrMap, "environment variables for this execution only"),
            f("timeout", FieldType::Duration, "limit for the run (default --exec-timeout); past it the connection is dropped, the interpreter interrupts the kernel and the step fails"),
            f("via", FieldType::Enum(&["interpreter", "exec"]), "interpreter (default): the code interpreter on port 49999; exec: a Python driver run with the sandbox's python3 (templates without the interpreter, e.g. base)"),
        ],
        matcher: false,
        free_keys: false,
        outputs: &[
            ("stdout", "printed output, joined"),
            ("stderr", "error output, joined"),
            ("logs", "{ stdout: [..], stderr: [..] } as the interpreter streamed them"),
            ("results", "every result (display calls, then the cell's value) with its forms: text, html, markdown, svg, png, jpeg, pdf, latex, json, javascript, data, chart, extra, is_main_result, and `formats` (the forms present); via exec: the last expression's value as { text, json }"),
            ("text", "text of the main result (the cell's value), or null"),
            ("error", "{ name, value, traceback } if it raised, else null"),
            ("execution_count", "the kernel's execution count of this cell (interpreter)"),
            ("context", "the interpreter's id of the named `context`, or null"),
            ("timed_out", "whether the timeout ended it"),
            ("stdout_dropped", "bytes of stdout beyond --max-output, not kept (0 normally)"),
            ("stderr_dropped", "bytes of stderr beyond --max-output, not kept"),
            ("results_dropped", "results not kept: together they passed --max-output (0 normally)"),
            ("frames_dropped", "lines of the interpreter's answer longer than twice --max-output, skipped unread (0 normally)"),
            ("cut", "what was not kept, in words, or null"),
        ],
        uses_sandbox: true,
        eventual: false,
        sets_last: true,
        example: "- run-code: { code: \"total = 21\", context: calc }\n- run-code: { code: \"total * 2\", context: calc }\n  id: answer\n- assert: { that: \"steps.answer.text == '42'\" }",
    },
];

/// Kinds whose command is given the step's limit and stopped by it, keeping what it printed
/// (`exec`, `host`): the runner gives them a moment past the limit to do so.
pub fn stops_itself(kind: &StepKind) -> bool {
    matches!(kind.name, "exec" | "host")
}

pub fn lookup(name: &str) -> Option<&'static StepKind> {
    REGISTRY.iter().find(|k| k.name == name)
}

pub fn names() -> impl Iterator<Item = &'static str> {
    REGISTRY.iter().map(|k| k.name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_main_fields_exist() {
        let mut seen = std::collections::BTreeSet::new();
        for k in REGISTRY {
            assert!(seen.insert(k.name), "duplicate kind {}", k.name);
            if let Some(m) = k.main {
                assert!(k.field(m).is_some() || k.matcher, "{}: main field {m} missing", k.name);
            }
        }
        assert_eq!(lookup("http").unwrap().fields[0].name, "method");
        assert_eq!(lookup("http").unwrap().fields.len(), 10);
    }
}
