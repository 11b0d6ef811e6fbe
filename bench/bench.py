#!/usr/bin/env python3
"""The benchmarks of scenario-run: generates the inputs, runs every row, prints the table.

Driven by bench/run (which installs hyperfine, GNU time and a venv with e2b, pytest and
pytest-xdist, and builds the release binary). Everything it writes goes under
target/bench/: the generated scenarios and tests, hyperfine JSON, logs, results.md and
results.json. Timings of whole commands come from hyperfine (rows 1 and 3) or from our own
clock around `/usr/bin/time -v` (rows 2, 4, 5), which also gives the client's user+sys CPU
(every descendant it waited for) and its largest resident set; the peak memory of a client
*process tree* (pytest-xdist has six processes) is the sum of the RSS of every process in the
tree, sampled every 10 ms from /proc.
"""

import argparse
import json
import os
import platform
import re
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
BIN = Path(os.environ.get("BENCH_BIN", TARGET / "release" / "scenario-run"))
OUT = TARGET / "bench"
GEN = OUT / "gen"
VENV_PY = Path(os.environ.get("BENCH_PY", TARGET / "bench-venv" / "bin" / "python"))
STATE = Path("/tmp/scenario-run-bench")


def log(msg):
    print(f"bench: {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- statistics


def summary(xs):
    xs = sorted(xs)
    return {"median": statistics.median(xs), "min": xs[0], "max": xs[-1], "runs": len(xs)}


def fmt(s, unit="s", scale=1.0, digits=2):
    return f"{s['median'] * scale:.{digits}f} {unit} ({s['min'] * scale:.{digits}f}–{s['max'] * scale:.{digits}f})"


# ---------------------------------------------------------------- generation


E2B_SCENARIO = """name: {name}
steps:
  - create: {{ template: base }}
  - exec: echo one
  - exec: echo two
  - exec: echo three
  - exec: echo four
  - exec: echo five
  - assert-stdout: {{ equals: "five\\n" }}
  - write-file: {{ path: /tmp/bench.txt, content: "hello {i}" }}
  - read-file: /tmp/bench.txt
    id: r
  - assert: {{ that: "steps.r.content == 'hello {i}'" }}
  - kill: {{}}
"""

ASYNC_SCRIPT = """import asyncio, sys
from e2b import AsyncSandbox

async def one(i, sem):
    async with sem:
        sb = await AsyncSandbox.create(timeout=120)
        try:
            for word in ["one", "two", "three", "four", "five"]:
                r = await sb.commands.run(f"echo {word}")
            assert r.stdout == "five\\n", r.stdout
            await sb.files.write("/tmp/bench.txt", f"hello {i}")
            content = await sb.files.read("/tmp/bench.txt")
            assert content == f"hello {i}", content
        finally:
            await sb.kill()

async def main(n):
    sem = asyncio.Semaphore(5)
    results = await asyncio.gather(*(one(i, sem) for i in range(n)), return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    for e in errors[:5]:
        print(repr(e), file=sys.stderr)
    print(f"{n - len(errors)} passed, {len(errors)} failed")
    sys.exit(1 if errors else 0)

asyncio.run(main(int(sys.argv[1])))
"""

PYTEST_FILE = """import pytest
from e2b import Sandbox

@pytest.mark.parametrize("i", range({n}))
def test_scenario(i):
    sb = Sandbox.create(timeout=120)
    try:
        for word in ["one", "two", "three", "four", "five"]:
            r = sb.commands.run(f"echo {{word}}")
        assert r.stdout == "five\\n"
        sb.files.write("/tmp/bench.txt", f"hello {{i}}")
        assert sb.files.read("/tmp/bench.txt") == f"hello {{i}}"
    finally:
        sb.kill()
"""

# One generated test per file, the same steps as E2B_SCENARIO.
PYTEST_ONE = """from e2b import Sandbox

def test_{name}():
    sb = Sandbox.create(timeout=120)
    try:
        for word in ["one", "two", "three", "four", "five"]:
            r = sb.commands.run(f"echo {{word}}")
        assert r.stdout == "five\\n"
        sb.files.write("/tmp/bench.txt", "hello {i}")
        assert sb.files.read("/tmp/bench.txt") == "hello {i}"
    finally:
        sb.kill()
"""

# The download row's client: one sandbox, a sparse file of SIZE bytes in it, read back through
# the SDK as a stream; serve's peak RSS (VmHWM) before and after. Prints the figures as JSON.
DOWNLOAD_SCRIPT = """import json, sys, time
from e2b import Sandbox

size, pid = int(sys.argv[1]), int(sys.argv[2])


def hwm():
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])


sb = Sandbox.create(timeout=300)
try:
    sb.commands.run(f"truncate -s {size} /home/user/big")
    before = hwm()
    t = time.perf_counter()
    n = sum(len(c) for c in sb.files.read("/home/user/big", format="stream"))
    dt = time.perf_counter() - t
    print(json.dumps({"bytes": n, "seconds": dt, "hwm_before": before, "hwm_after": hwm()}))
finally:
    sb.kill()
"""

# The latency row's client: one process per serve and round. Creates (each killed at once),
# then on one sandbox a warm-up, then N rounds of three calls in turn: the SDK's
# commands.run("true"), the same Connect call over a raw keep-alive HTTP connection (what the
# SDK adds), and `bash -c true` on the host; then N/2 rounds of the SDK call and the host's
# bash, each after a 100 ms pause (a client that thinks between commands; an idle machine
# starts anything slower, the host's bash included). Prints the times (seconds) as JSON.
LATENCY_SCRIPT = """import http.client, json, os, struct, subprocess, sys, time
from e2b import Sandbox

creates, n, warm = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
clock = time.perf_counter
out = {"create": [], "run": [], "raw": [], "host": [], "paused": [], "host_paused": []}
for i in range(creates + 1):
    t = clock()
    sb = Sandbox.create(timeout=300)
    dt = clock() - t
    if i:  # the first create is the warm-up
        out["create"].append(dt)
    if i < creates:
        sb.kill()
try:
    port = int(os.environ["E2B_API_URL"].rsplit(":", 1)[1])
    headers = {"E2b-Sandbox-Id": sb.sandbox_id, "E2b-Sandbox-Port": "49983",
               "Content-Type": "application/connect+json", "Connect-Protocol-Version": "1"}
    token = getattr(sb, "_envd_access_token", None)  # the SDK's own header, for the raw call
    if token:
        headers["X-Access-Token"] = token
    msg = json.dumps({"process": {"cmd": "/bin/bash", "args": ["-l", "-c", "true"], "envs": {}},
                      "stdin": False}).encode()
    body = b"\\x00" + struct.pack(">I", len(msg)) + msg
    conn = http.client.HTTPConnection("127.0.0.1", port)

    def raw():
        conn.request("POST", "/process.Process/Start", body=body, headers=headers)
        r = conn.getresponse()
        data = r.read()
        if r.status != 200 or b'"exit status 0"' not in data:
            raise SystemExit(f"raw Process/Start: {r.status} {data[:300]!r}")

    def run():
        r = sb.commands.run("true")
        if r.exit_code != 0:
            raise SystemExit(f"commands.run: exit {r.exit_code}")

    def host():
        subprocess.run(["bash", "-c", "true"], check=True)

    for _ in range(warm):
        run(); raw(); host()
    for _ in range(n):
        for k, f in (("run", run), ("raw", raw), ("host", host)):
            t = clock()
            f()
            out[k].append(clock() - t)
    for _ in range(n // 2):
        for k, f in (("paused", run), ("host_paused", host)):
            time.sleep(0.1)
            t = clock()
            f()
            out[k].append(clock() - t)
finally:
    sb.kill()
print(json.dumps(out))
"""

LOCAL_SCENARIO = "name: {name}\nsteps:\n  - create: {{ template: base }}\n" + '  - exec: "true"\n' * 10 + "  - kill: {{}}\n"

SCALE_SCENARIO = """name: {name}
steps:
  - create: {{ template: base }}
  - exec: echo hi
  - assert-stdout: {{ equals: "hi\\n" }}
  - kill: {{}}
"""

SLEEP_SCENARIO = """name: {name}
steps:
  - create: {{ template: base }}
  - sleep: 10m
"""


def write_set(dirname, n, template, suffix=".yaml", name_fmt="s{i:05d}"):
    d = GEN / dirname
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    for i in range(n):
        name = name_fmt.format(i=i)
        (d / f"{name}{suffix}").write_text(template.format(name=name, i=i, n=n))
    return d


# ---------------------------------------------------------------- running things


def paired(name, commands, rounds, warmup=True):
    """hyperfine, one run of each command per round, alternating (the machine is shared: a
    burst of someone else's load then hits both sides of a ratio). Returns per-command wall
    and user+sys summaries and the per-round ratios of the first command to the second."""
    a, b = list(commands)
    walls, cpus = {a: [], b: []}, {a: [], b: []}
    for r in range(rounds + (1 if warmup else 0)):
        res = hyperfine(f"{name}-{r}", commands, 1, warmup=0)
        if warmup and r == 0:
            continue
        for k in commands:
            walls[k].append(res[k]["wall"]["median"])
            cpus[k].append(res[k]["user_mean"] + res[k]["system_mean"])
    out = {k: {"wall": summary(walls[k]), "cpu": summary(cpus[k])} for k in commands}
    out["ratios"] = summary([x / y for x, y in zip(walls[a], walls[b])])
    out["cpu_ratios"] = summary([x / y for x, y in zip(cpus[a], cpus[b])])
    return out


def hyperfine(name, commands, runs, warmup=1, env=None, prepare=None):
    """Runs hyperfine over {label: shell command}; returns {label: summary of wall times}."""
    out = OUT / f"hyperfine-{name}.json"
    args = ["hyperfine", "--runs", str(runs), "--warmup", str(warmup), "--export-json", str(out), "--style", "basic"]
    if prepare:
        args += ["--prepare", prepare]
    for label, cmd in commands.items():
        args += ["--command-name", label, cmd]
    log(f"hyperfine {name}: {runs} runs of {', '.join(commands)}")
    subprocess.run(args, check=True, env=env, stdout=sys.stderr)
    data = json.loads(out.read_text())
    res = {}
    for r in data["results"]:
        if any(c != 0 for c in r.get("exit_codes", [])):
            raise SystemExit(f"bench: {r['command']} failed in a hyperfine run (exit codes {r['exit_codes']})")
        res[r["command"]] = {"wall": summary(r["times"]), "user_mean": r["user"], "system_mean": r["system"]}
    return res


def tree_rss_kib(root):
    """Sum of VmRSS over root and all its descendants."""
    total, stack, seen = 0, [root], set()
    while stack:
        pid = stack.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
                        break
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as f:
                    stack.extend(int(c) for c in f.read().split())
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            pass
    return total


def tree_rss_kib_one(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            return next((int(line.split()[1]) for line in f if line.startswith("VmRSS:")), 0)
    except (FileNotFoundError, ProcessLookupError):
        return 0


def measure(cmd, env=None, cwd=None, expect_rc=(0,), stdout_path=None):
    """One run of cmd under /usr/bin/time -v: wall, user+sys of the tree, peak RSS (KiB)."""
    tf = OUT / "time-v.txt"
    out = open(stdout_path, "w") if stdout_path else subprocess.DEVNULL
    t0 = time.monotonic()
    p = subprocess.Popen(["/usr/bin/time", "-v", "-o", str(tf)] + cmd, env=env, cwd=cwd, stdout=out,
                         stderr=subprocess.PIPE)
    peak = [0]
    done = threading.Event()

    def sample():
        while not done.is_set():
            # The tree below /usr/bin/time: its own ~1 MiB is not the client's.
            peak[0] = max(peak[0], tree_rss_kib(p.pid) - tree_rss_kib_one(p.pid))
            done.wait(0.01)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    _, err = p.communicate()
    wall = time.monotonic() - t0
    done.set()
    th.join()
    if stdout_path:
        out.close()
    tv = tf.read_text()
    rc = int(re.search(r"Exit status: (\d+)", tv).group(1)) if "Exit status" in tv else p.returncode
    if rc not in expect_rc:
        sys.stderr.write(err.decode(errors="replace")[-3000:])
        raise SystemExit(f"bench: {' '.join(map(str, cmd))} exited {rc}")
    user = float(re.search(r"User time \(seconds\): ([\d.]+)", tv).group(1))
    sys_ = float(re.search(r"System time \(seconds\): ([\d.]+)", tv).group(1))
    maxrss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", tv).group(1))
    return {"wall": wall, "cpu": user + sys_, "rss_kib": max(maxrss, peak[0]), "maxrss_one_kib": maxrss}


class Serve:
    """`scenario-run serve` on a free loopback port with a random key."""

    def __init__(self, binary=None, name="serve", extra=(), env=None):
        self.bin, self.name, self.extra, self.vars = Path(binary or BIN), name, list(extra), dict(env or {})
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        self.port = s.getsockname()[1]
        s.close()
        self.key = "e2b_" + secrets.token_hex(20)

    def __enter__(self):
        self.log = open(OUT / f"{self.name}.log", "a")
        env = dict(os.environ, SCENARIO_RUN_STATE_DIR=str(STATE / self.name), **self.vars)
        self.proc = subprocess.Popen([str(self.bin), "serve", "--listen", f"127.0.0.1:{self.port}", "--api-key", self.key]
                                     + self.extra,
                                     stdout=subprocess.PIPE, stderr=self.log, env=env)
        line = self.proc.stdout.readline().decode()
        if not line.startswith("listening on"):
            raise SystemExit(f"bench: serve did not start: {line!r} (see {OUT / (self.name + '.log')})")
        log(f"serve {line.strip()} (pid {self.proc.pid})")
        return self

    def env(self):
        e = dict(os.environ)
        for k in ["E2B_DEBUG", "E2B_ACCESS_TOKEN"]:
            e.pop(k, None)
        url = f"http://127.0.0.1:{self.port}"
        e.update(E2B_API_KEY=self.key, E2B_API_URL=url, E2B_SANDBOX_URL=url, E2B_DOMAIN=f"localhost:{self.port}")
        return e

    def __exit__(self, *exc):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


# ---------------------------------------------------------------- the rows


def row_engine(q):
    n, cmds, runs = (10, 10, 1) if q else (100, 10, 5)
    d = write_set("local", n, LOCAL_SCENARIO)
    (STATE / "engine").mkdir(parents=True, exist_ok=True)
    (STATE / "floor").mkdir(parents=True, exist_ok=True)
    engine = f"SCENARIO_RUN_STATE_DIR={STATE / 'engine'} {BIN} {d} -j 5 --no-progress >/dev/null"
    # The floor starts its sandboxes from the same image as the engine (built now if needed).
    rootfs = subprocess.run([str(BIN), "image", "base"], check=True, capture_output=True, text=True).stdout.strip()
    floor = f"seq 1 {n} | xargs -P 5 -I{{}} {ROOT / 'bench' / 'floor.sh'} {STATE / 'floor'} {{}} {cmds} {rootfs}"
    r = paired("engine", {"scenario-run": engine, "floor": floor}, runs, warmup=not q)
    ratio = r["ratios"]["median"]
    return {"n": n, "commands": cmds, "engine": r["scenario-run"], "floor": r["floor"], "ratio": ratio,
            "ratios": r["ratios"], "cpu_ratios": r["cpu_ratios"], "met": ratio <= 1.15,
            "cmd_engine": engine, "cmd_floor": floor}


def row_clients(q):
    n, runs = (10, 1) if q else (50, 5)
    d = write_set("e2b", n, E2B_SCENARIO)
    script = GEN / "sdk_async.py"
    script.write_text(ASYNC_SCRIPT)
    tdir = GEN / "pytest_clients"
    if tdir.exists():
        shutil.rmtree(tdir)
    tdir.mkdir(parents=True)
    (tdir / "test_bench.py").write_text(PYTEST_FILE.format(n=n))
    clients = {
        "scenario-run": [str(BIN), str(d), "--provider", "e2b", "-j", "5", "--no-progress"],
        "asyncio SDK": [str(VENV_PY), str(script), str(n)],
        "pytest-xdist": [str(VENV_PY), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "5", str(tdir)],
    }
    res = {k: [] for k in clients}
    with Serve() as srv:
        env = srv.env()
        # one untimed round first: imports and the page cache warm, like hyperfine's warmup
        if not q:
            for k, c in clients.items():
                measure(c, env=env)
        for i in range(runs):
            for k, c in clients.items():
                m = measure(c, env=env, stdout_path=OUT / f"clients-{k.replace(' ', '_')}.log")
                log(f"clients run {i + 1}/{runs} {k}: {m}")
                res[k].append(m)
    out = {"n": n}
    for k, ms in res.items():
        out[k] = {f: summary([m[f] for m in ms]) for f in ["wall", "cpu", "rss_kib"]}
    best = {f: min(out[k][f]["median"] for k in ["asyncio SDK", "pytest-xdist"]) for f in ["wall", "cpu", "rss_kib"]}
    sr = out["scenario-run"]
    out["ratios"] = {f: sr[f]["median"] / best[f] for f in best}
    out["met"] = {"cpu": out["ratios"]["cpu"] <= 0.2, "rss_kib": out["ratios"]["rss_kib"] <= 0.25,
                  "wall": out["ratios"]["wall"] <= 1.0}
    out["commands"] = {k: " ".join(c) for k, c in clients.items()}
    return out


def row_check(q):
    n, runs = (200, 2) if q else (2000, 5)
    d = write_set("check", n, E2B_SCENARIO)
    t = write_set("collect", n, PYTEST_ONE, suffix=".py", name_fmt="test_s{i:05d}")
    check = f"{BIN} check {d} >/dev/null"
    collect = f"cd {t} && {VENV_PY} -m pytest --collect-only -q -p no:cacheprovider . >/dev/null"
    r = paired("check", {"scenario-run check": check, "pytest --collect-only": collect}, runs)
    speedup = 1 / r["ratios"]["median"]
    return {"n": n, "check": r["scenario-run check"], "collect": r["pytest --collect-only"], "speedup": speedup,
            "speedups": {k: 1 / v for k, v in r["ratios"].items() if k != "runs"},
            "met": speedup >= 10, "cmd_check": check, "cmd_collect": collect}


def row_scale(q):
    n, levels, runs = (40, [5, 10, 20], 1) if q else (1000, [5, 50, 200], 3)
    d = write_set("scale", n, SCALE_SCENARIO)
    one = write_set("scale1", 1, SCALE_SCENARIO)
    out = {"n": n, "levels": {}}
    # 200 idle sandboxes of 512 MiB declare 100 GiB: serve's default admission (twice the
    # host's memory) would answer part of -j 200 with 429. This row measures the client.
    with Serve(extra=["--memory-overcommit", "8"]) as srv:
        env = srv.env()
        base = [measure([str(BIN), str(one), "--provider", "e2b", "-j", "1", "--no-progress"], env=env)
                for _ in range(runs)]
        out["baseline"] = {f: summary([m[f] for m in base]) for f in ["rss_kib", "wall"]}
        for j in levels:
            ms, peaks, errors = [], [], []
            for i in range(runs):
                rep = OUT / f"scale-j{j}.json"
                m = measure([str(BIN), str(d), "--provider", "e2b", "-j", str(j), "--no-progress", "--json", str(rep)],
                            env=env, expect_rc=(0, 1, 4))
                data = json.loads(rep.read_text())
                tot = data.get("totals", {})
                bad = sum(v for k, v in tot.items() if k in ("failed", "error") and isinstance(v, int))
                errors.append(bad)
                peaks.append(data.get("provider_stats", {}).get("peak_live"))
                m["throughput"] = n / m["wall"]
                log(f"scale -j {j} run {i + 1}/{runs}: {m} errors={bad}")
                ms.append(m)
            out["levels"][j] = {f: summary([m[f] for m in ms]) for f in ["wall", "cpu", "rss_kib", "throughput"]}
            out["levels"][j]["errors"] = errors
            out["levels"][j]["peak_live"] = max(p or 0 for p in peaks)
    top = levels[-1]
    per = (out["levels"][top]["rss_kib"]["median"] - out["baseline"]["rss_kib"]["median"]) / top
    out["per_inflight_kib"] = per
    out["met"] = {"errors": all(e == 0 for lv in out["levels"].values() for e in lv["errors"]), "mem": per < 1024}
    out["top"] = top
    return out


def pct(xs, p):
    """The p-th percentile (nearest rank) of xs."""
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, -(-p * len(xs) // 100) - 1))]


def client(name, text):
    """Writes an SDK client script into GEN; its path."""
    GEN.mkdir(parents=True, exist_ok=True)
    script = GEN / name
    script.write_text(text)
    return script


def serve_binaries():
    """The binaries a serve row runs: this build, and BENCH_BASELINE if set."""
    bins = [("scenario-run", BIN)]
    if os.environ.get("BENCH_BASELINE"):
        bins.append(("baseline", Path(os.environ["BENCH_BASELINE"])))
    return bins


def run_client(what, who, srv, script, *args):
    """Runs an SDK client script against `srv`; the JSON its last line prints."""
    cmd = [str(VENV_PY), str(script)] + [str(a) for a in args]
    p = subprocess.run(cmd, env=srv.env(), capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        raise SystemExit(f"bench: {what} client against {who} exited {p.returncode}: {p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def row_latency(q):
    """Sequential latency through the official SDK against serve: Sandbox.create,
    commands.run("true") and, side by side in the same client, `bash -c true` on the host (the
    floor) and the same Connect call made with a raw HTTP client (the SDK's share). With
    BENCH_BASELINE=<another scenario-run binary> a second serve runs it, and the rounds
    alternate between the two (before/after in one run)."""
    creates, n, warm, rounds = (3, 20, 5, 1) if q else (20, 50, 20, 4)
    script = client("latency.py", LATENCY_SCRIPT)
    bins = serve_binaries()
    fields = ["create", "run", "raw", "host", "paused", "host_paused", "cold_create"]
    data = {k: {f: [] for f in fields} for k, _ in bins}
    # Each binary twice: as shipped, and with no sandboxes booted ahead, where every create
    # boots its own (what a create that finds no spare costs; the networks, disks and user
    # namespaces are still made ahead, as they are for any create).
    # Each serve is made (its free port drawn) only once the one before listens: drawn all at
    # once, two could be handed the same port before either bound it.
    plan = [(b, f"serve-latency-{k}", {}) for k, b in bins]
    plan += [(b, f"serve-latency-{k}-cold", {"SCENARIO_RUN_SANDBOX_POOL": "0"}) for k, b in bins]
    started = []
    try:
        for b, name, env in plan:
            started.append(Serve(b, name, env=env).__enter__())
        for r in range(rounds):
            order = list(zip(bins, started[:len(bins)], started[len(bins):]))
            for (k, _), srv, cold_srv in order if r % 2 == 0 else reversed(order):
                got = run_client("latency", k, srv, script, creates, n, warm)
                for f in fields[:-1]:
                    data[k][f].extend(got[f])
                got_cold = run_client("latency (no spare)", k, cold_srv, script, creates, 0, 0)
                data[k]["cold_create"].extend(got_cold["create"])
                log(f"latency round {r + 1}/{rounds} {k}: run p50 {pct(got['run'], 50) * 1000:.2f} ms, "
                    f"host p50 {pct(got['host'], 50) * 1000:.2f} ms, create p50 {pct(got['create'], 50) * 1000:.2f} ms, "
                    f"with no spare {pct(got_cold['create'], 50) * 1000:.2f} ms")
    finally:
        for srv in reversed(started):
            srv.__exit__(None, None, None)
    out = {"n": n * rounds, "creates": creates * rounds, "binaries": {k: str(b) for k, b in bins}}
    for k, _ in bins:
        out[k] = {f: {"p50": pct(xs, 50), "p90": pct(xs, 90), "n": len(xs)} for f, xs in data[k].items()}
    me = out["scenario-run"]
    out["ratio"] = me["run"]["p50"] / me["host"]["p50"]
    out["met"] = out["ratio"] <= 3.0
    out["cold_met"] = me["cold_create"]["p50"] <= 0.015
    if "baseline" in out:
        out["cold_vs_baseline"] = me["cold_create"]["p50"] / out["baseline"]["cold_create"]["p50"]
        out["create_vs_baseline"] = me["create"]["p50"] / out["baseline"]["create"]["p50"]
        out["run_vs_baseline"] = me["run"]["p50"] / out["baseline"]["run"]["p50"]
        out["paused_vs_baseline"] = me["paused"]["p50"] / out["baseline"]["paused"]["p50"]
    return out


def row_download(q):
    """One download of a sparse file through the official SDK (`files.read(format="stream")`)
    from serve: throughput, and how far serve's peak RSS moved. Each round a fresh serve, so
    that its peak is this download's. With BENCH_BASELINE, the baseline binary too (a file
    under 1 GiB, which a serve that reads downloads into memory still serves)."""
    size, rounds = (64 << 20, 1) if q else (900 << 20, 3)
    script = client("download.py", DOWNLOAD_SCRIPT)
    bins = serve_binaries()
    out = {"size": size, "rounds": rounds, "binaries": {k: str(b) for k, b in bins}}
    for k, b in bins:
        mibs, grew = [], []
        for r in range(rounds):
            with Serve(b, f"serve-download-{k}") as srv:
                got = run_client("download", k, srv, script, size, srv.proc.pid)
            if got["bytes"] != size:
                raise SystemExit(f"bench: the download from {k} gave {got['bytes']} of {size} bytes")
            mibs.append(size / (1 << 20) / got["seconds"])
            grew.append(got["hwm_after"] - got["hwm_before"])
            log(f"download round {r + 1}/{rounds} {k}: {mibs[-1]:.0f} MiB/s, serve's peak RSS +{grew[-1] / 1024:.1f} MiB")
        out[k] = {"mib_s": summary(mibs), "rss_grew_kib": summary(grew)}
    out["met"] = out["scenario-run"]["rss_grew_kib"]["max"] < 64 * 1024
    return out


BUILD_SCENARIO = """name: build {tpl}
steps:
  - deploy: {tpl}
    timeout: 15m
  - create: {{ template: {tpl} }}
  - exec: "true"
"""


def row_builds(q):
    """A template's build kept by content (issue 37 item 1): the wall time of a scenario that
    deploys it and starts a sandbox from it, on a fresh state directory (the layer cache
    empty; apt/pip/npm package caches as the machine has them), again (the build reused), and
    after one file of the folder changed (built again). Full: `python-hello` (a venv and a pip
    install; BENCH_BUILD_TEMPLATE names another folder of templates/); quick: a one-RUN
    template."""
    tpl = "bench-tiny" if q else os.environ.get("BENCH_BUILD_TEMPLATE", "python-hello")
    tdir = GEN / "templates"
    shutil.rmtree(tdir, ignore_errors=True)
    tdir.mkdir(parents=True)
    if q:
        (tdir / tpl).mkdir()
        (tdir / tpl / "template.yaml").write_text(f"name: {tpl}\n")
        (tdir / tpl / "Dockerfile").write_text("FROM base\nRUN echo built > /built\n")
    else:
        shutil.copytree(ROOT / "templates" / tpl, tdir / tpl)
    sc = GEN / "build.yaml"
    sc.write_text(BUILD_SCENARIO.format(tpl=tpl))
    state = STATE / "builds"
    shutil.rmtree(state, ignore_errors=True)
    env = dict(os.environ, SCENARIO_RUN_STATE_DIR=str(state), SCENARIO_RUN_TEMPLATES_DIR=str(tdir))
    env.pop("SCENARIO_RUN_KEEP_BUILDS", None)
    out = {"template": tpl}
    for phase in ["first", "second", "changed"]:
        if phase == "changed":
            with open(tdir / tpl / "template.yaml", "a") as f:
                f.write("# changed\n")
        t0 = time.monotonic()
        p = subprocess.run([str(BIN), str(sc), "--no-progress"], env=env, capture_output=True, text=True)
        wall = time.monotonic() - t0
        if p.returncode != 0:
            raise SystemExit(f"bench: the build scenario failed ({phase}):\n{p.stdout[-3000:]}{p.stderr[-2000:]}")
        reused = "reusing the cached build" in p.stdout
        if reused != (phase == "second"):
            raise SystemExit(f"bench: {phase} run {'reused' if reused else 'did not reuse'} the build:\n{p.stdout[-3000:]}")
        out[phase] = wall
        log(f"builds {phase}: {wall:.2f}s")
    subprocess.run([str(BIN), "cache", "prune"], env=env, capture_output=True)
    shutil.rmtree(state, ignore_errors=True)
    return out


def ns_children(pid, comm="bwrap"):
    """The children of `pid` named `comm`. A child that exits while it is looked at (the
    provider's helpers come and go: nft, mkfs, a spare sandbox's boot) is not counted: its
    /proc entry vanishes (ENOENT) or is half gone (ESRCH)."""
    n = 0
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                for c in f.read().split():
                    try:
                        with open(f"/proc/{c}/comm") as cf:
                            if cf.read().strip() == comm:
                                n += 1
                    except (FileNotFoundError, ProcessLookupError):
                        pass
    except (FileNotFoundError, ProcessLookupError):
        pass
    return n


def sandboxes_alive(state):
    """Sandbox processes (bwrap, sleep) still using a directory under `state`."""
    left = 0
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            if str(state) in open(f"/proc/{p}/cmdline").read():
                left += 1
        except (FileNotFoundError, ProcessLookupError):
            pass
    return left


def row_interrupt(q):
    n, runs = (10, 1) if q else (50, 3)
    d = write_set("interrupt", n, SLEEP_SCENARIO)
    state = STATE / "interrupt"
    times, ok = [], []
    for i in range(runs):
        state.mkdir(parents=True, exist_ok=True)
        junit, js = OUT / "interrupt-junit.xml", OUT / "interrupt.json"
        for f in (junit, js):
            f.unlink(missing_ok=True)
        env = dict(os.environ, SCENARIO_RUN_STATE_DIR=str(state))
        p = subprocess.Popen([str(BIN), str(d), "-j", str(n), "--no-progress", "--step-timeout", "20m",
                              "--junit", str(junit), "--json", str(js)], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 120
            while ns_children(p.pid) < n and time.monotonic() < deadline:
                time.sleep(0.05)
            if ns_children(p.pid) < n:
                raise SystemExit(f"bench: only {ns_children(p.pid)} of {n} sandboxes came up")
            time.sleep(1.0)  # every scenario is now in its sleep step
            t0 = time.monotonic()
            p.send_signal(signal.SIGINT)
            rc = p.wait(120)
        except BaseException:
            # Not left running its 20-minute sleeps (a crash here once left a run behind).
            p.send_signal(signal.SIGINT)
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
            raise
        dt = time.monotonic() - t0
        left = sandboxes_alive(state)
        dirs = [x for x in state.iterdir()] if state.exists() else []
        good = rc == 130 and left == 0 and not dirs and junit.exists() and js.exists()
        log(f"interrupt run {i + 1}/{runs}: {dt:.3f}s rc={rc} left={left} dirs={len(dirs)} reports={junit.exists() and js.exists()}")
        times.append(dt)
        ok.append(good)
    return {"n": n, "time": summary(times), "clean": all(ok)}


# ---------------------------------------------------------------- the table


def machine():
    def run(c):
        try:
            return subprocess.run(c, shell=True, capture_output=True, text=True).stdout.strip()
        except Exception:
            return "?"

    cpu = run("lscpu | sed -n 's/^Model name: *//p'")
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory": run("free -h | awk '/Mem:/ {print $2}'"),
        "kernel": platform.release(),
        "os": run(". /etc/os-release && echo $PRETTY_NAME"),
        "load_before": run("cat /proc/loadavg"),
        "scenario-run": run(f"git -C {ROOT} rev-parse --short HEAD") + (" (dirty)" if run(f"git -C {ROOT} status --porcelain -- src") else ""),
        "binary": str(BIN),
        "rustc": run("rustc --version"),
        "bwrap": run("bwrap --version"),
        "hyperfine": run("hyperfine --version"),
        "python": run(f"{VENV_PY} --version"),
        "e2b": run(f"{VENV_PY} -c 'import importlib.metadata as m; print(m.version(\"e2b\"))'"),
        "pytest": run(f"{VENV_PY} -c 'import importlib.metadata as m; print(m.version(\"pytest\"), m.version(\"pytest-xdist\"))'"),
    }


def table(r):
    L = []
    yes = lambda b: "met" if b else "**missed**"
    if "engine" in r:
        e = r["engine"]
        L.append(f"| Engine overhead, local, {e['n']} × (create + {e['commands']} × `exec: \"true\"` + kill), -j 5 "
                 f"| scenario-run {fmt(e['engine']['wall'])} vs shell floor {fmt(e['floor']['wall'])} "
                 f"| **{e['ratio']:.2f}x** the floor (per-round {e['ratios']['min']:.2f}–{e['ratios']['max']:.2f}); "
                 f"CPU {fmt(e['engine']['cpu'])} vs {fmt(e['floor']['cpu'])} = {e['cpu_ratios']['median']:.2f}x | ≤ 1.15x | {yes(e['met'])} |")
    if "clients" in r:
        c = r["clients"]
        for k in ["scenario-run", "asyncio SDK", "pytest-xdist"]:
            x = c[k]
            L.append(f"| {c['n']} scenarios over serve, -j 5: {k} | wall {fmt(x['wall'])}, CPU {fmt(x['cpu'])}, "
                     f"peak RSS {fmt(x['rss_kib'], 'MiB', 1 / 1024, 1)} | | | |")
        rt = c["ratios"]
        L.append(f"| scenario-run / best of SDK script and pytest | | wall **{rt['wall']:.2f}x**, CPU **{rt['cpu']:.3f}x**, "
                 f"memory **{rt['rss_kib']:.3f}x** | wall ≤ 1, CPU ≤ 0.2, memory ≤ 0.25 | "
                 f"wall {yes(c['met']['wall'])}, CPU {yes(c['met']['cpu'])}, memory {yes(c['met']['rss_kib'])} |")
    if "check" in r:
        c = r["check"]
        L.append(f"| Validation, {c['n']} files | `check` {fmt(c['check']['wall'])} vs `pytest --collect-only` "
                 f"{fmt(c['collect']['wall'])} | **{c['speedup']:.1f}x** faster (per-round {c['speedups']['max']:.1f}–{c['speedups']['min']:.1f}) | ≥ 10x | {yes(c['met'])} |")
    if "scale" in r:
        s = r["scale"]
        for j, lv in s["levels"].items():
            L.append(f"| Scale, {s['n']} scenarios over serve, -j {j} | {fmt(lv['throughput'], 'scen/s', 1, 1)}, "
                     f"wall {fmt(lv['wall'])}, client CPU {fmt(lv['cpu'])}, client peak RSS "
                     f"{fmt(lv['rss_kib'], 'MiB', 1 / 1024, 1)}, peak live sandboxes {lv['peak_live']}, errors {lv['errors']} | | | |")
        L.append(f"| Scale: memory per in-flight scenario | (peak at -j {s['top']} − baseline "
                 f"{s['baseline']['rss_kib']['median'] / 1024:.1f} MiB) / {s['top']} | **{s['per_inflight_kib']:.0f} KiB** "
                 f"| < 1 MiB, zero errors | memory {yes(s['met']['mem'])}, errors {yes(s['met']['errors'])} |")
    if "latency" in r:
        lt = r["latency"]
        ms = lambda x: f"{x['p50'] * 1000:.2f} ms (p90 {x['p90'] * 1000:.2f})"
        for k in ["scenario-run", "baseline"]:
            if k not in lt:
                continue
            x = lt[k]
            who = "" if k == "scenario-run" else f" — baseline `{lt['binaries'][k]}`"
            ratio = x["run"]["p50"] / x["host"]["p50"]
            paused = x["paused"]["p50"] / x["host_paused"]["p50"]
            L.append(f"| Latency{who}, official Python SDK against serve, sequential, {lt['n']} calls each "
                     f"| `commands.run(\"true\")` p50 {ms(x['run'])}; after a 100 ms pause {ms(x['paused'])} "
                     f"(host's bash after a pause {ms(x['host_paused'])}); "
                     f"the same Connect call, raw HTTP, {ms(x['raw'])}; "
                     f"host `bash -c true` {ms(x['host'])}; `Sandbox.create` ({lt['creates']}) {ms(x['create'])} "
                     f"| **{ratio:.2f}x** the host's `bash -c true` (after a pause {paused:.2f}x) | ≤ 3x | {yes(ratio <= 3.0)} |")
            L.append(f"| Create with no spare{who}: `Sandbox.create` against serve with `SCENARIO_RUN_SANDBOX_POOL=0` "
                     f"({lt['creates']}) | {ms(x['cold_create'])} | | ≤ 15 ms p50 | {yes(x['cold_create']['p50'] <= 0.015)} |")
        if "baseline" in lt:
            L.append(f"| Latency: scenario-run / baseline, p50 | | run **{lt['run_vs_baseline']:.2f}x**, "
                     f"after a pause **{lt['paused_vs_baseline']:.2f}x**, with no spare **{lt['cold_vs_baseline']:.2f}x**, "
                     f"create **{lt['create_vs_baseline']:.2f}x** | create no slower (≤ 1.1x: noise) | {yes(lt['create_vs_baseline'] <= 1.1)} |")
    if "download" in r:
        d = r["download"]
        for k in ["scenario-run", "baseline"]:
            if k not in d:
                continue
            x = d[k]
            who = "" if k == "scenario-run" else f" — baseline `{d['binaries'][k]}`"
            L.append(f"| Download{who}, {d['size'] >> 20} MiB through the Python SDK's `files.read(format=\"stream\")`, "
                     f"{d['rounds']} rounds | {x['mib_s']['median']:.0f} MiB/s ({x['mib_s']['min']:.0f}–{x['mib_s']['max']:.0f}) "
                     f"| serve's peak RSS **+{x['rss_grew_kib']['median'] / 1024:.1f} MiB** | < 64 MiB, whatever the size "
                     f"| {yes(x['rss_grew_kib']['max'] < 64 * 1024)} |")
    if "builds" in r:
        b = r["builds"]
        L.append(f"| Builds kept by content, `deploy: {b['template']}` + create + kill, local | first run "
                 f"{b['first']:.2f} s; again {b['second']:.2f} s (reused); after a file changed {b['changed']:.2f} s "
                 f"(built again) | again / first **{b['second'] / b['first']:.2f}x** | (no target) | |")
    if "interrupt" in r:
        i = r["interrupt"]
        L.append(f"| Interrupt: SIGINT with {i['n']} live sandboxes (local) | until exit, every sandbox gone, reports written "
                 f"| **{fmt(i['time'])}** | (no target) | {'clean' if i['clean'] else '**not clean**'} |")
    head = "| row | measured (median (min–max)) | ratio | target | |\n|---|---|---|---|---|\n"
    return head + "\n".join(L) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="small N, one run each (CI)")
    ap.add_argument("rows", nargs="*",
                    default=["engine", "clients", "check", "scale", "interrupt", "latency", "download", "builds"])
    a = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    STATE.mkdir(parents=True, exist_ok=True)
    results = {"quick": a.quick, "machine": machine()}
    fns = {"engine": row_engine, "clients": row_clients, "check": row_check, "scale": row_scale,
           "interrupt": row_interrupt, "latency": row_latency, "download": row_download, "builds": row_builds}
    for row in a.rows:
        t0 = time.monotonic()
        results[row] = fns[row](a.quick)
        log(f"{row} done in {time.monotonic() - t0:.1f}s")
    results["machine"]["load_after"] = open("/proc/loadavg").read().strip()
    (OUT / "results.json").write_text(json.dumps(results, indent=2, default=str))
    t = table(results)
    if a.quick:
        t = f"quick mode ({BIN}, small N, one run): checks the harness, not a measurement\n\n" + t
    (OUT / "results.md").write_text(t)
    print(t)
    print("machine: " + json.dumps(results["machine"], indent=1))


if __name__ == "__main__":
    main()
