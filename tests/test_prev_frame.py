"""The second skip source and the pose input of the world model (``WorldDiT(skip_source=...)``,
``WorldDiT(pose_path=...)``): warm start, what training feeds them, what on-policy clips feed
them, what the engine feeds them, save points (tiny models, CPU, fp32)."""

import numpy as np
import pytest
import torch

from tests.test_training import random_latent_data
from worldstream.engine.models.builtin.attention import (
    DenseContext,
    block_causal_frame_mask,
    expand_frame_mask,
)
from worldstream.engine.models.builtin.world_dit import WorldDiT, warm_start
from worldstream.engine.training.latents import LatentDataset
from worldstream.engine.training.onpolicy import OnPolicyPool
from worldstream.engine.training.train_world import previous_frames, recipe_clips, train_world
from worldstream.engine.worlds.actions import IDLE, direction_to_action


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
    model = WorldDiT(dim=32, depth=1, num_heads=2, skip_source=skip_source).eval()
    with torch.no_grad():  # adaLN-Zero starts as the identity; randomise so every path matters
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


def test_warm_start_adds_the_previous_frame_at_zero_then_it_is_an_input():
    trained = _trained()
    model = WorldDiT(dim=32, depth=1, num_heads=2, skip_source="previous").eval()
    warm_start(model, trained.state_dict())
    x = _inputs()
    prev = torch.randn(2, 3, 4, 32, 32)
    with torch.no_grad():
        want = trained(**x)
        assert torch.equal(model(**x, skip=prev), want)  # exactly the trained model
        assert torch.equal(model(**x, skip=torch.zeros_like(prev)), want)
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
def test_the_mixing_map_takes_the_skip_from_the_previous_frame(prior):
    """With the map at 1 and no residual the model's x0 is the previous frame (scaled by the
    base's clean fraction); at 0 it is the base; at 0.25 a quarter of the way. The map is
    ``skip_prior`` plus the network's output (here its bias), so with the prior at 1 a zero
    output takes the whole skip from the source; the prior is a setting, not a weight: a
    warm start from a model without one keeps every weight."""
    trained = WorldDiT(dim=32, depth=1, num_heads=2, skip_source="previous")
    model = WorldDiT(dim=32, depth=1, num_heads=2, skip_source="previous",
                     skip_prior=prior).eval()
    warm_start(model, trained.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                 trained.state_dict().values()))
    _assert_mixes(model, [(m, m) for m in (0.0, 1.0, 0.25)], prior)


def _assert_mixes(model: WorldDiT, pairs: list[tuple[float, float]], prior: float = 0.0):
    """With no residual and the map's network output set so that the map is ``m``, the
    model's x0 is ``clean · (base + used · (prev − base))`` for each ``(m, used)``."""
    x = _inputs()
    prev = torch.randn(2, 3, 4, 32, 32)
    with torch.no_grad():
        model.out.weight.zero_()
        model.out.bias.zero_()
        clean = 1 - x["base_sigma"][..., None, None, None]
        for m, used in pairs:
            model.skip_gate.bias.fill_(m - prior)
            want = clean * (x["base"] + used * (prev - x["base"]))
            assert torch.allclose(model(**x, skip=prev), want, atol=1e-6)


def test_the_mixing_map_floor_clamps_it_from_below_only():
    """With ``skip_floor`` 0.8 a map the network puts at 0 or 0.25 mixes 0.8 of the source in,
    one at 0.9 or 1.2 is left as it is (hand-worked: x0 = clean · (base + m (prev − base)));
    a floor outside [0, 1], or one without a skip source, is refused."""
    model = WorldDiT(dim=32, depth=1, num_heads=2, skip_source="previous",
                     skip_floor=0.8).eval()
    _assert_mixes(model, [(0.0, 0.8), (0.25, 0.8), (0.9, 0.9), (1.2, 1.2)])
    with pytest.raises(ValueError, match="skip_floor"):
        WorldDiT(dim=32, depth=1, num_heads=2, skip_source="previous", skip_floor=1.5)
    with pytest.raises(ValueError, match="skip_floor"):
        WorldDiT(dim=32, depth=1, num_heads=2, skip_floor=0.5)


