"""files: write/read (text, bytes, several MiB), list, exists, make_dir, rename, remove."""

import hashlib
import os

import pytest
from e2b import FileNotFoundException
from e2b.sandbox.filesystem.filesystem import FileType


def test_write_read_text(sandbox):
    info = sandbox.files.write("/home/user/hello.txt", "héllo\nwörld\n")
    assert info.path == "/home/user/hello.txt"
    assert info.name == "hello.txt"
    assert sandbox.files.read("/home/user/hello.txt") == "héllo\nwörld\n"
    assert sandbox.commands.run("cat /home/user/hello.txt").stdout == "héllo\nwörld\n"


def test_relative_paths_are_under_home(sandbox):
    info = sandbox.files.write("rel/dir/x.txt", "rel")
    assert info.path == "/home/user/rel/dir/x.txt"
    assert sandbox.files.read("/home/user/rel/dir/x.txt") == "rel"
    assert sandbox.files.read("rel/dir/x.txt") == "rel"


def test_write_read_bytes(sandbox):
    data = bytes(range(256)) * 4
    sandbox.files.write("/tmp/bin.dat", data)
    got = sandbox.files.read("/tmp/bin.dat", format="bytes")
    assert bytes(got) == data


def test_several_mib(sandbox):
    data = os.urandom(6 * 1024 * 1024 + 7)
    sandbox.files.write("/home/user/big.bin", data)
    assert bytes(sandbox.files.read("/home/user/big.bin", format="bytes")) == data
    digest = sandbox.commands.run("sha256sum /home/user/big.bin").stdout.split()[0]
    assert digest == hashlib.sha256(data).hexdigest()


def test_read_written_by_a_command(sandbox):
    # Commands run as `user`, as on E2B: a directory that user may write.
    sandbox.commands.run("mkdir -p /tmp/out && printf 'from bash' > /tmp/out/f.txt")
    assert sandbox.files.read("/tmp/out/f.txt") == "from bash"


def test_read_missing(sandbox):
    with pytest.raises(FileNotFoundException):
        sandbox.files.read("/home/user/nope.txt")


def test_list(sandbox):
    sandbox.files.make_dir("/home/user/ls")
    sandbox.files.write("/home/user/ls/a.txt", "aaa")
    sandbox.files.write("/home/user/ls/sub/b.txt", "b")
    entries = {e.name: e for e in sandbox.files.list("/home/user/ls")}
    assert set(entries) == {"a.txt", "sub"}
    assert entries["a.txt"].type == FileType.FILE
    assert entries["a.txt"].path == "/home/user/ls/a.txt"
    assert entries["a.txt"].size == 3
    assert entries["sub"].type == FileType.DIR
    deep = {e.path for e in sandbox.files.list("/home/user/ls", depth=2)}
    assert deep == {"/home/user/ls/a.txt", "/home/user/ls/sub", "/home/user/ls/sub/b.txt"}
    with pytest.raises(FileNotFoundException):
        sandbox.files.list("/home/user/missing-dir")


def test_exists(sandbox):
    assert sandbox.files.exists("/home/user") is True
    assert sandbox.files.exists("/home/user/nothing-here") is False
    sandbox.files.write("/home/user/e.txt", "e")
    assert sandbox.files.exists("/home/user/e.txt") is True


def test_make_dir(sandbox):
    assert sandbox.files.make_dir("/home/user/new/nested") is True
    assert sandbox.files.make_dir("/home/user/new/nested") is False
    assert sandbox.commands.run("test -d /home/user/new/nested && echo yes").stdout == "yes\n"


def test_rename(sandbox):
    sandbox.files.write("/home/user/old.txt", "content")
    info = sandbox.files.rename("/home/user/old.txt", "/home/user/moved/new.txt")
    assert info.path == "/home/user/moved/new.txt"
    assert info.name == "new.txt"
    assert sandbox.files.exists("/home/user/old.txt") is False
    assert sandbox.files.read("/home/user/moved/new.txt") == "content"
    with pytest.raises(FileNotFoundException):
        sandbox.files.rename("/home/user/old.txt", "/home/user/x.txt")


def test_remove(sandbox):
    sandbox.files.write("/home/user/rm/a.txt", "a")
    sandbox.files.remove("/home/user/rm/a.txt")
    assert sandbox.files.exists("/home/user/rm/a.txt") is False
    sandbox.files.write("/home/user/rm/deep/b.txt", "b")
    sandbox.files.remove("/home/user/rm")
    assert sandbox.files.exists("/home/user/rm") is False
    # Removing what is not there is not an error (envd uses RemoveAll).
    sandbox.files.remove("/home/user/rm")


def test_get_info_of_a_file(sandbox):
    sandbox.files.write("/home/user/i.txt", "12345")
    if not hasattr(sandbox.files, "get_info"):
        pytest.skip("files.get_info is not in this SDK version")
    info = sandbox.files.get_info("/home/user/i.txt")
    assert info.size == 5
    assert info.type == FileType.FILE
