"""Helpers of the real-browser tests (``tests/test_browser.py``): JupyterLab started as
``make jupyter`` starts it, serving a git copy of the repository, on localhost; Debian's
Chromium driven by Playwright; notebooks written with nbformat.

The recipe (flags, selectors, teardown; ``docs/widgets.md``): the Makefile's own
``make jupyter`` command (read with ``make -n``) plus test-only options (a free port, no
token, isolated settings / workspaces / runtime folders); Chromium from
``/usr/bin/chromium`` (Playwright's own download does not work here) with background
networking off; teardown that kills the server's kernels by PID.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

import nbformat
import psutil

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage"]
NO_CHROMIUM = (f"{CHROMIUM} not found: the browser tests need Debian's Chromium. Run `make test` "
               "(it installs it through .ci/ensure-chromium) or `apt-get install -y chromium` (as root).")
KERNEL_IDLE = "(ipykernel) | Idle"

# Settings a fresh user-settings folder starts with: every cell kept in the DOM so that
# off-screen widgets can be found, kernels left running when a tab closes, no extension
# manager. The news pop-up and the update check are off by make jupyter's own config
# (.jupyter/jupyter_server_config.py), which the tests check.
LAB_SETTINGS = {
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings":
        {"windowingMode": "none", "kernelShutdown": False},
    "@jupyterlab/extensionmanager-extension/plugin.jupyterlab-settings": {"enabled": False},
}
SERVED = ("notebooks", ".jupyter", "Makefile", ".gitignore", "*.md")
"""What the repository copy holds (``git ls-files`` patterns): what ``make jupyter`` serves
and the notebooks link to."""
WORK = "runs/browser"
"""Where the tests write their notebooks in the copy (``runs/`` is ignored by git)."""


# ----------------------------------------------------------------------------- server


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def repo_copy(dst: Path) -> Path:
    """A git repository at ``dst`` holding this repository's :data:`SERVED` files, committed,
    so that a save can be checked with ``git status``."""
    files = subprocess.run(["git", "ls-files", "-z", "--", *SERVED], cwd=ROOT, check=True,
                           capture_output=True, text=True).stdout.split("\0")
    for name in filter(None, files):
        target = dst / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, target)
    git = ["git", "-c", "user.name=labkit tests", "-c", "user.email=tests@labkit.invalid"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "copy"]):
        subprocess.run(git + args, cwd=dst, check=True)
    return dst


def make_jupyter_command(repo: Path, args: Sequence[str]) -> list[str]:
    """The command ``make jupyter`` runs in ``repo`` (its Makefile, printed by ``make -n``),
    with this interpreter's virtualenv and ``args`` as ``JUPYTER_ARGS``; nothing is
    installed (``-o`` the install stamp)."""
    venv = Path(sys.prefix)
    out = subprocess.run(["make", "-s", "-n", "-o", str(venv / ".installed"), f"VENV={venv}",
                          f"JUPYTER_ARGS={shlex.join(args)}", "jupyter"], cwd=repo, check=True,
                         capture_output=True, text=True).stdout.strip().splitlines()
    assert len(out) == 1, f"make jupyter runs more than one command: {out}"
    return shlex.split(out[0])


class LabServer:
    """JupyterLab started as ``make jupyter`` starts it in ``root`` (a repository copy,
    :func:`repo_copy`), on a free localhost port, with no token; the tests' notebooks go to
    ``work`` (:data:`WORK`). ``start()`` waits for ``/api/status``; ``stop()`` ends the server
    and every process it started (kernels included), by PID.
    """

    def __init__(self, root: Path, state: Path):
        self.root, self.state = Path(root), Path(state)
        self.work = self.root / WORK
        self.work.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = self.state / "jupyter.log"
        self.proc: subprocess.Popen | None = None
        self._known: dict[int, psutil.Process] = {}

    def path_of(self, name: str | Path) -> str:
        """The server's path of a notebook: ``name`` in :attr:`work`, or a path under
        ``root`` when it is one."""
        p = Path(name)
        p = p if p.is_absolute() else self.work / p
        return p.relative_to(self.root).as_posix()

    def start(self, timeout: float = 90.0) -> LabServer:
        settings = self.state / "settings"
        for name, values in LAB_SETTINGS.items():
            path = settings / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(values))
        for sub in ("workspaces", "runtime", "config", "ipython"):
            (self.state / sub).mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(self.state / "runtime"),
               "JUPYTER_CONFIG_DIR": str(self.state / "config"),
               "IPYTHONDIR": str(self.state / "ipython"),
               "JUPYTER_PLATFORM_DIRS": "1", "PYTHONUNBUFFERED": "1",
               "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        cmd = make_jupyter_command(self.root, [
            "--no-browser", f"--port={self.port}", "--ServerApp.ip=127.0.0.1",
            "--IdentityProvider.token=", "--ServerApp.password=", "--ServerApp.port_retries=0",
            "--ServerApp.disable_check_xsrf=True", f"--LabApp.user_settings_dir={settings}",
            f"--LabApp.workspaces_dir={self.state / 'workspaces'}"])
        self.log = self.log_path.open("w")
        self.proc = subprocess.Popen(cmd, cwd=self.root, env=env, stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyter lab exited with {self.proc.returncode}:\n"
                                   + self.log_text())
            try:
                with urllib.request.urlopen(f"{self.url}/api/status", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"jupyter lab did not answer within {timeout:.0f} s:\n"
                           + self.log_text())

    def log_text(self, tail: int = 6000) -> str:
        return self.log_path.read_text(errors="replace")[-tail:] if self.log_path.exists() else ""

    def remember_children(self) -> None:
        """Note the server's descendants now (kernels), so ``stop`` can end them by PID even
        once they are orphaned."""
        if self.proc is None:
            return
        try:
            for p in psutil.Process(self.proc.pid).children(recursive=True):
                self._known[p.pid] = p
        except psutil.NoSuchProcess:
            pass

    def stop(self) -> None:
        if self.proc is None:
            return
        self.remember_children()
        procs = list(self._known.values())
        try:
            procs.append(psutil.Process(self.proc.pid))
        except psutil.NoSuchProcess:
            pass
        for p in procs:
            try:
                p.send_signal(signal.SIGTERM)
            except psutil.NoSuchProcess:
                pass
        _, alive = psutil.wait_procs(procs, timeout=8)
        for p in alive:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(alive, timeout=5)
        self.proc = None
        self.log.close()


# ----------------------------------------------------------------------------- notebooks


def write_notebook(path: Path, cells: Sequence[str | tuple[str, str]]) -> Path:
    """A notebook of code cells (``("markdown", text)`` for markdown) with the standard
    ``python3`` kernel."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)",
                                 "language": "python"}
    for cell in cells:
        if isinstance(cell, tuple) and cell[0] == "markdown":
            nb.cells.append(nbformat.v4.new_markdown_cell(cell[1]))
        else:
            nb.cells.append(nbformat.v4.new_code_cell(cell))
    nbformat.write(nb, path)
    return path


