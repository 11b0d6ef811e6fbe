"""The files of src/server name each other in no circle (issue 39 item 1): each protocol's
handlers import down only, into leaves they share. `scripts/modgraph --check-acyclic server`
draws the file graph from the code's paths and refuses any circle, of any length; the checker
itself is tried here on small made-up trees, so that a checker that sees nothing cannot pass.
"""
import importlib.machinery
import importlib.util
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODGRAPH = ROOT / "scripts/modgraph"


def modgraph():
    loader = importlib.machinery.SourceFileLoader("modgraph", str(MODGRAPH))
    spec = importlib.util.spec_from_loader("modgraph", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def tree(tmp_path, files):
    for rel, text in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text, encoding="utf-8")
    return tmp_path


def check(root, module="server"):
    return subprocess.run(
        [sys.executable, str(MODGRAPH), "--root", str(root), "--check-acyclic", module],
        capture_output=True,
        text=True,
    )


def test_no_circle_of_files_inside_server():
    r = subprocess.run([sys.executable, str(MODGRAPH), "--check-acyclic", "server"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_circle_of_three_files_is_found(tmp_path):
    root = tree(
        tmp_path,
        {
            "lib.rs": "mod server;\n",
            "server/mod.rs": "mod a;\nmod b;\nmod c;\n",
            "server/a.rs": "use super::b::B;\npub struct A;\n",
            "server/b.rs": "use crate::server::c::C;\npub struct B;\n",
            "server/c.rs": "pub struct C;\nfn f() -> super::a::A { super::a::A }\n",
        },
    )
    mg = modgraph()
    edges, _ = mg.graph(mg.load(str(root)))
    assert mg.file_sccs(edges, ("server",)) == [[("server", "a"), ("server", "b"), ("server", "c")]]
    r = check(root)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "server::a -> server::b -> server::c -> server::a" in r.stdout, r.stdout


def test_a_child_naming_its_parent_is_a_circle(tmp_path):
    root = tree(
        tmp_path,
        {
            "lib.rs": "mod server;\n",
            "server/mod.rs": "mod envd;\npub struct State;\nfn f() { envd::route() }\n",
            "server/envd.rs": "use super::State;\npub fn route() {}\n",
        },
    )
    r = check(root)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "src/server/mod.rs" in r.stdout and "src/server/envd.rs" in r.stdout, r.stdout


def test_a_tree_that_imports_down_only_passes(tmp_path):
    root = tree(
        tmp_path,
        {
            "lib.rs": "mod server;\n",
            "server/mod.rs": "mod envd;\nmod state;\nfn f() { envd::route(state::State) }\n",
            "server/envd.rs": "use super::state::State;\npub fn route(_: State) {}\n",
            "server/state.rs": "pub struct State;\n",
            # Tests may name anything: they are left out of the graph.
            "server/other.rs": "#[cfg(test)]\nmod tests {\n    use super::super::envd;\n}\n",
        },
    )
    r = check(root)
    assert r.returncode == 0, r.stdout + r.stderr
