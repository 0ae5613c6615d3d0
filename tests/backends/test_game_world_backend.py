"""GameWorldBackend (``--env ID --model-path DIR``): a trained game world behind the WorldBackend
contract. Its frames are the model's own rollout from the real game's start; determinism,
batching, rewind and fork exactness, per-job errors, and the registry's refusals."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from tests.fixtures.game_world import tiny_world_folder
from tests.fixtures.tiny_game import TINY
from worldstream.engine.backends.game.world import GameWorldBackend, start_action
from worldstream.engine.core.backend import ChunkJob
from worldstream.engine.core.registry import (
    BackendUnavailableError,
    backend_id,
    env_backend_id,
    load_backend,
)
from worldstream.engine.models.game.world import WorldFolderError, frame_draws, load_world
from worldstream.engine.worlds.game.env import GameEnv

#: chunks of 1-3 frames of the tiny game's actions (0 idle, 1 left, 2 right)
CHUNKS = [[2], [2, 2], [1, 0, 1], [0], [1, 1], [2, 0, 2], [0, 0], [1]]


@pytest.fixture(scope="module")
def folder():
    return tiny_world_folder()


@pytest.fixture(scope="module")
def backend(folder):
    backend = GameWorldBackend(env=TINY, path=folder, rewind_chunks=4)
    yield backend
    backend.close()


def _run(backend, state, chunks):
    frames = []
    for actions in chunks:
        (result,) = backend.generate([ChunkJob(state, list(actions), 1)])
        assert result.error is None, result.error
        assert set(result.stages_ms) == {"predict", "decode"}
        frames.append(result.frames)
    return np.concatenate(frames)


def _reference(folder, seed, actions, bf16):
    """The model's own rollout, computed here: the game reset with the session's seed and
    stepped ``context - 1`` times with the start action, then ``next_frame`` frame by frame,
    frame ``k``'s outcome drawn from ``frame_draws(seed, k)``."""
    world = load_world(folder)
    game = GameEnv(TINY, size=world.size)
    start = start_action(world.action_meanings)
    frames = [game.reset(seed)] + [game.step(start) for _ in range(world.context - 1)]
    context = torch.from_numpy(world.palette.encode(np.stack(frames)).astype(np.int64))[None]
    held = [start] * (world.context - 1)
    out = []
    assert world.samples  # the fixture's world draws outcomes: the draws are checked too
    for k, action in enumerate(actions):
        u = frame_draws(np.array([seed]), np.array([k]), world.draws)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            nxt = world.next_frame(context, torch.tensor([[*held, action]]), u)
        out.append(world.palette.decode(nxt[0].numpy()))
        context = torch.cat([context[:, 1:], nxt[:, None]], 1)
        held = [*held[1:], action]
    return np.stack(out)


def test_frames_are_the_models_own_rollout_from_the_games_start(backend, folder):
    state = backend.new_state("ignored: a game has no prompt", 5)
    got = _run(backend, state, CHUNKS)
    actions = [a for chunk in CHUNKS for a in chunk]
    assert got.shape == (len(actions), 16, 16, 3) and got.dtype == np.uint8
    assert np.array_equal(got, _reference(folder, 5, actions, backend.bf16))
    assert len({f.tobytes() for f in got}) > len(got) // 2  # frames change (no frozen copy)
    # the same seed and keys again: the same frames; another seed: another game
    assert np.array_equal(got, _run(backend, backend.new_state("x", 5), CHUNKS))
    assert not np.array_equal(got, _run(backend, backend.new_state("x", 6), CHUNKS))


@pytest.mark.parametrize("batch_invariant", [True, False])
def test_sessions_batched_give_the_frames_of_each_alone(folder, batch_invariant):
    backend = GameWorldBackend(env=TINY, path=folder, batch_invariant=batch_invariant)
    alone = [_run(backend, backend.new_state("x", s), CHUNKS) for s in (1, 2)]
    states = [backend.new_state("x", s) for s in (1, 2)]
    together = [[], []]
    for i, actions in enumerate(CHUNKS):
        # the second session's chunks are shorter: frame positions with one row and with two
        other = [(a + 1) % 3 for a in actions][: max(1, len(actions) - i % 2)]
        results = backend.generate([ChunkJob(states[0], actions, 1),
                                    ChunkJob(states[1], other, 1)])
        together[0].append(results[0].frames)
        together[1].append(results[1].frames)
    assert np.array_equal(np.concatenate(together[0]), alone[0])
    second = _run(backend, backend.new_state("x", 2),
                  [[(a + 1) % 3 for a in c][: max(1, len(c) - i % 2)]
                   for i, c in enumerate(CHUNKS)])
    assert np.array_equal(np.concatenate(together[1]), second)
    backend.close()


