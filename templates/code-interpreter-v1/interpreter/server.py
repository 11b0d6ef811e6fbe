"""The code interpreter of code-interpreter-v1: E2B's code-interpreter protocol on port 49999.

What the platform's clients call (the `e2b-code-interpreter` SDKs, Alibaba's
`agent_sandbox.code_interpreter`), answered from Jupyter kernels driven with jupyter_client:

    GET    /health                    200 "OK"
    POST   /execute                   {code, language?, context_id?, env_vars?} -> a stream of
                                      JSON lines: number_of_executions, stdout, stderr, result,
                                      error, keepalive ... then end_of_execution
    POST   /contexts                  {language?, cwd?} -> {id, language, cwd}
    GET    /contexts                  [{id, language, cwd}]
    POST   /contexts/<id>/restart     a fresh kernel for the context (its state is gone)
    DELETE /contexts/<id>             the context and its kernel go

A context is one kernel. Every language has a default context, made on first use (Python's and
JavaScript's at start, as the official server does); `/execute` without language or context
runs in Python's. One execution runs at a time per context; a client that goes away (its
timeout, a dropped connection) interrupts the kernel, so the next execution is not stuck behind
it; a kernel that died is replaced by a fresh one at the next execution. Per-execution `env_vars`
are set in the kernel before the code and put back after it (silent executions, so the
execution count is the user's). A language without a kernel here is answered as the official
server answers a kernel Jupyter does not have: 500 `Failed to create context: ...`.

Only the standard library and jupyter_client; stdlib HTTP/1.1 with chunked streaming.
"""

import json
import os
import queue
import re
import select
import socket
import sys
import threading
import time
import uuid
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from jupyter_client.kernelspec import NoSuchKernel
from jupyter_client.manager import KernelManager

PORT = int(os.environ.get("CODE_INTERPRETER_PORT", "49999"))
HOME = "/home/user"
# Seconds between keepalive lines while a cell is silent (the official server's interval):
# a write is also how a vanished client shows, should its close not.
KEEPALIVE = 5.0
# How long to wait after a JavaScript cell's idle status for a result published late.
LATE = 0.05
DEBUG = os.environ.get("CODE_INTERPRETER_DEBUG") == "1"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")

# language -> Jupyter kernel name (the official server's: the language itself, TypeScript on
# the JavaScript kernel).
KERNELS = {"python": "python3", "javascript": "javascript", "typescript": "javascript", "r": "r", "bash": "bash"}


def normalize_language(language):
    if not language:
        return "python"
    language = language.lower().strip()
    return {"js": "javascript", "ts": "typescript"}.get(language, language)


def kernel_name(language):
    return KERNELS.get(language, language)


def now_iso():
    return datetime.now(timezone.utc).isoformat()


def log(msg):
    print(f"{now_iso()} {msg}", file=sys.stderr, flush=True)


# -- values written into a kernel, per language ------------------------------------------------


def quoted(language, value):
    if language == "bash":
        return "'" + value.replace("'", "'\\''") + "'"
    # A JSON string (ASCII only) is a valid string literal in Python, JavaScript and R.
    return json.dumps(value)


def set_env_code(language, env):
    lines = []
    for k, v in env.items():
        if language == "python":
            lines.append(f"__import__('os').environ[{quoted(language, k)}] = {quoted(language, v)}")
        elif language in ("javascript", "typescript"):
            lines.append(f"process.env[{quoted(language, k)}] = {quoted(language, v)};")
        elif language == "r":
            lines.append(f"do.call(Sys.setenv, setNames(list({quoted(language, v)}), {quoted(language, k)}))")
        elif language == "bash":
            lines.append(f"export {k}={quoted(language, v)}")
    return "\n".join(lines)


def unset_env_code(language, keys):
    lines = []
    for k in keys:
        if language == "python":
            lines.append(f"__import__('os').environ.pop({quoted(language, k)}, None)")
        elif language in ("javascript", "typescript"):
            lines.append(f"delete process.env[{quoted(language, k)}];")
        elif language == "r":
            lines.append(f"Sys.unsetenv({quoted(language, k)})")
        elif language == "bash":
            lines.append(f"unset {k}")
    return "\n".join(lines)