def smoke_copy(src: Path, dst: Path, until: str | None = None, then: str | None = None) -> Path:
    """A copy of notebook ``src`` at ``dst`` whose ``parameters`` cell sets ``smoke = True``
    (the papermill parameters cell: its ``smoke = False`` line is rewritten); with ``until``,
    only the cells up to the first code cell containing that text are kept; ``then``: a code
    cell inserted after the ``if smoke:`` cell (to change what the smoke budget set)."""
    nb = nbformat.read(src, as_version=4)
    if until is not None:
        ends = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and until in c.source]
        if not ends:
            raise ValueError(f"{src}: no code cell contains {until!r}")
        nb.cells = nb.cells[:ends[0] + 1]
    cells = [c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    if not cells:
        raise ValueError(f"{src} has no cell tagged 'parameters'")
    source, n = re.subn(r"(?m)^smoke\s*=\s*False\b", "smoke = True", cells[0].source)
    if n != 1:
        raise ValueError(f"{src}: the parameters cell has no `smoke = False` line")
    cells[0].source = source
    if then is not None:
        smoke = next(i for i, c in enumerate(nb.cells)
                     if c.cell_type == "code" and c.source.startswith("if smoke:"))
        nb.cells.insert(smoke + 1, nbformat.v4.new_code_cell(then))
    for c in nb.cells:
        if c.cell_type == "code":
            c.outputs, c.execution_count = [], None
    nbformat.write(nb, dst)
    return dst


def real_notebook(name: str, uses: str) -> Path | None:
    """``notebooks/<name>.ipynb`` when it exists and its code mentions ``uses`` (a widget
    class), else None."""
    path = ROOT / "notebooks" / f"{name}.ipynb"
    if not path.exists():
        return None
    nb = nbformat.read(path, as_version=4)
    return path if any(uses in c.source for c in nb.cells if c.cell_type == "code") else None


# ----------------------------------------------------------------------------- page


class NotebookPage:
    """A Playwright page on one notebook of a :class:`LabServer`; records uncaught page
    errors (``errors``) so a test can fail on them."""

    def __init__(self, page, server: LabServer, shots: Sequence[Path]):
        self.page, self.server, self.shots = page, server, list(shots)
        self.errors: list[str] = []
        page.on("pageerror", lambda e: self.errors.append(str(e)))

    def open(self, name: str | Path, timeout: float = 120_000) -> None:
        """Open a notebook of the server's work folder (or a path under its root) and wait
        for its kernel."""
        # ?reset: start from an empty workspace, not the tabs an earlier test left open
        self.page.goto(f"{self.server.url}/lab/tree/{self.server.path_of(name)}?reset")
        self.page.locator(".jp-Notebook").first.wait_for(timeout=timeout)
        self.wait_idle(timeout)
        self.server.remember_children()

    def wait_idle(self, timeout: float = 120_000) -> None:
        self.page.wait_for_function(
            """(idle) => [...document.querySelectorAll('.jp-StatusBar-Widget')]
                   .some(e => e.textContent.includes(idle))""", arg=KERNEL_IDLE, timeout=timeout)

    def run_all(self, timeout: float = 240_000) -> None:
        """Run > Run All Cells, then wait until every code cell has an execution count and
        none is queued or running; raises with the first traceback if a cell failed."""
        self.page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
        self.page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()
        try:
            self._wait_all_ran(timeout)
        except Exception as e:  # a timeout: say which cells had not run
            prompts = self.page.evaluate(
                """() => [...document.querySelectorAll(
                    '.jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell .jp-InputArea-prompt')]
                    .map(p => p.textContent)""")
            for folder in self.shots:
                folder.mkdir(parents=True, exist_ok=True)
                self.page.screenshot(path=str(folder / "run_all_timeout.png"))
            raise AssertionError(f"Run All did not finish in {timeout / 1000:.0f} s; cell "
                                 f"prompts: {prompts}") from e
        self.server.remember_children()
        failed = self.page.evaluate(
            """() => [...document.querySelectorAll('.jp-OutputArea-output')]
                .map(o => o.textContent)
                .filter(t => t.includes('Traceback (most recent call last)') ||
                             t.includes('Error displaying widget'))""")
        if failed:
            raise AssertionError("a notebook cell failed:\n" + failed[0][-4000:])

    def _wait_all_ran(self, timeout: float) -> None:
        self.page.wait_for_function(
            """() => {
                const panel = document.querySelector(
                    '.jp-NotebookPanel:not(.lm-mod-hidden)') || document;
                const cells = [...panel.querySelectorAll('.jp-CodeCell')];
                const prompts = cells.map(c => c.querySelector('.jp-InputArea-prompt'));
                const failed = [...document.querySelectorAll('.jp-OutputArea-output')]
                    .some(o => o.textContent.includes('Traceback (most recent call last)'));
                return failed || (cells.length > 0 && prompts.every(
                    p => p && /\\[\\d+\\]/.test(p.textContent)));
            }""", timeout=timeout)

    def screenshot(self, selector: str, name: str) -> list[Path]:
        """Screenshot of the first element matching ``selector`` into every folder of
        ``shots`` as ``name`` (a PNG)."""
        loc = self.page.locator(selector).first
        loc.scroll_into_view_if_needed()
        paths = []
        for folder in self.shots:
            folder.mkdir(parents=True, exist_ok=True)
            loc.screenshot(path=str(folder / name))
            paths.append(folder / name)
        return paths


def shot_folders(tmp_path: Path) -> list[Path]:
    """Where screenshots go: the test's output folder, and ``$LABKIT_SCREENSHOTS`` when set."""
    folders = [tmp_path / "screenshots"]
    if os.environ.get("LABKIT_SCREENSHOTS"):
        folders.append(Path(os.environ["LABKIT_SCREENSHOTS"]))
    return folders




# ----------------------------------------------------------------------------- README picture


def report_picture(report: Path, png: Path, width: int = 1280, height: int = 1500) -> Path:
    """The top ``width`` x ``height`` of a lab's ``report.html``, opened from disk in
    Chromium, as a PNG (the README's ``docs/screenshots/report_front.png``)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True,
                                      args=CHROMIUM_ARGS)
        page = chromium.new_context(viewport={"width": width, "height": height}).new_page()
        page.goto(Path(report).resolve().as_uri())
        page.wait_for_function("() => document.querySelectorAll('.js-plotly-plot .main-svg')"
                               ".length > 0")
        png.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(png))
        chromium.close()
    return png


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python tests/browser_support.py RUN/report.html PICTURE.png")
    print(report_picture(Path(sys.argv[1]), Path(sys.argv[2])))
