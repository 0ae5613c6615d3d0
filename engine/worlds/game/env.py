"""A Gymnasium environment as a deterministic game: made by id, snapshotted, replayed.

``GameEnv`` wraps any env with image observations and a discrete action space: ``ALE/Pong-v5``
(ale-py), ``VizdoomBasic-v1`` (vizdoom), ``CrafterReward-v1`` (crafter), any id registered
with Gymnasium, or ``module:factory`` for a user's own env. Settings that make an env a function
of its seed and actions are the default (ALE: no sticky actions, a fixed frame skip).
"""

from __future__ import annotations

import copy
import functools
import importlib
import sys
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from worldstream.engine.worlds.game.frames import scale_frame

#: env id prefix -> keyword arguments that make its episodes a function of seed and actions
DETERMINISTIC: dict[str, dict[str, Any]] = {
    "ALE/": {"repeat_action_probability": 0.0, "frameskip": 4, "full_action_space": False},
    "Vizdoom": {"frame_skip": 4},
}
#: the longest episode (actions) of a game that sets no limit of its own: ALE's cap of 108,000
#: frames, the longest any shipped game plays
MAX_EPISODE_ACTIONS = 108_000
#: observation dict keys that hold the screen, in the order they are looked for
_IMAGE_KEYS = ("pixels", "screen", "image", "rgb", "observation")


class GameEnvError(ValueError):
    """An env id or env that cannot be a game world; the message names what is expected."""


def _register_plugins() -> None:
    """Register the game packages that are installed (each is optional)."""
    try:
        import ale_py
        gym.register_envs(ale_py)
    except ImportError:
        pass
    try:
        import vizdoom.gymnasium_wrapper  # noqa: F401  (registers the Vizdoom* ids)
    except ImportError:
        pass
    if "CrafterReward-v1" not in gym.registry:
        gym.register("CrafterReward-v1", entry_point="worldstream.engine.worlds.game."
                     "crafter_env:make_crafter")
        gym.register("CrafterNoReward-v1", entry_point="worldstream.engine.worlds.game."
                     "crafter_env:make_crafter", kwargs={"reward": False})


_PACKAGE_FOR = {"ALE/": "ale-py", "Vizdoom": "vizdoom", "Crafter": "crafter"}


class OldApiEnv(gym.Env):
    """A gym-0.21-style env (``reset() -> obs``, ``step -> (obs, r, done, info)``) seen through
    Gymnasium's API; crafter is one."""

    def __init__(self, env: Any, meanings: list[str] | None = None):
        self.env = env
        self.action_space = gym.spaces.Discrete(int(env.action_space.n))
        shape = tuple(int(s) for s in env.observation_space.shape)
        self.observation_space = gym.spaces.Box(0, 255, shape, np.uint8)
        self.meanings = meanings

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if seed is not None and hasattr(self.env, "_seed"):
            self.env._seed = seed  # crafter seeds its world generator from this attribute
            if hasattr(self.env, "_episode"):
                self.env._episode = 0  # and its count of resets: a world is its seed's alone
        return self.env.reset(), {}

    def step(self, action: int):
        obs, reward, done, info = self.env.step(action)
        return obs, reward, bool(done), False, info

    def get_action_meanings(self) -> list[str]:
        return list(self.meanings or [str(i) for i in range(self.action_space.n)])

    def close(self) -> None:
        pass


def _one_line(what: Any) -> str:
    """An exception's (or a space's) text as one line (a package's message may hold the id's
    newlines, numpy prints long bounds on several lines)."""
    return " ".join(str(what).split()) or type(what).__name__


