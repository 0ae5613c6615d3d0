"""On-policy fine-tuning data (engine.training.onpolicy): tiny random models, CPU, fp32."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from worldstream.engine.backends.builtin import BuiltinBackend, BuiltinConfig
from worldstream.engine.backends.builtin import plan as plan_stage
from worldstream.engine.backends.stages import replace_stage
from worldstream.engine.models.builtin.attention import (
    DenseContext,
    block_causal_frame_mask,
    expand_frame_mask,
)
from worldstream.engine.models.builtin.autoencoder import build_autoencoder
from worldstream.engine.models.builtin.world_dit import WorldDiT
from worldstream.engine.training.latents import VIEW_BOX, memory_bases
from worldstream.engine.training.onpolicy import onpolicy_loss, onpolicy_target
from worldstream.engine.training.rollouts import EpisodeSpec, collect_rollouts
from worldstream.engine.worlds.recorder import record_episode


def tiny_generator(chunk_frames: int) -> BuiltinBackend:
    torch.manual_seed(0)
    model = WorldDiT(dim=64, depth=2, num_heads=2, chunk_frames=chunk_frames, view_box=VIEW_BOX)
    with torch.no_grad():  # adaLN-Zero starts as the identity; randomise so every path matters
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    cfg = BuiltinConfig(attention_backend="reference", max_states=4, batch_invariant=False,
                        restyle_chunks=1)  # as collect_rollouts runs it
    return BuiltinBackend(model, build_autoencoder(width=8), cfg)


def episodes(seeds: list[int], length: int, chunk_frames: int) -> EpisodeSpec:
    eps = [record_episode(s, length, switch_prob=0.15, transition_frames=0) for s in seeds]
    return EpisodeSpec(
        np.stack([e["frames"][:chunk_frames] for e in eps]),
        np.stack([e["actions"] for e in eps]).astype(np.int64),
        np.stack([e["prompt"] for e in eps]).astype(np.int64),
        np.stack([e["switch"] for e in eps]),
        np.stack([e["camera"] for e in eps]),
        np.arange(len(seeds)),
    )


def test_forced_rollout_replays_to_exactly_what_the_generator_read():
    """The camera follows the recorded path (not the model's dynamics), prompt switches reach
    the stream, and replaying the shown frames through memory_bases gives, frame for frame,
    the memory pictures the generator fed the model: the on-policy bases are on-policy."""
    f = 2
    gen = tiny_generator(f)
    eps = episodes([3, 11], 16, f)
    assert eps.switch[:, f:].any(), "the test needs a scene switch inside the rollout"
    seen = {"origins": [], "pictures": []}

    def spy(backend, batch):
        plan_stage.plan(backend, batch)
        seen["origins"].append(np.stack([r.origins for r in batch.records]))
        pics = batch.views.pictures
        seen["pictures"].append(pics.reshape(len(batch.jobs), f, *pics.shape[1:]))

    gen.stages = replace_stage(gen.stages, "plan", spy)
    rolls = collect_rollouts(gen, eps, steps=2, seed=1)
    assert gen.model.camera.__class__.__name__ == "CameraDynamics"  # restored
    origins = np.concatenate(seen["origins"], axis=1)  # (E, L - f, 2)
    # the stream places the given start chunk at its last frame's position, then follows the
    # recorded path exactly
    np.testing.assert_array_equal(rolls.camera[:, f:], eps.camera[:, f:])
    np.testing.assert_array_equal(origins, (eps.camera[:, f:] - eps.camera[:, f - 1 : f]))
    pictures = np.concatenate(seen["pictures"], axis=1)
    for i in range(len(eps.index)):
        rgb, _ = memory_bases(rolls.frames[i], rolls.camera[i], eps.switch[i], f,
                              settle_px=gen.config.memory_settle_px)
        np.testing.assert_array_equal(rgb[f:], pictures[i])
    # the stream's settle distance matters here: the training replay's 16 reads other bases
    assert gen.config.memory_settle_px != 16
    assert any(not np.array_equal(memory_bases(rolls.frames[i], rolls.camera[i],
                                               eps.switch[i], f)[0][f:], pictures[i])
               for i in range(len(eps.index)))
    np.testing.assert_array_equal(rolls.frames[:, :f], eps.first)
    assert rolls.latents.shape == (2, 16, 4, 32, 32)
    assert np.isfinite(rolls.camera_err).all()


def test_target_keeps_own_memory_plus_the_true_change_only_where_memory_is_current():
    g = torch.Generator().manual_seed(0)
    z, own, orig = (torch.randn(2, 3, 4, 8, 8, generator=g) for _ in range(3))
    known = torch.zeros(2, 3, 2, 8, 8)
    known[:, :, 0, :, :4] = 1.0  # left half current
    known[:, :, 1, :, 4:] = 1.0  # right half stale: restyle to the truth
    t = onpolicy_target(z, own, orig, known)
    torch.testing.assert_close(t[..., 4:], z[..., 4:])
    torch.testing.assert_close(t[..., :4], (own + z - orig)[..., :4])
    torch.testing.assert_close(onpolicy_target(z, orig, orig, known), z)


def test_loss_is_finite_and_trains_every_block():
    torch.manual_seed(0)
    model = WorldDiT(dim=32, depth=1, num_heads=2, chunk_frames=1)
    with torch.no_grad():  # past adaLN-Zero's identity start, or no gradient reaches qkv
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    b, f = 2, 4
    ctx = DenseContext(expand_frame_mask(block_causal_frame_mask(f, 1), model.tokens_per_frame))
    lat, own, bo, bw = (torch.randn(b, f, 4, 32, 32) for _ in range(4))
    known = torch.rand(b, f, 2, 32, 32) / 2
    loss = onpolicy_loss(
        model,
        lat,
        own,
        bo,
        bw,
        known,
        torch.zeros(b, f, dtype=torch.long),
        torch.randn(b, f, 384),
        torch.Generator().manual_seed(1),
        1,
        0.3,
        ctx,
        torch.device("cpu"),
    )
    assert torch.isfinite(loss) and loss > 0
    loss.backward()
    assert model.blocks[0].qkv.weight.grad.abs().sum() > 0


class _ZeroModel:
    """Stands in for a WorldDiT in :func:`onpolicy_loss`: identity normalisation, predicts 0,
    so the loss is the weighted mean of the squared target."""

    config = SimpleNamespace()

    def normalize(self, x):
        return x

    def __call__(self, x, *args, **kwargs):
        return torch.zeros_like(x)


def test_change_weight_puts_the_loss_where_the_target_leaves_its_base():
    """Hand-worked (the avatar's case: memory current everywhere, own base = true base): two
    frames, the first context (k = 1 is the only choice), one channel, two pixels. The target
    frame differs from its base by 3 on one pixel: change map = |diff| / batch mean =
    [3, 0] / 0.75 = [4, 0]; with change_weight 2 the weights are [9, 1], the loss
    (9·3² + 1·0²) / (9 + 1) = 8.1; without, (3² + 0²) / 2 = 4.5."""
    lat = torch.zeros(1, 2, 1, 1, 2)
    lat[0, 1, 0, 0, 0] = 3.0
    base = torch.zeros_like(lat)
    known = torch.zeros(1, 2, 2, 1, 2)
    known[:, :, 0] = 1.0
    args = (lat, lat.clone(), base, base.clone(), known, torch.zeros(1, 2, dtype=torch.long),
            torch.zeros(1, 2, 384))
    rest = (1, 0.3, None, torch.device("cpu"))
    for weight, want in ((2.0, 8.1), (0.0, 4.5)):
        loss = onpolicy_loss(_ZeroModel(), *args, torch.Generator().manual_seed(0), *rest,
                             change_weight=weight)
        assert loss.item() == pytest.approx(want)


def test_rollouts_start_and_switch_with_the_worlds_own_prompt_table():
    """Prompt indices point into the table passed (the avatar's looks), not the landscape's."""
    from worldstream.engine.worlds.avatar.looks import PROMPTS as LOOK_PROMPTS

    gen = tiny_generator(1)
    eps = episodes([3], 6, 1)
    eps.prompt[:] = 5
    eps.prompt[0, 3:] = 17
    eps.switch[:] = False
    eps.switch[0, 3] = True
    seen = []
    new_state, set_prompt = gen.new_state, gen.set_prompt
    gen.new_state = lambda prompt, *a, **k: seen.append(prompt) or new_state(prompt, *a, **k)
    gen.set_prompt = lambda state, prompt: seen.append(prompt) or set_prompt(state, prompt)
    collect_rollouts(gen, eps, steps=1, prompts=LOOK_PROMPTS)
    assert seen == [LOOK_PROMPTS[5], LOOK_PROMPTS[17]]


@pytest.mark.parametrize("extra,named", [
    (["--set", "p_onpolicy=0.5"], "p_onpolicy"),
    (["--set", "p_onpolicy=0.5", "--set", "init_from=x", "--set", "rollout_steps=0"],
     "rollout_steps"),
    (["--set", "loss=l1"], "unknown setting 'loss'"),
    (["--preset", "landscape"], "not 'avatar'"),
    (["--preset", "avatar-v2.4"], "--preset")])
def test_train_world_cli_refuses_bad_settings_before_any_work(tmp_path, capsys, extra, named):
    """Bad settings are refused in one line, exit 2, before recording."""
    from worldstream.app import cli

    argv = ["train-world", "--world", "avatar", "--data", str(tmp_path / "data"),
            "--run-dir", str(tmp_path / "run"), *extra]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert named in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "data").exists() and not (tmp_path / "run").exists()


def test_train_world_cli_lists_the_settings(capsys):
    from worldstream.app import cli

    assert cli.main(["train-world", "--preset", "avatar-v2.2", "--set", "help"]) == 0
    out = capsys.readouterr().out
    assert "p_onpolicy (float) = 0.5\n    Fraction of each batch" in out
    assert "avatar-v2.7" in out


def test_onpolicy_bases_read_memory_as_the_models_engine_does():
    """The replayed bases use the model's view box (the avatar's: none), not the landscape's
    default."""
    from worldstream.engine.training.latents import ae_encode
    from worldstream.engine.training.rollouts import Rollouts, onpolicy_bases
    from worldstream.engine.worlds.actions import direction_to_action
    from worldstream.engine.worlds.avatar.actions import ACTION_FACTORS, NUM_ACTIONS, encode_action
    from worldstream.engine.worlds.avatar.simulator import AvatarSimulator

    model = WorldDiT(dim=32, depth=1, num_heads=2, num_actions=NUM_ACTIONS,
                     action_factors=ACTION_FACTORS, view_box=0)
    ae = build_autoencoder(width=8).eval()
    actions = np.array([encode_action(direction_to_action(1, -1), 0)] * 6)
    sim = AvatarSimulator(4, "forest")
    frames = np.stack([sim.step(int(a)) for a in actions])[None]
    n = frames.shape[1]
    rolls = Rollouts(frames, torch.zeros(1, n, 4, 16, 16), np.zeros((1, n, 2), np.int64),
                     np.zeros((1, n, 2)))
    eps = EpisodeSpec(frames[:, :1], actions[None], np.zeros((1, n), np.int64),
                      np.zeros((1, n), bool), np.zeros((1, n, 2), np.int64), np.arange(1))
    got, _ = onpolicy_bases(ae, rolls, eps, 1, torch.device("cpu"), model.config)
    want, _ = memory_bases(frames[0], np.zeros((n, 2), np.int64), np.zeros(n, bool), 1, 0)
    torch.testing.assert_close(got[0], ae_encode(ae, want, torch.device("cpu")).half())
    landscape, _ = memory_bases(frames[0], np.zeros((n, 2), np.int64), np.zeros(n, bool), 1)
    assert not np.array_equal(landscape, want)  # the default would have read another base
