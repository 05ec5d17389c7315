"""JupyterLab in headless Chromium, for the browser tests (tests/test_browser.py).

``jupyter_lab(root)`` serves ``root`` from this environment on a free loopback port, offline
(no news feed, no update check, no extension manager), with its config, data, runtime,
settings and workspace directories in a temp dir so no user state leaks in or out, and shuts
the server and every process it started down on exit, failure included.
``voila_app(root, notebook)`` serves one notebook as ``make app`` does.
``chromium_page(...)`` is a headless Chromium (Debian's ``chromium``, driven by Playwright)
with a fresh profile and no background networking; requests off the loopback interface are
refused and recorded in ``page.external_requests``, and every message the page's kernels send
is read off the websocket into ``page.kernel`` (a ``KernelWatch``): a widget callback's error
or stderr reaches the browser with no cell to show it in, so the DOM alone would miss it.
The UI helpers act through the UI as a person would: menus, clicks and keys, never the kernel
API (``find_controls`` / ``change_control`` for every ipywidgets control a notebook renders).
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from _procs import free_port  # one definition for the tests' ports (tests/_procs.py)

CHROMIUM = os.environ.get("ACCUMLIB_CHROMIUM", "/usr/bin/chromium")
INSTALL_HINT = "sudo apt-get install -y chromium"
# Headless, no sandbox (CI containers run as root), no GPU, and nothing that phones home:
# without the background-networking flags Chromium keeps retrying the closed network.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--no-default-browser-check",
    "--no-proxy-server",
]

STARTUP_TIMEOUT_S = 60  # JupyterLab answers /api in ~3 s here; 60 s covers a loaded CI box
SHUTDOWN_TIMEOUT_S = 20  # graceful /api/shutdown (kernels included), then SIGTERM, SIGKILL

# The server also stops itself if the test process dies without cleaning up (SIGKILL):
# kernels idle for 5 min are culled, and a server with no kernel for 5 min exits.
SELF_STOP_S = 300


def chromium_missing_reason() -> str | None:
    """Why the browser tests cannot run here, or None when they can."""
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        return (
            f"Chromium not found at {CHROMIUM} (set ACCUMLIB_CHROMIUM to another path); "
            f"install it with: {INSTALL_HINT}"
        )
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed: pip install -c constraints.txt -e '.[dev]'"
    return None


_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass
class LabServer:
    root: Path
    port: int
    token: str
    proc: subprocess.Popen
    log_path: Path
    kind: str = "lab"  # or "voila"

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def lab_url(self, notebook: str) -> str:
        # A fresh, empty workspace per page: nothing a previous test opened is restored.
        return (
            f"{self.base_url}lab/workspaces/{secrets.token_hex(6)}/tree/{notebook}?reset&token={self.token}"
        )

    def app_url(self) -> str:
        return f"{self.base_url}?token={self.token}"

    def api(self, path: str, method: str = "GET", timeout: float = 5) -> bytes:
        req = urllib.request.Request(
            self.base_url + path,
            method=method,
            headers={"Authorization": f"token {self.token}"},
            data=b"" if method == "POST" else None,  # DELETE and GET carry no body
        )
        with _NO_PROXY.open(req, timeout=timeout) as resp:
            return resp.read()

    def shutdown_kernel(self, path: str) -> None:
        """End the session (and kernel) of the notebook at ``path``: a module's notebooks share one
        server, and a kernel left running holds its memory until the server stops."""
        for session in json.loads(self.api("api/sessions")):
            if session["path"] == path:
                with contextlib.suppress(urllib.error.HTTPError):
                    self.api(f"api/sessions/{session['id']}", method="DELETE", timeout=SHUTDOWN_TIMEOUT_S)

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no server log)"


def _server_env(state: Path) -> dict[str, str]:
    env = dict(os.environ)
    # tests/conftest.py sets MPLBACKEND=Agg for pytest; a participant's kernel has none
    # and shows figures inline. Same for the other per-user Jupyter/IPython locations.
    env.pop("MPLBACKEND", None)
    env.pop("JUPYTER_PATH", None)
    env.pop("JUPYTER_CONFIG_PATH", None)
    for var, sub in [
        ("JUPYTER_CONFIG_DIR", "config"),
        ("JUPYTER_DATA_DIR", "data"),
        ("JUPYTER_RUNTIME_DIR", "runtime"),
        ("IPYTHONDIR", "ipython"),
        ("MPLCONFIGDIR", "matplotlib"),
    ]:
        (state / sub).mkdir(parents=True, exist_ok=True)
        env[var] = str(state / sub)
    env["JUPYTER_PLATFORM_DIRS"] = "1"
    # One intra-op thread per kernel, as tests/conftest.py does for pytest: on 2 shared cores
    # PyTorch's default (a thread per core) oversubscribes them, and notebook 1's training
    # cell took 56 s instead of 1.6 s under load here.
    env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _write_config(state: Path) -> None:
    # news_url must be None (not "") to switch the news feed off; the command line cannot say None.
    (state / "config" / "jupyter_server_config.json").write_text(
        json.dumps({"LabApp": {"news_url": None}}, indent=1)
    )
    # JupyterLab user settings: no autosave (the server serves a throwaway copy anyway),
    # no news or update notifications.
    overrides = {
        "@jupyterlab/docmanager-extension:plugin": {"autosave": False},
        # Every cell in the DOM (the default windowing leaves off-screen cells out of it).
        "@jupyterlab/notebook-extension:tracker": {"windowingMode": "none"},
        "@jupyterlab/apputils-extension:notification": {"checkForUpdates": False, "fetchNews": "false"},
    }
    settings = state / "settings"
    for plugin, values in overrides.items():
        package, name = plugin.split(":")
        path = settings / package / f"{name}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))


def _lab_command(root: Path, state: Path, port: int, token: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "jupyter",
        "lab",  # this environment's JupyterLab and kernel
        "--no-browser",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        f"--ServerApp.root_dir={root}",
        f"--IdentityProvider.token={token}",
        "--ServerApp.terminals_enabled=False",
        f"--ServerApp.shutdown_no_activity_timeout={SELF_STOP_S}",
        f"--MappingKernelManager.cull_idle_timeout={SELF_STOP_S}",
        "--MappingKernelManager.cull_interval=60",
        "--MappingKernelManager.cull_connected=True",
        f"--LabApp.user_settings_dir={state / 'settings'}",
        f"--LabApp.workspaces_dir={state / 'workspaces'}",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        "--LabApp.extension_manager=readonly",
    ] + (["--allow-root"] if os.geteuid() == 0 else [])  # CI containers run as root


def _voila_command(root: Path, state: Path, port: int, token: str, notebook: str) -> list[str]:
    # What `make app` runs, on a loopback port with a token.
    return [
        sys.executable,
        "-m",
        "voila",
        notebook,
        "--no-browser",
        "--Voila.ip=127.0.0.1",
        f"--Voila.port={port}",
        "--Voila.port_retries=0",
        f"--Voila.token={token}",
    ]


def _wait_ready(server: LabServer, deadline: float) -> None:
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(
                f"{server.kind} exited with {server.proc.returncode} before answering:\n" + server.log_tail()
            )
        try:
            if server.kind == "lab":
                json.loads(server.api("api/status", timeout=2))
            else:  # Voila runs the notebook on GET /; any answer from a static path will do
                server.api("voila/static/ready-probe", timeout=2)
            return
        except urllib.error.HTTPError:
            if server.kind != "lab":
                return
            time.sleep(0.25)
        except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError):
            time.sleep(0.25)
    raise TimeoutError(
        f"{server.kind} did not answer on port {server.port} within {STARTUP_TIMEOUT_S} s:\n"
        + server.log_tail()
    )


def _stop(server: LabServer) -> list[str]:
    """Stop the server and everything it started. Returns processes that would not die."""
    import psutil

    try:
        family = [psutil.Process(server.proc.pid)]
        family += family[0].children(recursive=True)  # kernels run in their own sessions
    except psutil.NoSuchProcess:
        family = []
    if server.proc.poll() is None:
        if server.kind == "lab":
            with contextlib.suppress(OSError, urllib.error.URLError):
                server.api("api/shutdown", method="POST")  # shuts kernels down too
        else:
            server.proc.send_signal(signal.SIGTERM)  # Voila shuts its kernels down on SIGTERM
        try:
            server.proc.wait(SHUTDOWN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.proc.pid, signal.SIGTERM)
    live = [p for p in family if p.is_running()]
    for p in live:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.terminate()
    _, live = psutil.wait_procs(live, timeout=5)
    for p in live:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    _, live = psutil.wait_procs(live, timeout=5)
    with contextlib.suppress(subprocess.TimeoutExpired):
        server.proc.wait(5)
    return [f"{p.pid} {p.name()}" for p in live if p.is_running()]


@contextlib.contextmanager
def jupyter_lab(root: Path) -> Iterator[LabServer]:
    """Serve ``root`` with JupyterLab; stop it and every process it started on exit."""
    with _serve(root, "lab", lambda state, port, token: _lab_command(root, state, port, token)) as server:
        yield server


@contextlib.contextmanager
def voila_app(root: Path, notebook: str) -> Iterator[LabServer]:
    """Serve ``notebook`` (relative to ``root``) as a Voila app, as `make app` does."""
    cmd = lambda state, port, token: _voila_command(root, state, port, token, notebook)  # noqa: E731
    with _serve(root, "voila", cmd) as server:
        yield server


@contextlib.contextmanager
def _serve(root: Path, kind: str, command) -> Iterator[LabServer]:
    state = Path(tempfile.mkdtemp(prefix=f"accumlib-{kind}-"))
    server = None
    try:
        env = _server_env(state)
        _write_config(state)
        for attempt in range(3):  # the free port can be taken between probe and bind
            port, token = free_port(), secrets.token_hex(24)
            log_path = state / f"server-{attempt}.log"
            with open(log_path, "wb") as log:
                proc = subprocess.Popen(
                    command(state, port, token),
                    cwd=root,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # its own process group: killable as one
                )
            server = LabServer(root, port, token, proc, log_path, kind)
            try:
                _wait_ready(server, time.monotonic() + STARTUP_TIMEOUT_S)
                break
            except RuntimeError:
                _stop(server)
                if "already in use" not in server.log_tail() or attempt == 2:
                    raise
        yield server
    finally:
        survivors = _stop(server) if server is not None else []
        log_copy = server.log_tail(200) if server is not None else ""
        shutil.rmtree(state, ignore_errors=True)
        if survivors:
            raise RuntimeError(f"processes left after stopping {kind}: {survivors}\n{log_copy}")


@contextlib.contextmanager
def chromium_page(profile_dir: Path, timeout_ms: int = 30_000):
    """A Playwright page in headless Debian Chromium with a fresh profile in ``profile_dir``."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(profile_dir),
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1400, "height": 1000},
        )
        try:
            context.set_default_timeout(timeout_ms)
            # Offline as on this machine, whether or not the network is reachable: every
            # request off the loopback interface is refused and recorded (a test checks none).
            external: list[str] = []

            def route(r):
                if _is_local(r.request.url):
                    r.continue_()
                else:
                    external.append(r.request.url)
                    r.abort()

            context.route("**/*", route)
            page = context.pages[0] if context.pages else context.new_page()
            page.external_requests = external
            page.kernel = KernelWatch(page)  # before the first goto: every kernel socket is seen
            yield page
        finally:
            context.close()


