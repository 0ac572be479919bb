"""``make test`` sets up what the suite needs: ``.ci/ensure-chromium`` installs Debian's
Chromium when it is missing, or stops with one line saying what to run.

Chromium is installed where these tests run, so each branch is driven with a ``PATH`` that
holds only stubs (``id``, ``sudo``, ``apt-get``, ``apt-cache``, ``env``) that log their
arguments, and ``LABKIT_CHROMIUM`` pointing at a file the stub ``apt-get install`` creates.
Nothing is installed for real.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / ".ci" / "ensure-chromium"
BASH = shutil.which("bash")
CHMOD = shutil.which("chmod")
INSTALL = "apt-get install -y -q --no-install-recommends chromium chromium-driver fonts-liberation"


class Machine:
    """A fake machine: a stub directory as the whole ``PATH``, and a log of what ran."""

    def __init__(self, tmp_path: Path, uid: int = 0, sudo: str | None = None,
                 lists_know_chromium: bool = True, apt: bool = True):
        self.bin = tmp_path / "bin"
        self.bin.mkdir()
        self.log = tmp_path / "log"
        self.log.touch()
        self.chromium = tmp_path / "usr-bin-chromium"
        self.stub("id", f'[ "$1" = -u ] && echo {uid}')
        self.stub("env", 'while [[ "$1" == *=* ]]; do export "$1"; shift; done; exec "$@"')
        if apt:
            make = (f'[ "$1" = install ] && printf "#!/bin/sh\\n" > {self.chromium} '
                    f"&& {CHMOD} +x {self.chromium}")
            self.stub("apt-get", f"{make}; exit 0")
            self.stub("apt-cache", "exit 0" if lists_know_chromium else "exit 100")
        if sudo == "passwordless":
            self.stub("sudo", '[ "$1" = -n ] && shift; [ "$1" = true ] && exit 0; exec "$@"')
        elif sudo == "needs a password":
            self.stub("sudo", "echo 'sudo: a password is required' >&2; exit 1")

    def stub(self, name: str, body: str) -> None:
        path = self.bin / name
        path.write_text(f'#!{BASH}\necho "{name} $*" >> {self.log}\n{body}\n')
        path.chmod(0o755)

    def run(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([BASH, str(SCRIPT), *args], capture_output=True, text=True,
                              timeout=60, check=False,
                              env={"PATH": str(self.bin), "LABKIT_CHROMIUM": str(self.chromium)})

    def ran(self) -> list[str]:
        return self.log.read_text().splitlines()


def test_nothing_happens_when_chromium_is_there(tmp_path):
    m = Machine(tmp_path)
    m.chromium.write_text("#!/bin/sh\n")
    m.chromium.chmod(0o755)
    p = m.run()
    assert p.returncode == 0 and p.stdout == p.stderr == "" and m.ran() == []


def test_as_root_on_a_fresh_machine_it_updates_then_installs(tmp_path):
    m = Machine(tmp_path, lists_know_chromium=False)
    p = m.run()
    assert p.returncode == 0, p.stderr
    assert m.ran() == ["id -u", "apt-cache show chromium",
                       "env DEBIAN_FRONTEND=noninteractive apt-get update -q",
                       "apt-get update -q",
                       f"env DEBIAN_FRONTEND=noninteractive {INSTALL}", INSTALL]
    assert m.chromium.exists()


def test_as_root_with_package_lists_it_only_installs(tmp_path):
    m = Machine(tmp_path)
    assert m.run().returncode == 0
    assert [line for line in m.ran() if line.startswith("apt-get")] == [INSTALL]


def test_without_root_it_goes_through_passwordless_sudo(tmp_path):
    m = Machine(tmp_path, uid=1000, sudo="passwordless")
    p = m.run()
    assert p.returncode == 0, p.stderr
    assert f"sudo -n env DEBIAN_FRONTEND=noninteractive {INSTALL}" in m.ran()
    assert m.chromium.exists()


@pytest.mark.parametrize("sudo", [None, "needs a password"])
def test_without_root_or_usable_sudo_it_says_what_to_run(tmp_path, sudo):
    m = Machine(tmp_path, uid=1000, sudo=sudo)
    p = m.run()
    assert p.returncode == 1 and p.stdout == ""
    (line,) = p.stderr.splitlines()
    assert line == (f"ensure-chromium: {m.chromium} is missing (the browser tests need it); "
                    "run as root: apt-get update && apt-get install -y chromium chromium-driver "
                    "fonts-liberation "
                    "(or make test as root)")
    assert not any(entry.startswith("apt-get") for entry in m.ran())


def test_without_apt_get_it_says_so(tmp_path):
    m = Machine(tmp_path, apt=False)
    p = m.run()
    assert p.returncode == 1
    (line,) = p.stderr.splitlines()
    assert "not a Debian/Ubuntu system (no apt-get)" in line


def test_a_failing_install_is_one_line(tmp_path):
    m = Machine(tmp_path)
    m.stub("apt-get", "exit 100")
    p = m.run()
    assert p.returncode == 1
    (line,) = p.stderr.splitlines()
    assert "apt-get install failed; run it yourself: apt-get install -y chromium" in line


def test_dry_run_prints_the_commands_and_runs_nothing(tmp_path):
    m = Machine(tmp_path, uid=1000, sudo="passwordless", lists_know_chromium=False)
    p = m.run("--dry-run")
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == [
        "would run: sudo -n env DEBIAN_FRONTEND=noninteractive apt-get update -q",
        f"would run: sudo -n env DEBIAN_FRONTEND=noninteractive {INSTALL}"]
    assert not any(entry.startswith(("apt-get", "env")) for entry in m.ran())
    assert not m.chromium.exists()
    bad = m.run("--force")
    assert bad.returncode == 2 and "unknown argument '--force'" in bad.stderr


def test_the_real_script_on_this_machine_and_the_readme_command():
    """Here Chromium is installed: nothing to do. ``make test`` runs the script before the
    suite, and ``.ci/run`` is the README's command and nothing more."""
    p = subprocess.run([str(SCRIPT), "--dry-run"], capture_output=True, text=True, timeout=60,
                       check=False)
    assert p.returncode == 0 and p.stdout == "" and p.stderr == ""
    make = subprocess.run(["make", "-n", "test"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, check=False)
    steps = make.stdout.splitlines()
    assert steps.index(".ci/ensure-chromium") < next(
        i for i, s in enumerate(steps) if "-m pytest" in s), make.stdout
    commands = [line for line in (ROOT / ".ci" / "run").read_text().splitlines()
                if line and not line.startswith("#")]
    assert commands[-1] == "make test" and not any("apt-get" in c for c in commands)


GROUPED = '''
import os
from pathlib import Path

import pytest

OUT = Path(os.environ["GROUP_TEST_OUT"])


@pytest.fixture(scope="module")
def shared():
    return "built once"


@pytest.mark.parametrize("i", range(6))
def test_grouped(i, shared):
    (OUT / f"grouped-{i}").write_text(os.environ["PYTEST_XDIST_WORKER"])


@pytest.mark.parametrize("i", range(6))
def test_free(i):
    (OUT / f"free-{i}").write_text(os.environ["PYTEST_XDIST_WORKER"])
'''


def test_make_tests_groups_keep_their_tests_on_one_worker(tmp_path):
    """`make test` builds each shared fixture once because pytest-xdist's ``--dist loadgroup``
    keeps a group on one worker (tests/conftest.py files the tests that share a session or a
    module fixture into groups). A pytest that drops the groups silently (9.2 with
    pytest-xdist 3.8 did) fails here: the six tests of a module fixture spread over both."""
    shutil.copy(ROOT / "tests" / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_groups.py").write_text(GROUPED)
    out = tmp_path / "out"
    out.mkdir()
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadgroup",
                        "-p", "no:cacheprovider", "--rootdir", str(tmp_path), str(tmp_path)],
                       capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path,
                       env={**os.environ, "GROUP_TEST_OUT": str(out)})
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    workers = {f.name: f.read_text() for f in out.iterdir()}
    assert len(workers) == 12
    assert len({w for name, w in workers.items() if name.startswith("grouped")}) == 1, workers
    assert {w for name, w in workers.items() if name.startswith("free")} <= {"gw0", "gw1"}
