"""commands.run: output, exit codes, cwd, envs, timeouts, background processes and callbacks."""

import time

import pytest
from e2b import CommandExitException, InvalidArgumentException, TimeoutException


def test_stdout_stderr_exit_zero(sandbox):
    r = sandbox.commands.run("echo hi; echo err >&2; printf 'no newline'")
    assert r.exit_code == 0
    assert r.stdout == "hi\nno newline"
    assert r.stderr == "err\n"
    assert not r.error  # None in new SDKs, "" in 2.31


def test_nonzero_exit_raises(sandbox):
    with pytest.raises(CommandExitException) as e:
        sandbox.commands.run("echo partial; echo bad >&2; exit 3")
    assert e.value.exit_code == 3
    assert e.value.stdout == "partial\n"
    assert e.value.stderr == "bad\n"
    assert "exit status 3" in e.value.error


def test_cwd(sandbox):
    assert sandbox.commands.run("pwd").stdout == "/home/user\n"
    assert sandbox.commands.run("pwd", cwd="/tmp").stdout == "/tmp\n"
    sandbox.files.make_dir("/home/user/sub/dir")
    assert sandbox.commands.run("pwd", cwd="sub/dir").stdout == "/home/user/sub/dir\n"
    with pytest.raises(InvalidArgumentException):
        sandbox.commands.run("pwd", cwd="/does/not/exist")


def test_envs(sandbox):
    r = sandbox.commands.run('echo "$A-$B"', envs={"A": "1", "B": "two words"})
    assert r.stdout == "1-two words\n"
    # Per-command envs do not leak into the next command.
    assert sandbox.commands.run('echo "[$A]"').stdout == "[]\n"


def test_timeout(sandbox):
    start = time.time()
    with pytest.raises(TimeoutException):
        sandbox.commands.run("sleep 20", timeout=1)
    assert time.time() - start < 8
    # The process is killed at its deadline: the client gave up at the same moment, so it may
    # look before the server's kill has landed (a loaded machine once listed it). It must be
    # gone within a moment, long before `sleep 20` would have ended.
    deadline = time.time() + 5
    while "sleep 20" in sandbox.commands.run("ps -eo args").stdout:
        assert time.time() < deadline, "the timed-out command outlived its deadline"
        time.sleep(0.1)


def test_background_and_kill(sandbox):
    # The marker file comes after the echo: once it exists, "started" has been written. (The
    # pid is listed as soon as bash starts, before a loaded machine has run the echo.)
    h = sandbox.commands.run("echo started; touch /tmp/bg-started; sleep 60", background=True)
    assert h.pid > 0
    deadline = time.time() + 10
    while not sandbox.files.exists("/tmp/bg-started") and time.time() < deadline:
        time.sleep(0.1)
    listed = {p.pid: p for p in sandbox.commands.list()}
    assert h.pid in listed
    assert listed[h.pid].cmd == "/bin/bash"
    assert "sleep 60" in " ".join(listed[h.pid].args)
    assert h.kill() is True
    with pytest.raises(CommandExitException) as e:
        h.wait()
    assert e.value.exit_code != 0
    assert "started\n" in e.value.stdout
    assert h.pid not in [p.pid for p in sandbox.commands.list()]
    # Killing it again reports that it is gone.
    assert sandbox.commands.kill(h.pid) is False


def test_background_wait_collects_output(sandbox):
    h = sandbox.commands.run("sleep 0.5; echo done; exit 0", background=True)
    r = h.wait()
    assert r.exit_code == 0
    assert r.stdout == "done\n"


def test_callbacks(sandbox):
    out, err = [], []
    r = sandbox.commands.run(
        "for i in 1 2 3; do echo out$i; echo err$i >&2; sleep 0.1; done",
        on_stdout=out.append,
        on_stderr=err.append,
    )
    assert "".join(out) == "out1\nout2\nout3\n"
    assert "".join(err) == "err1\nerr2\nerr3\n"
    assert r.stdout == "out1\nout2\nout3\n"


def test_output_is_streamed_live(sandbox):
    seen = []
    h = sandbox.commands.run("echo first; sleep 2; echo second", background=True)
    t0 = time.time()
    for stdout, _stderr, _pty in h:
        if stdout:
            seen.append((stdout, time.time() - t0))
    assert "".join(s for s, _ in seen) == "first\nsecond\n"
    # "first" arrived well before the command ended.
    assert seen[0][0].startswith("first") and seen[0][1] < 1.5


def test_large_output(sandbox):
    r = sandbox.commands.run("head -c 3000000 /dev/zero | tr '\\0' 'x'")
    assert len(r.stdout) == 3_000_000
    assert set(r.stdout) == {"x"}


def test_stdin(sandbox):
    h = sandbox.commands.run("read line; echo got:$line", background=True, stdin=True)
    sandbox.commands.send_stdin(h.pid, "hello\n")
    r = h.wait()
    assert r.stdout == "got:hello\n"


def test_connect_to_a_running_command(sandbox):
    h = sandbox.commands.run("sleep 1; echo later; exit 5", background=True)
    h.disconnect()
    # The process keeps running without its first stream; a new stream gets what comes next.
    again = sandbox.commands.connect(h.pid)
    with pytest.raises(CommandExitException) as e:
        again.wait()
    assert e.value.exit_code == 5
    assert e.value.stdout == "later\n"


def test_close_stdin(sandbox):
    if not hasattr(sandbox.commands, "close_stdin"):
        pytest.skip("commands.close_stdin is not in this SDK version")
    h = sandbox.commands.run("wc -c", background=True, stdin=True)
    sandbox.commands.send_stdin(h.pid, "12345")
    sandbox.commands.close_stdin(h.pid)
    assert h.wait().stdout.strip() == "5"