def test_rewind_and_fork_are_exact(backend):
    state = backend.new_state("x", 7)
    _run(backend, state, CHUNKS[:2])
    later = _run(backend, state, CHUNKS[2:5])
    backend.rewind(state, 3)
    assert np.array_equal(_run(backend, state, CHUNKS[2:5]), later)
    with pytest.raises(ValueError, match="can rewind 1..4"):
        backend.rewind(state, 5)  # 4 chunks of history kept
    branch = backend.fork(state)
    assert np.array_equal(_run(backend, branch, CHUNKS[5:]), _run(backend, state, CHUNKS[5:]))
    # each goes its own way; the original continues as if no branch had been made
    _run(backend, branch, [[1], [1, 1]])
    mine = _run(backend, state, [[2], [0, 2]])
    alone = _run(backend, backend.new_state("x", 7), [*CHUNKS, [2], [0, 2]])
    assert np.array_equal(alone[-3:], mine)
    backend.rewind(branch, 1)  # a branch keeps the history it was forked with
    backend.free(branch)
    backend.free(branch)  # idempotent
    with pytest.raises(ValueError, match="freed"):
        backend.rewind(branch, 1)


def test_a_bad_job_fails_alone_and_leaves_its_state(backend):
    good, bad = backend.new_state("x", 1), backend.new_state("x", 2)
    before = bad.frames
    results = backend.generate([ChunkJob(good, [0, 1], 1), ChunkJob(bad, [0, 9], 1)])
    assert results[0].error is None and results[0].frames.shape == (2, 16, 16, 3)
    assert isinstance(results[1].error, ValueError) and "[0, 3)" in str(results[1].error)
    assert bad.frames is before and not bad.history
    with pytest.raises(ValueError, match="no text prompt"):
        backend.set_prompt(good, "a snowy forest")


def test_keys_come_from_the_folder_or_the_command_line(folder, tmp_path, backend):
    assert backend.wire_keys == ("left", "right")
    assert backend.key_action(frozenset({"left"})) == 1
    assert backend.controls["keys"]["ArrowLeft"] == "left"
    mine = tmp_path / "world"
    shutil.copytree(folder, mine)
    (mine / "keymap.json").write_text(json.dumps(
        {"keys": {"KeyJ": "back", "KeyL": "ahead"}, "actions": {"back": "LEFT",
                                                                "ahead": "RIGHT"}}))
    from_folder = GameWorldBackend(env=TINY, path=mine)
    assert from_folder.wire_keys == ("ahead", "back")
    assert from_folder.key_action(frozenset({"back"})) == 1
    override = tmp_path / "keys.json"
    override.write_text(json.dumps({"keys": {"KeyF": "go"}, "actions": {"go": "RIGHT"}}))
    assert GameWorldBackend(env=TINY, path=mine, keymap=str(override)).wire_keys == ("go",)
    # the key map decides frames: a save from another key map is another model version
    assert from_folder.frame_version() != backend.frame_version()


def test_the_registry_plays_a_folder_and_refuses_the_wrong_one(folder, tmp_path):
    name = env_backend_id(TINY, "builtin")
    assert name == f"game-builtin:{TINY}" and backend_id("pong", "builtin") == \
        "game-builtin:ALE/Pong-v5"
    loaded = load_backend(name, model_path=str(folder))
    assert isinstance(loaded, GameWorldBackend) and loaded.name == name
    loaded.close()
    other = tmp_path / "other"
    shutil.copytree(folder, other)
    meta = json.loads((other / "world.json").read_text())
    (other / "world.json").write_text(json.dumps({**meta, "env": "ALE/Pong-v5"}))
    with pytest.raises(WorldFolderError, match="world of 'ALE/Pong-v5', not"):
        load_backend(name, model_path=str(other))
    with pytest.raises(BackendUnavailableError, match=r"train with `worldstream train --env "):
        load_backend(name, model_path=str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="needs --model-path DIR"):
        load_backend(name)
    with pytest.raises(ValueError, match="takes no --model-path"):
        load_backend(env_backend_id(TINY, "sim"), model_path=str(folder))


def test_a_named_game_worlds_shipped_folder_holds_its_weights():
    from worldstream.engine.backends.game.world import shipped_folder

    assert (shipped_folder("ALE/Pong-v5") / "unet" / "config.json").is_file()
    assert (shipped_folder("ALE/Breakout-v5") / "world.json").is_file()
    assert shipped_folder("ALE/Freeway-v5") is None
