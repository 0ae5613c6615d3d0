"""The second skip source and the pose input of the world model (``WorldDiT(skip_source=
"warped")``, ``WorldDiT(pose_path=...)``): warm start, the mixing map, what training feeds them,
what the engine feeds them, save points, and saved configs with retired keys (tiny models, CPU,
fp32)."""

from pathlib import Path

import numpy as np
import pytest
import torch

from tests.fixtures.training import random_latent_data
from worldstream.engine.models.builtin.attention import (
    DenseContext,
    block_causal_frame_mask,
    expand_frame_mask,
)
from worldstream.engine.models.builtin.world_dit import WorldDiT
from worldstream.engine.training.config import TrainConfig
from worldstream.engine.training.latents import LatentDataset
from worldstream.engine.training.recipe import recipe_clips
from worldstream.engine.training.train_world import train_world
from worldstream.engine.training.warm_start import warm_start
from worldstream.engine.worlds.actions import direction_to_action

RIG = "head_rig_fit"
POSE = torch.zeros(2, 3, 2)


def _inputs(b: int = 2, t: int = 3, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return dict(
        latents=torch.randn(b, t, 4, 32, 32, generator=g),
        base=torch.randn(b, t, 4, 32, 32, generator=g),
        base_sigma=torch.full((b, t), 0.05),
        known=torch.rand(b, t, 2, 32, 32, generator=g),
        sigma=torch.rand(b, t, generator=g),
        actions=torch.randint(0, 9, (b, t), generator=g),
        text=torch.randn(b, t, 384, generator=g),
        positions=torch.arange(t)[None].repeat(b, 1),
        ctx=DenseContext(expand_frame_mask(block_causal_frame_mask(t, 1), 64)),
    )


def _trained(skip_source: str | None = None) -> WorldDiT:
    torch.manual_seed(0)
    model = WorldDiT(dim=32, depth=1, num_heads=2, skip_source=skip_source,
                     pose_path=RIG if skip_source else None).eval()
    with torch.no_grad():  # adaLN-Zero starts as the identity; randomise so every path matters
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


def test_warm_start_adds_the_warped_picture_at_zero_then_it_is_an_input():
    trained = _trained()
    model = WorldDiT(dim=32, depth=1, num_heads=2, skip_source="warped", pose_path=RIG).eval()
    warm_start(model, trained.state_dict())
    x = {**_inputs(), "pose": POSE}
    prev = torch.randn(2, 3, 4, 32, 32)
    with torch.no_grad():
        want = trained(**_inputs())
        # the trained model to float rounding: a stem over more input channels (zero weights)
        # may sum in another order (seen on an AVX2-only CPU), so not bit for bit
        torch.testing.assert_close(model(**x, skip=prev), want, rtol=0, atol=1e-6)
        torch.testing.assert_close(model(**x, skip=torch.zeros_like(prev)), want, rtol=0,
                                   atol=1e-6)
        model.stem.weight[:, -4:].normal_(0, 0.05)  # once trained, the frame matters
        assert not torch.allclose(model(**x, skip=prev), want, atol=1e-3)


def test_warm_start_grows_a_deeper_model_that_starts_as_the_trained_one():
    """A model two blocks deeper, warm-started from a trained one, keeps its trained blocks
    and gives exactly the trained model's output (its extra blocks add nothing until trained,
    then they do); a shallower model is refused."""
    trained = _trained()
    model = WorldDiT(dim=32, depth=3, num_heads=2).eval()
    warm_start(model, trained.state_dict())
    x = _inputs()
    with torch.no_grad():
        assert torch.equal(model(**x), trained(**x))
        model.blocks[2].ada.bias.normal_(0, 0.5)  # once trained, the new block matters
        assert not torch.allclose(model(**x), trained(**x), atol=1e-3)
    with pytest.raises(RuntimeError):
        warm_start(WorldDiT(dim=32, depth=1, num_heads=2), model.state_dict())


@pytest.mark.parametrize("prior", [0.0, 1.0])
def test_the_mixing_map_takes_the_skip_from_the_warped_picture(prior):
    """With the map at 1 and no residual the model's x0 is the warped picture (scaled by the
    base's clean fraction); at 0 it is the base; at 0.25 a quarter of the way. The map is
    ``skip_prior`` plus the network's output (here its bias), so with the prior at 1 a zero
    output takes the whole skip from the source; the prior is a setting, not a weight: a
    warm start from a model without one keeps every weight."""
    trained = WorldDiT(dim=32, depth=1, num_heads=2, skip_source="warped", pose_path=RIG)
    model = WorldDiT(dim=32, depth=1, num_heads=2, skip_source="warped", pose_path=RIG,
                     skip_prior=prior).eval()
    warm_start(model, trained.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                 trained.state_dict().values()))
    _assert_mixes(model, [(m, m) for m in (0.0, 1.0, 0.25)], prior)


