"""The judges are pinned (issue 36 item 8): every Python judge's requirements are all `==`, every
npm judge has exact versions and a lock, every suite names a commit; and tests/judges/lib.sh
finds a suite's pinned commit beside the checkout, says there is none (the harness SKIPS,
loudly), or refuses a repository that lacks it (the harness FAILS), without any absolute path
of one machine. Git repositories made here, offline (JUDGES_OFFLINE=1): no network.
"""
import json
import pathlib
import re
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[2]
JUDGES = ROOT / "tests/judges"


def test_every_judge_is_pinned():
    names = [d.name for d in JUDGES.iterdir() if d.is_dir()]
    assert names
    for d in JUDGES.iterdir():
        if not d.is_dir():
            continue
        req = d / "requirements.txt"
        if req.exists():
            lines = [l.strip() for l in req.read_text().splitlines() if l.strip() and not l.startswith("#")]
            assert lines, d.name
            for l in lines:
                assert re.fullmatch(r"[A-Za-z0-9._-]+==[A-Za-z0-9.+!_-]+", l), f"{d.name}: {l!r} is not an == pin"
            assert (d / "requirements.in").exists(), f"{d.name}: no requirements.in"
        pkg = d / "package.json"
        if pkg.exists():
            p = json.loads(pkg.read_text())
            for sec in ("dependencies", "devDependencies"):
                for k, v in p.get(sec, {}).items():
                    assert re.fullmatch(r"\d+\.\d+\.\d+", v), f"{d.name}: {k} {v!r} is not an exact version"
            assert (d / "package-lock.json").exists(), f"{d.name}: no package-lock.json"
        suite = d / "suite"
        if suite.exists():
            line = [l for l in suite.read_text().splitlines() if l.strip() and not l.startswith("#")][0]
            repo, commit = line.split()
            assert re.fullmatch(r"[\w.-]+/[\w.-]+", repo) and re.fullmatch(r"[0-9a-f]{40}", commit), line
        assert req.exists() or pkg.exists() or suite.exists(), f"{d.name} pins nothing"


def test_no_harness_defaults_to_one_machines_path():
    for f in ["tests/e2b_sdk/run.sh", "tests/e2b_sdk/code-interpreter.sh", "tests/e2b_sdk/official.sh",
              "tests/opensandbox_sdk/run.sh", "tests/judges/lib.sh", "bench/run", "scripts/test"]:
        assert "/work/" not in (ROOT / f).read_text(), f


def git(*args, cwd):
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True,
                   capture_output=True)


def find(tmp, commit, var=None):
    """Runs judge_suite for a judge pinned at `commit` of owner/repo in a checkout under tmp:
    (its status, stdout, stderr)."""
    env = {"PATH": "/usr/bin:/bin", "JUDGES_OFFLINE": "1", "HOME": str(tmp)}
    if var:
        env["SOME_REPO"] = var
    script = f"""
root={tmp}/checkout target={tmp}/checkout/target JUDGES_DIR={tmp}/pins
. {JUDGES}/lib.sh
judge_suite x SOME_REPO; rc=$?
echo "rc=$rc git=$suite_git commit=$suite_commit"
"""
    pins = tmp / "pins/x"
    pins.mkdir(parents=True, exist_ok=True)
    (pins / "suite").write_text(f"# a pin\nowner/repo {commit}\n")
    (tmp / "checkout").mkdir(exist_ok=True)
    r = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60)
    return r.stdout, r.stderr


def test_a_suite_is_found_beside_the_checkout_or_skipped_or_refused(tmp_path):
    # No source at all: status 2 (the harness says SKIPPED).
    out, err = find(tmp_path, "0" * 40)
    assert "rc=2" in out, out + err
    # A mirror beside the checkout with the pinned commit: found there.
    mirror = tmp_path / ".mirror/owner+repo/repo"
    mirror.mkdir(parents=True)
    git("init", "-q", ".", cwd=mirror)
    (mirror / "f").write_text("one")
    git("add", "f", cwd=mirror)
    git("commit", "-q", "-m", "one", cwd=mirror)
    first = subprocess.run(["git", "rev-parse", "HEAD"], cwd=mirror, capture_output=True, text=True).stdout.strip()
    out, err = find(tmp_path, first)
    assert f"rc=0 git={mirror}/.git commit={first}" in out, out + err
    # A mirror without it: status 1 (the harness FAILS), saying which commit is missing.
    out, err = find(tmp_path, "1" * 40)
    assert "rc=1" in out and "1" * 40 in err and "FAILED" in err, out + err
    # The variable, when set, is taken before the mirror; without the commit it fails too.
    other = tmp_path / "other"
    other.mkdir()
    git("init", "-q", "--bare", ".", cwd=other)
    out, err = find(tmp_path, first, var=str(other))
    assert "rc=1" in out and "$SOME_REPO" in err, out + err
