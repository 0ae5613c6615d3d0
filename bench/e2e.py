"""``python -m bench e2e``: action-to-photon latency through the real server, WebRTC and codec.

A headless aiortc client (``PROTOCOL.md``: one recvonly video transceiver, a ``control`` data
channel) opens a session, replays an action script (``--script``: a JSON list of
``{"t_s": float, "keys": [...]}``; default: a seeded random script, a key change every
0.3-1.0 s) and receives the video. Each decoded video frame is matched to its ``frame``
metadata message by RTP timestamp (aiortc's receiver rebases timestamps on the first packet it
gets, so the constant offset is found as the one that matches most frames), which names the
newest action the frame was conditioned on. Reported: action-to-photon p50/p95/p99 (client
send -> the frame's last RTP packet received: the moment a browser starts decoding it), fps
received, dropped frames (generated indices never received), inter-frame jitter, and the
per-stage ms of the path (queue, denoise, cache fill, decode from the engine; server queue from
the server; encode + transport = frame complete at the client - its metadata arrival).

The client is :mod:`bench.e2e_client`, the figures :mod:`bench.e2e_analysis`: see the NOTE
there on aiortc's one-frame hold (``action_to_decoded_ms``).

Without ``--url`` the suite serves the app in-process (``--model builtin|sim``, ``--mode``) on a
loopback port; then every frame the server sent is also kept, and each decoded frame is
compared with it (``corrupted_frames``: PSNR under ``e2e_analysis.CORRUPT_PSNR_DB``, i.e. a broken
picture, not codec loss). ``--stress N`` runs N busy processes beside the server and client.
The session is also written as a latency-lab export (``bench.analyse`` format).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from worldstream.bench import harness
from worldstream.bench.e2e_analysis import analyse_log, to_export
from worldstream.bench.e2e_client import random_script, run_client, run_client_process
from worldstream.bench.e2e_server import LocalServer, SentFrames, busy_processes


def _markdown(payload: dict) -> str:
    from worldstream.bench.results import context_md, table

    r = payload["e2e"]
    lat = r["action_to_photon_ms"]
    dec = r["action_to_decoded_ms"]
    rows = [["action-to-photon p50 / p95 / p99 (ms, frame complete at the client)",
             f"{lat['p50'] or 0:.0f} / {lat['p95'] or 0:.0f} / {lat['p99'] or 0:.0f}"],
            ["action-to-decoded p50 / p95 (ms, + aiortc's one-frame hold)",
             f"{dec['p50'] or 0:.0f} / {dec['p95'] or 0:.0f}"],
            ["actions sent / measured", f"{r['actions_sent']} / {lat['count']}"],
            ["fps received", r["fps"]], ["frames received", r["frames_received"]],
            ["time to first photon (ms, offer -> first frame)", r["first_photon_ms"]],
            ["dropped frames", f"{r['dropped_frames']} of {r['frames_generated']}"],
            ["jitter std (ms)", r["jitter"]["std_ms"]],
            ["jitter p95 |dev| (ms)", r["jitter"]["p95_abs_dev_ms"]]]
    if "corrupted_frames" in r:
        rows += [["corrupted frames / checked",
                  f"{r['corrupted_frames']} / {r['frames_checked']}"],
                 ["PSNR decoded vs sent p5 / p50 (dB)",
                  f"{r['psnr_db_p5']:.1f} / {r['psnr_db_p50']:.1f}"]]
    rows += [[f"stage {k} (ms, p50)", v] for k, v in r["stages_ms"].items()]
    return ("# End to end: headless WebRTC client\n\n" + context_md(payload) + "\n"
            + table(["figure", "value"], rows))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench e2e", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    harness.add_common_args(parser)
    parser.add_argument("--url", default=None, help="a running server (default: serve here)")
    parser.add_argument("--model", choices=("builtin", "sim"), default="builtin",
                        help="backend of the in-process server")
    parser.add_argument("--seconds", type=float, default=None, help="default 20 (4 smoke)")
    parser.add_argument("--fps", type=int, default=None, help="session fps (server default)")
    parser.add_argument("--mode", choices=("responsive", "quality"), default="responsive",
                        help="the session's mode (engine.core.config.MODES; default responsive)")
    parser.add_argument("--steps", type=int, default=None,
                        help="denoising steps (default: the mode's)")
    parser.add_argument("--stress", type=int, default=0, metavar="N",
                        help="run N busy processes beside the server and client")
    parser.add_argument("--script", default=None, help="action script JSON")
    parser.add_argument("--prompt", default=harness.PROMPT)
    parser.add_argument("--no-compile", action="store_true",
                        help="builtin: the model eager (default: compiled, as `worldstream "
                             "play` runs it; --smoke never compiles)")
    parser.add_argument("--export", default=None,
                        help="latency-lab export path (default results/e2e/session.json)")
    args = parser.parse_args(argv)
    harness.apply_common_args(args)
    import os

    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    from worldstream.bench import plots, results
    from worldstream.bench.common import hardware_info

    seconds = args.seconds or (4.0 if args.smoke else 20.0)
    script = (json.loads(open(args.script).read()) if args.script
              else random_script(seconds))
    model, server_settings, sent = None, {"url": args.url}, None
    settings = {"mode": args.mode, **({"steps": args.steps} if args.steps else {})}
    client = {"seconds": seconds, "fps": args.fps, "prompt": args.prompt, "settings": settings}
    with busy_processes(args.stress):
        if args.url:
            log, session = asyncio.run(run_client(args.url, script, **client))
        else:
            from worldstream.engine.core.config import EngineConfig
            from worldstream.engine.core.engine import Engine

            if args.model == "sim":
                from worldstream.engine.core.registry import load_backend

                backend = load_backend("sim")
                model = {"name": "sim (ground-truth simulator)", "weights": "none",
                         "resolution": f"{backend.width}x{backend.height}"}
            else:
                models = harness.load_models(args.weights, smoke=args.smoke)
                backend = harness.make_generator(
                    models, max_states=4, compile=not (args.no_compile or args.smoke))
                model = models.describe()
            engine = Engine(backend, EngineConfig(mode=args.mode)).start()
            try:
                from worldstream.bench.streams import measure_ttff

                measure_ttff(engine, repeats=1, timeout_s=300)  # loads the text encoder
                with LocalServer(engine) as server, SentFrames(engine) as sent:
                    server_settings = {
                        "url": "in-process " + server.url, "backend": args.model,
                        "engine": f"EngineConfig(mode={args.mode!r}) (degradation on)",
                        "chunk_frames": engine.chunk_frames,
                        "steps": args.steps or engine.default_steps}
                    log, session = run_client_process(server.url, script, keep_pictures=True,
                                                      **client)
            finally:
                engine.stop()
    figures = analyse_log(log, session["fps"], sent=sent.frames if sent else None)
    payload = results.stamp_payload("e2e", {
        "hardware": hardware_info(), "model": model or {"name": "remote server"},
        "settings": {"seconds": seconds, "fps": session["fps"], "mode": args.mode,
                     "stress_processes": args.stress,
                     "actions": len(log.actions), "threads": args.threads, **server_settings,
                     "resolution": f"{session['width']}x{session['height']}"},
        "e2e": figures}, argv)
    export = to_export(log)
    lat = [e["t_photon_ms"] - e["t_action_ms"] for e in export if e["t_photon_ms"] is not None]
    folder = results.save("e2e", payload, _markdown(payload), {
        "action_to_photon": plots.latency_histogram(lat, "action-to-photon (headless WebRTC)"),
        "stages": plots.stage_bars(figures["stages_ms"], "path of a frame (p50 ms)")})
    with open(folder / "client_log.json", "w") as f:  # raw observations, for re-analysis
        json.dump({"actions": log.actions, "messages": log.messages, "frames": log.frames,
                   "errors": log.errors, "first_photon_ms": log.first_photon_ms}, f)
    export_path = args.export or str(folder / "session.json")
    with open(export_path, "w") as f:
        json.dump(export, f, indent=1)
    print(f"report: {folder / 'result.md'}; export: {export_path}", file=sys.stderr)
    results.print_json(payload, args.json)
    return 0