def _assert_mixes(model: WorldDiT, pairs: list[tuple[float, float]], prior: float = 0.0):
    """With no residual and the map's network output set so that the map is ``m``, the
    model's x0 is ``clean · (base + used · (prev − base))`` for each ``(m, used)``."""
    x = {**_inputs(), "pose": POSE}
    prev = torch.randn(2, 3, 4, 32, 32)
    with torch.no_grad():
        model.out.weight.zero_()
        model.out.bias.zero_()
        clean = 1 - x["base_sigma"][..., None, None, None]
        for m, used in pairs:
            model.skip_gate.bias.fill_(m - prior)
            want = clean * (x["base"] + used * (prev - x["base"]))
            assert torch.allclose(model(**x, skip=prev), want, atol=1e-6)


def test_the_warped_picture_is_required_by_a_model_with_it_and_refused_by_one_without():
    x = _inputs()
    with pytest.raises(ValueError, match="needs a second skip source"):
        _trained(skip_source="warped")(**x, pose=POSE)
    with pytest.raises(ValueError, match="takes no"):
        _trained()(**x, skip=torch.zeros(2, 3, 4, 32, 32))
    other = WorldDiT(dim=48, depth=1, num_heads=2, skip_source="warped", pose_path=RIG)
    with pytest.raises(RuntimeError):  # another width: not a warm start
        warm_start(other, _trained().state_dict())


def _indexed_data(episodes: int = 3, length: int = 12) -> LatentDataset:
    """Latents whose every value is ``100 * episode + frame``, so a clip names its frames."""
    ids = (100 * torch.arange(episodes)[:, None] + torch.arange(length)[None]).float()
    lat = ids[:, :, None, None, None].expand(episodes, length, 4, 32, 32).half()
    return LatentDataset(
        lat, -lat, torch.zeros(episodes, length, 2, 32, 32, dtype=torch.uint8),
        (ids.long() % 9), torch.zeros(episodes, length, dtype=torch.long), torch.randn(1, 384),
        torch.zeros(episodes, length, 2, dtype=torch.long),
    )


def test_train_world_warm_starts_a_warped_skip_model_that_starts_as_its_init(tmp_path):
    data = random_latent_data()
    cfg = TrainConfig(batch=2, frames=4, dim=32, depth=1, num_heads=2, ckpt_every=1,
                      export_every=100, camera_steps=5, steps=1)
    train_world(cfg, data, tmp_path / "init", tmp_path / "r0")
    init = WorldDiT.from_pretrained(tmp_path / "init")
    data.skip = data.base.clone()  # stands in for the warped pictures
    warped = TrainConfig(**{**cfg.__dict__, "steps": 2, "skip_source": "warped",
                            "pose_path": RIG, "init_from": str(tmp_path / "init")})
    result = train_world(warped, data, tmp_path / "out", tmp_path / "r1")
    assert result["steps"] == 2 and np.isfinite(result["final_loss"])
    model = WorldDiT.from_pretrained(tmp_path / "out")
    assert model.config.skip_source == "warped"
    assert model.stem.weight.shape[1] == init.stem.weight.shape[1] + 4
    # the new input was trained from zero: the rest of the stem moved, the new part is small
    new = model.stem.weight[:, -4:].abs().max()
    assert 0 < new < 0.05


