"""The game recipe on a tiny game: it trains, resumes bit-exactly, saves a loadable world, and
its evaluation reports every metric beside a sound ground-truth twin."""

import dataclasses
import json
import shutil

import pytest
import torch

from tests.fixtures.tiny_game import TINY
from worldstream.engine.evaluation.game import metrics as gm
from worldstream.engine.evaluation.game.evaluate import GameEvalConfig, evaluate
from worldstream.engine.models.game.world import WorldFolderError, load_world
from worldstream.engine.training.game import train as game
from worldstream.engine.training.game.card import write_card
from worldstream.engine.training.game.data import ClipSampler
from worldstream.engine.training.game.train import GameTrainConfig, train


def _cfg(out, data=""):
    return GameTrainConfig(env=TINY, out=str(out), data=data, record_frames=600, size=16,
                           steps=6, batch=4, channels=(8, 16), checkpoint_every=2,
                           workers=1, threads=1)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny-world")
    world = train(_cfg(out), progress=False)
    return out, world


def test_train_writes_a_world_folder_that_loads(trained):
    out, world = trained
    assert (out / "unet" / "config.json").exists() and (out / "data" / "meta.json").exists()
    assert (out / "keymap.json").exists()
    loaded = load_world(out, env_id=TINY)
    assert loaded.palette.colours.tolist() == world.palette.colours.tolist()
    info = json.loads((out / "training.json").read_text())
    assert info["frames"] >= 600 and info["colours"] == 3
    with pytest.raises(WorldFolderError, match="not 'ALE/Pong-v5'"):
        load_world(out, env_id="ALE/Pong-v5")


def _on_sample(monkeypatch, n: int, hook):
    """``hook()`` as the ``n``-th clip batch is drawn (in step ``n``); the real sampler."""
    calls = {"n": 0}
    real = ClipSampler.sample

    def sample(self, batch):
        calls["n"] += 1
        if calls["n"] == n:
            hook()
        return real(self, batch)

    monkeypatch.setattr(ClipSampler, "sample", sample)
    return real


def test_an_interrupted_run_resumes_to_the_same_weights(trained, tmp_path, monkeypatch):
    data = str(trained[0] / "data")
    whole = train(_cfg(tmp_path / "a", data), progress=False)
    def crash():
        raise KeyboardInterrupt

    real = _on_sample(monkeypatch, 4, crash)  # a crash in step 4: no checkpoint at it
    with pytest.raises(KeyboardInterrupt):
        train(_cfg(tmp_path / "b", data), progress=False)
    monkeypatch.setattr(ClipSampler, "sample", real)
    resumed = train(_cfg(tmp_path / "b", data), progress=False)
    for p, q in zip(whole.unet.parameters(), resumed.unet.parameters(), strict=True):
        assert torch.equal(p, q)


def test_a_signal_stops_after_the_step_in_flight_with_its_checkpoint(trained, tmp_path,
                                                                     monkeypatch):
    """SIGTERM mid-run (a session's end): the step in flight finishes, the checkpoint holds
    it (not the last multiple of checkpoint_every), and the same command resumes to the
    uninterrupted run's weights; the handlers are given back."""
    import os
    import signal

    data = str(trained[0] / "data")
    whole = train(_cfg(tmp_path / "a", data), progress=False)
    before = signal.getsignal(signal.SIGTERM)
    # during step 3 of 6 (checkpoints every 2)
    real = _on_sample(monkeypatch, 3, lambda: os.kill(os.getpid(), signal.SIGTERM))
    with pytest.raises(game.Stopped) as stopped:
        train(_cfg(tmp_path / "b", data), progress=False)
    assert stopped.value.step == 3 and stopped.value.signum == signal.SIGTERM
    assert torch.load(tmp_path / "b" / "checkpoint.pt", weights_only=False)["step"] == 3
    assert not (tmp_path / "b" / "training.json").exists()
    assert signal.getsignal(signal.SIGTERM) is before
    monkeypatch.setattr(ClipSampler, "sample", real)
    resumed = train(_cfg(tmp_path / "b", data), progress=False)
    for p, q in zip(whole.unet.parameters(), resumed.unet.parameters(), strict=True):
        assert torch.equal(p, q)


def test_learning_curve_snapshots_are_worlds_with_their_own_record(trained, tmp_path):
    """Each curve step's EMA world loads, and says which weights it holds, so its card (and
    its rebuild chain: the run's own command) is written as for the run's last weights."""
    data = str(trained[0] / "data")
    out = tmp_path / "c"
    train(dataclasses.replace(_cfg(out, data), curve=(2, 4, 6)), progress=False)
    snaps = sorted(p.name for p in (out / "curve").iterdir())
    assert snaps == ["step-000002", "step-000004"]  # the last step is the run's own folder
    for name, steps in (("step-000002", 2), ("step-000004", 4)):
        snap = out / "curve" / name
        assert load_world(snap, env_id=TINY).env_id == TINY
        record = json.loads((snap / "training.json").read_text())
        assert record["config"]["steps"] == 6 and record["step"] == steps
        assert len(record["loss_per_100"]) == 1
        assert f"at step {steps} of this 6-step run" in record["weights"]
        card = write_card(snap).read_text()
        assert record["weights"] in card and "--set steps=6" in card
    assert "weights" not in json.loads((out / "training.json").read_text())


