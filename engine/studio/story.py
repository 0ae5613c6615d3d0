"""Storyboards: a list of beats (a prompt or a two-prompt blend, a duration, an optional action
script, a transition), compiled into input-log events (:mod:`engine.inputlog`), so that one
story plays the same live in the engine (:func:`engine.worldio.play_story`) and headless
(:func:`engine.replay.replay`, ``worldstream generate --story``).

A story starts a fresh world from its first beat's prompt and its seed. Each later beat
switches the prompt through the engine's recache (no cut): at once, or with ``transition_s``
as a blend from the previous beat's prompt to the new one whose weight rises in four steps a
second; ``cut: true`` starts a fresh world of the beat's prompt instead. Keys are released at
each beat's start; the beat's ``actions`` hold keys from ``at_s`` seconds into the beat.

File format (JSON, ``STORY_FORMAT``)::

    {"format": "worldstream-story/1", "seed": 0,
     "beats": [{"prompt": "a green meadow with ponds", "duration_s": 6,
                "actions": [{"at_s": 0, "keys": ["right"]}, {"at_s": 3, "keys": []}]},
               {"prompt": "a snowy forest", "duration_s": 6, "transition_s": 1},
               {"prompt": "hot desert dunes", "blend": {"text": "a snowy forest",
                "weight": 0.3}, "duration_s": 6, "cut": true}]}
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from worldstream.engine.core.inputlog import LOG_FORMAT
from worldstream.engine.core.limits import MAX_PROMPT_CHARS, check_json

STORY_FORMAT = "worldstream-story/1"
MAX_STORY_BYTES = 64 * 1024
#: the longest story, s, and the most beats
MAX_STORY_S = 600.0
MAX_BEATS = 64
#: blend steps per second of a transition
TRANSITION_STEPS_PER_S = 4

Key = Literal["up", "down", "left", "right"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class Blend(_Strict):
    text: str = Field(min_length=1, max_length=MAX_PROMPT_CHARS)
    weight: float = Field(ge=0.0, le=1.0)


class BeatAction(_Strict):
    at_s: float = Field(ge=0.0)
    keys: list[Key] = Field(max_length=4)


class Beat(_Strict):
    """One beat: ``prompt`` (blended with ``blend.text`` at ``blend.weight``) for
    ``duration_s`` seconds; ``transition_s`` seconds of blending in from the previous beat
    (0: switch at once); ``cut``: a fresh world instead of a transition; ``actions``: keys
    held from ``at_s`` seconds into the beat."""

    prompt: str = Field(min_length=1, max_length=MAX_PROMPT_CHARS)
    blend: Blend | None = None
    duration_s: float = Field(gt=0.0, le=MAX_STORY_S)
    transition_s: float = Field(default=0.0, ge=0.0, le=30.0)
    cut: bool = False
    actions: list[BeatAction] = Field(default_factory=list, max_length=1000)

    @model_validator(mode="after")
    def _fits(self) -> Beat:
        if self.transition_s > self.duration_s:
            raise ValueError(f"transition_s ({self.transition_s}) is longer than duration_s "
                             f"({self.duration_s})")
        if self.cut and self.transition_s:
            raise ValueError("a cut has no transition: set transition_s to 0 or cut to false")
        late = [a.at_s for a in self.actions if a.at_s >= self.duration_s]
        if late:
            raise ValueError(f"actions: at_s {late[0]} is not within duration_s "
                             f"({self.duration_s})")
        return self


class Storyboard(_Strict):
    format: Literal["worldstream-story/1"] = STORY_FORMAT
    seed: int = Field(default=0, ge=0, lt=2**31)
    beats: list[Beat] = Field(min_length=1, max_length=MAX_BEATS)

    @model_validator(mode="after")
    def _length(self) -> Storyboard:
        total = sum(b.duration_s for b in self.beats)
        if total > MAX_STORY_S:
            raise ValueError(f"the story lasts {total:g} s; the limit is {MAX_STORY_S:g} s")
        return self

    @property
    def duration_s(self) -> float:
        return sum(b.duration_s for b in self.beats)


def parse_story(raw: bytes | str, name: str = "storyboard") -> Storyboard:
    """Validate a storyboard (JSON text). Raises ValueError with one line naming the beat and
    the field: ``storyboard: beat 2, duration_s: Input should be greater than 0``."""
    return story_from_data(check_json(raw, name, MAX_STORY_BYTES), name)


def story_from_data(data: Any, name: str = "storyboard") -> Storyboard:
    """:func:`parse_story` for already decoded JSON data."""
    try:
        return Storyboard.model_validate(data)
    except ValidationError as err:
        first = err.errors(include_url=False)[0]
        loc = list(first["loc"])
        msg = first["msg"].removeprefix("Value error, ")
        where = ""
        if len(loc) >= 2 and loc[0] == "beats" and isinstance(loc[1], int):
            where = f"beat {loc[1] + 1}"
            loc = loc[2:]
        field = ".".join(str(p) for p in loc)
        where = ", ".join(w for w in (where, field) if w) or "story"
        raise ValueError(f"{name}: {where}: {msg}") from None


def beat_starts(story: Storyboard, fps: int) -> list[int]:
    """The frame at which each beat starts, then the story's last frame + 1."""
    starts, t = [], 0.0
    for beat in story.beats:
        starts.append(round(t * fps))
        t += beat.duration_s
    return [*starts, round(t * fps)]