def _tiny_backend():
    from worldstream.engine.backends.builtin import BuiltinBackend, BuiltinConfig
    from worldstream.engine.models.builtin.autoencoder import build_autoencoder

    torch.manual_seed(0)
    model = WorldDiT(dim=32, depth=1, num_heads=2, skip_source="warped", pose_path=RIG,
                     view_box=0).eval()
    with torch.no_grad():  # past the zero starts, so every input matters
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return BuiltinBackend(model, build_autoencoder(width=8),
                          BuiltinConfig(attention_backend="reference", steady_guidance_sigma=None))


def test_save_points_carry_the_previous_frame_and_pose_and_refuse_a_file_without_them():
    from worldstream.engine.core.backend import ChunkJob
    from worldstream.engine.studio.savepoint import SavepointError
    from worldstream.engine.studio.savestate import export_state, import_state

    gen = _tiny_backend()
    state = gen.new_state("a green meadow", seed=3)
    for n in range(4):
        gen.generate([ChunkJob(state, [n % 9], steps=1, seed=n)])
    arrays, scalars = export_state(gen, state)
    assert all(f"h{i}.skip" in arrays and f"h{i}.poses" in arrays
               for i in range(len(scalars["history"])))
    copy = import_state(gen, arrays, scalars)
    a, b = (gen.generate([ChunkJob(s, [2], steps=1, seed=9)])[0].frames for s in (state, copy))
    assert np.array_equal(a, b)
    free = gen.allocator.num_free
    for cut, what in ((".skip", "second skip source"), (".poses", "pose input")):
        older = {k: v for k, v in arrays.items() if not k.endswith(cut)}
        with pytest.raises(SavepointError, match=what):
            import_state(gen, older, scalars)
        assert gen.allocator.num_free == free  # nothing kept from the refused file


