"""Training plumbing on tiny data: noise-level sampling, frame feeding, resume, export; the
sampler against an oracle."""

import numpy as np
import pytest
import torch

from worldstream.engine.backends.sampler import denoise
from worldstream.engine.models.builtin.attention import (
    DenseContext,
    block_causal_frame_mask,
    expand_frame_mask,
)
from worldstream.engine.models.builtin.autoencoder import build_autoencoder
from worldstream.engine.models.builtin.loading import load_autoencoder
from worldstream.engine.models.builtin.spatial_memory import centre_box
from worldstream.engine.models.builtin.world_dit import CameraDynamics, WorldDiT
from worldstream.engine.training.latents import VIEW_BOX, LatentDataset, memory_bases
from worldstream.engine.training.train_ae import train_ae
from worldstream.engine.training.train_world import (
    GHOST_MAX,
    WorldPrediction,
    change_map,
    degrade_bases,
    fit_camera_dynamics,
    ghost_inputs,
    pose_window_mask,
    sample_chunk_sigmas,
    train_world,
)
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


def random_latent_data() -> LatentDataset:
    """Three random episodes of 12 frames: latents, bases, known planes, actions, prompts,
    camera paths."""
    g = torch.Generator().manual_seed(0)
    return LatentDataset(
        torch.randn(3, 12, 4, 32, 32, generator=g).half(),
        torch.randn(3, 12, 4, 32, 32, generator=g).half(),
        torch.randint(0, 256, (3, 12, 2, 32, 32), generator=g).to(torch.uint8),
        torch.randint(0, 9, (3, 12), generator=g),
        torch.randint(0, 2, (3, 12), generator=g),
        torch.randn(2, 384),
        torch.cumsum(torch.randint(-6, 7, (3, 12, 2), generator=g), dim=1),
    )


def test_train_world_resumes_and_exports(tmp_path, monkeypatch):
    data = random_latent_data()
    kw = dict(batch=2, frames=4, chunk_frames=1, dim=32, depth=1, num_heads=1, ckpt_every=1,
              export_every=100, camera_steps=5)
    first = train_world(data, tmp_path / "out", tmp_path / "run", steps=2, **kw)
    assert first["steps"] == 2
    again = train_world(data, tmp_path / "out", tmp_path / "run", steps=3, **kw)
    assert again["steps"] == 3 and np.isfinite(again["final_loss"])
    model = WorldDiT.from_pretrained(tmp_path / "out")
    assert model.config.latent_mean is not None and len(model.config.latent_std) == 4
    assert model.config.view_box == VIEW_BOX
    assert model.camera.mlp[2].weight.abs().sum() > 0  # the camera dynamics were fitted
    kinds = []
    error = WorldPrediction.loss

    def spy(self, kind="mse", ghost_weight=0.0):
        kinds.append((kind, ghost_weight))
        return error(self, kind, ghost_weight)

    monkeypatch.setattr(WorldPrediction, "loss", spy)
    other = train_world(data, tmp_path / "out2", tmp_path / "run2", steps=3, loss="l1",
                        p_ghost=0.5, ghost_weight=2.0, **kw)
    assert np.isfinite(other["final_loss"])
    assert kinds == [("l1", 2.0)] * 3  # every step, not only the first
    with pytest.raises(ValueError, match="ghost_weight"):
        train_world(data, tmp_path / "out3", tmp_path / "run3", steps=1, ghost_weight=-1, **kw)
    with pytest.raises(ValueError, match="loss"):
        train_world(data, tmp_path / "out3", tmp_path / "run3", steps=1, loss="huber", **kw)
    with pytest.raises(ValueError, match="p_ghost"):
        train_world(data, tmp_path / "out3", tmp_path / "run3", steps=1, p_ghost=1.5, **kw)
    # trained on partly low-passed noise (before the posed run: it attaches poses to data)
    low = train_world(data, tmp_path / "out6", tmp_path / "run6", steps=2,
                      noise_correlation=0.3, noise_scale=1.5, **kw)
    assert np.isfinite(low["final_loss"])
    saved = WorldDiT.from_pretrained(tmp_path / "out6").config  # what the engine will read
    assert (saved.noise_correlation, saved.noise_scale) == (0.3, 1.5)
    with pytest.raises(ValueError, match="noise_correlation"):
        train_world(data, tmp_path / "out7", tmp_path / "run7", steps=1, noise_correlation=1.0,
                    **kw)
    masks = []
    attend = DenseContext.attend

    def seen(self, q, k, v, layer):
        masks.append(self.mask)
        return attend(self, q, k, v, layer)

    monkeypatch.setattr(DenseContext, "attend", seen)
    posed = train_world(data, tmp_path / "out4", tmp_path / "run4", steps=2, pose_path="head",
                        pose_window_tolerance=0.0625, **kw)
    assert np.isfinite(posed["final_loss"])
    # a mask per clip (batch 2, 4 frames of 64 tokens), block-causal or sparser
    assert masks and all(m.shape == (2, 1, 256, 256) for m in masks)
    causal = expand_frame_mask(block_causal_frame_mask(4, 1), 64)
    assert all(not (m[:, 0] & ~causal).any() for m in masks)
    with pytest.raises(ValueError, match="pose_window_tolerance"):
        train_world(data, tmp_path / "out5", tmp_path / "run5", steps=1,
                    pose_window_tolerance=0.1, **kw)  # no pose_path


