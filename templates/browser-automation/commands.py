"""browser-automation: agent-sandbox-server on 9000 with Playwright for Python on Debian's Chromium.

Playwright's own browser download is not used: every launch here names CHROMIUM_PATH
(/usr/bin/chromium, Debian's package) with CHROMIUM_FLAGS (--no-sandbox: Chromium's sandbox
needs namespaces a sandbox does not grant, so it runs headless as root or `user` without it;
--disable-dev-shm-usage: /dev/shm may be small). The server's opt-in `browser` group
(/browser/navigate, /browser/screenshot, ...) launches Chromium through Playwright's default
`launch()`; it is pointed at the same Chromium below. A script of your own does the same with
`p.chromium.launch(executable_path=os.environ["CHROMIUM_PATH"], args=os.environ["CHROMIUM_FLAGS"].split())`.

- `version()`: Chromium's and Playwright's versions (no key needed).
- `render(url, selector="body")`: load `url` (a `data:` URL works offline) in headless Chromium;
  returns the page's title, the text of `selector`, and the size of a PNG screenshot.
- `run(script)`: a Python Playwright script in the workspace (CHROMIUM_PATH and CHROMIUM_FLAGS set).
- `run_script(script)`: Python in the workspace.
"""

import os
import shutil
import subprocess
import sys

from agent_sandbox.server import command, start

WORK = "/home/user/workspace"


def _run(argv, cwd=WORK, timeout=600, env=None, stdin=None):
    """Runs argv in the workspace; the result is data: {stdout, stderr, exit_code}."""
    if shutil.which(argv[0]) is None:
        return {"stdout": "", "stderr": f"{argv[0]}: not found", "exit_code": 127}
    os.makedirs(cwd, exist_ok=True)
    try:
        done = subprocess.run(
            argv,
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=timeout,
            input=stdin,
            stdin=None if stdin is not None else subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
        )
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
        return {"stdout": out, "stderr": err + f"\n(timed out after {timeout}s)", "exit_code": 124}
    return {"stdout": done.stdout, "stderr": done.stderr, "exit_code": done.returncode}


@command(description="Run a Python script in the workspace")
def run_script(script: str) -> dict:
    return _run([sys.executable, "-c", script])


CHROMIUM = os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium")
FLAGS = os.environ.get("CHROMIUM_FLAGS", "--no-sandbox --disable-dev-shm-usage").split()


def _point_playwright_at_chromium() -> None:
    """Makes launches that name no browser (the server's browser routes) use Debian's Chromium."""
    from playwright.sync_api import BrowserType

    original = BrowserType.launch

    def launch(self, *args, **kwargs):
        if self.name == "chromium" and not kwargs.get("executable_path") and not kwargs.get("channel"):
            kwargs["executable_path"] = CHROMIUM
            kwargs["args"] = [*FLAGS, *(kwargs.get("args") or [])]
        return original(self, *args, **kwargs)

    BrowserType.launch = launch


@command(description="Chromium's and Playwright's versions (no key needed)")
def version() -> dict:
    import importlib.metadata as md

    r = _run([CHROMIUM, "--version"])
    r["playwright"] = md.version("playwright")
    return r


@command(description="Load a URL (a data: URL works offline) in headless Chromium: title, text, screenshot size")
def render(url: str, selector: str = "body") -> dict:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            page = browser.new_page()
            page.goto(url)
            shot = page.screenshot()
            return {
                "title": page.title(),
                "text": page.inner_text(selector),
                "screenshot_bytes": len(shot),
                "png": shot[:8] == b"\x89PNG\r\n\x1a\n",
                "browser": browser.version,
            }
        finally:
            browser.close()


@command(description="Run a Python Playwright script in the workspace (CHROMIUM_PATH and CHROMIUM_FLAGS set)")
def run(script: str, timeout: int = 300) -> dict:
    return _run([sys.executable, "-c", script], timeout=timeout)


if __name__ == "__main__":
    os.makedirs(WORK, exist_ok=True)
    _point_playwright_at_chromium()
    start(9000)