def test_attached_poses_follow_the_head_rig_and_clips_carry_each_frames_pose():
    """Hand-worked: the head eases a quarter of the gap toward the held direction a frame."""
    from worldstream.engine.training.latents import attach_poses
    from worldstream.engine.worlds.catalog import make_base_warp

    data = _indexed_data(episodes=2, length=12)
    right, idle = direction_to_action(1, 0), direction_to_action(0, 0)
    data.actions[0] = torch.tensor([right] * 2 + [idle] * 10)
    attach_poses(data, make_base_warp(RIG, 128))
    assert data.pose.shape == (2, 12, 2) and data.pose.dtype == torch.float32
    assert torch.allclose(data.pose[0, :4, 0], torch.tensor([0.25, 0.4375, 0.328125, 0.24609375]))
    assert torch.equal(data.pose[0, :, 1], torch.zeros(12))
    rng = np.random.default_rng(0)
    data.skip = data.latents.clone()
    for source in (None, "warped"):
        lat, *_, pose = recipe_clips(data, rng, 8, 4, 1, source)
        ids = lat[:, :, 0, 0, 0].long()
        assert torch.equal(pose, data.pose[ids // 100, ids % 100])


def test_pose_embedding_starts_at_zero_then_the_pose_is_an_input():
    trained = _trained()
    model = WorldDiT(dim=32, depth=1, num_heads=2, pose_path=RIG).eval()
    warm_start(model, trained.state_dict())
    x = _inputs()
    pose = torch.rand(2, 3, 2) * 2 - 1
    with torch.no_grad():
        want = trained(**x)
        assert torch.equal(model(**x, pose=pose), want)
        model.pose_emb.frame.weight.normal_(0, 0.05)
        assert not torch.allclose(model(**x, pose=pose), want, atol=1e-3)
        assert not torch.allclose(model(**x, pose=pose), model(**x, pose=-pose), atol=1e-3)
    with pytest.raises(ValueError, match="needs the rig's pose"):
        model(**x)
    with pytest.raises(ValueError, match="takes no"):
        trained(**x, pose=pose)


@pytest.mark.parametrize("rig", [RIG])
def test_a_warped_skip_source_is_the_memory_picture_warped_to_each_frames_pose(rig):
    """The engine feeds a ``"warped"`` model each frame's memory picture (the stream's first
    frame: a still camera) warped by its ``pose_path``'s warp to the head pose the keys lead
    to, encoded; the base stays the picture itself."""
    from worldstream.engine.backends.builtin import BuiltinBackend, BuiltinConfig
    from worldstream.engine.core.backend import ChunkJob
    from worldstream.engine.models.builtin.loading import load_autoencoder
    from worldstream.engine.worlds.catalog import make_base_warp, world

    torch.manual_seed(0)
    model = WorldDiT(dim=32, depth=1, num_heads=2, skip_source="warped", pose_path=rig,
                     view_box=0)  # memory holds every pixel, as the avatar's
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
        for p in model.camera.parameters():  # a still camera, as the avatar's
            p.zero_()
    # the avatar's trained autoencoder: a random one's latents hardly see a picture move
    gen = BuiltinBackend(model.eval(), load_autoencoder(world("avatar").assets / "vae"),
                         BuiltinConfig(attention_backend="reference", ctx_noise=False,
                                       steady_guidance_sigma=None))
    ys, xs = np.mgrid[:128, :128]
    check = ((xs // 6 + ys // 6) % 2 * 200).astype(np.uint8)  # sharp edges the warp moves
    first = np.stack([check, 255 - check, xs.astype(np.uint8)], -1)[None]
    state = gen.new_state("a face", seed=1, start_frames=first)
    right = direction_to_action(1, 0)
    for _ in range(3):
        gen.generate([ChunkJob(state, [right], steps=1, seed=0)])
    gen.finish()
    warp, pose = make_base_warp(rig, 128), np.zeros(2)
    for rec in list(state.history)[1:]:  # after the start frame
        pose = warp.path(pose, rec.actions)[-1]
        assert np.allclose(rec.poses[-1], pose)
        want = gen.encode_frames(warp.apply(first[0], pose)[None])
        assert torch.allclose(rec.skip, want, atol=1e-5)
        assert torch.allclose(rec.base, gen.encode_frames(first), atol=1e-5)
        assert (rec.skip - rec.base).abs().max() > 0.1  # the head moved


def test_saved_configs_with_retired_keys_load_at_their_default_and_are_refused_otherwise(
        tmp_path):
    """A config saved before the experiments left (the shipped avatar's holds ``base_warp``
    null, ``noise_correlation`` 0 and ``noise_scale`` 2) loads with those keys dropped; a
    retired key at another value, or the retired ``"previous"`` skip source, is refused with
    one line naming it and the last commit that ran it."""
    import json

    model = WorldDiT(dim=32, depth=1, num_heads=2)
    model.save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    saved = json.loads(path.read_text())
    old = {**saved, "base_warp": None, "noise_correlation": 0.0, "noise_scale": 2.0,
           "skip_floor": None, "backdrop_fill": False}
    path.write_text(json.dumps(old))
    loaded = WorldDiT.from_pretrained(tmp_path)
    assert "noise_scale" not in loaded.config and loaded.config.noise_scale == 2.0
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(),
                                                 model.state_dict().values()))
    for key, value in (("noise_correlation", 0.3), ("skip_floor", 0.8), ("base_warp", "head"),
                       ("backdrop_fill", True), ("skip_source", "previous")):
        path.write_text(json.dumps({**saved, key: value}))
        with pytest.raises(ValueError, match=f"{key}=.*60fcd8b|{key}='previous'.*60fcd8b"):
            WorldDiT.from_pretrained(tmp_path)
    shipped = WorldDiT.load_config(Path(__file__).parents[2] / "assets/avatar/transformer")
    assert shipped["noise_scale"] == 2.0  # the shipped file keeps its keys, and loads
