"""``worldstream eval``'s as-played part: a learned game world and the game itself from the
reset frame a session starts at, driven by one action sequence a person would press, judged on
what a player sees. No per-game code: what the keys move, where the score is and what counts
as a serve are found from the game itself.

For each policy (``taps``: presses of 0.2-0.6 s with gaps and FIRE every 2-5 s; ``recording``:
the recording's player) and each of ``seeds`` sessions, the game starts as a session does
(reset with ``episode_seed(seed, 0)``, then the start action ``context - 1`` times: the model's
context), then both play ``seconds * fps`` frames of the same actions. The player watches the
game (FIRE after the game's lost balls); the game resets at its game over (transitions into a
reset are not judged), the model plays on. The model draws each frame's outcome from the
session's seed and the frame's index, as the backend does.

Frames here are palette indices ``(rows, T, H, W)`` uint8 (the world's palette); ``T`` counts
the ``context`` start frames, and transition ``t`` is frame ``t -> t + 1``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from worldstream.engine.evaluation.game import objects as go
from worldstream.engine.models.game.world import GameWorld, frame_draws
from worldstream.engine.worlds.game.env import GameEnv
from worldstream.engine.worlds.game.policy import RECORDING, TAPS, Player, PlayStyle

#: session seeds of the as-played part: far from every recorded and held-out episode's seed
PLAYED_SEED = 1_500_000
#: the players: name -> style
POLICIES: dict[str, PlayStyle] = {"taps": TAPS, "recording": RECORDING}
#: a colour class "moves in the game" from this many moving objects per frame
MOVING_CLASS = 0.02
#: frames a cleared pixel must stay background to count (a ball passing is not a break)
CLEARED_FOR = 15
#: frames in a row of a cleared pixel's first colour that say it was not cleared (a ball
#: crossing a hole shows it for one or two)
BACK_FOR = 3


@dataclass
class PlayedConfig:
    seeds: int = 8
    """Sessions per policy."""
    seconds: float = 60.0
    """Play per session (s)."""
    fps: int = 15
    """Game frames per second (an Atari game at frame skip 4)."""
    policies: tuple[str, ...] = ("taps", "recording")
    """Players (``POLICIES``)."""
    seed: int = 0
    """Which set of sessions (their seeds are ``PLAYED_SEED + 100 * seed + i``)."""
    probes: int = 32
    """Game states the objects the keys move are found from."""


@dataclass
class Plays:
    """One policy's sessions. ``model``, ``game``: ``(rows, T, H, W)`` uint8 palette indices;
    ``judged``: ``(rows, T - 1)`` bool, the game's transitions of play (not into a reset, not
    among the start frames); ``rewards``: ``(rows, T - 1)`` float, the game's reward on each;
    ``seeds``: ``(rows,)`` the sessions' seeds; ``start``: the first judged transition (the
    last start frame to the first played one)."""

    model: np.ndarray
    game: np.ndarray
    judged: np.ndarray
    rewards: np.ndarray
    seeds: np.ndarray
    start: int
    snapshots: list
    """Game states along the plays (``GameEnv.Snapshot``), where the keys' objects are found."""


def session_seeds(cfg: PlayedConfig) -> np.ndarray:
    return PLAYED_SEED + 100 * cfg.seed + np.arange(cfg.seeds)


def _start_action(game: GameEnv) -> int:
    from worldstream.engine.backends.game.world import start_action

    return start_action(game.action_meanings)


def play_game(game: GameEnv, seed: int, style: PlayStyle, frames: int, context: int,
              policy_index: int, snapshot_every: int = 0):
    """The game's side of one session: its frames (RGB, ``context + frames``), the actions
    after each frame but the last, whether each transition is play (not into a reset, not a
    start frame's), each transition's reward, and a snapshot every ``snapshot_every`` played
    frames (0: none)."""
    from worldstream.engine.backends.game.sim import episode_seed

    player = Player(game.action_meanings, np.random.default_rng([seed, policy_index, 72]),
                    style)
    start = _start_action(game)
    shown = [game.reset(episode_seed(seed, 0))]
    actions, judged, rewards, snaps = [], [], [], []
    for _ in range(context - 1):
        shown.append(game.step(start))
        actions.append(start)
        judged.append(False)
        rewards.append(game.reward)
    episode = 0
    for t in range(frames):
        if snapshot_every and t % snapshot_every == snapshot_every // 2 and not game.done:
            snaps.append(game.snapshot())
        action = player()
        actions.append(action)
        shown.append(game.step(action))
        rewards.append(game.reward)
        judged.append(True)
        if game.setback:
            player.setback()
        if game.done:
            episode += 1
            shown[-1] = game.reset(episode_seed(seed, episode))
            player.reset()
            judged[-1] = False
    return shown, actions, judged, rewards, snaps