def test_pose_window_mask_hand_worked():
    """A frame attends itself (its chunk) and earlier chunks posed within the tolerance of its
    chunk's first frame; a chunk with one far frame is left out whole."""
    def mask(yaws, chunk_frames, tol=0.1):
        pose = torch.tensor([[[y, 0.0] for y in yaws]])
        return pose_window_mask(pose, chunk_frames, tol)[0].int().tolist()

    assert mask([0, 0, 0.5, 0.5], 1) == [[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 1, 1]]
    assert mask([0, 0.05, 0.5, 0.5], 2) == [[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 1],
                                            [0, 0, 1, 1]]
    assert mask([0.5, 0, 0, 0.05], 2) == [[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 1],
                                          [0, 0, 1, 1]]  # chunk 0 holds one far frame
    assert mask([0, 0.05, 0.1, 0.12], 1) == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0],
                                             [0, 1, 1, 1]]  # pitch differences count too:
    pose = torch.tensor([[[0.0, 0.0], [0.0, 0.3]]])
    assert pose_window_mask(pose, 1, 0.1)[0].int().tolist() == [[1, 0], [0, 1]]
    wide = pose_window_mask(torch.rand(3, 8, 2) * 2 - 1, 2, 2.0)
    assert torch.equal(wide, block_causal_frame_mask(8, 2).expand(3, 8, 8))
    batched = expand_frame_mask(wide, 3)
    assert batched.shape == (3, 24, 24) and torch.equal(batched[1], expand_frame_mask(wide[1], 3))


def test_ghost_inputs_blend_the_memory_base_into_whole_clips():
    """``ghost_inputs``: each chosen clip is ``z - β (z - zb)`` with one β in [0, GHOST_MAX]
    for all its frames and pixels; the others pass unchanged."""
    g = torch.Generator().manual_seed(0)
    z, zb = torch.randn(64, 3, 4, 8, 8, generator=g), torch.randn(64, 3, 4, 8, 8, generator=g)
    assert torch.equal(ghost_inputs(z, zb, g, 0.0), z)
    out = ghost_inputs(z, zb, g, 0.5)
    beta = ((z - out) / (z - zb)).flatten(1)  # the blend weight at every element of a clip
    assert torch.allclose(beta, beta[:, :1].expand_as(beta), atol=1e-4)
    beta = beta[:, 0]
    assert (beta >= 0).all() and (beta <= GHOST_MAX + 1e-6).all()
    assert 0.3 < (beta > 0).float().mean() < 0.7
    assert torch.equal(ghost_inputs(z, z, g, 1.0), z)  # a frame equal to its base: no ghost


def test_world_prediction_losses_hand_worked():
    """The weighted squared and absolute errors: errors 1 and -3 at weights 1 and 3 over two
    elements: (1 + 27) / 4 and (1 + 9) / 4."""
    pred = torch.tensor([1.0, -3.0]).view(1, 2, 1, 1, 1)
    weight = torch.tensor([1.0, 3.0]).view(1, 2, 1, 1, 1)
    p = WorldPrediction(pred, torch.zeros_like(pred), weight, None, None, None)
    assert p.loss().item() == 7.0 and p.loss("mse").item() == 7.0
    assert p.loss("l1").item() == 2.5
    with pytest.raises(ValueError, match="loss"):
        p.loss("huber")
    with pytest.raises(ValueError, match="ghost_weight"):
        p.loss("mse", 1.0)  # no bases


def test_ghost_error_is_the_error_along_the_memory_base_hand_worked():
    """A prediction with a share a of its memory base blended in has the ghost error a² |g|²
    (g = base - target, weighted); an error orthogonal to g, or away from the base, has none;
    the loss adds it times the ghost weight over the total weight."""
    g = torch.Generator().manual_seed(0)
    target = torch.randn(2, 3, 4, 8, 8, generator=g)
    base = target + torch.randn(2, 3, 4, 8, 8, generator=g)
    weight = torch.rand(2, 3, 1, 8, 8, generator=g) + 0.5
    d = base - target
    gg = (weight * d * d).flatten(2).sum(-1)
    blend = WorldPrediction(target + 0.3 * d, target, weight, None, None, None, base)
    assert torch.allclose(blend.ghost_error(), (0.09 * gg).sum(), rtol=1e-5)
    away = WorldPrediction(target - 0.3 * d, target, weight, None, None, None, base)
    assert away.ghost_error().item() == 0.0
    other = torch.randn(2, 3, 4, 8, 8, generator=g)  # made orthogonal to d per frame (weighted)
    other -= ((weight * other * d).flatten(2).sum(-1) / gg)[..., None, None, None] * d
    assert WorldPrediction(target + other, target, weight, None, None, None,
                           base).ghost_error().item() < 1e-6
    total = weight.expand_as(target).sum()
    assert torch.allclose(blend.loss("mse", 2.0), blend.loss() + 2.0 * blend.ghost_error() / total)


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


