"""``python -m bench scale --hosts 2 --replicas 1,2,4 --model emulated [--host-loss]``:
scale-out across hosts, each host a network namespace of this machine (``hosts.sh``: a Ray
head in the first, workers in the others, ``--delay`` ms one way between any two), run as
root. The replicas are **emulated** accelerators (``engine/backends/emulated.py``: the
simulator's frames, a published model's chunk time spent waiting), so what is measured is the
serving system, not a model.

Outside the hosts this re-runs itself inside them (and everything is torn down after); inside,
it measures (``bench/cluster/runs.py``):

1. throughput: for each replica count, ``--per-replica`` sessions per replica at ``--fps``,
   128x128; aggregate and per-session frames/s, action-to-frame p95, front-end CPU;
2. the front end's CPU per watched session at 832x480 (2 WebRTC sessions), media sent by the
   front end (before) and by the replicas' hosts (after);
3. with ``--host-loss``: 8 WebRTC sessions on 4 replicas across the hosts, one recording,
   every process of the second host SIGKILLed mid-stream;
4. with ``--ramp``: sessions 2 -> 16 -> 2, replicas autoscaled in [1, the largest count]
   (``bench/cluster/ramp.py``); where namespaces are not permitted, on one host (a local
   Ray), said so in ``ramp_hosts``, and nothing else is measured.

Writes one JSON object (``--json F``) with ``ratio_4_vs_1`` (largest count vs smallest),
``min_session_fps``, ``a2f_p95_vs_1``, ``frontend_core_per_session`` (after; ``_before``
too), ``host_loss_max_gap_s``, ``host_loss_sessions_lost``, the ``ramp_*`` figures and the
rows; a report under ``bench/results/scale_hosts/`` ends with the capacity model
(``bench/cluster/capacity.py``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from worldstream.bench.cluster import hosts


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench scale --hosts", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hosts", type=int, required=True, help="namespaces (hosts), >= 2")
    p.add_argument("--replicas", default="1,2,4", help="replica counts, e.g. 1,2,4")
    p.add_argument("--model", default="emulated", choices=("emulated",),
                   help="emulated: a SIMULATION of a GPU model (the only one that scales on "
                        "this machine's CPUs)")
    p.add_argument("--per-replica", type=int, default=4, help="sessions per replica")
    p.add_argument("--fps", type=int, default=16)
    p.add_argument("--seconds", type=float, default=10.0, help="measured per replica count")
    p.add_argument("--delay", type=float, default=20.0, help="one-way ms between hosts")
    p.add_argument("--host-loss", action="store_true", help="also lose a host mid-stream")
    p.add_argument("--skip-frontend", action="store_true", help="skip the 832x480 CPU run")
    p.add_argument("--skip-throughput", action="store_true", help="skip the replica counts' "
                   "throughput runs (e.g. with --ramp alone)")
    p.add_argument("--ramp", action="store_true", help="also autoscale under a ramp of "
                   "2 -> 16 -> 2 sessions, replicas in [1, the largest --replicas count]")
    p.add_argument("--update-readme", action="store_true",
                   help="rewrite README.md's measured scale-out table from this run")
    p.add_argument("--json", default=None, help="also write the JSON here")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = _parser().parse_args(argv)
    counts = [int(c) for c in args.replicas.split(",")]
    if args.hosts < 2 or min(counts) < 1 or args.per_replica < 1:
        raise SystemExit("need --hosts >= 2, replica counts >= 1, --per-replica >= 1")
    if hosts.cluster_env() is None:
        reason = hosts.unavailable()
        if reason is not None and args.ramp:  # the ramp needs no second host: run it here
            print(f"[scale --hosts] namespaces unavailable ({reason}): the ramp only, on one "
                  "host (a local Ray)", file=sys.stderr)
            args.skip_throughput, args.skip_frontend, args.host_loss = True, True, False
            return _measure(args, counts, argv, address=None, one_host=reason)
        return _run_inside_hosts(args, argv)
    return _measure(args, counts, argv, address=hosts.cluster_env()["address"])


def _run_inside_hosts(args: argparse.Namespace, argv: list[str]) -> int:
    """Re-run this command in the first of ``--hosts`` namespaces; all of them torn down
    after (the script's trap), whatever happens."""
    reason = hosts.unavailable()
    if reason is not None:
        raise SystemExit(f"--hosts runs hosts as network namespaces: {reason}")
    # the inner run starts where this one stands (`ip netns exec` keeps the folder): --json
    # and the stamped command stay as typed
    inner = [sys.executable, "-m", "worldstream.bench", "scale", *argv]
    return subprocess.run(hosts.hosts_argv(inner, hosts=args.hosts, delay_ms=args.delay),
                          env=hosts.script_env(), cwd=os.getcwd()).returncode


def _measure(args: argparse.Namespace, counts: list[int], argv: list[str],
             address: str | None, one_host: str | None = None) -> int:
    from worldstream.bench import results
    from worldstream.bench.cluster import capacity, ramp, runs
    from worldstream.bench.common import hardware_info

    load_before = os.getloadavg()
    rows = []
    for n in [] if args.skip_throughput else counts:
        rows.append(runs.throughput(address, n, per_replica=args.per_replica, fps=args.fps,
                                    seconds=args.seconds))
        print(f"[scale --hosts] {n} replica(s): {rows[-1]['aggregate_fps']:.1f} fps, min "
              f"{rows[-1]['min_session_fps']:.1f}, hosts {rows[-1]['replicas_per_host']}",
              file=sys.stderr)
    frontend = None
    if not args.skip_frontend:
        frontend = {media: runs.frontend_cpu(address, media, fps=args.fps)
                    for media in ("front", "replica")}
        print(f"[scale --hosts] front end: {frontend}", file=sys.stderr)
    loss = runs.host_loss(address, fps=args.fps) if args.host_loss else None
    if loss is not None:
        print(f"[scale --hosts] host loss: {loss}", file=sys.stderr)
    ramped = ramp.ramp(address, max_replicas=max(counts)) if args.ramp else None
    if ramped is not None:
        ramped["ramp_hosts"] = (f"one host, a local Ray (namespaces unavailable: {one_host})"
                                if one_host else f"{args.hosts} namespace hosts")
        print("[scale --hosts] ramp: " + ", ".join(
            f"{k}={v}" for k, v in ramped.items() if k.startswith("ramp_") and not
            isinstance(v, list | dict)), file=sys.stderr)
    payload = results.stamp_payload("scale", {
        "hardware": {**hardware_info(), "load_avg_1m_before": round(load_before[0], 2),
                     "load_avg_1m_after": round(os.getloadavg()[0], 2)},
        "settings": {"hosts": args.hosts, "delay_ms": args.delay, "model": args.model,
                     "per_replica": args.per_replica, "fps": args.fps,
                     "seconds": args.seconds, "frame_size": "128x128"},
        **_throughput_figures(rows),
        "frontend_core_per_session": (frontend["replica"]["frontend_core_per_session"]
                                      if frontend else None),
        "frontend_core_per_session_before": (frontend["front"]["frontend_core_per_session"]
                                             if frontend else None),
        "host_loss_max_gap_s": loss["host_loss_max_gap_s"] if loss else None,
        "host_loss_sessions_lost": loss["host_loss_sessions_lost"] if loss else None,
        **(ramped or {}), "rows": rows, "frontend": frontend, "host_loss": loss}, argv)
    md = "# Scale-out: autoscaling\n\n" + results.context_md(payload) + "\n"
    if rows:
        payload["capacity"] = capacity.model(payload)
        md = capacity.report(payload)
    if ramped is not None:
        md += "\n" + ramp.markdown(ramped)
    folder = results.save("scale_hosts", payload, md, {})
    print(f"report: {folder / 'result.md'}", file=sys.stderr)
    if args.update_readme:
        capacity.update_readme(payload)
    results.print_json(payload, args.json)
    return 0


def _throughput_figures(rows: list[dict]) -> dict:
    """The headline figures of the replica counts' runs (none without them)."""
    if not rows:
        return {}
    first, last = rows[0], rows[-1]
    return {f"ratio_{last['replicas']}_vs_{first['replicas']}":
            round(last["aggregate_fps"] / max(first["aggregate_fps"], 1e-9), 3),
            "min_session_fps": min(r["min_session_fps"] for r in rows),
            "a2f_p95_vs_1": _ratio(last["a2f_p95_ms_median"], first["a2f_p95_ms_median"])}


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None
