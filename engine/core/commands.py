"""Commands on the engine thread: a session's action, prompt, settings, fork, adopt and rewind
applied to its backend state, each checked first (an invalid one changes nothing and comes
back as :class:`InvalidCommand`, reported to the client as an error event), and logged to the
session's input log once applied.

The :class:`CommandHandler` is the engine's only writer of a session's model-facing state
besides the loop itself; the state budget it charges for fork branches is the scheduler's.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any

import numpy as np

from worldstream.engine.core.action_space import check_pointer
from worldstream.engine.core.api import (
    ActionCommand,
    AdoptCommand,
    CapacityError,
    Command,
    ForkCommand,
    PromptCommand,
    RewindCommand,
    SettingsCommand,
)
from worldstream.engine.core.backend import (
    BackendInfo,
    Configurable,
    WorldBackend,
    WorldControls,
)
from worldstream.engine.core.config import MODES, EngineConfig
from worldstream.engine.core.limits import (
    MAX_CHUNK_FRAMES,
    MAX_MEMORY_FRAMES,
    MAX_STEPS,
    MIN_MEMORY_FRAMES,
    check_prompt,
)
from worldstream.engine.core.scheduler import StateBudget
from worldstream.engine.core.session import Branch, Session


class InvalidCommand(ValueError):
    """A rejected command: reported to the client as an error event naming ``field``."""

    def __init__(self, field: str, message: str, code: str = "invalid"):
        super().__init__(message)
        self.field = field
        self.code = code


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def derived_seed(*parts: int) -> int:
    """A well-mixed 31-bit seed from integers (branch previews get distinct noise)."""
    return int(np.random.SeedSequence([p & 0xFFFFFFFF for p in parts]).generate_state(1)[0]
               >> 1)


def mode_settings(name: str, chunk_sizes: tuple[int, ...], min_steps: int) -> tuple[int, int]:
    """``(chunk_frames, steps)`` of mode ``name`` on a backend generating ``chunk_sizes``: the
    supported chunk size nearest to the mode's (the smaller on a tie), its steps within
    ``[min_steps, MAX_STEPS]``. Raises KeyError for an unknown mode."""
    mode = MODES[name]
    chunk = min(chunk_sizes, key=lambda c: (abs(c - mode.chunk_frames), c))
    return chunk, min(max(mode.steps, min_steps), MAX_STEPS)


class CommandHandler:
    """Applies commands to sessions over ``backend`` (engine thread only).

    Args:
        backend: the model the sessions' states belong to; info: what it is.
        config: the engine's settings (``max_fork``, ``preview_chunks``, fps bounds).
        budget: the scheduler's state budget (fork branches count against it).
        lock: the engine's lock (``metrics()`` reads what settings change).
        chunk_sizes: chunk sizes the backend generates. rewind_chunks: the most one rewind
            may go back.
    """

    def __init__(self, backend: WorldBackend, info: BackendInfo, config: EngineConfig,
                 budget: StateBudget, lock: threading.Lock, chunk_sizes: tuple[int, ...],
                 rewind_chunks: int):
        self.backend = backend
        self.info = info
        self.config = config
        self.budget = budget
        self.lock = lock
        self.chunk_sizes = chunk_sizes
        self.rewind_chunks = rewind_chunks
        self.model_name = backend.name

    def apply(self, s: Session, command: Command, receipt_ns: int) -> None:
        """Apply ``command`` to ``s`` and log it; InvalidCommand (nothing changed) when it is
        refused."""
        pointer = None
        if isinstance(command, ActionCommand):
            pointer = self._pointer(command)  # checked before anything changes
            if command.expression is not None or command.say is not None:
                self._apply_controls(s, command)
            try:
                s.apply_action(command, self.backend.key_action(command.keys), receipt_ns,
                               pointer)
            except ValueError as exc:
                raise InvalidCommand("keys", str(exc)) from None
        elif isinstance(command, PromptCommand):
            self.apply_prompt(s, command)
        elif isinstance(command, SettingsCommand):
            self._apply_settings(s, command, receipt_ns)
        elif isinstance(command, ForkCommand):
            self._fork(s, command, receipt_ns)
        elif isinstance(command, AdoptCommand):
            self._adopt(s, command)
        elif isinstance(command, RewindCommand):
            self._rewind(s, command)
        self._log_command(s, command, pointer)

    def _pointer(self, command: ActionCommand) -> tuple[float, float] | None:
        """The action's pointer motion, checked (InvalidCommand ``pointer`` for a bad value),
        when the backend's ``action_space`` takes mouse input; None otherwise (v1: a world
        without mouse input ignores a pointer)."""
        if command.pointer is None:
            return None
        try:
            pointer = check_pointer(command.pointer)
        except ValueError as exc:
            raise InvalidCommand("pointer", str(exc)) from None
        return pointer if self.info.mouse else None

    def _log_command(self, s: Session, c: Command,
                     pointer: tuple[float, float] | None = None) -> None:
        """Append an applied command to the session's input log (an action older than the
        newest one applied was ignored: not logged), with the pointer motion it added."""
        applied: dict[str, Any] = {}
        if isinstance(c, ActionCommand) and s.action_seq != c.seq:
            return
        if pointer is not None:
            applied = {"pointer": pointer}
        if isinstance(c, SettingsCommand):
            applied = {"chunk_frames": s.chunk_frames, "steps": s.steps,
                       **{k: getattr(c, k) for k in ("memory_frames", "attention")
                          if getattr(c, k) is not None}}
        elif isinstance(c, ForkCommand):
            applied = {"fork_id": s.fork_id}
        s.inputs.command(c, s.chunk_index, s.frame_index, applied=applied)

    def _apply_controls(self, s: Session, command: ActionCommand) -> None:
        """A world's own controls carried by an action (the avatar's expression and speech),
        through the backend's ``apply_controls`` (:class:`WorldControls`), which checks both
        before applying either."""
        field = "expression" if command.expression is not None else "say"
        if not isinstance(self.backend, WorldControls):
            raise InvalidCommand(field, f"{field} is not supported by model "
                                        f"{self.model_name!r}", code="unsupported")
        try:
            self.backend.apply_controls(s.state, expression=command.expression,
                                        say=command.say)
        except ValueError as exc:
            raise InvalidCommand(field, str(exc)) from None
        s.inputs.controls(s.chunk_index, s.frame_index, expression=command.expression,
                          say=command.say)

    def apply_prompt(self, s: Session, command: PromptCommand) -> None:
        """Switch the prompt of ``s`` (a story beat uses it too); InvalidCommand for a bad one."""
        try:
            check_prompt(command.text)
        except ValueError as exc:
            raise InvalidCommand("text", str(exc)) from None
        if command.blend_text is not None:
            try:
                check_prompt(command.blend_text)
            except ValueError as exc:
                raise InvalidCommand("blend", f"blend {exc}") from None
        weight = command.blend_weight
        if not isinstance(weight, int | float) or not 0.0 <= weight <= 1.0:
            raise InvalidCommand("blend", f"blend weight must be in [0, 1], got {weight!r}")
        try:
            self.backend.set_prompt(s.state, command.text, command.blend_text, float(weight))
        except ValueError as exc:  # e.g. a prompt the model's text encoder refuses
            raise InvalidCommand("text", str(exc)) from None
        s.prompt = command.text
        s.prompt_version += 1

    def _apply_settings(self, s: Session, c: SettingsCommand, now_ns: int) -> None:
        cfg = self.config
        if c.mode is not None:
            if c.mode not in MODES:
                raise InvalidCommand("mode", f"mode must be one of {sorted(MODES)}, "
                                              f"got {c.mode!r}")
            chunk, steps = mode_settings(c.mode, self.chunk_sizes, self.config.min_steps)
            c = replace(c, chunk_frames=c.chunk_frames or chunk, steps=c.steps or steps)
        checks = {
            "steps": (c.steps, 1, MAX_STEPS),
            "chunk_frames": (c.chunk_frames, 1, MAX_CHUNK_FRAMES),
            "fps": (c.fps, cfg.min_fps, cfg.max_fps),
            "memory_frames": (c.memory_frames, MIN_MEMORY_FRAMES, MAX_MEMORY_FRAMES),
        }
        for name, (value, low, high) in checks.items():
            if value is not None and (not is_int(value) or not low <= value <= high):
                raise InvalidCommand(name, f"{name} must be an int in [{low}, {high}], "
                                            f"got {value!r}")
        if c.chunk_frames is not None and c.chunk_frames not in self.chunk_sizes:
            raise InvalidCommand("chunk_frames", f"model {self.model_name!r} generates chunks "
                                                  f"of {list(self.chunk_sizes)} frames, "
                                                  f"got {c.chunk_frames}", code="unsupported")
        if c.attention is not None and not isinstance(c.attention, str):
            raise InvalidCommand("attention", f"attention must be a string, got {c.attention!r}")
        model_settings = {k: v for k, v in (("memory_frames", c.memory_frames),
                                            ("attention", c.attention)) if v is not None}
        if model_settings:
            # these reach the model through Configurable; a backend without it reports them
            # as unsupported
            if not isinstance(self.backend, Configurable):
                field = next(iter(model_settings))
                raise InvalidCommand(field, f"{field} is not supported by model "
                                             f"{self.model_name!r}", code="unsupported")
            try:
                self.backend.configure(s.state, **model_settings)
            except ValueError as exc:
                raise InvalidCommand(next(iter(model_settings)), str(exc)) from None
        with self.lock:  # metrics() and latency_budget() read these
            if c.chunk_frames is not None or c.steps is not None:
                s.stats.gen_ms.clear()  # chunk time changes: plan from fresh measurements
            if c.chunk_frames is not None:
                s.chunk_frames = c.chunk_frames
            if c.mode is not None:
                s.mode = c.mode
            if c.steps is not None or c.fps is not None:
                s.degrade.set_requested(steps=c.steps, fps=c.fps)
                s.clock.set_fps(s.degrade.fps, now_ns)
        s.emit("info", seq=c.seq, mode=s.mode, chunk_frames=s.chunk_frames, steps=s.steps,
               fps=s.degrade.fps)

    def account(self, s: Session, delta: int) -> None:
        """Count ``delta`` backend states more (or fewer) for ``s`` against the budget."""
        with self.lock:
            self.budget.account(s, delta)

    def free_branches(self, s: Session, keep: int | None = None) -> None:
        """Free the fork's branch states (all, or all but ``keep``) and their budget."""
        branches, s.branches = s.branches, []
        for i, branch in enumerate(branches):
            if i != keep:
                self.backend.free(branch.state)
                self.account(s, -1)

    def _fork(self, s: Session, c: ForkCommand, receipt_ns: int) -> None:
        cfg = self.config
        if not is_int(c.k) or not 1 <= c.k <= cfg.max_fork:
            raise InvalidCommand("k", f"k must be an int in [1, {cfg.max_fork}], got {c.k!r}")
        self.free_branches(s)  # a new fork replaces the previous one
        no_room = CapacityError(f"the model's memory cannot hold {c.k} more branches now")
        with self.lock:
            if not self.budget.can_reserve(c.k):
                raise InvalidCommand("k", str(no_room), code="capacity")
        s.fork_id += 1
        s.fork_seq = c.seq
        try:
            for i in range(c.k):
                state = self.backend.fork(s.state)
                self.account(s, 1)
                s.branches.append(Branch(state=state, seed=derived_seed(s.seed, s.fork_id, i),
                                         chunks_left=cfg.preview_chunks, requested_ns=receipt_ns))
        except CapacityError as exc:
            self.free_branches(s)
            raise InvalidCommand("k", str(exc), code="capacity") from None
        except Exception:
            self.free_branches(s)
            raise

    def _adopt(self, s: Session, c: AdoptCommand) -> None:
        if not s.branches:
            raise InvalidCommand("branch", "there is no fork to adopt a branch of")
        if not is_int(c.branch) or not 0 <= c.branch < len(s.branches):
            raise InvalidCommand("branch", f"branch must be in [0, {len(s.branches)}), "
                                            f"got {c.branch!r}")
        adopted = s.branches[c.branch]
        self.free_branches(s, keep=c.branch)
        old, s.state = s.state, adopted.state
        self.backend.free(old)
        self.account(s, -1)  # the adopted branch's state counts in place of the old one
        s.emit("info", seq=c.seq, adopted=c.branch, fork_id=s.fork_id)

    def _rewind(self, s: Session, c: RewindCommand) -> None:
        if not is_int(c.chunks) or not 1 <= c.chunks <= self.rewind_chunks:
            raise InvalidCommand("chunks", f"chunks must be an int in [1, "
                                            f"{self.rewind_chunks}], got {c.chunks!r}")
        try:
            self.backend.rewind(s.state, c.chunks)
        except ValueError as exc:
            raise InvalidCommand("chunks", str(exc)) from None
        s.emit("info", seq=c.seq, rewound=c.chunks)
