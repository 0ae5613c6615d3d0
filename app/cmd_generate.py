"""``worldstream generate``: play action scripts against the engine and write one MP4 per
session, then print a JSON summary. A game world (``--env ID``, ``--world pong``) plays its
own keys (a script of them, or by default each of its keys held in turn) and no prompt."""

from __future__ import annotations

import json
import time
from pathlib import Path

from worldstream.app import game_args, settings_cli
from worldstream.app.action_script import ScriptPlayer, game_script, load_action_script

DEFAULT_PROMPTS = (
    "a green meadow with ponds",
    "a snowy forest",
    "a sandy desert with an oasis",
    "a dark landscape at night",
)


def register(sub) -> None:
    p = sub.add_parser("generate", help="generate videos from action scripts through the engine")
    p.add_argument(
        "--actions",
        type=Path,
        action="append",
        default=None,
        help="action script JSON (repeatable: one per session)",
    )
    p.add_argument("--prompt", action="append", default=None, help="scene prompt (repeatable)")
    p.add_argument("--frames", type=int, default=240, help="frames per session (default 240)")
    p.add_argument(
        "--out",
        type=Path,
        default=Path("out.mp4"),
        help="output MP4; with --sessions N, OUT_0.mp4 ... OUT_{N-1}.mp4",
    )
    p.add_argument(
        "--sessions", type=int, default=1, help="sessions generated side by side (one MP4 each)"
    )
    p.add_argument("--fps", type=int, default=15, help="playback rate of the script and the MP4")
    p.add_argument("--steps", type=int, default=4,
                   help="denoising steps per chunk (1-4; default 4: the quality of an offline "
                        "job, where `play` picks 2 in its responsive mode)")
    p.add_argument("--seed", type=int, default=0, help="world seed of session 0 (+i for session i)")
    p.add_argument("--world", choices=game_args.world_choices(), default=None,
                   help="the world (default landscape; pong, breakout: a game; a replay uses "
                        "its log's)")
    p.add_argument("--model", choices=game_args.model_choices(), default=None,
                   help="model family (default: the world's own default; a replay uses its "
                        "log's); " + game_args.model_help().removeprefix("model family: "))
    game_args.add_arguments(p)
    p.add_argument("--replay", type=Path, default=None,
                   help="play this input log (a session's export) instead: the same frames "
                        "(a log is data: a game it names as module:factory is played only "
                        "when --env names the same)")
    p.add_argument("--state", type=Path, default=None,
                   help="with --replay: the save point the logged session was loaded from")
    p.add_argument("--story", type=Path, default=None,
                   help="play this storyboard JSON instead (--fps, --steps apply)")
    p.add_argument("--score", action="store_true",
                   help="with --story: each beat's scene accuracy 1-2 s after its start")
    p.add_argument("--model-path", default=None,
                   help="model folder, for a model that takes one (a world's trained model: "
                        "default the world's assets; a game: a folder of `worldstream train "
                        "--env ID`; a model's release where its weights are not shipped)")
    settings_cli.add_arguments(p)
    p.set_defaults(func=run)


def _outputs(out: Path, n: int) -> list[Path]:
    return [out] if n == 1 else [out.with_name(f"{out.stem}_{i}{out.suffix}") for i in range(n)]


def _game_scripts(args, wire_keys: tuple[str, ...]) -> list:
    """A game world's scripts: ``--actions`` in its own keys, else :func:`game_script`;
    ValueError for a prompt (a game has none)."""
    if args.prompt:
        raise ValueError("--prompt: a game world has no text prompt; steer it with --actions")
    scripts = [load_action_script(p, wire_keys) for p in args.actions] if args.actions else \
        [game_script(wire_keys, args.frames)]
    if any(e.prompt is not None for s in scripts for e in s.events):
        raise ValueError("--actions: a game world has no text prompt; script its keys only")
    return [scripts[i % len(scripts)] for i in range(args.sessions)]


