"""Virtual environments for the peer systems, each with pinned versions.

django_dispatch and the raw baseline run in the project's own interpreter (the
one running ``run.py``), so the working tree is what gets measured. Each peer
gets ``benchmarks/.venv-<system>``, created on first use and reused while its
pinned requirements are unchanged. ``dispatch_python(ref)`` instead installs
one commit of django_dispatch into ``benchmarks/.venv-dispatch-<sha>``, to
measure a fixed version while the working tree changes.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent

#: Pinned peer versions. Django-based peers get the project's Django version,
#: so that both Django backends run on the same framework.
PEERS: dict[str, list[str]] = {
    "django-tasks-db": ["django-tasks-db==0.13.0", "Django=={django}", "psycopg[binary]>=3.2"],
    "procrastinate": ["procrastinate==3.10.0", "psycopg[binary,pool]>=3.2"],
    # asyncpg: the driver PgQueuer documents and ``pgq run`` tries first (the
    # async check runs it so; see drivers/pgqueuer.py). Django: its ORM job rows,
    # the realistic job as a Django site on PgQueuer writes it.
    "pgqueuer": ["pgqueuer==1.6.0", "psycopg[binary]>=3.2", "asyncpg==0.30.0", "Django=={django}"],
    # Chancy needs PostgreSQL 14+ (the harness's server is 15).
    "chancy": ["chancy==0.26.0", "psycopg[binary,pool]>=3.2"],
}


def _django_version() -> str:
    import django

    return django.get_version()


def _venv(name: str, requirements: list[str], label: str = "") -> str:
    """``benchmarks/.venv-<name>`` with ``requirements`` installed.

    Reused while its stamp (``label``, or the requirements) is unchanged.
    """
    venv = BENCH_DIR / f".venv-{name}"
    python = venv / "bin" / "python"
    stamp = venv / ".requirements"
    wanted = label or "\n".join(requirements)
    if python.exists() and stamp.exists() and stamp.read_text() == wanted:
        return str(python)
    print(f"[venv] creating {venv.name}: {label or ', '.join(requirements)}", file=sys.stderr)
    # A venv made from a venv's interpreter is based on the same base Python.
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    done = subprocess.run([*pip, *requirements], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"pip install failed for {venv.name}:\n{done.stderr[-3000:]}")
    stamp.write_text(wanted)
    return str(python)


def python_for(system: str) -> str:
    """The interpreter that runs ``system``'s driver, creating its venv if needed."""
    if system not in PEERS:
        return sys.executable
    return _venv(system, [r.format(django=_django_version()) for r in PEERS[system]])


def dispatch_python(ref: str) -> tuple[str, str]:
    """An interpreter with commit ``ref`` of django_dispatch installed, and its short sha."""
    git = ["git", "-C", str(REPO_DIR)]
    sha = subprocess.run(
        [*git, "rev-parse", "--short", f"{ref}^{{commit}}"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="dispatch-src-") as src:
        archive = subprocess.run([*git, "archive", sha], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", src], input=archive, check=True)
        # The driver talks to PostgreSQL: the extra that brings psycopg (an older
        # commit without that extra gets a warning from pip, and psycopg here).
        requirements = [f"{src}[postgres]", "psycopg[binary]>=3.2"]
        label = f"django_dispatch {sha} [postgres]"
        return _venv(f"dispatch-{sha}", requirements, label=label), sha


def installed_version(python: str, distribution: str) -> str:
    """The version of ``distribution`` installed for ``python``."""
    code = f"import importlib.metadata as m; print(m.version({distribution!r}))"
    return subprocess.run(
        [python, "-c", code], check=True, capture_output=True, text=True
    ).stdout.strip()


if __name__ == "__main__":  # create them all: python benchmarks/venvs.py
    for name in PEERS:
        print(name, python_for(name))
