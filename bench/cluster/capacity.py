"""The capacity model of a scale-out run (``python -m bench scale --hosts``), from its
measurements and the emulated backend's cost model: sessions per replica, replicas per host,
the front end's cost per session, the largest cluster one front end can place for, and what
grows past it. Also the run's Markdown report and the README's table."""

from __future__ import annotations

import re
from pathlib import Path

from worldstream.bench.results import context_md, fmt, table

README = Path(__file__).resolve().parents[2] / "README.md"
#: the README's generated block (``--update-readme``)
#: the committed runs the README's table is made of (``--json`` of the commands it names)
MEASURED = Path(__file__).resolve().parent / "measured.json"
MEASURED_RAMP = Path(__file__).resolve().parent / "measured_ramp.json"
START, END = "<!-- bench:scale-hosts:start -->", "<!-- bench:scale-hosts:end -->"
#: the cores one front end may spend on its sessions (the rest: HTTP, Ray, the OS)
FRONTEND_CORES = 1.0


def model(payload: dict) -> dict:
    """The sizing figures (JSON-ready) of one run's ``payload``."""
    from worldstream.engine.backends.emulated import EmulatedCost

    fps = payload["settings"]["fps"]
    cost = EmulatedCost()
    one = payload["rows"][0]
    measured = one["sessions"] / one["replicas"] if one["min_session_fps"] >= 0.95 * fps \
        else one["aggregate_fps"] / one["replicas"] / fps
    per_session = payload.get("frontend_core_per_session")
    per_core = int(FRONTEND_CORES / per_session) if per_session else None
    big = cost.sessions_per_replica(fps, 4, 832, 480)
    return {
        "sessions_per_replica_128_model": cost.sessions_per_replica(fps, 1, 128, 128),
        "sessions_per_replica_128_measured_at_least": round(measured, 2),
        "sessions_per_replica_832x480_model": big,
        "frontend_core_per_session": per_session,
        "sessions_per_frontend_core": per_core,
        "replicas_per_frontend_core_832x480": per_core // max(big, 1) if per_core else None,
        "replicas_per_frontend_core_128": (per_core // cost.sessions_per_replica(fps, 1, 128,
                                                                                 128)
                                           if per_core else None),
    }


def _capacity_md(c: dict, fps: int) -> str:
    per_core = c["sessions_per_frontend_core"]
    return "\n".join([
        "## Capacity model", "",
        f"- **Sessions per replica** = the largest n with t(n rows) <= chunk interval, "
        f"t(batch) = a + b·frames·area (emulated Self-Forcing on one H100: a = 20 ms, b = "
        f"57.2 ms per 832x480 frame). At 128x128, 1-frame chunks, {fps} fps: "
        f"{c['sessions_per_replica_128_model']} by the model; the 1-replica run held "
        f"{c['sessions_per_replica_128_measured_at_least']} at full rate. At 832x480 (4-frame "
        f"chunks): {c['sessions_per_replica_832x480_model']}: one GPU per session.",
        "- **Replicas per host**: one per GPU (the host process waits on its device); on a "
        "CPU host one per core at most.",
        f"- **Front end per session**: {fmt(c['frontend_core_per_session'], 4)} core with "
        f"media from the replicas' hosts (signalling, placement, notes, metrics): "
        f"{per_core or '-'} sessions per front-end core, i.e. "
        f"{c['replicas_per_frontend_core_832x480'] or '-'} GPU replicas at 832x480 "
        f"({c['replicas_per_frontend_core_128'] or '-'} at 128x128) placed by one core.",
        "- **Past one front end**: several front ends behind a session-affine load balancer. "
        "A new session (`POST /api/sessions`) goes to any front end (least loaded); every "
        "later request of the session carries its id in the path "
        "(`/api/sessions/{id}/...`), which the balancer hashes (consistent hashing on the "
        "id) to the front end that owns it; each front end owns its sessions' replicas "
        "(Ray fate-sharing: they end with it). Media never crosses a front end, so front "
        "ends grow with sessions, not with frames.",
    ]) + "\n"