def run(args) -> int:
    from worldstream.engine.core.backend import PromptPrefetch, backend_info
    from worldstream.engine.core.config import EngineConfig
    from worldstream.engine.core.engine import Engine
    from worldstream.engine.core.limits import DIRECTION_KEYS
    from worldstream.engine.core.registry import env_of, load_backend
    from worldstream.streaming.recording import Recorder

    if settings_cli.wants_help(args):
        choice = game_args.resolve(args)
        return settings_cli.print_family_settings(choice.family, choice.world, args.model_path)
    if not Path(args.out).parent.is_dir():  # the recorder would write nothing, silently
        raise ValueError(f"--out: the folder {Path(args.out).parent} does not exist")
    if args.replay is not None or args.story is not None:
        from worldstream.app.headless import run_replay, run_story

        if args.replay is not None and args.story is not None:
            raise ValueError("--replay and --story exclude each other")
        if args.keymap is not None and args.replay is None:
            raise ValueError("--keymap goes with --replay (the log of a game world's "
                             "session) or a game world (--env ID, --world pong|breakout)")
        # the backend named on the command line, checked against the log's; None: the log's
        keymap, args.keymap = args.keymap, None  # a replayed log names its own world
        named = args.model is not None or args.env is not None or args.world is not None
        named_choice = game_args.resolve(args) if named else None
        args.backend = named_choice.backend if named_choice is not None else None
        if named_choice is not None:  # --set for a model that takes none: refused here
            settings_cli.family_overrides(named_choice.family, args)
        args.keymap = keymap
        if args.story is not None and args.backend and env_of(args.backend) is not None:
            raise ValueError("--story: a game world has no text prompt to tell a story with")
        return run_replay(args) if args.replay is not None else run_story(args)
    choice = game_args.resolve(args)  # ValueError
    args.world, args.model, args.backend = choice.world, choice.model, choice.backend
    args.settings = settings_cli.family_overrides(choice.family, args)  # ValueError
    if args.frames < 1 or args.sessions < 1 or args.fps < 1:
        raise ValueError("--frames, --sessions and --fps must be >= 1")
    backend = load_backend(args.backend, model_path=args.model_path,
                           **game_args.backend_kwargs(args, choice), **args.settings)
    info = backend_info(backend)
    if info.world == "game":  # a game's page: its own keys (or the direction keys), no prompt
        scripts = _game_scripts(args, info.wire_keys or DIRECTION_KEYS)
        prompts = ["play"]  # a game's sessions take a prompt and ignore it
    else:
        prompts = args.prompt or [DEFAULT_PROMPTS[0]]
        if any(not p.strip() for p in prompts):
            raise ValueError("--prompt must not be empty")
        if args.sessions > 1 and len(prompts) == 1:
            prompts = [prompts[0], *DEFAULT_PROMPTS[1:]]
        scripts = [load_action_script(p)
                   for p in (args.actions or [Path("assets/demo_actions.json")])]
        # more sessions than scripts: each extra session plays the script turned by a quarter
        scripts = [
            scripts[i] if i < len(scripts) else scripts[i % len(scripts)].rotated(i)
            for i in range(args.sessions)
        ]
    # offline job: keep the requested steps and fps (no degradation), never drop frames
    config = EngineConfig(
        max_sessions=args.sessions,
        fps=args.fps,
        steps=args.steps,
        min_steps=args.steps,
        min_fps=args.fps,
        max_fps=max(60, args.fps),
    )
    outs = _outputs(args.out, args.sessions)
    summary = []
    if isinstance(backend, PromptPrefetch):  # the scripts' prompts here, not on the engine thread
        for text in {e.prompt for s in scripts for e in s.events if e.prompt is not None}:
            backend.prepare_prompt(text)
    # NOTE: the sessions are made, subscribed and given their scripts before the engine thread
    # starts (its first drain takes all of it before any chunk): no frame is generated before
    # the recorder listens or before the script holds frame 0's keys. The script plays by frame
    # index on the engine thread (ScriptPlayer), so a busy machine changes when frames come,
    # never which (issue 66)
    engine = Engine(backend, config)
    try:
        sids, counters, recorders, attached = [], [], [], []
        for i in range(args.sessions):
            info = engine.create_session(
                prompts[i % len(prompts)], seed=args.seed + i, fps=args.fps
            )
            sids.append(info.session_id)
            recorders.append(
                Recorder(
                    engine.subscribe(info.session_id, args.frames + 64),
                    outs[i],
                    args.fps,
                    max_frames=args.frames,
                ).start()
            )
            counters.append(engine.subscribe(info.session_id, args.frames + 64))
            attached.append(engine.call(info.session_id, ScriptPlayer(engine, scripts[i]).attach))
        engine.start()
        for future in attached:
            future.result()
        got = [[] for _ in sids]
        t0 = None  # the wall clock starts with the first frame (after model warm-up)
        while any(len(g) < args.frames for g in got):
            for i, sid in enumerate(sids):
                while len(got[i]) < args.frames and (f := counters[i].get_nowait()) is not None:
                    got[i].append(f)
                    if t0 is None:
                        t0 = time.perf_counter()
                while not engine.events(sid).empty():
                    ev = engine.events(sid).get_nowait()
                    if ev.kind in ("error", "closed"):
                        raise RuntimeError(f"session {i} ended: {ev.payload}")
            time.sleep(0.005)
        wall = time.perf_counter() - t0
        for i in range(len(sids)):
            while recorders[i].frames_written < args.frames and recorders[i].running:
                time.sleep(0.01)
            recorders[i].stop()
            chunks = {f.chunk_index: f.stages_ms for f in got[i]}
            gen_ms = [sum(v for k, v in st.items() if k != "queue") for st in chunks.values()]
            summary.append(
                {
                    "out": str(outs[i]),
                    "prompt": prompts[i % len(prompts)],
                    "frames": recorders[i].frames_written,
                    # frame rate over the intervals after the first frame (None for one frame)
                    "fps": round((len(got[i]) - 1) / wall, 2) if len(got[i]) > 1 else None,
                    "ms_per_chunk": round(sum(gen_ms) / max(len(gen_ms), 1), 1),
                }
            )
    finally:
        engine.stop()
    print(
        json.dumps(
            {
                "world": args.world,
                "model": args.model,
                "steps": args.steps,
                "target_fps": args.fps,
                "wall_s": round(wall, 2),
                "sessions": summary,
            }
        )
    )
    return 0
