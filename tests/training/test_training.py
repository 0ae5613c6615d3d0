"""Training plumbing on tiny data: noise-level sampling, frame feeding, resume, export; the
sampler against an oracle."""

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.fixtures.training import random_latent_data
from worldstream.engine.backends.sampler import denoise
from worldstream.engine.models.builtin.autoencoder import build_autoencoder
from worldstream.engine.models.builtin.camera_dynamics import CameraDynamics
from worldstream.engine.models.builtin.loading import load_autoencoder
from worldstream.engine.models.builtin.spatial_memory import centre_box
from worldstream.engine.models.builtin.world_dit import WorldDiT
from worldstream.engine.training.config import PRESETS, AEConfig, TrainConfig
from worldstream.engine.training.latents import VIEW_BOX, memory_bases
from worldstream.engine.training.recipe import (
    WorldPrediction,
    change_map,
    degrade_bases,
    sample_chunk_sigmas,
)
from worldstream.engine.training.train_ae import train_ae
from worldstream.engine.training.train_world import fit_camera_dynamics, train_world
from worldstream.engine.worlds.recorder import record_episode, record_shard


def test_chunk_sigmas_mix_diffusion_forcing_and_clean_context():
    sig = sample_chunk_sigmas(torch.Generator().manual_seed(0), 4000, 4, ctx_sigma_max=0.15,
                              p_context=0.9)
    assert sig.shape == (4000, 4) and (sig >= 0).all() and (sig <= 1).all()
    low = (sig <= 0.15).float().mean().item()
    # context rows (0.9) hold k ~ U{1,2,3} context chunks of 4: 0.9 * 0.5 = 0.45; the other
    # chunks are logit-normal, 4.1% of which fall below 0.15: + 0.55 * 0.041
    assert 0.44 < low < 0.51
    assert (sig[:, 0] <= 0.15).float().mean().item() > 0.88  # a row's first chunk: context


@pytest.mark.slow
def test_camera_dynamics_fitted_on_recorded_paths_predict_held_out_paths():
    """Fitted on 64 recorded episodes, the camera dynamics follow held-out episodes' camera
    (the simulator's ground truth) to within a few pixels over 64 frames."""
    torch.manual_seed(0)
    train = [record_episode(s, 64) for s in range(64)]
    cam = torch.as_tensor(np.stack([e["camera"] for e in train]))
    act = torch.as_tensor(np.stack([e["actions"] for e in train]), dtype=torch.int64)
    model = CameraDynamics(9)
    assert fit_camera_dynamics(model, cam, act, steps=200) < 1.0
    for seed in (900_001, 900_002, 900_003):
        held = record_episode(seed, 64)
        acts = torch.as_tensor(held["actions"], dtype=torch.int64)
        disp, _ = model.rollout(torch.zeros(2), acts)
        path = torch.cumsum(disp, 0)
        truth = torch.as_tensor(held["camera"] - held["camera"][0], dtype=torch.float32)
        err = (path - path[0] - truth).norm(dim=1)
        assert truth.norm(dim=1).max() > 40  # the episode moves: the test can fail
        assert err.max() < 3.0, (seed, err.max())


def test_memory_bases_replay_the_engines_reads():
    """Replayed bases: the first frame has nothing remembered; the second sees the first
    frame's pixels shifted by the camera's motion (sprite box excluded); later frames see
    remembered ground wherever their window overlaps earlier ones."""
    ep = record_episode(7, 12)
    frames, cam = ep["frames"], ep["camera"]
    assert (cam[1] != cam[0]).any() or (cam[5] != cam[0]).any()
    rgb, known = memory_bases(frames, cam, np.zeros(12, bool), chunk_frames=1)
    assert rgb.shape == frames.shape and known.shape == (12, 2, 32, 32)
    assert (rgb[0] == 128).all() and known[0].sum() == 0
    dx, dy = cam[1] - cam[0]
    ys, xs = slice(max(0, -dy), min(128, 128 - dy)), slice(max(0, -dx), min(128, 128 - dx))
    shifted = frames[0][ys.start + dy : ys.stop + dy, xs.start + dx : xs.stop + dx]
    box = centre_box(128, VIEW_BOX)
    keep = ~box[ys.start + dy : ys.stop + dy, xs.start + dx : xs.stop + dx]
    assert np.array_equal(rgb[1][ys, xs][keep], shifted[keep])
    assert known[1:, 1].sum() == 0  # no scene switch: nothing stale
    assert (known[1:, 0].mean(axis=(1, 2)) > 0.7).all()  # at most ~6 px of new ground a frame