def _is_local(url: str) -> bool:
    return url.startswith(("http://127.0.0.1:", "ws://127.0.0.1:", "data:", "blob:", "about:"))


# --- acting in JupyterLab through its UI -------------------------------------------------

# JupyterLab renders an exception (an `error` output) with the stderr MIME type, as it does
# stream output to stderr (there is no separate error MIME type in the DOM); ERROR_TEXT tells
# a traceback from other stderr text.
STDERR_MIME = "application/vnd.jupyter.stderr"
NOTEBOOK = ".jp-NotebookPanel:not(.lm-mod-hidden)"  # the notebook on screen, not other tabs
ERROR_TEXT = re.compile(r"Traceback \(most recent call last\)|^\w*(Error|Exception)\b", re.M)


def open_notebook(page, server: LabServer, path: str, timeout_ms: int = 60_000) -> None:
    """Open the notebook at ``path`` (relative to the server root); wait until every cell is rendered and
    its kernel is connected and idle."""
    import nbformat

    page.goto(server.lab_url(path), timeout=timeout_ms)
    nb = nbformat.read(server.root / path, as_version=4)
    page.wait_for_function(
        "n => document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-Cell').length === n"
        " && document.querySelectorAll('.jp-NotebookPanel').length === 1",
        arg=len(nb.cells),
        timeout=timeout_ms,
    )
    wait_kernel_idle(page, server, path, timeout_ms)
    wait_widget_manager(page, timeout_ms)


