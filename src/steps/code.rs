//! `run-code`: code-interpreter semantics on any sandbox with Python.
//!
//! The code and a small driver are written into the sandbox and run with `python3`. The driver
//! executes every statement, evaluates a trailing expression as the result (like a notebook
//! cell), and writes `{ results, error }` as JSON to a result file, so printed output and the
//! result never mix.

use std::time::Instant;

use serde_json::{json, Value as JsonValue};

use super::args::Args;
use super::{exec_outputs, StepCtx, StepError, StepResult};
use crate::provider::ExecRequest;

const DRIVER: &str = r#"import ast, json, sys, traceback
src = open(sys.argv[1]).read()
out = {"results": [], "error": None}
ns = {"__name__": "__main__"}
try:
    tree = ast.parse(src, "<cell>")
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    exec(compile(tree, "<cell>", "exec"), ns)
    if last is not None:
        value = eval(compile(ast.Expression(last.value), "<cell>", "eval"), ns)
        if value is not None:
            r = {"text": value if isinstance(value, str) else repr(value)}
            try:
                r["json"] = json.loads(value) if isinstance(value, str) else json.loads(json.dumps(value))
            except Exception:
                r["json"] = None
            out["results"].append(r)
except BaseException as e:
    out["error"] = {"name": type(e).__name__, "value": str(e), "traceback": traceback.format_exc()}
sys.stdout.flush()
with open(sys.argv[2], "w") as f:
    json.dump(out, f)
"#;

pub async fn run_code(ctx: &mut StepCtx, a: &Args) -> StepResult {
    let code = a.str("code");
    let lang = a.opt_str("language").unwrap_or("python");
    if lang != "python" {
        return Err(StepError::bad_args(format!("language `{lang}` is not supported: use python")));
    }
    let id = ctx.sandbox_id()?;
    let n = crate::random::hex(8);
    let dir = "/tmp/.scenario-run";
    let (driver, cell, result) =
        (format!("{dir}/driver.py"), format!("{dir}/cell-{n}.py"), format!("{dir}/result-{n}.json"));
    ctx.provider.write_file(&id, &driver, DRIVER.as_bytes().to_vec(), None).await?;
    ctx.provider.write_file(&id, &cell, code.as_bytes().to_vec(), None).await?;
    let req = ExecRequest {
        cmd: format!("python3 {driver} {cell} {result}"),
        timeout: Some(a.duration("timeout").unwrap_or(ctx.exec_timeout)),
        max_output: Some(ctx.max_output),
        ..Default::default()
    };
    let started = Instant::now();
    let r = ctx.provider.exec(&id, req, None).await?;
    let mut outputs = exec_outputs(&r, started.elapsed());
    if r.timed_out {
        return Err(StepError::fail("code timed out").with_outputs(outputs));
    }
    let parsed: JsonValue = match ctx.provider.read_file(&id, &result).await {
        Ok(bytes) => {
            serde_json::from_slice(&bytes).map_err(|e| StepError::error(format!("driver wrote bad JSON: {e}")))?
        }
        Err(_) => {
            let how = match (r.exit_code, r.signal) {
                (Some(code), _) => format!("exit {code}"),
                (None, Some(sig)) => format!("killed by signal {sig}"),
                (None, None) => "no exit code".into(),
            };
            let stderr = super::lossy(&r.stderr);
            let mut msg = format!("python3 did not run the code ({how})");
            if !stderr.trim().is_empty() {
                msg.push_str(&format!(": {}", stderr.trim()));
            }
            return Err(StepError::error(msg).with_outputs(outputs));
        }
    };
    let _ = ctx.provider.remove(&id, &cell).await;
    let _ = ctx.provider.remove(&id, &result).await;
    let results = parsed.get("results").cloned().unwrap_or(json!([]));
    let text =
        results.as_array().and_then(|r| r.last()).and_then(|r| r.get("text")).cloned().unwrap_or(JsonValue::Null);
    let obj = outputs.as_object_mut().expect("exec outputs are an object");
    obj.insert("results".into(), results);
    obj.insert("text".into(), text);
    obj.insert("error".into(), parsed.get("error").cloned().unwrap_or(JsonValue::Null));
    Ok(outputs)
}