VALID_ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


# -- results -------------------------------------------------------------------------------------

MIME = [
    ("text/plain", "text"),
    ("text/html", "html"),
    ("text/markdown", "markdown"),
    ("image/svg+xml", "svg"),
    ("image/png", "png"),
    ("image/jpeg", "jpeg"),
    ("application/pdf", "pdf"),
    ("text/latex", "latex"),
    ("application/json", "json"),
    ("application/javascript", "javascript"),
    ("e2b/data", "data"),
    ("e2b/chart", "chart"),
]


def result_line(data, is_main):
    data = dict(data)
    out = {"type": "result"}
    for mime, key in MIME:
        if mime in data:
            out[key] = data.pop(mime)
    text = out.get("text")
    if isinstance(text, str):
        text = ANSI.sub("", text)
        # A string's repr comes back as the string, as from the official server.
        if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
            text = text[1:-1]
        out["text"] = text
    if data:
        out["extra"] = data
    out["is_main_result"] = is_main
    return out


# -- contexts ------------------------------------------------------------------------------------


class ContextError(Exception):
    pass


class Context:
    """One kernel, its language and working directory, and the executions waiting on it."""

    def __init__(self, language, cwd):
        self.id = str(uuid.uuid4())
        self.language = language
        self.cwd = cwd
        self.lock = threading.Lock()  # one execution at a time
        self.waiting = {}  # msg_id -> queue of iopub messages
        self.waiting_lock = threading.Lock()
        self.km = None
        self.kc = None
        self.generation = 0
        self.start()

    def info(self):
        return {"id": self.id, "language": self.language, "cwd": self.cwd}

    def start(self):
        name = kernel_name(self.language)
        env = dict(os.environ)
        km = KernelManager(kernel_name=name)
        try:
            km.start_kernel(cwd=self.cwd, env=env)
        except NoSuchKernel:
            # What Jupyter's session API answers, which the official server passes on.
            msg = (
                f"The '{name}' kernel is not available. Please pick another suitable kernel "
                "instead, or install that kernel."
            )
            raise ContextError(json.dumps({"message": msg, "short_message": f"{name} not found"}))
        except Exception as e:  # the kernel's program is missing, the cwd is not there...
            raise ContextError(json.dumps({"message": f"cannot start the {name} kernel: {e}"}))
        kc = km.blocking_client()
        kc.start_channels()
        try:
            kc.wait_for_ready(timeout=90)
        except Exception as e:
            kc.stop_channels()
            km.shutdown_kernel(now=True)
            raise ContextError(json.dumps({"message": f"the {name} kernel did not start: {e}"}))
        self.km, self.kc = km, kc
        self.generation += 1
        threading.Thread(target=self._read, args=(kc, self.generation), daemon=True).start()

    def stop(self):
        kc, km = self.kc, self.km
        self.kc = self.km = None
        self.generation += 1
        if kc is not None:
            try:
                kc.stop_channels()
            except Exception:
                pass
        if km is not None:
            try:
                km.shutdown_kernel(now=True)
            except Exception:
                pass
        with self.waiting_lock:
            for q in self.waiting.values():
                q.put(None)

    def restart(self):
        self.stop()
        self.start()

    def alive(self):
        try:
            return self.km is not None and self.km.is_alive()
        except Exception:
            return False

    def _read(self, kc, generation):
        """Hands every iopub message to the execution it belongs to."""
        while self.generation == generation:
            try:
                msg = kc.get_iopub_msg(timeout=0.5)
            except queue.Empty:
                continue
            except Exception:
                if self.generation != generation:
                    return
                time.sleep(0.2)
                continue
            parent = (msg.get("parent_header") or {}).get("msg_id")
            with self.waiting_lock:
                q = self.waiting.get(parent)
            if q is not None:
                q.put(msg)
            elif DEBUG:
                log(f"context {self.id}: unclaimed {msg['msg_type']} of {parent}")

    def _send(self, code, silent):
        # Nobody waits for execute replies (iopub says all); drop those that piled up.
        try:
            while True:
                self.kc.get_shell_msg(timeout=0)
        except Exception:
            pass
        q = queue.Queue()
        msg = self.kc.session.msg(
            "execute_request",
            {
                "code": code,
                "silent": silent,
                "store_history": not silent,
                "user_expressions": {},
                "allow_stdin": False,
                "stop_on_error": True,
            },
        )
        with self.waiting_lock:
            self.waiting[msg["header"]["msg_id"]] = q
        self.kc.shell_channel.send(msg)
        return msg["header"]["msg_id"], q

    def _done(self, msg_id):
        with self.waiting_lock:
            self.waiting.pop(msg_id, None)

    def run_silent(self, code, seconds=30):
        """Runs code nobody sees (environment variables); returns the error, if any."""
        if not code:
            return None
        msg_id, q = self._send(code, True)
        error = None
        deadline = time.monotonic() + seconds
        try:
            while time.monotonic() < deadline:
                try:
                    msg = q.get(timeout=0.5)
                except queue.Empty:
                    if not self.alive():
                        return "the kernel died"
                    continue
                if msg is None:
                    return "the kernel went away"
                if msg["msg_type"] == "error":
                    error = f"{msg['content'].get('ename')}: {msg['content'].get('evalue')}"
                if msg["msg_type"] == "status" and msg["content"].get("execution_state") == "idle":
                    return error
            return "timed out"
        finally:
            self._done(msg_id)

    def execute(self, code, env_vars, emit, gone):
        """Runs `code`, calling `emit(line)` for each output line; `gone()` says whether the
        client went away. Holds the context for the whole execution."""
        with self.lock:
            if not self.alive():
                log(f"context {self.id}: the kernel is not running, starting a fresh one")
                self.restart()
            env_vars = {k: str(v) for k, v in (env_vars or {}).items() if VALID_ENV.match(k)}
            before = {k: os.environ.get(k) for k in env_vars}
            if env_vars:
                err = self.run_silent(set_env_code(self.language, env_vars))
                if err:
                    log(f"context {self.id}: setting env_vars failed: {err}")
            try:
                self._execute(code, emit, gone)
            finally:
                if env_vars and self.alive():
                    back = {k: v for k, v in before.items() if v is not None}
                    code = set_env_code(self.language, back) + "\n" + unset_env_code(
                        self.language, [k for k, v in before.items() if v is None]
                    )
                    err = self.run_silent(code.strip())
                    if err:
                        log(f"context {self.id}: restoring env_vars failed: {err}")

    def _execute(self, code, emit, gone):
        msg_id, q = self._send(code, False)
        errored = False
        last_write = time.monotonic()
        idle_at = None
        try:
            while True:
                try:
                    # Deno's kernel may publish a cell's result just after its idle status:
                    # after idle, wait a moment for what may still come.
                    msg = q.get(timeout=0.5 if idle_at is None else LATE)
                except queue.Empty:
                    if idle_at is not None:
                        return
                    if gone():
                        log(f"context {self.id}: the client went away, interrupting the kernel")
                        self._interrupt_and_settle(q)
                        return
                    if not self.alive():
                        emit({"type": "error", "name": "ContextRestarting", "value": "Context was restarted", "traceback": ""})
                        return
                    if time.monotonic() - last_write >= KEEPALIVE:
                        if not emit({"type": "keepalive"}):
                            self._interrupt_and_settle(q)
                            return
                        last_write = time.monotonic()
                    continue
                if msg is None:
                    emit({"type": "error", "name": "ContextRestarting", "value": "Context was restarted", "traceback": ""})
                    return
                kind, content = msg["msg_type"], msg["content"]
                if DEBUG:
                    log(f"context {self.id}: {kind} {content.get('execution_state', '')}")
                line = None
                if kind == "execute_input":
                    line = {"type": "number_of_executions", "execution_count": content.get("execution_count")}
                elif kind == "stream":
                    name = "stderr" if content.get("name") == "stderr" else "stdout"
                    line = {"type": name, "text": content.get("text", ""), "timestamp": msg["header"].get("date") or now_iso()}
                    if not isinstance(line["timestamp"], str):
                        line["timestamp"] = line["timestamp"].isoformat()
                elif kind in ("display_data", "execute_result"):
                    line = result_line(content.get("data", {}), kind == "execute_result")
                elif kind == "error" and not errored:
                    errored = True
                    line = {
                        "type": "error",
                        "name": content.get("ename") or "",
                        "value": content.get("evalue") or "",
                        "traceback": ANSI.sub("", "\n".join(content.get("traceback") or [])),
                    }
                elif kind == "status" and content.get("execution_state") == "idle":
                    if self.language not in ("javascript", "typescript"):
                        return
                    idle_at = time.monotonic()
                if line is not None:
                    if not emit(line):
                        log(f"context {self.id}: the client went away, interrupting the kernel")
                        self._interrupt_and_settle(q)
                        return
                    last_write = time.monotonic()
        finally:
            self._done(msg_id)

    def _interrupt_and_settle(self, q, seconds=10):
        """Interrupts the running cell and waits until the kernel is idle again, so the next
        execution starts clean; a kernel that does not settle is replaced."""
        try:
            self.km.interrupt_kernel()
        except Exception as e:
            log(f"context {self.id}: interrupt failed: {e}")
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                msg = q.get(timeout=0.5)
            except queue.Empty:
                continue
            if msg is None:
                return
            if msg["msg_type"] == "status" and msg["content"].get("execution_state") == "idle":
                return
        log(f"context {self.id}: the kernel did not stop after an interrupt, restarting it")
        self.restart()