# The comm ipywidgets' widget manager opens on every kernel it connects to, to fetch the kernel's
# widgets. Before ipywidgets is imported the kernel answers it on stderr ("No such comm target
# registered: jupyter.widget.control"), harmless; a test that marks the kernel's messages before
# that answer arrives would read it as its own cell's error.
WIDGET_CONTROL_TARGET = "jupyter.widget.control"


def wait_widget_manager(page, timeout_ms: int) -> None:
    """Wait until the notebook's widget manager has asked the kernel for its widgets and the kernel
    has answered every request the page sent (it went idle for each): from here on, any kernel
    message a test sees answers what the test did."""
    watch = page.kernel
    deadline = time.monotonic() + timeout_ms / 1000
    while True:
        asked = any(
            m.msg_type == "comm_open" and m.content.get("target_name") == WIDGET_CONTROL_TARGET
            for m in list(watch.sent.values())
        )
        if asked and not watch.unanswered():
            return
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"widget manager not settled after {timeout_ms / 1000:.0f} s: "
                f"control comm opened: {asked}; unanswered requests: {watch.unanswered()}"
            )
        page.wait_for_timeout(100)  # a Playwright call: websocket events are delivered only during one


def wait_kernel_idle(page, server: LabServer, path: str, timeout_ms: int) -> None:
    """The notebook's execution indicator says idle and the server agrees: the kernel of the
    notebook's session is idle and has a browser connection."""
    deadline = time.monotonic() + timeout_ms / 1000
    while True:
        ui = page.evaluate(
            "() => document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) "
            ".jp-Notebook-ExecutionIndicator')?.getAttribute('data-status')"
        )
        kernels = [s["kernel"] for s in json.loads(server.api("api/sessions")) if s["path"] == path]
        if ui == "idle" and any(k["execution_state"] == "idle" and k["connections"] > 0 for k in kernels):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"kernel of {path} not idle after {timeout_ms / 1000:.0f} s: ui={ui} {kernels}"
            )
        time.sleep(0.25)