def _from_factory(env_id: str) -> Any:
    """The env of ``module:factory``, named on the command line (files never name one:
    ``registry.model_of_file``). Only a module path and a name are accepted, never Python's
    own modules, a ``__main__`` or private module (importing ``numpy.f2py.__main__`` runs
    f2py's command line) or a private name, and only a factory defined in the module's package
    is called (not ``os.fork`` re-exported by it); what it returns must be an env."""
    module_name, _, factory = env_id.partition(":")
    if not (factory.isidentifier() and all(p.isidentifier() for p in module_name.split("."))):
        raise GameEnvError(f"env {env_id!r}: expected module:factory (a dotted module path and "
                           "the name of a function or class in it)")
    private = next((p for p in (*module_name.split("."), factory) if p.startswith("_")), None)
    if private is not None:
        raise GameEnvError(f"env {env_id!r}: {private} is a private or __main__ name (importing "
                           "it may run a program); expected module:factory of your own env")
    top = module_name.split(".")[0]
    if top in sys.stdlib_module_names or top in sys.builtin_module_names:
        raise GameEnvError(f"env {env_id!r}: {top} is part of Python, not an env's module; "
                           "expected module:factory of your own env")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise GameEnvError(f"env {env_id!r}: cannot import module {module_name!r} "
                           f"({_one_line(exc)}); expected module:factory") from exc
    except Exception as exc:  # the module itself failed while importing
        raise GameEnvError(f"env {env_id!r}: importing {module_name} failed: "
                           f"{_one_line(exc)}") from exc
    make = getattr(module, factory, None)
    if not callable(make):
        raise GameEnvError(f"env {env_id!r}: {module_name} has no callable {factory!r}")
    home = getattr(make, "__module__", None)
    if not isinstance(home, str) or home.split(".")[0] != top:
        raise GameEnvError(f"env {env_id!r}: {factory} is not defined in {top} (it is "
                           f"{home!r}'s); name the module that defines the env's factory")
    try:
        env = make()
        if hasattr(env, "observation_space") and _new_api(env):
            return env
        return OldApiEnv(env)
    except (Exception, SystemExit) as exc:
        raise GameEnvError(f"env {env_id!r}: {module_name}.{factory}() did not make an env "
                           f"({type(exc).__name__}: {_one_line(exc)})") from exc


def _vizdoom_config_in_cache(env: Any) -> None:
    """ViZDoom writes its engine's config (``_vizdoom.ini``) where it is told, by default the
    working folder at the game's first start: point it at the user's cache folder instead."""
    import os
    from pathlib import Path

    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "worldstream"
    cache.mkdir(parents=True, exist_ok=True)
    env.unwrapped.game.set_doom_config_path(str(cache / "_vizdoom.ini"))


def _make_raw(env_id: str) -> Any:
    if not isinstance(env_id, str) or not env_id.strip():
        raise GameEnvError(f"an env id must be a non-empty string, got {env_id!r}")
    if ":" in env_id and "/" not in env_id.split(":")[0]:
        return _from_factory(env_id)
    _register_plugins()
    kwargs = next((dict(v) for k, v in DETERMINISTIC.items() if env_id.startswith(k)), {})
    try:
        env = gym.make(env_id, **kwargs)
        if env_id.startswith("Vizdoom"):
            _vizdoom_config_in_cache(env)
        return env
    except gym.error.Error as exc:
        package = next((p for k, p in _PACKAGE_FOR.items() if env_id.startswith(k)), None)
        hint = (f" (is {package} installed? pip install {package})" if package else
                "; expected a Gymnasium id such as ALE/Pong-v5 or module:factory")
        raise GameEnvError(f"unknown env id {env_id!r}{hint}: {_one_line(exc)}") from exc
    except Exception as exc:  # a ROM or data file the env's package lacks, and the like
        raise GameEnvError(f"env {env_id!r} failed to start: {_one_line(exc)}") from exc


def _new_api(env: Any) -> bool:
    return isinstance(env, gym.Env) or isinstance(getattr(env, "unwrapped", None), gym.Env)


def _image_key(space: Any, env_id: str) -> str | None:
    """The dict key holding the screen (None when the observation is the screen itself);
    GameEnvError when no observation is an ``(H, W, 3)`` image."""
    def is_image(s: Any) -> bool:
        shape = getattr(s, "shape", None)
        return shape is not None and len(shape) == 3 and shape[2] == 3 and shape[0] >= 8

    if isinstance(space, gym.spaces.Dict):
        for key in _IMAGE_KEYS:
            if key in space.spaces and is_image(space.spaces[key]):
                return key
    elif is_image(space):
        return None
    raise GameEnvError(f"env {env_id!r} has no image observation (got {_one_line(space)}); a "
                       "game world needs (H, W, 3) RGB frames")


@dataclass(frozen=True)
class Snapshot:
    """A game as it was: the episode's seed and actions (always enough to replay it), the
    env's native state where it has one (ALE), and the frame it showed. ``actions`` is a
    read-only 1-D int16/int32 array (:func:`compact_actions`): snapshots of one episode are
    views of one array, so a rewind history costs bytes per action, not objects."""

    seed: int
    actions: np.ndarray
    native: Any
    frame: np.ndarray
    done: bool


def action_dtype(num_actions: int) -> np.dtype:
    """The compact dtype of a game's action ids: int16, or int32 beyond 32,767 actions."""
    return np.dtype(np.int16 if num_actions <= 2**15 else np.int32)


def compact_actions(actions: Any, num_actions: int) -> np.ndarray:
    """``actions`` as a read-only 1-D array of :func:`action_dtype` (no copy where it is one
    already and read-only)."""
    arr = np.asarray(actions)
    dtype = action_dtype(num_actions)
    if arr.dtype != dtype or arr.ndim != 1 or arr.flags.writeable:
        arr = np.array(arr, dtype=dtype).reshape(-1)
        arr.flags.writeable = False
    return arr


