"""A session's journal in the front end: what a surviving replica needs to take the session
over when its replica dies — the prompt and seed, the settings in force, the keys
held, and the last frames with the actions that produced them."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, replace

import numpy as np

from worldstream.engine.core.api import ActionCommand, Command, PromptCommand, SettingsCommand


@dataclass
class Journal:
    """``frames``: the last ``max_frames`` frames shown, ``(H, W, 3)`` uint8 each, with the
    held keys each was conditioned on (``keys``; the new replica's backend maps them to its
    actions). ``keys_by_seq``: held keys of the recent
    actions, to name a frame's action from its ``action_seq``."""

    prompt: str
    seed: int
    fps: int
    max_frames: int = 16
    settings: list[SettingsCommand] = field(default_factory=list)
    prompt_command: PromptCommand | None = None
    last_action: ActionCommand | None = None
    paused: bool = False
    frames: deque = field(default_factory=deque)
    keys: deque = field(default_factory=deque)
    keys_by_seq: dict[int, frozenset] = field(default_factory=dict)

    def record_command(self, command: Command) -> None:
        """Note a command sent to the session (the ones a restore replays)."""
        if isinstance(command, ActionCommand):
            self.last_action = command
            self.keys_by_seq[command.seq] = frozenset(command.keys)
            if len(self.keys_by_seq) > 256:  # older actions have long been shown
                del self.keys_by_seq[min(self.keys_by_seq)]
        elif isinstance(command, PromptCommand):
            self.prompt_command = command
        elif isinstance(command, SettingsCommand):
            self.settings.append(command)
            del self.settings[:-8]

    def record_frame(self, rgb: np.ndarray, action_seq: int) -> None:
        self.frames.append(rgb)
        self.keys.append(self.keys_by_seq.get(action_seq, frozenset()))
        while len(self.frames) > self.max_frames:
            self.frames.popleft()
            self.keys.popleft()

    def history(self) -> tuple[np.ndarray, list[frozenset[str]]] | None:
        """The recent frames ``(n, H, W, 3)`` uint8 and their held keys, None if none."""
        if not self.frames:
            return None
        return np.stack(self.frames), list(self.keys)

    def replay(self) -> list[Command]:
        """Commands that bring a restored session to the journal's settings, prompt and keys
        (the last action without its mouse motion: the dead replica spent it)."""
        out: list[Command] = list(self.settings)
        if self.prompt_command is not None:
            out.append(self.prompt_command)
        if self.last_action is not None:
            out.append(replace(self.last_action, pointer=None))
        return out