def menu_command(page, menu: str, command: str) -> None:
    """Click a main-menu entry, e.g. ("Run", "runmenu:run-all")."""
    page.locator(".lm-MenuBar-item", has_text=menu).first.click()
    page.locator(f'.lm-Menu-item[data-command="{command}"]').first.click()


_PROMPTS_JS = (
    "() => [...document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook "
    ".jp-CodeCell .jp-InputArea-prompt')].map(p => p.textContent.trim())"
)


def run_all_cells(page, server: LabServer, path: str, timeout_ms: int) -> list[str]:
    """Edit > Clear Outputs of All Cells, Run > Run All Cells, then wait until every non-empty
    code cell shows an execution count (or a cell failed: Run All stops there) and the kernel
    is idle. Returns the code cells' prompts."""
    import nbformat

    nb = nbformat.read(server.root / path, as_version=4)
    n_code = sum(1 for c in nb.cells if c.cell_type == "code" and c.source.strip())
    if any(c.get("metadata", {}).get("jupyter", {}).get("source_hidden") for c in nb.cells):
        # a folded input (the lessons' check cells) shows a placeholder without a prompt, so its
        # execution count could never be read: View > Expand All Code first
        menu_command(page, "View", "notebook:show-all-cell-code")
    menu_command(page, "Edit", "editmenu:clear-all")
    page.wait_for_function(_PROMPTS_JS.replace("() =>", "() => !(") + ".some(p => /\\d/.test(p)))")
    menu_command(page, "Run", "runmenu:run-all")
    deadline = time.monotonic() + timeout_ms / 1000
    while True:
        prompts = page.evaluate(_PROMPTS_JS)
        ran = sum(1 for p in prompts if p.strip("[]:").strip().isdigit())
        failed = any(ERROR_TEXT.search(t) for t in outputs_of(page, STDERR_MIME))
        if (ran == n_code or failed) and not any("*" in p for p in prompts):
            wait_kernel_idle(page, server, path, max(1000, int((deadline - time.monotonic()) * 1000)))
            return prompts
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"{ran} of {n_code} code cells ran within {timeout_ms / 1000:.0f} s: {prompts}"
            )
        time.sleep(0.25)


def outputs_of(page, mime: str) -> list[str]:
    """Text of every rendered output of one MIME type in the open notebook."""
    return notebook(page).locator(f'.jp-OutputArea-output[data-mime-type="{mime}"]').all_inner_texts()


