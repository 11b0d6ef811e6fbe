"""bench/symbol-order reads callgrind's compressed names right: only the client binary's
functions, each once, in the order the profile first names them (a `cfn=` defines a name that
a later `fn=` only refers to)."""
import importlib.machinery
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def load():
    loader = importlib.machinery.SourceFileLoader("symbol_order", str(ROOT / "bench" / "symbol-order"))
    spec = importlib.util.spec_from_loader("symbol_order", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def test_functions_of_the_binary_only_once_each_in_order(tmp_path):
    binary = tmp_path / "scenario-run"
    binary.write_text("")
    profile = tmp_path / "callgrind.out"
    profile.write_text(
        "\n".join(
            [
                "version: 1",
                f"ob=(1) {binary}",
                "fn=(1) _ZN4main17h1E",
                "cob=(2) /usr/lib/x86_64-linux-gnu/libc.so.6",
                "cfn=(2) memcpy",
                "calls=1 0",
                "0 5",
                "cob=(1)",
                "cfn=(3) _ZN3run17h2E",
                "calls=1 0",
                "0 7",
                "ob=(2)",
                "fn=(2)",
                "0 3",
                "ob=(1)",
                "fn=(3)",
                "0 9",
                "fn=(1)",
                "0 1",
                "fn=(4) _ZN4exit17h3E",
                "0 1",
            ]
        )
        + "\n"
    )
    assert load().functions_run(profile, binary) == ["_ZN4main17h1E", "_ZN3run17h2E", "_ZN4exit17h3E"]


def test_the_recorded_order_is_there_and_names_functions():
    names = [n for n in (ROOT / "link" / "scenario-run.order").read_text().split("\n") if n]
    assert len(names) > 500, "link/scenario-run.order holds too few functions to lay out a client run"
    assert len(set(names)) == len(names), "a function named twice"
    assert any("scenario_run" in n for n in names), "none of scenario-run's own functions"
