"""Save-point state of a game world's env backend (``game-sim:ENV``): the env's snapshot now and
before each chunk of the rewind history.

Arrays per snapshot ``P`` (``now``, ``history.0`` ... oldest first): ``P.frame`` ``(S, S, 3)``
uint8, ``P.actions`` ``(n,)`` int32 (the episode's actions so far) and, for an env with a
native state (ALE's ``cloneState``), ``P.native`` ``(m,)`` uint8 (its serialized bytes).
Scalars: the session seed, and per snapshot its episode seed, episode index and ``done``. An
env without a native state is restored by replaying its episode's actions from its seed.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import numpy as np

from worldstream.engine.core.helpers import run_in_child
from worldstream.engine.core.limits import MAX_SEED
from worldstream.engine.studio.savepoint import SavepointError


def _snapshot_parts(prefix: str, snap: Any, episode: int,
                    arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    arrays[f"{prefix}.frame"] = np.ascontiguousarray(snap.frame, dtype=np.uint8)
    arrays[f"{prefix}.actions"] = np.asarray(snap.actions, dtype=np.int32).reshape(-1)
    native = snap.native
    if native is not None and hasattr(native, "serialize"):  # ALE
        arrays[f"{prefix}.native"] = np.frombuffer(native.serialize(), dtype=np.uint8).copy()
    return {"seed": int(snap.seed), "episode": int(episode), "done": bool(snap.done)}


def export_game(state: Any) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """``(arrays, scalars)`` of a :class:`~engine.backends.game.sim.GameState`."""
    arrays: dict[str, np.ndarray] = {}
    now = _snapshot_parts("now", *state.snapshot(), arrays)
    history = [_snapshot_parts(f"history.{i}", snap, episode, arrays)
               for i, (snap, episode) in enumerate(state.history)]
    return arrays, {"seed": int(state.seed), "now": now, "history": history}


#: the largest emulator state read (ALE's is ~15 KB)
MAX_NATIVE_BYTES = 2**20
#: the most env steps a load may replay, all snapshots together (a game without emulator
#: state in the file: crafter, ViZDoom, a module:factory env); crafter's longest episode
#: (10,000 steps, ~12 s) plus a little
MAX_REPLAY_STEPS = 12_000
_SNAPSHOT_FIELDS = frozenset({"seed", "episode", "done"})
_STATE_FIELDS = frozenset({"seed", "now", "history"})
_INT_DTYPES = frozenset({"U8", "I8", "U16", "I16", "U32", "I32", "I64"})
# one load replays at a time (each holds a core for up to seconds)
_replaying = threading.Lock()
#: the replaying process's niceness (Linux: 0-19, higher yields more): the sessions playing
#: come first
REPLAY_NICE = 10
#: the longest a save point's replay may take, s (MAX_REPLAY_STEPS of crafter: ~15 s on a
#: busy core); past it the process is killed and the load fails with HelperError
REPLAY_TIMEOUT_S = 90.0


def _int(value: Any, low: int, high: int | None = None) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low and (
        high is None or value < high)


def check_game(backend: Any, scalars: dict[str, Any],
               layout: dict[str, tuple[str, tuple[int, ...]]]) -> None:
    """The state's scalars and arrays (``layout``: name -> (dtype, shape), from the file's
    header) against ``backend``'s game, before any array is decoded: known fields only, ids
    and counts in range, each episode's actions no more than the game plays in one, an
    emulator state exactly where the game has one. SavepointError (one line) otherwise."""
    unknown = sorted(set(scalars) - _STATE_FIELDS)
    history = scalars.get("history")
    if unknown or not isinstance(history, list) or not _int(scalars.get("seed"), 0,
                                                            MAX_SEED + 1):
        raise SavepointError(f"the save point's state needs a seed in [0, 2**63), a history "
                             f"list, a snapshot now and nothing else (unknown: {unknown[:3]})")
    if len(history) > backend.rewind_chunks:
        raise SavepointError("the save point keeps more rewind history than this server")
    prefixes = ["now", *(f"history.{i}" for i in range(len(history)))]
    expected: set[str] = set()
    for prefix, meta in zip(prefixes, [scalars.get("now"), *history], strict=True):
        if not isinstance(meta, dict) or set(meta) != _SNAPSHOT_FIELDS or \
                not _int(meta["seed"], 0, 2**31) or not _int(meta["episode"], 0, 2**31) or \
                not isinstance(meta["done"], bool):
            raise SavepointError(f"the save point's snapshot {prefix} is {meta!r:.200}; a seed "
                                 "in [0, 2**31), an episode in [0, 2**31) and done (a bool) "
                                 "expected")
        size = backend.size
        if layout.get(f"{prefix}.frame") != ("U8", (size, size, 3)):
            raise SavepointError(f"the save point's {prefix}.frame is "
                                 f"{layout.get(f'{prefix}.frame')}; this game streams "
                                 f"({size}, {size}, 3) uint8")
        dtype, shape = layout.get(f"{prefix}.actions", (None, ()))
        if dtype not in _INT_DTYPES or len(shape) != 1 or \
                shape[0] > backend.max_episode_actions:
            raise SavepointError(f"the save point's {prefix}.actions are {dtype} {shape}; an "
                                 f"episode of {backend.env_id} is at most "
                                 f"{backend.max_episode_actions} actions")
        expected |= {f"{prefix}.frame", f"{prefix}.actions"}
        native = layout.get(f"{prefix}.native")
        if backend.native_state:
            if native is None:  # dropped by hand: it would replay every action
                raise SavepointError(f"the save point's snapshot {prefix} lacks the emulator "
                                     "state")
            if native[0] != "U8" or len(native[1]) != 1 or native[1][0] > MAX_NATIVE_BYTES:
                raise SavepointError(f"the save point's {prefix}.native is {native}; an "
                                     f"emulator state is at most {MAX_NATIVE_BYTES} bytes")
            expected.add(f"{prefix}.native")
    unknown = sorted(set(layout) - expected)
    if unknown:
        raise SavepointError(f"the save point has arrays this game does not keep: "
                             f"{unknown[:3]!r:.200}")


def _snapshot_from(prefix: str, meta: dict[str, Any], arrays: dict[str, np.ndarray],
                   backend: Any, actions: np.ndarray) -> tuple[Any, int]:
    from worldstream.engine.worlds.game.env import Snapshot

    frame = arrays[f"{prefix}.frame"]
    native = None
    if f"{prefix}.native" in arrays:
        import ale_py

        native = ale_py.ALEState(arrays[f"{prefix}.native"].tobytes())
    snap = Snapshot(int(meta["seed"]), actions, native, frame.copy(), bool(meta["done"]))
    return snap, int(meta["episode"])


def _episodes(backend: Any, seeds: list[int], saved: list[np.ndarray]) -> list[np.ndarray]:
    """Each snapshot's actions as one compact read-only array per episode (the snapshots of
    one seed whose actions are a prefix of the longest are views of its array): a rewind
    history of n snapshots costs one episode's bytes, not n lists of ints. SavepointError
    for an action the game does not have."""
    from worldstream.engine.worlds.game.env import action_dtype

    out: list[np.ndarray | None] = [None] * len(saved)
    heads: list[int] = []
    for i in sorted(range(len(saved)), key=lambda i: -len(saved[i])):
        a = saved[i]
        head = next((h for h in heads if seeds[h] == seeds[i] and
                     np.array_equal(saved[h][:len(a)], a)), None)
        if head is None:
            if a.size and not 0 <= a.min() <= a.max() < backend.num_actions:
                raise SavepointError(f"the save point's actions are not actions of "
                                     f"{backend.env_id}")
            heads.append(i)
            # NOTE: always a copy: ``a`` is a view of the whole save file's bytes
            # (savepoint.decode), which a kept view would hold for the state's life
            kept = np.array(a, dtype=action_dtype(backend.num_actions))
            kept.flags.writeable = False
            out[i] = kept
        else:
            out[i] = out[head][:len(a)]
    return out  # type: ignore[return-value]


def _layout(arrays: dict[str, np.ndarray]) -> dict[str, tuple[str, tuple[int, ...]]]:
    names = {np.dtype(np.uint8): "U8", np.dtype(np.int8): "I8", np.dtype(np.uint16): "U16",
             np.dtype(np.int16): "I16", np.dtype(np.uint32): "U32",
             np.dtype(np.int32): "I32", np.dtype(np.int64): "I64"}
    return {k: (names.get(v.dtype, str(v.dtype)), tuple(v.shape)) for k, v in arrays.items()}


def import_game(backend: Any, arrays: dict[str, np.ndarray], scalars: dict[str, Any]) -> Any:
    """A new state of ``backend`` continuing the saved game exactly. SavepointError for more
    history than the backend keeps or contents that do not fit its game. A game without an
    emulator state in the file is replayed here (at most MAX_REPLAY_STEPS steps): call it off
    the engine thread (``savestate.prepare_import`` does)."""
    check_game(backend, scalars, _layout(arrays))
    prefixes = ["now", *(f"history.{i}" for i in range(len(scalars["history"])))]
    metas = [scalars["now"], *scalars["history"]]
    actions = _episodes(backend, [int(m["seed"]) for m in metas],
                        [arrays[f"{p}.actions"] for p in prefixes])
    (snap, episode), *history = [_snapshot_from(p, m, arrays, backend, a)
                                 for p, m, a in zip(prefixes, metas, actions, strict=True)]
    native = backend.native_state
    with _replaying:
        if not native:
            snap, history = _replayed(backend, snap, history)
        state = backend.state_from(scalars["seed"], episode, snap, history)
    try:
        if native:
            _check_history(state, snap, history)
    except BaseException:
        backend.free(state)
        raise
    return state


def _replayed(backend: Any, now: Any, history: list[tuple[Any, int]]
              ) -> tuple[Any, list[tuple[Any, int]]]:
    """The snapshots of a game without emulator state in the file, replayed once per chain of
    snapshots of one episode (each a prefix of the longest), at most MAX_REPLAY_STEPS steps
    together, in a child process (:func:`_replay`); where the env keeps copies of itself
    (crafter) each snapshot gets one, so that neither this load nor a later rewind replays
    on the engine thread. SavepointError for too long a replay or actions that do not replay
    to the saved frames."""
    snaps = [now, *(h for h, _ in history)]
    steps = sum(len(snaps[h].actions) for h in set(_chains(snaps).values()))
    if steps > MAX_REPLAY_STEPS:
        raise SavepointError(f"the save point's game has no emulator state: loading it would "
                             f"replay {steps} steps; the limit is {MAX_REPLAY_STEPS}")
    if not backend.copyable:  # restored by replay in state_from
        return now, history
    # NOTE: not in this process: a pure-Python game (crafter: world generation, then every
    # step) held the GIL for seconds, and every other session's engine thread waited on it
    # (their frames stalled during loads). The child runs at a lower CPU priority and sends
    # back the snapshots (the env's copies pickled).
    out = run_in_child(_replay, backend.env_id, backend.size, snaps, nice=REPLAY_NICE,
                       timeout_s=REPLAY_TIMEOUT_S, what="the process replaying the save point")
    # the actions as sent: one episode's snapshots stay views of one array (_episodes)
    out = [dataclasses.replace(o, actions=s.actions) for o, s in zip(out, snaps, strict=True)]
    return out[0], [(snap, episode) for snap, (_, episode) in zip(out[1:], history,
                                                                   strict=True)]


def _chains(snaps: list[Any]) -> dict[int, int]:
    """Each snapshot's chain: the index of the longest snapshot of its episode whose actions
    start with its own."""
    heads: list[int] = []
    chain_of: dict[int, int] = {}
    for i in sorted(range(len(snaps)), key=lambda i: -len(snaps[i].actions)):
        s = snaps[i]
        head = next((h for h in heads if snaps[h].seed == s.seed and
                     np.array_equal(snaps[h].actions[:len(s.actions)], s.actions)), None)
        if head is None:
            heads.append(i)
            head = i
        chain_of[i] = head
    return chain_of


def _replay(env_id: str, size: int, snaps: list[Any]) -> list[Any]:
    """``snaps`` replayed in a ``GameEnv(env_id, size)`` (in the child process): each chain
    once, each snapshot's frame and ``done`` checked, each given the env's copy where it
    keeps one; unchanged where it does not (restored by replay in ``state_from``)."""
    from worldstream.engine.worlds.game.env import GameEnv

    chain_of = _chains(snaps)
    game = GameEnv(env_id, size=size)
    try:
        if not game.copyable:
            return snaps
        out = list(snaps)
        for head in sorted(set(chain_of.values())):
            wanted = {len(snaps[i].actions): i for i in chain_of if chain_of[i] == head}
            game.reset(snaps[head].seed)
            for n, action in enumerate((*snaps[head].actions.tolist(), None)):
                if n in wanted:
                    out[wanted[n]] = _same(game.snapshot(), snaps[wanted[n]])
                if action is not None:
                    if game.done:
                        raise SavepointError("the save point's actions go on past the end of "
                                             "their episode")
                    game.step(action)
    finally:
        game.close()
    return out


def _same(replayed: Any, saved: Any) -> Any:
    if replayed.done != saved.done or not np.array_equal(replayed.frame, saved.frame):
        raise SavepointError("the save point's actions do not replay to its frames (another "
                             "version of the game, or an edited file)")
    return replayed


def _check_history(state: Any, now: Any, history: list[tuple[Any, int]]) -> None:
    """Restore each emulator state of the history once (a rewind restores them later, on the
    engine thread, where a damaged one failed the session), then ``now`` again."""
    for i, (snap, _) in enumerate(history):
        try:
            state.game.restore(snap)
        except Exception as err:
            raise SavepointError(f"the save point's snapshot history.{i} is damaged "
                                 f"({type(err).__name__})") from None
    state.game.restore(now)


class GameEnvSaves:
    """Save points of a game played by its env (:class:`engine.core.backend.SavesState`):
    its import may replay the saved actions (a game without emulator state), so it runs off
    the engine thread."""

    imports_off_thread = True

    def export_state(self, state):
        return export_game(state)

    def check_saved(self, scalars, layout) -> None:
        check_game(self, scalars, layout)

    def import_state(self, arrays, scalars):
        return import_game(self, arrays, scalars)

    def hash_frames(self, h) -> None:
        self.hash_game(h)
