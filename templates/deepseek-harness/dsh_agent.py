"""dsh-agent: a tool-calling coding agent for DeepSeek, on the deepseek-harness client.

    dsh-agent [--model M] [--max-turns N] [--no-stream] TASK
    dsh-agent --version
    dsh-agent --self-test

The loop: the task goes to the model with four tools (write_file, read_file, list_dir, run);
every tool call the model makes is carried out in the working directory and its result sent
back; when the model answers without a tool call, its answer is printed and the agent exits 0.
It exits 2 when the turns run out, 1 when the endpoint fails. The endpoint is
DEEPSEEK_BASE_URL (default https://api.deepseek.com) with DEEPSEEK_API_KEY; replies go through
DeepSeekHarness, so a tool call DeepSeek leaks into the text is salvaged, reasoning content is
kept for the next turn, and a streamed reply's shapes are normalised.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

VERSION = "1.0.0"

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "description": "Write text to a file (relative paths are in the working directory).",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                "required": ["path", "content"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a text file.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "list_dir",
            "description": "List a directory.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "run",
            "description": "Run a shell command; returns its exit code and output.",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
        },
    },
]

SYSTEM = (
    "You are a coding agent working in {cwd}. Use the tools to do the task; "
    "when it is done, answer with a short summary and no tool call."
)


def call_tool(name: str, arguments: str) -> str:
    """Carries out one tool call; the result (or the error) is text for the model."""
    try:
        args = json.loads(arguments or "{}")
        if name == "write_file":
            path = args["path"]
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            with open(path, "w") as f:
                f.write(args["content"])
            return f"wrote {len(args['content'])} characters to {path}"
        if name == "read_file":
            with open(args["path"]) as f:
                return f.read()
        if name == "list_dir":
            return "\n".join(sorted(os.listdir(args.get("path") or ".")))
        if name == "run":
            done = subprocess.run(["bash", "-c", args["command"]], capture_output=True, text=True, timeout=300)
            return f"exit code {done.returncode}\n{done.stdout}{done.stderr}"
        return f"error: no tool named {name}"
    except Exception as e:  # the model sees the error and may try again
        return f"error: {type(e).__name__}: {e}"


def reply(client, model: str, messages: list, stream: bool) -> dict:
    """The assistant message for `messages` (streamed through the harness unless told not to)."""
    if not stream:
        return client.chat(model=model, messages=messages, tools=TOOLS)["message"]
    message = None
    for event in client.stream_chat(model=model, messages=messages, tools=TOOLS):
        if event["type"] == "content_delta":
            sys.stderr.write(event["data"])
        elif event["type"] == "done":
            message = event["message"]
    return message or {"role": "assistant", "content": ""}


def agent(task: str, model: str, max_turns: int, stream: bool) -> int:
    from deepseek_harness import DeepSeekHarness

    client = DeepSeekHarness()
    messages = [{"role": "system", "content": SYSTEM.format(cwd=os.getcwd())}, {"role": "user", "content": task}]
    for turn in range(1, max_turns + 1):
        try:
            message = reply(client, model, messages, stream)
        except Exception as e:
            print(f"dsh-agent: the model endpoint failed: {type(e).__name__}: {e}", file=sys.stderr)
            return 1
        messages.append(message)
        calls = message.get("tool_calls") or []
        if not calls:
            print(message.get("content") or "")
            return 0
        for call in calls:
            fn = call["function"]
            result = call_tool(fn["name"], fn.get("arguments", "{}"))
            print(f"[turn {turn}] {fn['name']}: {result.splitlines()[0] if result else ''}", file=sys.stderr)
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
    print(f"dsh-agent: no answer after {max_turns} turns", file=sys.stderr)
    return 2


def self_test() -> int:
    """The tool loop without a model: a tool call leaked into the text (one of the shapes
    DeepSeek is known to produce) is salvaged by the harness and carried out."""
    from deepseek_harness import salvage_tool_calls_from_content

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "salvaged.txt")
        leaked = '<tool_call>{"name": "write_file", "arguments": {"path": "%s", "content": "salvaged"}}</tool_call>' % path
        calls, _, how = salvage_tool_calls_from_content(leaked, "stop")
        if not calls:
            print("self-test failed: the leaked tool call was not salvaged", file=sys.stderr)
            return 1
        for call in calls:
            call_tool(call["function"]["name"], call["function"]["arguments"])
        got = call_tool("read_file", json.dumps({"path": path}))
        if got != "salvaged":
            print(f"self-test failed: read back {got!r}", file=sys.stderr)
            return 1
        print(f"self-test ok: salvaged {len(calls)} tool call ({how}), wrote and read back {os.path.basename(path)}")
    return 0


def versions() -> str:
    import importlib.metadata as md

    return f"dsh-agent {VERSION} (deepseek-harness {md.version('deepseek-harness')}, openai {md.version('openai')})"


def main() -> int:
    p = argparse.ArgumentParser(prog="dsh-agent", description=__doc__.split("\n\n")[0])
    p.add_argument("task", nargs="?")
    p.add_argument("--model", default=os.environ.get("DEEPSEEK_MODEL", "deepseek-chat"))
    p.add_argument("--max-turns", type=int, default=20)
    p.add_argument("--no-stream", action="store_true", help="ask for whole replies instead of a stream")
    p.add_argument("--version", action="store_true")
    p.add_argument("--self-test", action="store_true")
    a = p.parse_args()
    if a.version:
        print(versions())
        return 0
    if a.self_test:
        return self_test()
    if not a.task:
        p.error("a task is needed")
    return agent(a.task, a.model, a.max_turns, not a.no_stream)


if __name__ == "__main__":
    sys.exit(main())