def report(payload: dict) -> str:
    """The run's Markdown report."""
    rows = payload["rows"]
    fps = payload["settings"]["fps"]
    md = ["# Scale-out across hosts (network namespaces, emulated accelerators)", "",
          context_md(payload), "",
          table(["replicas", "replicas per host", "sessions", "aggregate fps",
                 "min fps/session", "a2f p95 ms (median)", "front end core/session"],
                [[r["replicas"], _hosts(r["replicas_per_host"]), r["sessions"],
                  r["aggregate_fps"], r["min_session_fps"], r["a2f_p95_ms_median"],
                  r["frontend_core_per_session"]] for r in rows], digits=3), ""]
    fe = payload.get("frontend")
    if fe:
        md += ["## Front end CPU per watched session (832x480, 2 WebRTC sessions)", "",
               table(["media sent by", "core per session", "viewer fps"],
                     [["the front end (before)", fe["front"]["frontend_core_per_session"],
                       ", ".join(map(str, fe["front"]["viewer_fps"]))],
                      ["the replicas' hosts (after)", fe["replica"]["frontend_core_per_session"],
                       ", ".join(map(str, fe["replica"]["viewer_fps"]))]], digits=4), ""]
    loss = payload.get("host_loss")
    if loss:
        md += ["## Host loss", "",
               f"{loss['sessions']} WebRTC sessions on {loss['replicas']} replicas "
               f"({loss['sessions_per_host_before']}); every process of host "
               f"{loss['lost_host']} ({loss['killed_processes']}) SIGKILLed: the "
               f"{loss['sessions_on_lost_host']} sessions there resumed after at most "
               f"{loss['host_loss_max_gap_s']} s (any session: {loss['max_gap_any_session_s']} "
               f"s), {loss['host_loss_sessions_lost']} lost, {loss['recovered_events']} "
               f"`recovered` events, {loss['reconnects']} new offers; after: "
               f"{loss['sessions_per_host_after']}. Recording: {loss['recording']}.", ""]
    return "\n".join(md) + "\n" + _capacity_md(payload["capacity"], fps)


def _hosts(per_host: dict) -> str:
    return " + ".join(str(n) for _, n in sorted(per_host.items()))


def readme_block(payload: dict, ramp: dict | None = None) -> str:
    """The README's measured table (a few lines): the throughput and host-loss run
    ``payload`` and, when given, the autoscaling ramp's run ``ramp``."""
    ratio_key = next(k for k in payload if k.startswith("ratio_"))
    loss = payload.get("host_loss") or {}
    rows = [[f"aggregate fps, {ratio_key.split('_')[1]} vs {ratio_key.split('_')[3]} "
             f"replicas", f"{payload[ratio_key]}x", ">= 3.5x"],
            ["min fps of any session", payload["min_session_fps"], ">= 15"],
            ["front end core per session, 832x480 at 16 fps: media from the replicas' hosts "
             "(from the front end)", f"{fmt(payload['frontend_core_per_session'], 4)} "
             f"({_before(payload)})", "<= 0.02"],
            ["host lost: largest gap, sessions lost",
             f"{loss.get('host_loss_max_gap_s', '-')} s, "
             f"{loss.get('host_loss_sessions_lost', '-')}", "<= 2 s, 0"]]
    runs = [payload]
    if ramp is not None:
        st = ramp["ramp_settings"]
        rows.append([f"autoscaling, sessions {st['low']} -> {st['high']} -> {st['low']}: "
                     "replicas (bounds), sessions dropped (moved off drained replicas)",
                     f"{st['min_replicas']} -> {ramp['ramp_max_replicas']} -> "
                     f"{ramp['ramp_replicas_final']} ([{st['min_replicas']}, "
                     f"{st['max_replicas']}]: {fmt(ramp['ramp_within_bounds'])}), "
                     f"{ramp['ramp_sessions_dropped']} ({ramp['ramp_moved']})",
                     "within bounds, 0"])
        if ramp["command"] != payload["command"]:
            runs.append(ramp)
    return (f"{START}\n" + table(["measure", "result", "goal"], rows, digits=3) + "\n"
            + "; ".join(_run_line(r) for r in runs) + "; generated by `--update-readme`.\n"
            + END)


def _run_line(payload: dict) -> str:
    hw = payload["hardware"]
    return (f"`{payload['command']}` on {hw.get('cpu_model', '?')} ({hw.get('cpu_cores', '?')}"
            f" cores, load {hw.get('load_avg_1m_before')}), {payload['date'][:10]}")


def _before(payload: dict) -> str:
    """The front end's cost when it sent the media, with the rate it managed."""
    fe = (payload.get("frontend") or {}).get("front")
    if not fe:
        return "-"
    return (f"{fmt(fe['frontend_core_per_session'], 3)} while delivering "
            f"{fmt(min(fe['viewer_fps']), 1)} fps")


def update_readme(payload: dict, path: Path = README) -> None:
    """Replace the README's block between ``START`` and ``END`` with this run's table; what
    the run did not measure (the ramp, or the throughput and host loss) comes from the last
    committed run of it (:data:`MEASURED`, :data:`MEASURED_RAMP`)."""
    import json

    main = payload if payload.get("rows") else json.loads(MEASURED.read_text())
    ramp = payload if "ramp_settings" in payload else (
        json.loads(MEASURED_RAMP.read_text()) if MEASURED_RAMP.is_file() else None)
    text = path.read_text()
    pattern = re.compile(re.escape(START) + ".*?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise ValueError(f"{path} has no {START} ... {END} block")
    path.write_text(pattern.sub(lambda _m: readme_block(main, ramp), text))