def test_denoise_with_an_oracle_returns_the_data():
    x0 = torch.randn(2, 2, 4, 32, 32)
    for steps in (1, 2, 4):
        out = denoise(lambda x, s: x0, torch.randn_like(x0), steps)
        assert torch.allclose(out, x0, atol=1e-5)


def test_denoise_first_x0_stands_in_for_the_first_prediction():
    """``first_x0``: one prediction fewer, and the same sample as a predictor that returns
    the guess at σ = 1 (hand-worked for 2 steps: x at 0.5 = (g + ε) / 2, then x0(x, 0.5))."""
    g, eps = torch.randn(1, 2, 4, 8, 8), torch.randn(1, 2, 4, 8, 8)

    def model(x, s):  # any deterministic predictor
        return 0.5 * x + s

    for steps in (2, 3, 4):
        sigmas = []

        def spy(x, s, sigmas=sigmas):
            sigmas.append(s)
            return model(x, s)

        out = denoise(spy, eps, steps, shift=1.0, first_x0=g)
        assert len(sigmas) == steps - 1 and 1.0 not in sigmas
        want = denoise(lambda x, s: g if s == 1.0 else model(x, s), eps, steps, shift=1.0)
        assert torch.allclose(out, want, atol=1e-6)
    out = denoise(model, eps, 2, shift=1.0, first_x0=g)
    assert torch.allclose(out, model((g + eps) / 2, 0.5), atol=1e-6)
    with pytest.raises(ValueError, match="first_x0"):
        denoise(model, eps, 1, first_x0=g)


def test_train_world_resumes_and_exports(tmp_path):
    """A run resumes from its checkpoint, exports the EMA weights and its TrainConfig beside
    them; a posed, warped-skip model trains too."""
    data = random_latent_data()
    cfg = TrainConfig(batch=2, frames=4, chunk_frames=1, dim=32, depth=1, num_heads=1,
                      ckpt_every=1, export_every=100, camera_steps=5, steps=2)
    first = train_world(cfg, data, tmp_path / "out", tmp_path / "run")
    assert first["steps"] == 2
    again = train_world(TrainConfig(**{**cfg.__dict__, "steps": 3}), data, tmp_path / "out",
                        tmp_path / "run")
    assert again["steps"] == 3 and np.isfinite(again["final_loss"])
    model = WorldDiT.from_pretrained(tmp_path / "out")
    assert model.config.latent_mean is not None and len(model.config.latent_std) == 4
    assert model.config.view_box == VIEW_BOX
    assert model.camera.mlp[2].weight.abs().sum() > 0  # the camera dynamics were fitted
    assert TrainConfig.read(tmp_path / "out" / "train_config.json").steps == 3
    data.skip = data.base.clone()  # stands in for the warped pictures
    posed = train_world(TrainConfig(**{**cfg.__dict__, "skip_source": "warped",
                                       "pose_path": "head_rig_fit", "skip_prior": 1.0}),
                        data, tmp_path / "out2", tmp_path / "run2")
    assert np.isfinite(posed["final_loss"])
    assert WorldDiT.from_pretrained(tmp_path / "out2").config.skip_source == "warped"


@pytest.mark.parametrize("changes, field", [
    ({"frames": 5, "chunk_frames": 2}, "frames"), ({"lr": 0.0}, "lr"),
    ({"skip_source": "previous"}, "skip_source"), ({"pose_path": "head"}, "pose_path"),
    ({"skip_source": "warped"}, "skip_source"), ({"skip_prior": 1.0}, "skip_prior"),
    ({"p_onpolicy": 0.5}, "p_onpolicy"), ({"rollout_steps": 5}, "rollout_steps"),
    ({"world": "moon"}, "world"), ({"ctx_sigma_max": 1.0}, "ctx_sigma_max"),
])
def test_train_config_refuses_bad_settings_naming_the_field(changes, field):
    with pytest.raises(ValueError, match=f"TrainConfig.{field} must be"):
        TrainConfig(**changes)


