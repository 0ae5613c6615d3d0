"""``worldstream generate --replay LOG`` and ``--story STORY``: play an input log or a
storyboard headless, as fast as the model goes, into an H.264 MP4, then print a JSON summary.

A story writes beside its MP4 the storyboard (``OUT.story.json``) and the input log it played
(``OUT.log.json``: ``--replay`` reproduces the MP4's frames exactly). ``--score`` also reports,
per beat, the fraction of frames 1-2 s after the beat's start that the evaluation's scene
classifier (fitted on simulator frames) assigns to the beat's scene.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from worldstream.engine.core.inputlog import MAX_LOG_BYTES
from worldstream.engine.core.reader import read_bytes
from worldstream.engine.studio.savepoint import MAX_SAVEPOINT_BYTES
from worldstream.engine.studio.story import MAX_STORY_BYTES


class Mp4Writer:
    """Frames ``(n, H, W, 3)`` uint8 appended to an H.264 MP4 at ``fps`` (PyAV)."""

    def __init__(self, path: Path, fps: int):
        import av

        self.path, self.frames = Path(path), 0
        self._container = av.open(str(path), mode="w")
        self._stream = None
        self._fps = fps

    def write(self, frames: np.ndarray) -> None:
        import av

        for rgb in frames:
            if self._stream is None:
                self._stream = self._container.add_stream("libx264", rate=self._fps)
                self._stream.width, self._stream.height = rgb.shape[1], rgb.shape[0]
                self._stream.pix_fmt = "yuv420p"
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24")
            frame.pts = self.frames
            self._container.mux(self._stream.encode(frame))
            self.frames += 1

    def close(self) -> None:
        if self._stream is not None:
            self._container.mux(self._stream.encode(None))
        self._container.close()


def _play(backend: Any, log, out: Path, savepoint: bytes | None = None,
          keep: list | None = None) -> dict[str, Any]:
    from worldstream.engine.studio.replay import replay

    writer = Mp4Writer(out, log.fps)
    t0 = time.perf_counter()

    def on_frames(frames: np.ndarray) -> None:
        writer.write(frames)
        if keep is not None:
            keep.append(frames)

    try:
        summary = replay(backend, log, on_frames, savepoint=savepoint)
    finally:
        writer.close()
    wall = time.perf_counter() - t0
    return {"out": str(out), "model": log.model, "frames": summary["frames"],
            "chunks": summary["chunks"], "seconds": round(summary["frames"] / log.fps, 2),
            "wall_s": round(wall, 2), "fps": round(summary["frames"] / wall, 2) if wall else None}


def run_replay(args) -> int:
    """``--replay LOG [--state SAVE]``: the log's model (Matrix-Game: its variant, weights
    from ``--model-path``), seed and inputs, keys and mouse motion, frame for frame."""
    from worldstream.engine.core.registry import load_backend, model_of_file
    from worldstream.engine.studio.replay import read_log

    path = Path(args.replay)
    log = read_log(read_bytes(path, MAX_LOG_BYTES, what="input log"), str(path))
    # the log is data: its model is compared, never imported from it (module:factory games)
    model_of_file(log.model, args.backend, str(path))
    savepoint = None
    if args.state is not None:
        savepoint = read_bytes(args.state, MAX_SAVEPOINT_BYTES, what="save point")
    backend = load_backend(log.model, model_path=args.model_path, **_settings(log.model, args))
    result = _play(backend, log, args.out, savepoint)
    print(json.dumps(result))
    return 0


def run_story(args) -> int:
    """``--story STORY [--score]``: the storyboard played from a fresh world."""
    from worldstream.engine.core.inputlog import ReplayLog
    from worldstream.engine.core.registry import load_backend
    from worldstream.engine.studio.savepoint import model_version
    from worldstream.engine.studio.story import parse_story, story_log

    path = Path(args.story)
    story = parse_story(read_bytes(path, MAX_STORY_BYTES, what="storyboard"), str(path))
    from worldstream.app.game_args import DEFAULT_WORLD
    from worldstream.engine.core.registry import backend_id, default_model

    world = args.world or DEFAULT_WORLD
    name = args.backend or backend_id(world, default_model(world))
    backend = load_backend(name, model_path=args.model_path, **_settings(name, args))
    log = story_log(story, model=backend.name, model_version=model_version(backend),
                    fps=args.fps, chunk_frames=backend.chunk_frames, steps=args.steps)
    out = Path(args.out)
    out.with_suffix(".story.json").write_text(story.model_dump_json(indent=2))
    out.with_suffix(".log.json").write_text(json.dumps(log))
    frames: list[np.ndarray] | None = [] if args.score else None
    result = _play(backend, ReplayLog.model_validate(log), out, keep=frames)
    result.update(story=str(out.with_suffix(".story.json")),
                  log=str(out.with_suffix(".log.json")), beats=len(story.beats))
    if frames is not None:
        result["scene_accuracy"] = score_story(story, np.concatenate(frames), args.fps)
    print(json.dumps(result))
    return 0


def _settings(name: str, args) -> dict:
    """``--set`` settings for a backend whose family takes them (its row's ``settings``),
    ``--keymap`` for a game world's (others take none: ``--set`` is left unused there, as a
    replayed log names its own model)."""
    from worldstream.app.settings_cli import family_overrides
    from worldstream.engine.core.registry import env_of, family_of

    if env_of(name) is not None:
        keymap = getattr(args, "keymap", None)
        return {} if keymap is None else {"keymap": str(keymap)}
    family = family_of(name)
    return family_overrides(family, args) if family is not None and family.settings else {}


def score_story(story, frames: np.ndarray, fps: int) -> list[dict[str, Any]]:
    """Per beat: its scene (the prompt's, or the heavier prompt's of a blend) and the fraction
    of its frames 1-2 s after its start that the evaluation's scene classifier assigns to it
    (None for a beat shorter than 2 s)."""
    from worldstream.engine.evaluation.run import scene_classifier
    from worldstream.engine.models.builtin.text import scene_for_prompt
    from worldstream.engine.studio.story import beat_starts

    classifier = scene_classifier()
    starts = beat_starts(story, fps)
    scores = []
    for i, beat in enumerate(story.beats):
        heavier = (beat.blend.text if beat.blend is not None and beat.blend.weight > 0.5
                   else beat.prompt)
        scene = scene_for_prompt(heavier)
        window = range(starts[i] + fps, min(starts[i] + 2 * fps, starts[i + 1], len(frames)))
        hits = [classifier.predict(frames[j]) == scene for j in window]
        scores.append({"beat": i + 1, "scene": scene,
                       "accuracy": round(float(np.mean(hits)), 3) if hits else None})
    return scores