class Contexts:
    def __init__(self):
        self.lock = threading.Lock()
        self.by_id = {}
        self.defaults = {}  # language -> context id
        self.language_locks = {}

    def create(self, language, cwd):
        ctx = Context(language, cwd)
        with self.lock:
            self.by_id[ctx.id] = ctx
        log(f"context {ctx.id}: {language} in {cwd}")
        return ctx

    def get(self, context_id):
        with self.lock:
            return self.by_id.get(context_id)

    def default(self, language):
        with self.lock:
            lock = self.language_locks.setdefault(language, threading.Lock())
        with lock:
            with self.lock:
                ctx = self.by_id.get(self.defaults.get(language, ""))
            if ctx is None:
                ctx = self.create(language, HOME)
                with self.lock:
                    self.defaults[language] = ctx.id
            return ctx

    def list(self):
        with self.lock:
            return [c.info() for c in self.by_id.values()]

    def remove(self, context_id):
        with self.lock:
            ctx = self.by_id.pop(context_id, None)
            for lang, cid in list(self.defaults.items()):
                if cid == context_id:
                    del self.defaults[lang]
        if ctx is not None:
            ctx.stop()
        return ctx


CONTEXTS = Contexts()


# -- HTTP ----------------------------------------------------------------------------------------


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "code-interpreter"

    def log_message(self, fmt, *args):
        pass

    def _body(self):
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n) if n else b""
        if not raw.strip():
            return {}
        return json.loads(raw)

    def _send(self, status, body, content_type="application/json"):
        data = body if isinstance(body, bytes) else body.encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _json(self, status, value):
        self._send(status, json.dumps(value))

    def _text(self, status, text):
        self._send(status, text, "text/plain; charset=utf-8")

    def do_GET(self):
        path = self.path.split("?", 1)[0].rstrip("/")
        if path == "/health":
            return self._json(200, "OK")
        if path == "/contexts":
            STARTED.wait(180)
            return self._json(200, CONTEXTS.list())
        return self._json(404, {"detail": "Not Found"})

    def do_POST(self):
        path = self.path.split("?", 1)[0].rstrip("/")
        try:
            body = self._body()
        except ValueError as e:
            return self._json(422, {"detail": f"invalid JSON: {e}"})
        if not isinstance(body, dict):
            return self._json(422, {"detail": "the body must be a JSON object"})
        if path == "/execute":
            return self.execute(body)
        if path == "/contexts":
            # After the default contexts, as on the official server (a client takes the
            # last listed context for the one it made).
            STARTED.wait(180)
            language = normalize_language(body.get("language"))
            cwd = body.get("cwd") or HOME
            try:
                ctx = CONTEXTS.create(language, cwd)
            except ContextError as e:
                return self._text(500, f"Failed to create context: {e}")
            return self._json(200, ctx.info())
        m = re.fullmatch(r"/contexts/([^/]+)/restart", path)
        if m:
            ctx = CONTEXTS.get(m.group(1))
            if ctx is None:
                return self._text(404, f"Context {m.group(1)} not found")
            try:
                with ctx.lock:
                    ctx.restart()
            except ContextError:
                return self._text(500, f"Failed to restart context {m.group(1)}")
            return self._json(200, None)
        return self._json(404, {"detail": "Not Found"})

    def do_DELETE(self):
        path = self.path.split("?", 1)[0].rstrip("/")
        m = re.fullmatch(r"/contexts/([^/]+)", path)
        if m:
            if CONTEXTS.remove(m.group(1)) is None:
                return self._text(404, f"Context {m.group(1)} not found")
            return self._json(200, None)
        return self._json(404, {"detail": "Not Found"})

    def execute(self, body):
        code = body.get("code")
        if not isinstance(code, str):
            return self._json(422, {"detail": "code is required (a string)"})
        context_id, language = body.get("context_id"), body.get("language")
        if context_id and language:
            return self._text(400, "Only one of context_id or language can be provided")
        if context_id:
            ctx = CONTEXTS.get(context_id)
            if ctx is None:
                return self._text(404, f"Context {context_id} not found")
        else:
            try:
                ctx = CONTEXTS.default(normalize_language(language))
            except ContextError as e:
                return self._text(500, f"Failed to create context: {e}")
        env_vars = body.get("env_vars") or {}
        if not isinstance(env_vars, dict):
            return self._json(422, {"detail": "env_vars must be an object"})

        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        sock = self.connection
        state = {"open": True}

        def write(line):
            if not state["open"]:
                return False
            data = (json.dumps(line) + "\n").encode()
            try:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()
                return True
            except OSError:
                state["open"] = False
                return False

        def gone():
            """The client closed its side: the socket reads as EOF (it sent its whole request
            already, so nothing else can be waiting there)."""
            if not state["open"]:
                return True
            try:
                r, _, _ = select.select([sock], [], [], 0)
                if r and sock.recv(1, socket.MSG_PEEK) == b"":
                    state["open"] = False
            except OSError:
                state["open"] = False
            return not state["open"]

        try:
            ctx.execute(code, env_vars, write, gone)
        except ContextError as e:
            write({"type": "error", "name": "ContextError", "value": str(e), "traceback": ""})
        except Exception as e:  # a bug here must still end the stream as data
            log(f"execute failed: {e!r}")
            write({"type": "error", "name": type(e).__name__, "value": str(e), "traceback": ""})
        if write({"type": "end_of_execution"}):
            try:
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except OSError:
                pass
        else:
            self.close_connection = True


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


# Set once Python's and JavaScript's default contexts have been made (or failed to be).
STARTED = threading.Event()


def start_defaults():
    """The official server makes Python's and JavaScript's contexts before it answers. Here
    they start side by side while the server already answers, so the sandbox is ready sooner
    on a busy machine: an execution in a language waits for its default context (the
    language's lock), and listing contexts waits for both."""

    def one(language):
        try:
            CONTEXTS.default(language)
        except ContextError as e:
            log(f"no default {language} context: {e}")

    threads = [threading.Thread(target=one, args=(lang,), daemon=True) for lang in ("python", "javascript")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    STARTED.set()


def main():
    server = Server(("0.0.0.0", PORT), Handler)
    threading.Thread(target=start_defaults, daemon=True).start()
    log(f"code interpreter listening on {PORT}")
    server.serve_forever()


if __name__ == "__main__":
    main()