def test_train_config_sets_parse_as_json_and_every_field_is_documented(tmp_path):
    from worldstream.engine.backends.settings import field_docs

    cfg = PRESETS["avatar-v2.7"].with_sets(["steps=10", "lr=1e-3", "init_from=null"])
    assert (cfg.steps, cfg.lr, cfg.init_from, cfg.pose_path) == (10, 1e-3, None, "head_rig_fit")
    with pytest.raises(ValueError, match="unknown setting 'loss'"):
        cfg.with_sets(["loss=l1"])
    with pytest.raises(ValueError, match="steps: expected an integer"):
        cfg.with_sets(["steps=many"])
    for cls in (TrainConfig, AEConfig):
        docs = field_docs(cls)
        assert list(docs) == [f.name for f in dataclasses.fields(cls)]
        assert all(docs.values())  # every field has its one-line doc
    assert TrainConfig.read(cfg.write(tmp_path)) == cfg


def test_ae_config_keeps_the_recipe_defaults_and_refuses_bad_settings_naming_the_field():
    """The defaults are the former ``train-ae`` flags' (the model cards' recipes rely on them)."""
    cfg = AEConfig()
    assert (cfg.steps, cfg.batch, cfg.lr, cfg.seed, cfg.decoder_only, cfg.init_from, cfg.loss,
            cfg.ema_decay, cfg.eval_every) == (2400, 16, 1e-3, 0, False, None, "l1+mse", None,
                                               250)
    for changes, field in (({"steps": 0}, "steps"), ({"batch": 0}, "batch"), ({"lr": 0.0}, "lr"),
                           ({"loss": "l2"}, "loss"), ({"ema_decay": 1.0}, "ema_decay")):
        with pytest.raises(ValueError, match=f"AEConfig.{field} must be"):
            AEConfig(**changes)


class _FakeWorld:
    def __init__(self, root):
        self.assets, self.root = root / "assets", root

    def ensure_dataset(self, data):
        return [self.root / "shard"], self.root / "held"


def test_train_ae_cli_passes_set_overrides_to_the_config(tmp_path, monkeypatch, capsys):
    from worldstream.app import cli, cmd_train_ae
    from worldstream.engine.training import train_ae as module

    seen = {}

    def fake_train_ae(shards, held, out, run_dir, cfg, *, max_minutes=None):
        seen.update(cfg=cfg, out=out, max_minutes=max_minutes)
        return {"steps": cfg.steps}

    monkeypatch.setattr(cmd_train_ae, "world", lambda name: _FakeWorld(tmp_path))
    monkeypatch.setattr(module, "train_ae", fake_train_ae)
    argv = ["train-ae", "--set", "decoder_only=true", "--set", "steps=3000", "--set",
            "batch=32", "--set", "lr=2e-4", "--set", "loss=mse", "--set", "ema_decay=0.999",
            "--max-minutes", "5"]
    assert cli.main(argv) == 0
    assert seen["cfg"] == AEConfig(decoder_only=True, steps=3000, batch=32, lr=2e-4,
                                   loss="mse", ema_decay=0.999)
    # the default --out is under the working folder, never the shipped assets/
    assert (seen["out"], seen["max_minutes"]) == (Path("runs/landscape/vae"), 5.0)
    assert cli.main(["train-ae"]) == 0 and seen["cfg"] == AEConfig()


@pytest.mark.parametrize("argv", [["train-ae"], ["train-world"], ["fit-colour-prior"],
                                  ["train", "--env", "ALE/Pong-v5"]])