def test_decoder_only_ema_run_keeps_the_encoder_resumes_and_rejects_bad_settings(tmp_path):
    shard = record_shard(tmp_path / "shard", [0, 1], 6)
    held = record_shard(tmp_path / "held", [2], 6)
    start = build_autoencoder(width=8)
    start.save_pretrained(tmp_path / "vae")
    kw = dict(batch=2, decoder_only=True, loss="mse", ema_decay=0.9, eval_every=1)
    first = train_ae([shard], held, tmp_path / "vae", tmp_path / "run", steps=2, **kw)
    again = train_ae([shard], held, tmp_path / "vae", tmp_path / "run", steps=3, **kw)
    assert first["steps"] == 2 and again["steps"] == 3
    ck = torch.load(tmp_path / "run" / "ae_checkpoint.pt", weights_only=False)
    assert ck["ema"]["optimization_step"] == 3  # the EMA was resumed, not restarted
    saved = load_autoencoder(tmp_path / "vae")
    for a, b in zip(saved.encoder.parameters(), start.encoder.parameters()):
        assert torch.equal(a, b)  # the latents a world model was trained on stay valid
    for bad in (dict(loss="l2"), dict(ema_decay=1.0)):
        with pytest.raises(ValueError):
            train_ae([shard], held, tmp_path / "vae", tmp_path / "bad", steps=1,
                     **{**kw, **bad})
    assert not (tmp_path / "bad").exists()  # refused before anything was written


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


def test_a_transposed_shard_is_the_same_world_seen_with_x_and_y_swapped(tmp_path, capsys):
    """``transpose_shard``: frames transposed, each key's direction swapped (right, id 5, is
    down, id 7; up-right, id 2, is down-left, id 6), the camera's (x, y) swapped. The memory
    bases the engine would read replay on the copy as the transposed bases of the source (the
    swapped world is geometrically consistent); ``transposed_shards`` writes each copy once;
    the avatar world is refused by ``train-world --transposed-copies`` before any work."""
    from worldstream.app import cli
    from worldstream.engine.training.data import transposed_shards
    from worldstream.engine.worlds.recorder import load_shard

    src = record_shard(tmp_path / "data" / "shard0", [3, 4], 16, switch_prob=0.1,
                       transition_frames=0)
    (dst,) = transposed_shards([src])
    assert dst == tmp_path / "data" / "shard0_transposed"
    a, b = load_shard(src), load_shard(dst)
    np.testing.assert_array_equal(b["frames"], np.asarray(a["frames"]).transpose(0, 1, 3, 2, 4))
    np.testing.assert_array_equal(b["camera"], np.asarray(a["camera"])[..., ::-1])
    swap = {0: 0, 1: 3, 2: 6, 3: 1, 4: 4, 5: 7, 6: 2, 7: 5, 8: 8}
    np.testing.assert_array_equal(b["actions"],
                                  [[swap[int(x)] for x in row] for row in a["actions"]])
    for key in ("scene", "prompt", "switch"):
        np.testing.assert_array_equal(b[key], a[key])
    assert len(set(np.asarray(a["actions"]).ravel().tolist())) > 2  # the check saw moves
    for e in range(2):
        rgb, known = memory_bases(np.asarray(a["frames"][e]), np.asarray(a["camera"][e]),
                                  np.asarray(a["switch"][e]), chunk_frames=1)
        rgb_t, known_t = memory_bases(np.asarray(b["frames"][e]), np.asarray(b["camera"][e]),
                                      np.asarray(b["switch"][e]), chunk_frames=1)
        np.testing.assert_array_equal(rgb_t, rgb.transpose(0, 2, 1, 3))
        np.testing.assert_array_equal(known_t, known.transpose(0, 1, 3, 2))
    stamp = (dst / "frames.npy").stat().st_mtime_ns
    assert transposed_shards([src]) == [dst]
    assert (dst / "frames.npy").stat().st_mtime_ns == stamp  # written once

    argv = ["train-world", "--world", "avatar", "--data", str(tmp_path / "avatar"),
            "--run-dir", str(tmp_path / "run"), "--transposed-copies"]
    assert cli.main(argv) == 2
    assert "--transposed-copies" in capsys.readouterr().err
    assert not (tmp_path / "avatar").exists() and not (tmp_path / "run").exists()
