"""Matrix-Game 2.0 on a tiny configuration (3 blocks, action modules in blocks 0-1, the real
key names and module structure; CPU, fp32): streaming four chunks through the paged KV cache
and the action pools equals an independently written dense block-causal forward over the
whole stream, for each variant (its keyboard width, mouse branch and local window)."""

from __future__ import annotations

import pytest
import torch

from tests.fixtures.matrix_game import reference_flow, tiny_parts, to_original
from worldstream.engine.backends.matrix_game.backend import (
    MatrixGameBackend,
    MatrixGameBackendConfig,
)
from worldstream.engine.backends.matrix_game.stages import condition_frames, warped_sigmas
from worldstream.engine.core.backend import ChunkJob
from worldstream.engine.models.matrix_game.conditions import raw_inputs

H = W = 32  # tiny VAE: 4x spatial -> 8x8 latents -> 16 tokens a frame


def make(variant: str):
    model, cfg, vae, encoder = tiny_parts(variant)
    original = to_original({k: v.detach().clone() for k, v in model.state_dict().items()})
    backend = MatrixGameBackend(model, cfg, vae, encoder, MatrixGameBackendConfig(
        variant=variant, height=H, width=W, device="cpu", attention_backend="reference",
        cond_frames=4, max_states=2, memory_chunks=4))
    return backend, cfg, original


def random_controls(backend, g: torch.Generator) -> torch.Tensor:
    """12 frames of random held keys and pointer motion (model units)."""
    n = len(backend.variant.keys)
    keys = (torch.rand(12, n, generator=g) < 0.4).float()
    pointer = (torch.rand(12, backend.action_space.size - n, generator=g) - 0.5) * 0.4
    return torch.cat([keys, pointer], 1)


@pytest.mark.parametrize("variant", ["universal", "gta_drive", "templerun"])
def test_streamed_chunks_equal_the_dense_block_causal_reference(variant):
    backend, cfg, sd = make(variant)
    state = backend.new_state("play", seed=0)
    g = torch.Generator().manual_seed(7)
    controls = []
    for n in range(4):  # one step each: x0 = noise - flow at t = 1000
        controls.append(random_controls(backend, g))
        (result,) = backend.generate([ChunkJob(state, [0] * 12, 1, 100 + n,
                                               controls[-1].tolist())])
        assert result.error is None and result.frames.shape == (12, H, W, 3)
        backend.finish()
    latents = [c.latents for c in state.history]
    assert [c.position for c in state.history] == [0, 3, 6, 9]
    # the stream's raw frames: a first chunk shows raw frame 0 four times (9 raw frames)
    keyboard, mouse = raw_inputs(backend.variant, torch.cat([controls[0][3:], *controls[1:]]))
    clip = backend.image_encoder.encode(backend._default_image)[0]
    worst = 0.0
    for n in range(4):
        noise = torch.randn(backend.latent_shape, generator=torch.Generator().manual_seed(100 + n))
        frames = 3 * (n + 1)
        raw = 1 + 4 * (frames - 1)
        flow = reference_flow(sd, cfg, torch.cat([*latents[:n], noise], 1),
                              condition_frames(state.cond, 0, frames),
                              torch.tensor([0.0] * 3 * n + [1000.0] * 3), clip, keyboard[:raw],
                              None if mouse is None else mouse[:raw])
        worst = max(worst, (latents[n] - (noise - flow[:, -3:])).abs().max().item())
    assert worst <= 1e-4, worst
    # the local window mattered: chunk 3 attends 3 frames before it (universal, Temple Run)
    # or 1 (GTA) of the 9 the stream has
    assert backend.attended(state, None) == state.table.attended_pages()[
        -(cfg.local_attn_size - 3):]


def test_distilled_steps_renoise_with_the_chunks_own_noise():
    """Two chunks at the universal model's 3 steps: x0 at each level, noised afresh to the
    next from the chunk's generator (its draws after the initial noise)."""
    backend, cfg, sd = make("universal")
    sigmas = warped_sigmas((1000, 666, 333), 5.0)
    assert [round(s, 4) for s in sigmas] == [1.0, 0.9088, 0.714]
    state = backend.new_state("play", seed=0)
    controls = random_controls(backend, torch.Generator().manual_seed(3))
    for n in range(2):
        (result,) = backend.generate([ChunkJob(state, [0] * 12, 3, 50 + n, controls.tolist())])
        assert result.error is None
        backend.finish()
    latents = [c.latents for c in state.history]
    keyboard, mouse = raw_inputs(backend.variant, torch.cat([controls[3:], controls]))
    clip = backend.image_encoder.encode(backend._default_image)[0]
    for n in range(2):
        g = torch.Generator().manual_seed(50 + n)
        x = torch.randn(backend.latent_shape, generator=g)
        frames = 3 * (n + 1)
        raw = 1 + 4 * (frames - 1)
        for i, sigma in enumerate(sigmas):
            flow = reference_flow(sd, cfg, torch.cat([*latents[:n], x], 1),
                                  condition_frames(state.cond, 0, frames),
                                  torch.tensor([0.0] * 3 * n + [1000.0 * sigma] * 3), clip,
                                  keyboard[:raw], mouse[:raw])
            x0 = x - sigma * flow[:, -3:]
            if i + 1 < len(sigmas):
                x = (1 - sigmas[i + 1]) * x0 + sigmas[i + 1] * torch.randn(
                    backend.latent_shape, generator=g)
        assert (latents[n] - x0).abs().max().item() <= 1e-4


def test_forks_rewinds_and_batches_keep_the_action_caches_with_the_pages():
    """The action modules' keys/values live in pages: a fork continues exactly as its
    original (batched with it), a rewound chunk comes back the same, and the mouse reaches
    the model."""
    backend, _, _ = make("universal")
    state = backend.new_state("play", seed=0)
    controls = random_controls(backend, torch.Generator().manual_seed(5))

    def chunk(*states, seed=20, c=controls):
        results = backend.generate([ChunkJob(s, [0] * 12, 1, seed, c.tolist()) for s in states])
        assert all(r.error is None for r in results)
        backend.finish()
        return [s.history[-1].latents for s in states]

    chunk(state, seed=10)
    chunk(state, seed=11)
    twin = backend.fork(state)
    original, forked = chunk(state, twin)  # one batch of two rows
    torch.testing.assert_close(forked, original, atol=1e-5, rtol=0)
    backend.rewind(state, 1)
    (again,) = chunk(state)  # alone this time
    torch.testing.assert_close(again, original, atol=1e-5, rtol=0)
    backend.rewind(state, 1)
    looked = controls.clone()
    looked[:, -2] += 0.2  # turning right: yaw
    (turned,) = chunk(state, c=looked)
    assert (turned - original).abs().max() > 1e-3
    backend.free(twin)