def test_training_into_the_shipped_assets_needs_force(argv, capsys):
    """Nothing a user runs replaces what shipped: an --out inside assets/ is one line, exit 2,
    before any work (the checks run before data, models or envs are touched)."""
    from worldstream.app import cli
    from worldstream.engine.worlds.catalog import ASSETS

    out = {"train-ae": ASSETS / "builtin" / "vae",
           "train-world": ASSETS / "builtin" / "transformer",
           "fit-colour-prior": ASSETS / "builtin" / "colour_prior.json",
           "train": ASSETS / "pong"}[argv[0]]
    before = sorted(p.name for p in out.parent.iterdir())
    assert cli.main([*argv, "--out", str(out)]) == 2
    assert "inside the shipped assets/" in capsys.readouterr().err
    assert sorted(p.name for p in out.parent.iterdir()) == before


def test_force_lets_an_out_inside_assets_through():
    from worldstream.app.train_out import check_out
    from worldstream.engine.worlds.catalog import ASSETS

    assert check_out(ASSETS / "pong", force=True) == ASSETS / "pong"
    assert check_out(Path("runs/pong"), force=False) == Path("runs/pong")


@pytest.mark.parametrize("sets,named", [(["bogus=1"], "'bogus'"), (["steps=0"], "steps"),
                                        (["loss=l2"], "loss"), (["lr"], "field=value")])
def test_train_ae_cli_refuses_bad_settings_in_one_line(tmp_path, capsys, sets, named):
    from worldstream.app import cli

    argv = ["train-ae", "--data", str(tmp_path / "data"), "--run-dir", str(tmp_path / "run")]
    for item in sets:
        argv += ["--set", item]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert named in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "data").exists() and not (tmp_path / "run").exists()


@pytest.mark.parametrize("command,cls", [("train-ae", AEConfig), ("train-world", TrainConfig)])
def test_set_help_lists_every_field(capsys, command, cls):
    from worldstream.app import cli

    assert cli.main([command, "--set", "help"]) == 0
    out = capsys.readouterr().out
    listed = [line.split(" ")[0] for line in out.splitlines()
              if line and not line.startswith((" ", "settings", "presets"))]
    assert listed == [f.name for f in dataclasses.fields(cls)]


def test_presets_hold_the_shipped_recipes():
    """The presets are the model cards' command chains: the landscape's defaults and its
    change-weighted fine-tune, the avatar's depth-4 runs, on-policy fine-tune and fitted rig."""
    assert PRESETS["landscape"] == TrainConfig()
    assert (PRESETS["landscape"].ctx_sigma_max, PRESETS["landscape"].p_context) == (0.3, 0.9)
    assert PRESETS["landscape-v2.1"].change_weight == 4.0
    assert {PRESETS[n].depth for n in PRESETS if n.startswith("avatar")} == {4}
    onp = PRESETS["avatar-v2.2"]
    assert (onp.p_onpolicy, onp.refresh_every, onp.rollout_steps, onp.warmup) == (0.5, 700, 2, 50)
    fit = PRESETS["avatar-v2.7"]
    assert (fit.skip_source, fit.pose_path, fit.skip_prior) == ("warped", "head_rig_fit", 1.0)


def test_world_prediction_loss_hand_worked():
    """The weighted squared error: errors 1 and -3 at weights 1 and 3: (1 + 27) / 4."""
    pred = torch.tensor([1.0, -3.0]).view(1, 2, 1, 1, 1)
    weight = torch.tensor([1.0, 3.0]).view(1, 2, 1, 1, 1)
    p = WorldPrediction(pred, torch.zeros_like(pred), weight, None, None, None)
    assert p.loss().item() == 7.0


def test_degrade_bases_blurs_and_casts_only_the_chosen_frames():
    g = torch.Generator().manual_seed(0)
    zb = torch.randn(4, 8, 4, 32, 32, generator=g)
    assert torch.equal(degrade_bases(zb, g, 0.0), zb)
    out = degrade_bases(zb, g, 1.0)
    # a 3x3 box blur plus a per-channel constant: the Laplacian-like detail drops, the mean moves
    detail = lambda x: (x[..., 1:, :] - x[..., :-1, :]).pow(2).mean()  # noqa: E731
    assert detail(out) < 0.3 * detail(zb)
    half = degrade_bases(zb, torch.Generator().manual_seed(1), 0.5)
    changed = (half != zb).flatten(2).any(-1).float().mean().item()
    assert 0.3 < changed < 0.7