def play_model(world: GameWorld, start: np.ndarray, actions: np.ndarray,
               seeds: np.ndarray) -> np.ndarray:
    """The model's side: ``start`` ``(rows, context, H, W)`` palette indices, ``actions``
    ``(rows, A)`` (the action after each frame; the first ``context - 1`` are the start's)
    -> ``(rows, context + A - context + 1, H, W)`` uint8: the start frames, then one frame per
    later action, frame ``k`` drawn with ``frame_draws(seed, k)``."""
    from worldstream.engine.models.device import cpu_has_fast_bf16

    c = world.context
    context = torch.from_numpy(start.astype(np.int64))
    acts = torch.from_numpy(actions.astype(np.int64))
    out = [start]
    for k in range(actions.shape[1] - c + 1):
        u = frame_draws(seeds, np.full(len(seeds), k), world.draws) if world.samples else None
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16,
                                             enabled=cpu_has_fast_bf16()):
            nxt = world.next_frame(context, acts[:, k:k + c], u)
        out.append(nxt.numpy().astype(np.uint8)[:, None])
        context = torch.cat([context[:, 1:], nxt[:, None]], 1)
    return np.concatenate(out, 1)


def play(world: GameWorld, game: GameEnv, cfg: PlayedConfig, policy: str) -> Plays:
    """Both sides of ``cfg.seeds`` sessions of ``policy``."""
    c, n = world.context, int(round(cfg.seconds * cfg.fps))
    index = tuple(POLICIES).index(policy)
    seeds = session_seeds(cfg)
    every = max(1, n * cfg.seeds // max(cfg.probes, 1))
    games, acts, judged, rewards, snaps = [], [], [], [], []
    for seed in seeds:
        shown, a, j, r, s = play_game(game, int(seed), POLICIES[policy], n, c, index, every)
        games.append(world.palette.encode(np.stack(shown)))
        acts.append(a)
        judged.append(j)
        rewards.append(r)
        snaps += s
    game_idx = np.stack(games)
    model_idx = play_model(world, game_idx[:, :c], np.asarray(acts), seeds)
    return Plays(model_idx, game_idx, np.asarray(judged, bool), np.asarray(rewards, float),
                 seeds, c - 1, snaps)


# ------------------------------------------------------------------ found from the game
@dataclass
class Controlled:
    """What the keys move: ``locus`` ``(H, W)`` bool, the pixels where the actions make the
    frame differ; ``colours`` the palette indices drawn there; ``enough`` the pixels of those
    colours on the locus that count as the object shown (half the game's usual count)."""

    locus: np.ndarray
    colours: np.ndarray
    enough: int

    def shown(self, frames: np.ndarray) -> np.ndarray:
        """``(..., H, W)`` palette indices -> ``(...)`` bool: the object is on the frame."""
        on = np.isin(frames, self.colours) & self.locus
        return on.reshape(*frames.shape[:-2], -1).sum(-1) >= self.enough


def find_controlled(world: GameWorld, game: GameEnv, plays: Plays) -> Controlled | None:
    """From the game states of ``plays``: each action held 4 frames from the state; pixels
    where the branches differ in at least 10 % of the states that show a difference are the
    locus; the colours (not the frame's background) drawn on the differing pixels in at least
    20 % of the most drawn one's count are the object's. None where no action changes
    anything."""
    hits = np.zeros(plays.game.shape[2:], np.int64)
    states, colour_count = 0, np.zeros(len(world.palette), np.int64)
    for snap in plays.snapshots:
        branch = []
        for a in range(game.num_actions):
            frame = game.restore(snap)
            for _ in range(4):
                frame = game.step(a)
            branch.append(world.palette.encode(frame))
        branch_a = np.stack(branch)
        differ = (branch_a != branch_a[:1]).any(0)
        if not differ.any():
            continue
        states += 1
        hits += differ
        bg = go.background(branch_a)
        for b, frame in enumerate(branch_a):
            drawn = frame[differ]
            colour_count += np.bincount(drawn[drawn != bg[b]], minlength=len(world.palette))
    if states == 0 or colour_count.sum() == 0:
        return None
    locus = hits >= max(1, 0.1 * states)
    colours = np.flatnonzero(colour_count >= 0.2 * colour_count.max())
    counts = (np.isin(plays.game, colours) & locus).reshape(*plays.game.shape[:2], -1).sum(-1)
    judged = plays.judged.copy()
    judged[:, :plays.start] = False
    usual = np.median(counts[:, 1:][judged])
    return Controlled(locus, colours, max(1, int(usual // 2)))


def score_band(plays: Plays) -> np.ndarray:
    """``(H, W)`` bool: the pixels that change when the game scores (within 2 frames of a
    reward, in at least 30 % of the rewards) and not more often otherwise; empty where the
    game gave no reward."""
    change = plays.game[:, 1:] != plays.game[:, :-1]  # (rows, T-1, H, W)
    near = np.zeros(plays.rewards.shape, bool)
    events = 0
    for lag in range(3):
        hit = np.zeros(plays.rewards.shape, bool)
        hit[:, lag:] = plays.rewards[:, :plays.rewards.shape[1] - lag] != 0
        near |= hit
    events = int((plays.rewards != 0).sum())
    if events == 0:
        return np.zeros(plays.game.shape[2:], bool)
    judged = plays.judged[..., None, None]
    at_reward = (change & near[..., None, None] & judged).sum((0, 1))
    otherwise = (change & ~near[..., None, None] & judged).sum((0, 1))
    return (at_reward >= 0.3 * events) & (otherwise <= at_reward)


def score_changes(frames: np.ndarray, judged: np.ndarray, band: np.ndarray) -> int:
    """Times the score band changes: judged transitions that change a band pixel after at
    least 3 that did not (a digit redrawn over a few frames is one change)."""
    if not band.any():
        return 0
    moved = ((frames[:, 1:] != frames[:, :-1]) & band).any((-2, -1)) & judged
    count = 0
    for row in moved:
        quiet = 3
        for m in row:
            count += bool(m and quiet >= 3)
            quiet = 0 if m else quiet + 1
    return count


def cleared(frames: np.ndarray, judged: np.ndarray, start: int,
            left_out: np.ndarray | None = None) -> int:
    """Pixels an episode's first judged frame draws (not its background) that turned into
    the background for ``CLEARED_FOR`` frames and never showed their first colour again for
    ``BACK_FOR`` frames in a row (bricks broken, enemies shot: a ball may cross the hole; a
    paddle that left its first place and comes back was not cleared), counted at the episode's
    end, summed over rows and episodes. ``left_out`` (``(H, W)`` bool): pixels not judged
    (where the keys' object lives: a paddle that vanishes broke nothing; the score band: a
    digit redrawn is no brick)."""
    total = 0
    skip = np.zeros(frames.shape[2:], bool) if left_out is None else left_out
    for frame, ok in zip(frames, judged, strict=True):
        segments, first = [], start
        for t in range(start, len(ok)):
            if not ok[t]:  # into a reset: a new episode from t + 1
                segments.append((first, t))
                first = t + 1
        segments.append((first, len(frame) - 1))
        for a, b in segments:
            if b - a < CLEARED_FOR:
                continue
            seg = frame[a:b + 1]
            bg = go.background(seg[:1])[0]
            drawn = (seg[0] != bg) & ~skip
            gone_run = np.zeros(seg.shape[1:], np.int64)
            back_run = np.zeros(seg.shape[1:], np.int64)
            gone = np.zeros(seg.shape[1:], bool)
            back = np.zeros(seg.shape[1:], bool)
            for f in seg:
                gone_run = np.where(f == bg, gone_run + 1, 0)
                gone |= gone_run >= CLEARED_FOR
                back_run = np.where(gone & (f == seg[0]), back_run + 1, 0)
                back |= back_run >= BACK_FOR
            total += int((drawn & gone & ~back).sum())
    return total


# ------------------------------------------------------------------ the figures
def class_motion(frames: np.ndarray, judged: np.ndarray, colours: int,
                 objects: go.Objects | None = None) -> np.ndarray:
    """``(colours,)`` float: how far each colour class moves, px per judged frame.

    ``frames``: ``(T, H, W)`` palette indices of one played sequence; ``judged``: ``(T - 1,)``
    bool. On each transition a class's *moving pixels* are those of its moving objects; its
    displacement on a judged transition is how far the centre of its moving pixels went since
    the transition before, where both have some (a formation that marches moves its centre by
    its step; one held still or flickering in place, by nothing). The sum over the judged
    transitions, divided by their count. ``objects``: the sequence's moving objects where
    already found.
    """
    if objects is None:
        objects = go.moving_objects(frames[:-1], frames[1:])
    on = objects.labels > 0
    t, y, x = np.nonzero(on)
    c = frames[1:][on].astype(np.int64)
    n = len(frames) - 1
    key = t * colours + c
    count = np.bincount(key, minlength=n * colours).reshape(n, colours)
    cy = np.bincount(key, y, minlength=n * colours).reshape(n, colours)
    cx = np.bincount(key, x, minlength=n * colours).reshape(n, colours)
    with np.errstate(invalid="ignore", divide="ignore"):
        cy, cx = cy / count, cx / count
    step = np.hypot(cy[1:] - cy[:-1], cx[1:] - cx[:-1])  # transition t+1 against t
    both = (count[1:] > 0) & (count[:-1] > 0) & judged[1:, None]
    total = np.where(both, step, 0.0).sum(0)
    return total / max(int(judged.sum()), 1)


def _ratio(model: float, game: float) -> float:
    return model / game if game > 0 else float("nan")


def worst(ratios) -> float:
    """The ratio farthest from 1 (in log terms; 0 counts as 1e-3) of the finite ones; ``nan``
    with none."""
    finite = [r for r in ratios if isinstance(r, float | int) and r == r]
    return float(max(finite, key=lambda r: abs(np.log(max(r, 1e-3))))) if finite \
        else float("nan")


def _first_births(frames: np.ndarray, judged: np.ndarray, start: int, fps: int,
                  seconds: float, keys: np.ndarray | None) -> tuple[float, int]:
    """Mean seconds from the first played frame to the first appearance that is not where
    the keys' object lives (``keys`` ``(H, W)`` bool; a paddle coming back is no serve), a
    row with none counting ``seconds``, and the rows with none."""
    times, never = [], 0
    for frame, ok in zip(frames, judged, strict=True):
        objects, born = go.appearing(frame)
        if keys is not None:
            born &= objects.any_at((objects.labels > 0) & ~keys[None])
        ok = ok.copy()
        ok[:start] = False
        at = np.sort(objects.frame[born & ok[objects.frame]])
        if len(at):
            times.append((at[0] - start) / fps)
        else:
            times.append(seconds)
            never += 1
    return float(np.mean(times)), never


def figures(plays: Plays, control: Controlled | None, band: np.ndarray, fps: int,
            seconds: float, colours: int) -> dict:
    """The as-played figures of one policy's ``plays`` (``played_*``, each with the game's
    own ``gt_played_*``; ratios are model / game)."""
    out: dict = {}
    rows = len(plays.model)
    judged = plays.judged.copy()
    judged[:, :plays.start] = False
    frames_judged = int(judged.sum())
    # moving objects per frame, per colour class
    sides = {"model": plays.model, "game": plays.game}
    found = {name: [go.moving_objects(f[:-1], f[1:]) for f in frames]
             for name, frames in sides.items()}  # found once: counted, then followed
    per = {}
    for name in sides:
        counts = np.zeros(colours)
        for objects, ok in zip(found[name], judged, strict=True):
            counts += np.bincount(objects.colour[ok[objects.frame]], minlength=colours)
        per[name] = counts / max(frames_judged, 1)
    moving = np.flatnonzero(per["game"] >= MOVING_CLASS)
    ratios = {int(k): _ratio(per["model"][k], per["game"][k]) for k in moving}
    out["played_objects_ratio"] = worst(ratios.values())
    out["played_objects_per_class"] = {str(k): [round(float(per["model"][k]), 4),
                                                round(float(per["game"][k]), 4)]
                                       for k in moving}
    # how far each moving class goes per frame (a formation that marches, a ball in play)
    motion = {name: sum(class_motion(f, ok, colours, o) * ok.sum() for f, ok, o in
                        zip(frames, judged, found[name], strict=True)) / max(frames_judged, 1)
              for name, frames in sides.items()}
    moves = {int(k): _ratio(motion["model"][k], motion["game"][k]) for k in moving}
    out["played_motion_ratio"] = worst(moves.values())
    out["played_motion_per_class"] = {str(k): [round(float(motion["model"][k]), 4),
                                               round(float(motion["game"][k]), 4)]
                                      for k in moving}
    # the objects the keys move: the share of frames that show them
    if control is not None:
        m = control.shown(plays.model[:, 1:])[judged].mean()
        g = control.shown(plays.game[:, 1:])[judged].mean()
        out |= {"played_control": float(m), "gt_played_control": float(g),
                "played_control_ratio": _ratio(m, g)}
    # births per 100 frames and the first birth (the serve)
    births = {}
    for name, frames in (("model", plays.model), ("game", plays.game)):
        total = sum(int((go.births(f)[ok]).sum()) for f, ok in zip(frames, judged, strict=True))
        births[name] = 100 * total / max(frames_judged, 1)
    out |= {"played_births_per_100": births["model"], "gt_played_births_per_100": births["game"],
            "played_births_ratio": _ratio(births["model"], births["game"])}
    keys = None if control is None else control.locus
    m_first, m_never = _first_births(plays.model, judged, plays.start, fps, seconds, keys)
    g_first, g_never = _first_births(plays.game, judged, plays.start, fps, seconds, keys)
    out |= {"played_first_birth_s": m_first, "gt_played_first_birth_s": g_first,
            "played_first_birth_never": m_never, "gt_played_first_birth_never": g_never}
    # the score band's changes
    if band.any():
        m = score_changes(plays.model, judged, band)
        g = score_changes(plays.game, judged, band)
        out |= {"played_score_changes": m / rows, "gt_played_score_changes": g / rows,
                "played_score_changes_ratio": _ratio(m, g)}
    # what play clears for good (bricks broken)
    left_out = band.copy()
    if keys is not None:
        left_out |= go.dilate(keys[None])[0]
    m, g = (cleared(f, judged, plays.start, left_out) for f in (plays.model, plays.game))
    out |= {"played_cleared_px": m / rows, "gt_played_cleared_px": g / rows,
            "played_cleared_ratio": _ratio(m, g) if g >= 4 * rows else float("nan")}
    return out


def evaluate_played(world: GameWorld, game: GameEnv, cfg: PlayedConfig | None = None
                    ) -> tuple[dict, dict[str, Plays]]:
    """The as-played figures per policy (``played_*`` keys of the first policy; every
    policy's under ``played_by_policy``; the worst of the policies for the headline ratios)
    and each policy's plays (for the sheet)."""
    cfg = cfg or PlayedConfig()
    by, plays = {}, {}
    control, band = None, None
    for policy in cfg.policies:
        p = play(world, game, cfg, policy)
        plays[policy] = p
        if control is None:
            control = find_controlled(world, game, p)
            band = score_band(p)
        by[policy] = figures(p, control, band, cfg.fps, cfg.seconds, len(world.palette))
    out: dict = {"played_seeds": cfg.seeds, "played_seconds": cfg.seconds,
                 "played_policies": list(cfg.policies),
                 "played_control_colours": [] if control is None else
                 control.colours.tolist(),
                 "played_score_band_px": int(band.sum()) if band is not None else 0}
    # headline: each figure over the policies, the one farthest from the game's
    for key in by[cfg.policies[0]]:
        values = [by[p].get(key) for p in cfg.policies]
        if key.endswith("_ratio"):
            out[key] = worst(values)
        elif isinstance(values[0], float | int):
            out[key] = float(np.mean([v for v in values if v is not None]))
    out["played_by_policy"] = by
    return out, plays
