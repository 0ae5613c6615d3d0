"""Python side of ``hosts.sh`` (hosts of a Ray cluster as network namespaces on one machine):
the command line that runs a command inside them, what a command running inside learns from
its environment, losing a host (every process in its namespace killed), and what a run left
behind (nothing, when the script's trap did its job)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).with_name("hosts.sh")
#: namespaces, links and state folders of a run are named from this prefix
PREFIX = "wsc-"
#: every Ray process of a run carries its state folder (``--temp-dir``) on its command line
STATE_MARK = "/tmp/wsc."


def unavailable() -> str | None:
    """Why namespaces cannot be made here (not root, no ``ip``, refused), None if they can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2)"
    probe = f"{PREFIX}probe{os.getpid() % 1000}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"`ip netns add` refused: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def hosts_argv(command: list[str], *, hosts: int = 2, delay_ms: float = 0.0,
               loss_pct: float = 0.0, late_s: float = 0.0, cpus: int = 4,
               prefix: str = PREFIX, ray: bool = True) -> list[str]:
    """The command line running ``command`` in the first of ``hosts`` namespaces (see
    ``hosts.sh``: a Ray head there and workers in the others unless ``ray`` is False)."""
    argv = [str(SCRIPT), "--hosts", str(hosts), "--delay", f"{delay_ms:g}", "--loss",
            f"{loss_pct:g}", "--cpus", str(cpus), "--name", prefix]
    if late_s:
        argv += ["--late", f"{late_s:g}"]
    if not ray:
        argv.append("--no-ray")
    return [*argv, "--", *command]


def script_env() -> dict[str, str]:
    """This environment with this Python's folder first on PATH (its ``ray`` CLI and
    ``python`` are what the hosts run)."""
    folder = str(Path(sys.executable).parent)
    return {**os.environ, "PATH": f"{folder}:{os.environ.get('PATH', '')}",
            "RAY_BIN": str(Path(folder) / "ray"), "PYTHON": sys.executable}


def cluster_env() -> dict | None:
    """Inside ``hosts.sh``: ``{"address": the Ray head's HOST:PORT, "hosts": {"h0":
    "198.18.0.1", ...}, "prefix": the namespaces' prefix}``; None outside."""
    address = os.environ.get("WS_RAY_ADDRESS")
    if not address:
        return None
    hosts = dict(item.split("=", 1) for item in os.environ.get("WS_HOSTS", "").split())
    return {"address": address, "hosts": hosts,
            "prefix": os.environ.get("WS_NETNS_PREFIX", PREFIX)}


def namespace_pids(namespace: str) -> list[int]:
    """The processes in ``namespace`` (``ip netns pids``; [] when it does not exist)."""
    found = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True)
    return [int(p) for p in found.stdout.split()] if found.returncode == 0 else []


def kill_host(host: str, prefix: str = PREFIX) -> list[int]:
    """Lose a host: SIGKILL every process in its namespace (``h1`` -> ``wsc-h1``), as a power
    cut would, its link left up (the kernel answers for the dead sockets). Returns the
    killed pids."""
    pids = namespace_pids(prefix + host)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:  # exited meanwhile
            pass
    return pids


def leftovers(prefix: str = PREFIX) -> dict[str, list[str]]:
    """What runs with ``prefix`` left: namespaces, state folders, links (in this namespace),
    processes of a run (Ray with a state folder, the delay line). Empty lists after a clean
    tear-down."""
    spaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    procs = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:  # exited meanwhile
            continue
        if STATE_MARK in cmdline or ("delayline.py" in cmdline and prefix in cmdline):
            procs.append(f"{entry.name} {cmdline[:120]}")
    return {"namespaces": [line.split()[0] for line in spaces.splitlines()
                           if line.startswith(prefix)],
            "state_folders": [str(p) for p in Path("/tmp").glob(f"wsc.{prefix}*")],
            "links": [line.split(":")[1].strip() for line in links.splitlines()
                      if f" {prefix}" in line],
            "processes": procs}
