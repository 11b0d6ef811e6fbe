"""Every job of the GitHub workflow is a script in .ci/jobs/ that the workflow only calls and
.ci/run runs too (issue 26 item 13): what GitHub would run is what runs on a CI machine.

A workflow whose `run:` holds commands of its own (the `clients` job once started serve with
no --allow-public-traffic and no CA, and could not pass) is refused here.
"""
import os
import pathlib
import re
import subprocess

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / ".github/workflows/e2e.yml"
CALL = re.compile(r'^\.ci/jobs/([a-z0-9-]+)\.sh(?: "\$\{\{ [a-z.]+ \}\}")*$')


def jobs():
    return yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))["jobs"]


def test_every_run_step_only_calls_a_job_script():
    called = set()
    for name, job in jobs().items():
        runs = [s["run"] for s in job["steps"] if "run" in s]
        assert runs, f"job {name} runs nothing"
        for run in runs:
            m = CALL.match(run.strip())
            assert m, f"job {name}: `{run.strip()}` is not one call of a .ci/jobs/ script"
            script = ROOT / ".ci/jobs" / f"{m.group(1)}.sh"
            assert script.is_file() and os.access(script, os.X_OK), f"{script} is missing or not executable"
            called.add(m.group(1))
    assert called == {"test", "matrix", "local", "clients", "cloud"}, called


def test_ci_run_runs_every_job_script():
    text = (ROOT / ".ci/run").read_text(encoding="utf-8")
    for script in sorted(p for p in (ROOT / ".ci/jobs").glob("*.sh") if p.name != "lib.sh"):
        assert f".ci/jobs/{script.name}" in text, f".ci/run does not run {script.name}"


def test_a_cloud_job_without_its_key_says_skipped_and_is_not_a_pass(tmp_path):
    verdicts = tmp_path / "verdicts"
    env = {k: v for k, v in os.environ.items() if k not in ("E2B_API_KEY", "ABX_SANDBOX_API_KEY", "GITHUB_ACTIONS")}
    env.update(CI_JOB_VERDICTS=str(verdicts), SCENARIO_RUN_BIN="/nonexistent")
    for provider, key in (("e2b", "E2B_API_KEY"), ("alicloud", "ABX_SANDBOX_API_KEY")):
        out = subprocess.run(
            [str(ROOT / ".ci/jobs/cloud.sh"), provider, "scenarios/platform", "platform"],
            env=env, capture_output=True, text=True, timeout=60,
        )
        assert out.returncode == 0, out.stderr
        assert f"SKIPPED: job cloud {provider} platform did not run: missing credentials [{key}]" in out.stderr
    lines = verdicts.read_text().splitlines()
    assert [line.split("\t")[1].split(" ")[0] for line in lines] == ["SKIPPED", "SKIPPED"], lines


def test_a_cloud_job_with_its_key_fails_on_any_missing_credential(tmp_path):
    """Issue 27 item 3: with the provider's key the cloud job ran, and a scenario or step whose
    other secret was gone (a model's key) was SKIPPED in a green job. The job runs the suite
    with --require-credentials, so a missing credential is an ERROR there."""
    calls = tmp_path / "calls"
    fake = tmp_path / "scenario-run"
    fake.write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> "{calls}"\n')
    fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "GITHUB_ACTIONS"}
    env.update(E2B_API_KEY="e2b-fake-key", SCENARIO_RUN_BIN=str(fake), CI_JOB_VERDICTS=str(tmp_path / "verdicts"))
    out = subprocess.run(
        [str(ROOT / ".ci/jobs/cloud.sh"), "e2b", "scenarios/platform", "platform"],
        env=env, capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 0, out.stderr
    run, cleanup = calls.read_text().splitlines()
    assert run.startswith("scenarios/platform --provider e2b "), run
    assert "--require-credentials" in run.split(), run
    assert cleanup.startswith("cleanup --provider e2b "), cleanup