def notebook(page):
    """The notebook panel on screen."""
    return page.locator(NOTEBOOK).first


def png_pixels(src: str):
    """Decode an ``<img src="data:image/png;base64,...">`` into a PIL image (RGBA)."""
    from PIL import Image

    head, _, data = src.partition(",")
    if not head.startswith("data:image/png;base64"):
        raise ValueError(f"figure is not an inline PNG: {head[:60]!r}")
    return Image.open(io.BytesIO(base64.b64decode(data))).convert("RGBA")


def images_differ(src_a: str, src_b: str) -> bool:
    """Whether two inline PNGs differ in size or in any pixel (not merely in their bytes)."""
    a, b = png_pixels(src_a), png_pixels(src_b)
    # Not ImageChops.difference(...).getbbox(): on RGBA it looks at the alpha channel only.
    return a.size != b.size or a.tobytes() != b.tobytes()


# --- what the kernel said: iopub messages read off the page's websockets ----------------------

ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass
class KernelMessage:
    channel: str
    msg_type: str
    msg_id: str
    parent_id: str
    parent_type: str
    content: dict


def _decode_frame(payload) -> KernelMessage | None:
    """One kernel websocket frame: JSON text (legacy protocol) or v1.kernel.websocket.jupyter.org
    binary (uint64 count, uint64 offsets, then channel, header, parent header, metadata, content)."""
    try:
        if isinstance(payload, str):
            msg = json.loads(payload)
            channel, header, parent, content = (
                msg.get("channel", ""),
                msg["header"],
                msg.get("parent_header") or {},
                msg["content"],
            )
        else:
            b = bytes(payload)
            n = int.from_bytes(b[:8], "little")
            offsets = [int.from_bytes(b[8 + 8 * i : 16 + 8 * i], "little") for i in range(n)] + [len(b)]
            parts = [b[offsets[i] : offsets[i + 1]] for i in range(n)]
            channel, header = parts[0].decode(), json.loads(parts[1])
            parent, content = json.loads(parts[2] or b"{}"), json.loads(parts[4])
        return KernelMessage(
            channel,
            header["msg_type"],
            header.get("msg_id", ""),
            parent.get("msg_id", ""),
            parent.get("msg_type", ""),
            content,
        )
    except (ValueError, KeyError, IndexError, TypeError, UnicodeDecodeError):
        return None  # not a kernel message (the sockets carry nothing else we need)


class KernelWatch:
    """Every message the page's kernels send (iopub included) and every request the page sends.

    Playwright delivers websocket events only while a Playwright call runs: poll with
    ``page.wait_for_timeout``, not ``time.sleep``.
    """

    def __init__(self, page) -> None:
        self.received: list[KernelMessage] = []
        self.sent: dict[str, KernelMessage] = {}
        page.on("websocket", self._attach)

    def _attach(self, ws) -> None:
        if "/api/kernels/" in ws.url and "/channels" in ws.url:
            ws.on("framereceived", self._on_received)
            ws.on("framesent", self._on_sent)

    def _on_received(self, payload) -> None:
        msg = _decode_frame(payload)
        if msg is None:
            return
        self.received.append(msg)

    def _on_sent(self, payload) -> None:
        msg = _decode_frame(payload)
        if msg is not None:
            self.sent[msg.msg_id] = msg

    def mark(self) -> int:
        return len(self.received)

    def unanswered(self) -> list[str]:
        """Shell and control requests the page sent that the kernel has not yet gone idle for."""
        idle = {
            m.parent_id
            for m in list(self.received)
            if m.msg_type == "status" and m.content.get("execution_state") == "idle"
        }
        return [
            f"{m.msg_type} {m.msg_id}"
            for m in list(self.sent.values())
            if m.channel in ("shell", "control") and m.msg_id not in idle
        ]

    def busy_with(self, since: int = 0) -> list[str]:
        """Requests (after message ``since``) the kernel said it is busy with and not yet idle for."""
        state: dict[str, str] = {}
        for m in self.received[since:]:
            if m.msg_type == "status" and m.parent_id:
                state[m.parent_id] = m.content.get("execution_state", "")
        return [pid for pid, s in state.items() if s == "busy"]

    def handled_widget_message(self, since: int) -> bool:
        """Whether the kernel went busy for a widget (comm) message after ``since``."""
        return any(m.msg_type == "status" and m.parent_type == "comm_msg" for m in self.received[since:])

    def problems(self, since: int = 0, parents: tuple[str, ...] | None = None) -> list[str]:
        """Error and stderr messages after ``since`` (optionally only those answering ``parents``
        message types), as text: the exception's last line and traceback, or the stderr text."""
        found = []
        for m in self.received[since:]:
            if parents is not None and m.parent_type not in parents:
                continue
            if m.msg_type == "error":
                tb = ANSI.sub("", "\n".join(m.content.get("traceback", [])))
                found.append(
                    f"[{m.parent_type} error] {m.content.get('ename')}: {m.content.get('evalue')}\n{tb[-1500:]}"
                )
            elif m.msg_type == "stream" and m.content.get("name") == "stderr":
                found.append(f"[{m.parent_type} stderr] {m.content.get('text', '')[-1500:]}")
        return found


