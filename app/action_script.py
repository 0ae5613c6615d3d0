"""Action scripts for ``worldstream generate``: timed key presses and prompt switches.

File format (JSON)::

    {"events": [{"frame": 0, "keys": ["right"]},
                {"frame": 45, "keys": ["down", "right"]},
                {"frame": 120, "prompt": "a sandy desert"},
                {"frame": 150, "keys": []}]}

``frame`` is the stream frame index from which the event holds: it takes effect from the
chunk holding that frame, however fast the machine generates (:class:`ScriptPlayer`); ``keys``
is the full set of held keys from then on (empty = idle: the directions, or a game world's own
keys such as ``fire``); ``prompt`` switches the scene prompt. An event has ``keys`` or
``prompt`` (or both).
"""

from __future__ import annotations

import time
from collections import deque
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from worldstream.engine.core.fields import HeldKey
from worldstream.engine.worlds.actions import keys_to_action

#: the largest action script read (a 10-minute script with a key change every frame: ~1 MB)
MAX_SCRIPT_BYTES = 4 * 2**20

_ROTATE = {"up": "right", "right": "down", "down": "left", "left": "up"}


class ScriptEvent(BaseModel):
    model_config = ConfigDict(extra="forbid")
    frame: int = Field(ge=0)
    # DIRECTION_KEYS, or a game's wire keys (load_action_script's ``keys``)
    keys: list[HeldKey] | None = None
    prompt: str | None = Field(default=None, min_length=1, max_length=500)

    @model_validator(mode="after")
    def _has_content(self):
        if self.keys is None and self.prompt is None:
            raise ValueError("an event needs 'keys' or 'prompt'")
        return self


class ActionScript(BaseModel):
    model_config = ConfigDict(extra="forbid")
    events: list[ScriptEvent]

    def rotated(self, quarter_turns: int) -> ActionScript:
        """The same script with every direction turned clockwise ``quarter_turns`` times."""
        events = []
        for e in self.events:
            keys = e.keys
            if keys is not None:
                for _ in range(quarter_turns % 4):
                    keys = [_ROTATE[k] for k in keys]
            events.append(e.model_copy(update={"keys": keys}))
        return ActionScript(events=events)

    def per_frame(self, frames: int) -> tuple[list[int], dict[int, str]]:
        """The script unrolled: the action id of each of ``frames`` frames
        (``engine.worlds.actions``) and ``{frame: prompt}`` of its prompt switches."""
        by_frame = sorted(self.events, key=lambda e: e.frame)
        actions, prompts, keys, k = [], {}, [], 0
        for i in range(frames):
            while k < len(by_frame) and by_frame[k].frame <= i:
                e = by_frame[k]
                keys = e.keys if e.keys is not None else keys
                if e.prompt is not None:
                    prompts[i] = e.prompt
                k += 1
            actions.append(keys_to_action(keys))
        return actions, prompts


class ScriptPlayer:
    """Plays ``script`` in one engine session by frame index, not by clock: the engine calls
    :meth:`play_due` on its own thread before generating each stream chunk of the session, and
    every event due by the last frame of that chunk is applied there, through the engine's
    command path (checked and logged to the session's input log like a client's command).
    Attach it with ``engine.call(session_id, player.attach)`` before the engine starts, so that
    it is in place before the first chunk.

    NOTE: events sent on the wall clock (``frame / fps`` seconds after the first frame) landed
    on whichever chunk was being generated when they arrived: under load the same script took
    its keys at other frames (frame 8's at frame 4 on one run, at 10 on the next), and the two
    videos parted there for good (issue 66).
    """

    def __init__(self, engine: Any, script: ActionScript):
        from worldstream.engine.core.api import ActionCommand, PromptCommand

        self.engine = engine
        self.events: deque = deque()
        seq = 0
        for e in sorted(script.events, key=lambda e: e.frame):
            if e.keys is not None:
                seq += 1
                self.events.append((e.frame, ActionCommand(seq, 0.0, frozenset(e.keys))))
            if e.prompt is not None:
                seq += 1
                self.events.append((e.frame, PromptCommand(seq, 0.0, e.prompt)))

    def attach(self, session: Any) -> None:
        """Make this the session's script (engine thread, ``Engine.call``)."""
        session.script = self if self.events else None

    def play_due(self, session: Any) -> None:
        """Apply every event due by the last frame of the session's next chunk (engine
        thread); a refused one ends the script with an error event. Detaches itself after the
        last event."""
        last = session.frame_index + session.chunk_frames - 1
        while self.events and self.events[0][0] <= last:
            frame, command = self.events.popleft()
            try:
                self.engine.commands.apply(session, command, time.perf_counter_ns())
            except Exception as exc:  # InvalidCommand (names its field), a backend failure
                self.events.clear()
                session.emit("error", code="script", field=getattr(exc, "field", "script"),
                             message=f"action script, frame {frame}: {exc}")
        if not self.events:
            session.script = None


def game_script(wire_keys: tuple[str, ...] | list[str], frames: int) -> ActionScript:
    """The default script of a game world for ``frames`` frames: ``fire`` (a round's start,
    where the game has it) for 4 frames, then each of its keys held 30 frames in turn with 10
    idle frames between."""
    keys = sorted(k for k in wire_keys if k != "fire") or ["fire"]
    events: list[dict] = [{"frame": 0, "keys": ["fire"] if "fire" in wire_keys else []}]
    for i, frame in enumerate(range(4, frames, 40)):
        events += [{"frame": frame, "keys": [keys[i % len(keys)]]},
                   {"frame": frame + 30, "keys": []}]
    return ActionScript.model_validate({"events": events}, context={"keys": tuple(wire_keys)})


def load_action_script(path: str | Path, keys: tuple[str, ...] | None = None) -> ActionScript:
    """Parse and validate a script whose held keys are ``keys`` (a game's wire keys; None:
    the directions); raises FileNotFoundError or ValueError (one line)."""
    from worldstream.engine.core.reader import read_json_file, validate

    data = read_json_file(path, MAX_SCRIPT_BYTES, what="action script")
    return validate(ActionScript, data, f"{path}: malformed action script",
                    {"keys": keys} if keys else None)