def test_evaluation_reports_the_table_with_sound_twins(trained):
    out, world = trained
    cfg = GameEvalConfig(episodes=2, length=80, effect_states=2, free_play=120)
    result, (model_frames, env_frames) = evaluate(world, cfg)
    for key in ("teacher_forced_psnr_db", "changed_psnr_db", "rollout_psnr_db_16",
                "rollout_psnr_db_64", "copylast_psnr_db_16", "copylast_psnr_db_64",
                "action_effect_corr", "action_effect_corr_4", "off_palette_share",
                "change_rate_ratio"):
        assert key in result
    assert result["gt_changed_psnr_db"] == gm.PSNR_CAP
    assert result["gt_action_effect_corr"] == 1.0 and result["gt_action_effect_corr_4"] == 1.0
    assert result["gt_off_palette_share"] == 0.0
    assert result["off_palette_share"] == 0.0  # palette decoding: only the game's colours
    assert model_frames.shape == env_frames.shape == (124, 16, 16, 3)
    (out / "eval.json").write_text(json.dumps(result))
    card = write_card(out).read_text()
    assert "changed pixels (dB) |" in card and len(card.splitlines()) <= 100


def test_a_changed_recipe_does_not_resume_an_old_checkpoint(trained, tmp_path):
    data = str(trained[0] / "data")
    train(_cfg(tmp_path / "c", data), progress=False)
    cfg = _cfg(tmp_path / "c", data)
    cfg.lr = 0.5
    with pytest.raises(ValueError, match="another recipe .*lr"):
        game.train(cfg, progress=False)
    # moved to another folder, run on another number of threads: the same recipe, resumed
    shutil.copytree(tmp_path / "c", tmp_path / "moved")
    moved = dataclasses.replace(_cfg(tmp_path / "moved", data), threads=2)
    before = torch.load(tmp_path / "moved" / "checkpoint.pt", weights_only=False)["step"]
    game.train(moved, progress=False)
    assert torch.load(tmp_path / "moved" / "checkpoint.pt", weights_only=False)["step"] == before


def test_retired_settings_load_at_todays_value_and_name_their_commit_otherwise(trained,
                                                                              tmp_path):
    """A folder, checkpoint or record written while ``flow_steps`` / ``latent_prior`` existed
    (``unet.RETIRED``) holds them at their off values: it loads, plays the same frames,
    resumes and gets its chain; any other value is refused naming the commit with the code."""
    import shutil

    from worldstream.engine.training.game.card import chain

    out, world = trained
    older = tmp_path / "older"
    shutil.copytree(out, older, ignore=shutil.ignore_patterns("data", "checkpoint.pt"))
    config = json.loads((older / "unet" / "config.json").read_text())
    (older / "unet" / "config.json").write_text(json.dumps(
        {**config, "flow_steps": 0, "latent_prior": False}))
    frames = torch.randint(0, len(world.palette), (2, world.context, 16, 16))
    actions = torch.randint(0, 3, (2, world.context))
    assert torch.equal(load_world(out).next_frame(frames, actions),
                       load_world(older).next_frame(frames, actions))
    record = json.loads((out / "training.json").read_text())
    record["config"] |= {"flow_steps": 0}
    assert chain(record, out) == chain(json.loads((out / "training.json").read_text()), out)
    (older / "unet" / "config.json").write_text(json.dumps({**config, "flow_steps": 3}))
    with pytest.raises(WorldFolderError, match="flow_steps=3.*commit d42b936"):
        load_world(older)
    record["config"] |= {"flow_steps": 3}
    with pytest.raises(ValueError, match="flow_steps=3.*commit d42b936"):
        chain(record, out)
    # the checkpoint of a run started before the removal resumes (here: already finished)
    data = str(out / "data")
    train(_cfg(tmp_path / "r", data), progress=False)
    ckpt = tmp_path / "r" / "checkpoint.pt"
    state = torch.load(ckpt, weights_only=False)
    state["config"] |= {"flow_steps": 0}
    torch.save(state, ckpt)
    train(_cfg(tmp_path / "r", data), progress=False)


def test_the_saved_folder_plays_the_same_frames_as_the_trained_world(trained):
    out, world = trained
    loaded = load_world(out)
    frames = torch.randint(0, len(world.palette), (3, world.context, 16, 16))
    actions = torch.randint(0, 3, (3, world.context))
    assert all(p.dtype == torch.float32 for p in loaded.unet.parameters())
    assert torch.equal(world.next_frame(frames, actions), loaded.next_frame(frames, actions))


def test_context_corruption_only_moves_pixels_within_a_frame():
    from worldstream.engine.training.game.train import corrupt_context

    gen = torch.Generator().manual_seed(0)
    context = torch.zeros(64, 4, 16, 16, dtype=torch.long)
    context[:, :, 5, 5] = 1  # one object pixel a frame
    context[:, 2] += 2  # frame 2 holds colours 2 and 3 only
    assert torch.equal(corrupt_context(context, 0.0, gen), context)
    out = corrupt_context(context, 0.5, gen)
    assert set(out[:, 2].unique().tolist()) <= {2, 3}
    changed = (out != context).flatten(1).any(1)
    assert 10 < int(changed.sum()) < 54  # about half the clips are corrupted


@pytest.mark.parametrize("text", ["{", "[]", '{"env": 3}', '{"env": "x", "size": "big"}'])
def test_a_damaged_world_json_is_one_clear_error(trained, tmp_path, text):
    import shutil

    folder = tmp_path / "w"
    shutil.copytree(trained[0], folder, ignore=shutil.ignore_patterns("data", "*.pt"))
    (folder / "world.json").write_text(text)
    with pytest.raises(WorldFolderError, match="damaged") as err:
        load_world(folder)
    assert "\n" not in str(err.value)