def compile_story(story: Storyboard, *, fps: int, chunk_frames: int) -> tuple[
        list[dict[str, Any]], list[int], int]:
    """The story as input-log events (chunk indices from the story's start; the start itself,
    a fresh world of beat 1's prompt at the story's seed, is not an event), the chunk at which
    each beat starts, and the story's length in chunks. An event due at frame ``n`` takes
    effect from the chunk holding frame ``n``."""
    starts = beat_starts(story, fps)
    timed: list[tuple[int, int, dict[str, Any]]] = []  # (frame, order, event)

    def at(frame: int, event: dict[str, Any]) -> None:
        timed.append((frame, len(timed), event))

    def prompt_event(beat: Beat) -> dict[str, Any]:
        return {"kind": "prompt", "text": beat.prompt,
                "blend_text": beat.blend.text if beat.blend else None,
                "blend_weight": beat.blend.weight if beat.blend else 0.0}

    for i, beat in enumerate(story.beats):
        start = starts[i]
        if i > 0 and beat.cut:
            at(start, {"kind": "cut", "prompt": beat.prompt, "seed": story.seed + i})
        if i > 0 and beat.transition_s > 0:
            prev = story.beats[i - 1].prompt
            n = max(1, round(beat.transition_s * TRANSITION_STEPS_PER_S))
            for j in range(n):
                at(start + math.floor(j * beat.transition_s * fps / n),
                   {"kind": "prompt", "text": prev, "blend_text": beat.prompt,
                    "blend_weight": round((j + 1) / (n + 1), 4)})
            at(start + round(beat.transition_s * fps), prompt_event(beat))
        elif (i > 0 and not beat.cut) or beat.blend is not None:
            at(start, prompt_event(beat))
        if i > 0:
            at(start, {"kind": "action", "keys": []})
        for action in beat.actions:
            at(start + round(action.at_s * fps), {"kind": "action", "keys": sorted(action.keys)})
    events = []
    for frame, _, event in sorted(timed, key=lambda t: (t[0], t[1])):
        events.append({**event, "chunk": frame // chunk_frames, "frame": frame})
    chunks = math.ceil(starts[-1] / chunk_frames)
    return events, [s // chunk_frames for s in starts[:-1]], chunks


def story_log(story: Storyboard, *, model: str, model_version: str, fps: int,
              chunk_frames: int, steps: int) -> dict[str, Any]:
    """The input log (``LOG_FORMAT``) that plays ``story`` headless."""
    events, _, chunks = compile_story(story, fps=fps, chunk_frames=chunk_frames)
    return {"format": LOG_FORMAT, "model": model, "model_version": model_version,
            "start": {"kind": "prompt"}, "seed": story.seed, "prompt": story.beats[0].prompt,
            "chunk_frames": chunk_frames, "steps": steps, "fps": fps, "chunks": chunks,
            "frames": chunks * chunk_frames, "events": events}