class GameEnv:
    """One deterministic game.

    Args:
        env_id: a Gymnasium id or ``module:factory``.
        size: output frames are ``(size, size, 3)`` uint8 (``scale_frame``).
    Raises GameEnvError (a ValueError) for an unknown id, a missing package or ROM, an env
    without image observations or without a discrete action space.
    """

    def __init__(self, env_id: str, size: int = 64):
        if not isinstance(size, int) or not 8 <= size <= 512:
            raise GameEnvError(f"size must be an int in [8, 512], got {size!r}")
        self.env_id = env_id
        self.size = size
        self.env = _make_raw(env_id)
        try:
            if not isinstance(self.env.action_space, gym.spaces.Discrete):
                raise GameEnvError(f"env {env_id!r} has action space "
                                   f"{_one_line(self.env.action_space)}; a game world needs a "
                                   "discrete one (Discrete(n))")
            self._key = _image_key(self.env.observation_space, env_id)
            self.num_actions = int(self.env.action_space.n)
            self.action_meanings = tuple(_meanings(self.env))
            self._ale = getattr(self.env.unwrapped, "ale", None)
        except Exception as exc:  # not a game world: the env made is closed
            self.env.close()
            if isinstance(exc, GameEnvError):
                raise
            raise GameEnvError(f"env {env_id!r} cannot be a game world: "
                               f"{type(exc).__name__}: {_one_line(exc)}") from exc
        self.seed = 0
        # the episode's actions: the first ``_n`` of ``_buf`` (appended in place, handed out
        # as read-only views, never rewritten below ``_n``); after a restore, the snapshot's
        # own array until the next step copies it into a fresh buffer
        self._dtype = action_dtype(self.num_actions)
        self._buf = np.zeros(0, dtype=self._dtype)
        self._n = 0
        self._owned = True
        self.raw: np.ndarray | None = None
        self.frame: np.ndarray | None = None
        self.done = False
        #: the last step lost the player a ball (a life, or a point to the other side)
        self.setback = False
        self.lives: int | None = None
        #: the last step's reward (the score it added)
        self.reward = 0.0

    def _observe(self, obs: Any) -> np.ndarray:
        image = obs[self._key] if self._key is not None else obs
        self.raw = np.ascontiguousarray(np.asarray(image, dtype=np.uint8))
        self.frame = scale_frame(self.raw, self.size)
        return self.frame

    def reset(self, seed: int) -> np.ndarray:
        """Start the episode of ``seed``; its first frame ``(size, size, 3)`` uint8."""
        obs, _ = self.env.reset(seed=int(seed))
        self.seed, self.done = int(seed), False
        self.setback, self.lives, self.reward = False, None, 0.0
        self._set_actions(np.zeros(0, dtype=self._dtype))
        return self._observe(obs)

    @property
    def actions(self) -> np.ndarray:
        """The episode's actions so far: a read-only view (valid for good: later steps
        append past it, a reset or restore starts another array)."""
        view = self._buf[:self._n]
        view.flags.writeable = False
        return view

    def _set_actions(self, actions: np.ndarray) -> None:
        self._buf, self._n, self._owned = actions, len(actions), False

    def _append(self, action: int) -> None:
        n = self._n
        if not self._owned or n == len(self._buf):  # a shared array, or full: grow a copy
            cap = min(max(1024, 2 * n), max(self.max_episode_steps, n + 1))
            buf = np.empty(cap, dtype=self._dtype)
            buf[:n] = self._buf[:n]
            self._buf, self._owned = buf, True
        self._buf[n] = action
        self._n = n + 1

    def step(self, action: int) -> np.ndarray:
        """The frame after ``action``; ValueError (nothing changes) for an action outside
        ``[0, num_actions)``. After the episode ends (``done``) the env stays on its last
        frame: the caller resets."""
        if not isinstance(action, (int, np.integer)) or not 0 <= action < self.num_actions:
            raise ValueError(f"action must be an int in [0, {self.num_actions}), got {action!r}")
        if self.frame is None:
            raise RuntimeError("reset the game before stepping it")
        if self._n >= self.max_episode_steps:
            self.done = True  # no episode is longer (a save point holds no more actions)
        if self.done:
            return self.frame
        obs, reward, terminated, truncated, info = self.env.step(int(action))
        self._append(int(action))
        self.done = bool(terminated or truncated)
        lives = info.get("lives") if isinstance(info, dict) else None
        lives = int(lives) if isinstance(lives, int | np.integer) else None
        # a ball lost: a life gone, or a point to the other side (Pong has no lives)
        self.reward = float(reward)
        self.setback = (lives is not None and self.lives is not None and lives < self.lives) \
            or self.reward < 0
        self.lives = lives
        return self._observe(obs)

    def snapshot(self) -> Snapshot:
        """The game as it is now (cheap with ALE's native state; otherwise seed + actions)."""
        if self.frame is None:
            raise RuntimeError("reset the game before taking a snapshot")
        native = self._ale.cloneState(include_rng=True) if self._ale is not None else None
        if native is None and self._copyable():
            native = copy.deepcopy(self.env.unwrapped)
        return Snapshot(self.seed, self.actions, native, self.frame.copy(), self.done)

    @property
    def native_state(self) -> bool:
        """Whether snapshots hold the emulator's own state (ALE), not only seed and actions."""
        return self._ale is not None

    @property
    def copyable(self) -> bool:
        """Whether snapshots hold a copy of the env (pure Python: crafter), restored at once."""
        return self._copyable()

    @functools.cached_property
    def max_episode_steps(self) -> int:
        """The most actions one episode takes: the env's own limit (Gymnasium's time limit,
        ALE's frame cap over its frame skip, crafter's length), else MAX_EPISODE_ACTIONS (an
        episode ends there)."""
        spec = getattr(self.env, "spec", None)
        limit = getattr(spec, "max_episode_steps", None)
        kwargs = getattr(spec, "kwargs", None) or {}
        frames, skip = kwargs.get("max_num_frames_per_episode"), kwargs.get("frameskip", 1)
        if limit is None and isinstance(frames, int) and isinstance(skip, int) and skip >= 1:
            limit = -(-frames // skip)
        inner = getattr(self.env.unwrapped, "env", None)
        if limit is None and isinstance(getattr(inner, "_length", None), int):
            limit = inner._length  # crafter
        return min(int(limit), MAX_EPISODE_ACTIONS) if limit and limit > 0 else \
            MAX_EPISODE_ACTIONS

    def _copyable(self) -> bool:
        # pure-Python envs (crafter) deep-copy; native ones (vizdoom) replay from the seed
        return isinstance(self.env.unwrapped, OldApiEnv)

    def restore(self, snap: Snapshot) -> np.ndarray:
        """Back to ``snap``: the env continues exactly as it would have from there (also in
        a GameEnv never reset: a fork or a save point loaded into a fresh env)."""
        native = snap.native is not None and (self._ale is not None or self._copyable())
        if native and self.frame is None:
            if self._ale is None:  # the copy below replaces the whole game
                _mark_reset(self.env)
            else:
                self.env.reset(seed=int(snap.seed))  # Gymnasium refuses a step before a reset
        if self._ale is not None and snap.native is not None:
            self._ale.restoreState(snap.native)
        elif snap.native is not None and self._copyable():
            self.env.unwrapped.env = copy.deepcopy(snap.native.env)
        else:
            self.reset(snap.seed)
            for action in snap.actions.tolist():
                self.env.step(action)
        self.seed, self.done = snap.seed, snap.done
        self.setback, self.lives, self.reward = False, None, 0.0  # read from the next step
        self._set_actions(compact_actions(snap.actions, self.num_actions))
        self.frame = snap.frame.copy()
        return self.frame

    def close(self) -> None:
        self.env.close()


def _mark_reset(env: Any) -> None:
    """Tell Gymnasium's wrappers of ``env`` that it was reset. NOTE: a copyable game restored
    into a fresh env is replaced whole (its copy); the reset the wrappers ask first generated
    a crafter world for nothing (~1.2 s on the engine thread, at every fork)."""
    while env is not None:
        if hasattr(env, "_has_reset"):  # OrderEnforcing
            env._has_reset = True
        for name in ("checked_reset", "checked_step", "checked_data_reuse"):
            if hasattr(env, name):  # PassiveEnvChecker: its first-call checks are done
                setattr(env, name, True)
        inner = getattr(env, "env", None)
        env = inner if inner is not env else None


def _meanings(env: Any) -> list[str]:
    """Action names: ALE's and crafter's own, ViZDoom's buttons, or the indices."""
    unwrapped = env.unwrapped
    if hasattr(unwrapped, "get_action_meanings"):
        return [str(m) for m in unwrapped.get_action_meanings()]
    game = getattr(unwrapped, "game", None)
    n = int(env.action_space.n)
    if game is not None and hasattr(game, "get_available_buttons"):
        buttons = [str(b).split(".")[-1] for b in game.get_available_buttons()]
        # the vizdoom wrapper's Discrete space: 0 = no button, then one button each
        if n == len(buttons) + 1:
            return ["NOOP", *buttons]
        if n == len(buttons):
            return buttons
    return [str(i) for i in range(n)]