def test_previous_frame_is_required_by_a_model_with_it_and_refused_by_one_without():
    x = _inputs()
    with pytest.raises(ValueError, match="needs a second skip source"):
        _trained(skip_source="previous")(**x)
    with pytest.raises(ValueError, match="takes no"):
        _trained()(**x, skip=torch.zeros(2, 3, 4, 32, 32))
    other = WorldDiT(dim=48, depth=1, num_heads=2, skip_source="previous")
    with pytest.raises(RuntimeError):  # another width: not a warm start
        warm_start(other, _trained().state_dict())


def test_previous_frames_are_the_last_frame_before_each_chunk_hand_worked():
    lat = torch.arange(6.0)[None, :, None]  # frame i holds the value i
    assert previous_frames(lat, 1)[0, :, 0].tolist() == [0, 1, 2, 3, 4]  # frames 1..5
    assert previous_frames(lat, 2)[0, :, 0].tolist() == [1, 1, 3, 3]  # chunks (2,3), (4,5)
    assert previous_frames(lat, 3)[0, :, 0].tolist() == [2, 2, 2]  # chunk (3, 4, 5)


def _indexed_data(episodes: int = 3, length: int = 12) -> LatentDataset:
    """Latents whose every value is ``100 * episode + frame``, so a clip names its frames."""
    ids = (100 * torch.arange(episodes)[:, None] + torch.arange(length)[None]).float()
    lat = ids[:, :, None, None, None].expand(episodes, length, 4, 32, 32).half()
    return LatentDataset(
        lat, -lat, torch.zeros(episodes, length, 2, 32, 32, dtype=torch.uint8),
        (ids.long() % 9), torch.zeros(episodes, length, dtype=torch.long), torch.randn(1, 384),
        torch.zeros(episodes, length, 2, dtype=torch.long),
    )


@pytest.mark.parametrize("chunk", [1, 2])
def test_recipe_clips_feed_the_dataset_frame_before_each_chunk(chunk):
    data = _indexed_data()
    rng = np.random.default_rng(0)
    for _ in range(5):
        lat, base, known, actions, txt, prev, pose = recipe_clips(data, rng, 4, 4, chunk,
                                                                  "previous")
        ids = lat[:, :, 0, 0, 0]
        assert torch.equal(base[:, :, 0, 0, 0], -ids)  # the frames' own bases
        assert torch.equal(actions, ids.long() % 9)
        first = ids[:, ::chunk].repeat_interleave(chunk, dim=1)  # each chunk's first frame
        assert torch.equal(prev[:, :, 0, 0, 0], first - 1)
        assert pose is None
    *_, prev, pose = recipe_clips(data, rng, 4, 4, chunk, None)
    assert prev is None and pose is None


def test_onpolicy_clips_feed_the_generators_own_frame_before_each_chunk():
    data = _indexed_data()
    own = 1000 + data.latents[[2, 0]].float()  # the generator's frames of episodes 2 and 0
    pool = OnPolicyPool(torch.tensor([2, 0]), own.half(), own.half(), 0, 0.0)
    data.pose = data.latents[..., :2, 0, 0].float() * 2  # frame i's pose: (2i, 2i)
    lat, own_lat, *_, prev, pose = pool.sample(data, np.random.default_rng(1), 6, 4, 1,
                                                  "previous")
    assert torch.equal(own_lat[:, :, 0, 0, 0], 1000 + lat[:, :, 0, 0, 0])  # same frames
    assert torch.equal(prev[:, :, 0, 0, 0], own_lat[:, :, 0, 0, 0] - 1)  # own, one before
    assert torch.equal(pose[..., 0], 2 * lat[:, :, 0, 0, 0])  # each frame's own pose
    assert pool.sample(data, np.random.default_rng(1), 6, 4)[-2] is None
    data.skip = -data.latents  # a "warped" source: the data's own, frame for frame
    lat, *_, skip, _ = pool.sample(data, np.random.default_rng(2), 6, 4, 1, "warped")
    assert torch.equal(skip, -lat)