# --- every ipywidgets control a notebook renders ------------------------------------------------

# An error shown as text inside a widget (a callback that catches its exception and prints
# "ValueError: ...", or a status line "Failed: ..."): a Python exception or warning class name
# followed by a colon, or a traceback header.
ERROR_IN_WIDGET = re.compile(r"Traceback \(most recent call last\)|\b[A-Z]\w*(Error|Exception|Warning)\b:")

# Each kind of control: how to find it (CSS, relative to a code cell's output) and its value.
_CONTROLS_JS = r"""
() => {
  const cells = [...document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-CodeCell')];
  const text = e => (e ? e.innerText : '').trim();
  const label = el => text(el.querySelector(':scope > .widget-label')) || text(el.closest('.widget-box')?.querySelector(':scope > .widget-label'));
  const found = [];
  cells.forEach((cell, ci) => {
    const area = cell.querySelector('.jp-Cell-outputWrapper');
    if (!area) return;
    const add = (kind, el, desc, value, options, disabled) => {
      el.dataset.accumlibControl = String(found.length);
      found.push({id: found.length, cell: ci, kind, label: desc, value: String(value), options, disabled: !!disabled});
    };
    for (const el of area.querySelectorAll('.widget-slider')) {
      const h = el.querySelector('.noUi-handle');
      add('slider', el, label(el), text(el.querySelector('.widget-readout')) || h?.getAttribute('aria-valuenow'),
          [h?.getAttribute('aria-valuemin'), h?.getAttribute('aria-valuenow'), h?.getAttribute('aria-valuemax')],
          el.querySelector('.noUi-target[disabled]') || h?.hasAttribute('disabled'));
    }
    for (const el of area.querySelectorAll('.widget-dropdown, .widget-select:not(.widget-select-multiple)')) {
      const s = el.querySelector('select');
      if (!s) continue;
      add(el.classList.contains('widget-dropdown') ? 'dropdown' : 'select', el, label(el),
          s.selectedOptions[0]?.text ?? '', [...s.options].map(o => o.text), s.disabled);
    }
    for (const el of area.querySelectorAll('.widget-toggle-buttons')) {
      const bs = [...el.querySelectorAll('button')];
      add('toggle-buttons', el, label(el), text(bs.find(b => b.classList.contains('mod-active'))), bs.map(text), bs.every(b => b.disabled));
    }
    for (const el of area.querySelectorAll('button.widget-toggle-button')) {
      if (el.closest('.widget-toggle-buttons')) continue;
      add('toggle-button', el, text(el), el.classList.contains('mod-active'), null, el.disabled);
    }
    for (const el of area.querySelectorAll('.widget-checkbox')) {
      const i = el.querySelector('input[type=checkbox]');
      if (i) add('checkbox', el, text(el.querySelector('.widget-label-basic')) || label(el), i.checked, null, i.disabled);
    }
    for (const el of area.querySelectorAll('.widget-radio')) {
      const is = [...el.querySelectorAll('input[type=radio]')];
      add('radio', el, label(el), text(is.find(i => i.checked)?.parentElement), is.map(i => text(i.parentElement)), is.every(i => i.disabled));
    }
    for (const el of area.querySelectorAll('.widget-text')) {  // Int/FloatText and their Bounded kin
      const i = el.querySelector(':scope > input[type=number]');
      if (i) add('number', el, label(el), i.value, null, i.disabled);
    }
    for (const el of area.querySelectorAll('button.widget-button')) {
      if (el.classList.contains('widget-toggle-button')) continue;
      add('button', el, text(el) || el.title, '', null, el.disabled);
    }
  });
  return found;
}
"""