def test_change_map_weights_only_what_changed_against_the_base():
    # hand-worked: one latent pixel of 2 x 2 x 4 x 4 differs by 0.5 in every channel
    zb = torch.zeros(2, 2, 3, 4, 4)
    z = zb.clone()
    z[1, 0, :, 2, 3] = 0.5
    m = change_map(z, zb, cap=1000.0)
    assert m.shape == (2, 2, 1, 4, 4)
    # channel mean 0.5 at that pixel, batch mean 0.5 / 64: the map is 64 there, 0 elsewhere
    assert m[1, 0, 0, 2, 3].item() == 64.0
    assert m.sum().item() == 64.0
    assert change_map(z, zb).max().item() == 10.0  # capped
    assert torch.count_nonzero(change_map(zb, zb)) == 0  # no change, no extra weight


def test_decoder_only_ema_run_keeps_the_encoder_resumes_and_writes_its_config(tmp_path):
    shard = record_shard(tmp_path / "shard", [0, 1], 6)
    held = record_shard(tmp_path / "held", [2], 6)
    start = build_autoencoder(width=8)
    start.save_pretrained(tmp_path / "vae")
    cfg = AEConfig(steps=2, batch=2, decoder_only=True, loss="mse", ema_decay=0.9,
                   eval_every=1)
    first = train_ae([shard], held, tmp_path / "vae", tmp_path / "run", cfg)
    cfg = dataclasses.replace(cfg, steps=3)
    again = train_ae([shard], held, tmp_path / "vae", tmp_path / "run", cfg)
    assert first["steps"] == 2 and again["steps"] == 3
    ck = torch.load(tmp_path / "run" / "ae_checkpoint.pt", weights_only=False)
    assert ck["ema"]["optimization_step"] == 3  # the EMA was resumed, not restarted
    saved = load_autoencoder(tmp_path / "vae")
    for a, b in zip(saved.encoder.parameters(), start.encoder.parameters()):
        assert torch.equal(a, b)  # the latents a world model was trained on stay valid
    # the settings of the call that saved the weights, beside them (the decoder beat the start's)
    written = AEConfig.read(tmp_path / "vae" / "train_config.json")
    assert written in (cfg, dataclasses.replace(cfg, steps=2))
    # from init_from into a fresh folder: the start's encoder, the start saved until beaten
    cfg = AEConfig(steps=1, batch=2, decoder_only=True, init_from=str(tmp_path / "vae"),
                   eval_every=1)
    train_ae([shard], held, tmp_path / "tuned", tmp_path / "run2", cfg)
    tuned = load_autoencoder(tmp_path / "tuned")
    for a, b in zip(tuned.encoder.parameters(), start.encoder.parameters()):
        assert torch.equal(a, b)


def test_shards_recorded_in_worker_processes_equal_those_recorded_in_one(tmp_path):
    """``record_missing`` with two workers writes the same shards as one process (each shard's
    seeds fix it), and leaves a shard already recorded as it is."""
    from worldstream.engine.training.data import record_missing

    jobs = [(tmp_path / "par" / name, seeds, 5, 0.3) for name, seeds in (("a", [0, 1]), ("b", [2]))]
    (tmp_path / "par" / "b").mkdir(parents=True)
    np.save(tmp_path / "par" / "b" / "camera.npy", np.zeros(1))  # "b" counts as recorded
    record_missing(record_shard, jobs, workers=2)
    record_missing(record_shard, [(tmp_path / "one", [0, 1], 5, 0.3)], workers=1)
    for name in ("frames", "camera", "actions", "switch", "prompt"):
        np.testing.assert_array_equal(np.load(tmp_path / "par" / "a" / f"{name}.npy"),
                                      np.load(tmp_path / "one" / f"{name}.npy"))
    assert sorted(p.name for p in (tmp_path / "par" / "b").iterdir()) == ["camera.npy"]