def test_train_world_warm_starts_a_previous_frame_model_that_starts_as_its_init(tmp_path):
    data = random_latent_data()
    kw = dict(batch=2, frames=4, dim=32, depth=1, num_heads=2, ckpt_every=1, export_every=100,
              camera_steps=5)
    train_world(data, tmp_path / "init", tmp_path / "r0", steps=1, **kw)
    init = WorldDiT.from_pretrained(tmp_path / "init")
    result = train_world(data, tmp_path / "out", tmp_path / "r1", steps=2,
                         skip_source="previous",
                         init_from=tmp_path / "init", **kw)
    assert result["steps"] == 2 and np.isfinite(result["final_loss"])
    model = WorldDiT.from_pretrained(tmp_path / "out")
    assert model.config.skip_source == "previous"
    assert model.stem.weight.shape[1] == init.stem.weight.shape[1] + 4
    # the new input was trained from zero: the rest of the stem moved, the new part is small
    new = model.stem.weight[:, -4:].abs().max()
    assert 0 < new < 0.05


def _tiny_backend():
    from worldstream.engine.backends.builtin import BuiltinBackend, BuiltinConfig
    from worldstream.engine.models.builtin.autoencoder import build_autoencoder

    torch.manual_seed(0)
    model = WorldDiT(dim=32, depth=1, num_heads=2, skip_source="previous", pose_path="head").eval()
    with torch.no_grad():  # past the zero starts, so every input matters
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return BuiltinBackend(model, build_autoencoder(width=8),
                          BuiltinConfig(attention_backend="reference", steady_guidance_sigma=None))