# What a code cell's output shows apart from the controls' own values: its figures, its
# widget output areas and labels, stderr, and whether any button is disabled (busy).
_CELL_VIEW_JS = r"""
([ci, full, mark]) => {
  const cell = document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-CodeCell')[ci];
  const area = cell?.querySelector('.jp-Cell-outputWrapper');
  if (!area) return null;
  const imgs = [...area.querySelectorAll('img')];
  const texts = [...area.querySelectorAll('.widget-output, .widget-label:not(.widget-label-basic), .widget-html, .widget-htmlmath')]
    .filter(e => !e.parentElement.closest('.widget-output'))
    .map(e => e.innerText.trim());
  const outputs = [...area.querySelectorAll('.widget-output')].filter(e => !e.parentElement.closest('.widget-output'))
    .map(e => e.querySelectorAll('.jp-OutputArea-output').length);
  const stderr = [...area.querySelectorAll('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]')].map(e => e.innerText);
  let h = 2166136261;
  for (const s of [...imgs.map(i => i.src), ...texts]) for (let k = 0; k < s.length; k++) h = Math.imul(h ^ s.charCodeAt(k), 16777619);
  const fresh = imgs.filter(i => !i.dataset.accumlibSeen).length;
  if (mark) imgs.forEach(i => { i.dataset.accumlibSeen = '1'; });
  return {signature: (h >>> 0) + ':' + imgs.length + ':' + texts.join('').length, imgs: full ? imgs.map(i => i.src) : imgs.length,
          fresh, texts, outputs, stderr, busy: [...area.querySelectorAll('button')].filter(b => b.disabled).length};
}
"""


def find_controls(page) -> list[dict]:
    """Every ipywidgets control in the open notebook's outputs, in page order, each tagged in the DOM
    (``[data-accumlib-control=id]``) so ``change_control`` can find it: kind, code-cell index,
    label, shown value, options (where there are), disabled."""
    return page.evaluate(_CONTROLS_JS)


def cell_view(page, code_cell: int, full: bool = False, mark: bool = False) -> dict:
    """What code cell ``code_cell`` shows besides its controls' values (see ``_CELL_VIEW_JS``);
    ``full`` returns the figures' sources instead of their count; ``mark`` marks every figure
    shown, so ``fresh`` of a later view counts the figures drawn (as new elements) since."""
    return page.evaluate(_CELL_VIEW_JS, [code_cell, full, mark])


def control_value(page, control: dict) -> str:
    return next((c["value"] for c in find_controls(page) if c["id"] == control["id"]), "(gone)")


def change_control(page, control: dict) -> str:
    """Change a control once, as a person would: a slider one key step (right, or left at its
    maximum), the next option of a dropdown, select, radio group or toggle group, a click on a
    checkbox, toggle or button, one step up in a number box (Enter, then focus leaves). Returns
    what was done."""
    el = page.locator(f'{NOTEBOOK} [data-accumlib-control="{control["id"]}"]').first
    el.scroll_into_view_if_needed()
    kind = control["kind"]
    if kind == "slider":
        low, now, high = control["options"]
        key = "ArrowLeft" if now is not None and now == high else "ArrowRight"
        el.locator(".noUi-handle").first.focus()
        page.keyboard.press(key)
        return key
    if kind in ("dropdown", "select"):
        options = control["options"]
        nxt = (options.index(control["value"]) + 1) % len(options) if control["value"] in options else 0
        el.locator("select").select_option(index=nxt)
        return f"select {options[nxt]!r}"
    if kind in ("toggle-buttons", "radio"):
        options = control["options"]
        nxt = (options.index(control["value"]) + 1) % len(options) if control["value"] in options else 0
        target = el.locator("button" if kind == "toggle-buttons" else "input[type=radio]").nth(nxt)
        target.click()
        return f"choose {options[nxt]!r}"
    if kind == "checkbox":
        el.locator("input[type=checkbox]").click()
        return "click"
    if kind == "number":
        box = el.locator("input")
        box.focus()
        page.keyboard.press("ArrowUp")
        page.keyboard.press("Enter")
        box.evaluate("e => e.blur()")
        return "ArrowUp, Enter"
    el.click()  # button, toggle-button
    return "click"