def test_save_points_carry_the_previous_frame_and_pose_and_refuse_a_file_without_them():
    from worldstream.engine.core.backend import ChunkJob
    from worldstream.engine.studio.savepoint import SavepointError, export_state, import_state

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
    from worldstream.engine.worlds.actions import direction_to_action
    from worldstream.engine.worlds.catalog import make_base_warp

    data = _indexed_data(episodes=2, length=12)
    right, idle = direction_to_action(1, 0), direction_to_action(0, 0)
    data.actions[0] = torch.tensor([right] * 2 + [idle] * 10)
    attach_poses(data, make_base_warp("head", 128))
    assert data.pose.shape == (2, 12, 2) and data.pose.dtype == torch.float32
    assert torch.allclose(data.pose[0, :4, 0], torch.tensor([0.25, 0.4375, 0.328125, 0.24609375]))
    assert torch.equal(data.pose[0, :, 1], torch.zeros(12))
    rng = np.random.default_rng(0)
    for source in (None, "previous"):
        lat, *_, pose = recipe_clips(data, rng, 8, 4, 1, source)
        ids = lat[:, :, 0, 0, 0].long()
        assert torch.equal(pose, data.pose[ids // 100, ids % 100])


def test_pose_embedding_starts_at_zero_then_the_pose_is_an_input():
    trained = _trained()
    model = WorldDiT(dim=32, depth=1, num_heads=2, pose_path="head").eval()
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


@pytest.mark.parametrize("rig", ["head", "head_layer", "head_rig", "head_rig_fit",
                                 "head_rig_bridge"])
def test_a_warped_skip_source_is_the_memory_picture_warped_to_each_frames_pose(rig):
    """The engine feeds a ``"warped"`` model each frame's memory picture (the stream's first
    frame: a still camera) warped by its ``pose_path``'s warp to the head pose the keys lead
    to, encoded; the base stays the picture itself."""
    from worldstream.engine.backends.builtin import BuiltinBackend, BuiltinConfig
    from worldstream.engine.core.backend import ChunkJob
    from worldstream.engine.models.builtin.loading import load_autoencoder
    from worldstream.engine.worlds.actions import direction_to_action
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


def test_a_backdrop_fill_model_sees_the_streams_backdrop_where_a_turn_uncovers_the_scene():
    """A model trained with ``backdrop_fill`` gets the rig's warp of the memory picture with
    the stream's backdrop shown where the turn uncovers the scene; a model without it gets the
    warp filled from around whatever the backdrop, and a stream without one the same."""
    from worldstream.engine.backends.builtin import BuiltinBackend, BuiltinConfig
    from worldstream.engine.core.backend import ChunkJob
    from worldstream.engine.models.builtin.loading import load_autoencoder
    from worldstream.engine.worlds.avatar.simulator import AvatarSimulator, backdrop
    from worldstream.engine.worlds.catalog import make_base_warp, world

    first = AvatarSimulator(900_004, "city").step(IDLE)[None]
    plate = backdrop("city", 900_004)
    left = direction_to_action(-1, 0)
    warp = make_base_warp("head_rig_fit", 128)
    ae = load_autoencoder(world("avatar").assets / "vae")
    for fill in (True, False):
        torch.manual_seed(0)
        model = WorldDiT(dim=32, depth=1, num_heads=2, skip_source="warped",
                         pose_path="head_rig_fit", view_box=0, backdrop_fill=fill)
        with torch.no_grad():
            for p in model.camera.parameters():  # a still camera, as the avatar's
                p.zero_()
        gen = BuiltinBackend(model.eval(), ae, BuiltinConfig(attention_backend="reference",
                                                             ctx_noise=False))
        for given in (plate, None):
            state = gen.new_state("a face", seed=1, start_frames=first)
            gen.set_backdrop(state, given)
            for _ in range(3):
                gen.generate([ChunkJob(state, [left], steps=1, seed=0)])
            gen.finish()
            rec = state.history[-1]
            shown = given if fill else None
            want = gen.encode_frames(warp.apply(first[0], rec.poses[-1], backdrop=shown)[None])
            assert torch.allclose(rec.skip, want, atol=1e-5), (fill, given is None)
            filled = gen.encode_frames(warp.apply(first[0], rec.poses[-1])[None])
            assert (rec.skip - filled).abs().max() > 0.1 if fill and given is not None else True
            gen.free(state)
        with pytest.raises(ValueError, match="backdrop must be"):
            gen.set_backdrop(state, plate[:64])
    with pytest.raises(ValueError, match="backdrop_fill"):
        WorldDiT(dim=32, depth=1, num_heads=2, backdrop_fill=True)


def test_an_avatar_stream_has_its_looks_backdrop_and_a_look_switch_brings_the_new_one():
    from worldstream.engine.backends.avatar import AvatarModelBackend
    from worldstream.engine.backends.builtin import BuiltinBackend, BuiltinConfig
    from worldstream.engine.models.builtin.autoencoder import build_autoencoder
    from worldstream.engine.worlds.avatar.actions import ACTION_FACTORS, NUM_ACTIONS
    from worldstream.engine.worlds.avatar.simulator import backdrop

    model = WorldDiT(dim=32, depth=1, num_heads=2, chunk_frames=1, num_actions=NUM_ACTIONS,
                     action_factors=ACTION_FACTORS, view_box=0)
    backend = AvatarModelBackend(BuiltinBackend(model, build_autoencoder(width=8),
                                                BuiltinConfig(attention_backend="reference")))
    state = backend.new_state("a video call from the office", 12)
    np.testing.assert_array_equal(state.inner.backdrop, backdrop("office", 12))
    backend.set_prompt(state, "someone with a red cap in the city at night")
    np.testing.assert_array_equal(state.inner.backdrop, backdrop("city", 12))
    fork = backend.fork(state)
    np.testing.assert_array_equal(fork.inner.backdrop, backdrop("city", 12))
    for s in (state, fork):
        backend.free(s)
    # the evaluation's streams get their episode's backdrop as a live stream does
    from worldstream.engine.evaluation.avatar import scripted_episode
    from worldstream.engine.evaluation.run import start_stream

    ep = scripted_episode(900_602, "forest").episode
    np.testing.assert_array_equal(ep.backdrop, backdrop("forest", 900_602))
    inner = start_stream(backend.gen, ep, 5, 1)
    np.testing.assert_array_equal(inner.backdrop, ep.backdrop)
    backend.gen.free(inner)
