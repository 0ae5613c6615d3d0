"""The built-in world model: a small causal diffusion transformer over autoencoder latents.

Tokens are 4×4 latent patches (a 32×32 latent frame -> 8×8 = 64 tokens). Each frame is
conditioned (adaLN-Zero, DiT) on its noise level σ, its action and the scene-prompt embedding;
the action is also added to every token of its frame (a strong per-token signal). Positions:
learned over the 8×8 grid, rotary (RoPE) over time, so cached keys stay valid as the stream
moves on. Attention goes through ``engine.models.builtin.attention.attend`` (one call site): dense
block-causal for training, paged KV cache in the engine. The network predicts the clean latent
x0 (velocity prediction failed at this width in the first training runs).

Spatial memory (v2). Every frame is fed a *base*: the window of the stream's spatial memory
(``engine.models.builtin.spatial_memory``) at the frame's camera position, encoded by the
autoencoder, with two planes saying where memory holds content of the current prompt (*current*)
and of an earlier one (*stale*, to restyle). The output is residual on that base, so the
transformer generates only what memory cannot explain: newly revealed ground, animated water,
clouds and creatures, the player sprite, a new prompt's look. The camera position comes from a
learned camera dynamics model (:class:`CameraDynamics`, velocity from the previous velocity and the
action, fitted to the simulator's recorded camera paths): the model decides where the view moves,
the memory makes sure what was seen stays where it was. Since the base is read from memory once per
frame at integer pixel offsets, nothing is resampled twice — v1's base was the previous
*generated* frame shifted by a sub-pixel amount, and its rollouts collapsed into streaks within
three seconds (issue 11).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.models.modeling_utils import ModelMixin
from torch import nn

from worldstream.engine.models.builtin.attention import AttentionContext, attend


def _timestep_embedding(sigma: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal embedding of σ·1000: ``(...)`` -> ``(..., dim)`` float32."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=sigma.device) / half)
    args = sigma.float()[..., None] * 1000.0 * freqs
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


def _rope_cos_sin(positions: torch.Tensor, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables ``(B, 1, L, head_dim)`` for integer positions ``(B, L)``; angles in float64
    so that large stream positions keep full precision."""
    half = head_dim // 2
    inv = 1.0 / (
        10000.0 ** (torch.arange(half, device=positions.device, dtype=torch.float64) / half)
    )
    ang = positions.to(torch.float64)[..., None] * inv
    ang = torch.cat([ang, ang], dim=-1)[:, None]
    return ang.cos().float(), ang.sin().float()


def _apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return (x * cos + torch.cat([-x2, x1], dim=-1) * sin).to(x.dtype)


class WorldDiTActionEmbedding(nn.Module):
    """Embedding of a factored action id: ``id = a_0 + f_0 * (a_1 + f_1 * (a_2 + ...))`` with
    factor sizes ``factors``; the sum of one embedding table per factor. A world whose frame
    carries several independent controls (the avatar: head direction, expression, viseme)
    learns each from every frame it occurs in, instead of one row per combination."""

    def __init__(self, factors: tuple[int, ...], dim: int):
        super().__init__()
        self.factors = tuple(int(f) for f in factors)
        self.tables = nn.ModuleList(nn.Embedding(f, dim) for f in self.factors)

    def forward(self, actions: torch.Tensor) -> torch.Tensor:
        """``(...)`` int64 ids -> ``(..., dim)``."""
        out, rest = 0, actions
        for f, table in zip(self.factors, self.tables):
            out = out + table(rest % f)
            rest = rest // f
        return out


#: a model's second skip sources (``WorldDiT``'s ``skip_source``)
SKIP_SOURCES = (None, "previous", "warped")


class WorldDiTPoseEmbedding(nn.Module):
    """A rig's continuous pose ``(..., 2)`` (yaw, pitch in [-1, 1]) -> ``(token, frame)``
    vectors ``(..., dim)`` each: Fourier features (the pose and sin/cos of it at 4 octaves, as
    NeRF encodes positions) through an MLP, two zero-initialised outputs (added to every token
    of the frame, and to its adaLN conditioning, as the action is)."""

    OCTAVES = 4

    def __init__(self, dim: int):
        super().__init__()
        width = 2 + 4 * self.OCTAVES
        self.mlp = nn.Sequential(nn.Linear(width, dim), nn.SiLU())
        self.token, self.frame = nn.Linear(dim, dim), nn.Linear(dim, dim)
        for layer in (self.token, self.frame):
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)

    def forward(self, pose: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = math.pi * 2.0 ** torch.arange(self.OCTAVES, device=pose.device)
        ang = (pose[..., None] * freqs.to(pose.dtype)).flatten(-2)
        h = self.mlp(torch.cat([pose, torch.sin(ang), torch.cos(ang)], dim=-1))
        return self.token(h), self.frame(h)


class WorldDiTBlock(nn.Module):
    """Pre-norm transformer block with adaLN-Zero modulation and QK-RMSNorm."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float):
        super().__init__()
        self.num_heads = num_heads
        self.norm1 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.q_norm = nn.RMSNorm(dim // num_heads, eps=1e-6)
        self.k_norm = nn.RMSNorm(dim // num_heads, eps=1e-6)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        hidden = int(dim * mlp_ratio)
        self.mlp = nn.Sequential(
            nn.Linear(dim, hidden), nn.GELU(approximate="tanh"), nn.Linear(hidden, dim)
        )
        self.ada = nn.Linear(dim, 6 * dim)
        nn.init.zeros_(self.ada.weight)
        nn.init.zeros_(self.ada.bias)

    def forward(self, x, cond, rope, layer: int, ctx: AttentionContext):
        """``x``: ``(B, T, n, d)`` tokens of T frames; ``cond``: ``(B, T, 1, d)`` per frame (the
        modulation is computed once per frame and broadcast over its n tokens)."""
        b, t, n, d = x.shape
        shift1, scale1, gate1, shift2, scale2, gate2 = self.ada(cond).chunk(6, dim=-1)
        h = self.norm1(x) * (1 + scale1) + shift1
        qkv = self.qkv(h).view(b, t * n, 3, self.num_heads, d // self.num_heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        q, k = self.q_norm(q), self.k_norm(k)
        q, k = _apply_rope(q, *rope), _apply_rope(k, *rope)
        a = attend(q, k.to(q.dtype), v.to(q.dtype), layer, ctx)
        x = x + gate1 * self.proj(a.transpose(1, 2).reshape(b, t, n, d))
        h = self.norm2(x) * (1 + scale2) + shift2
        return x + gate2 * self.mlp(h)


class CameraDynamics(nn.Module):
    """Learned camera motion: ``v_t = v_{t-1} + L([v_{t-1}, a_t]) + MLP([v_{t-1}, a_t])`` with
    the action one-hot, in image pixels per frame; the camera position is the running sum of
    ``v``. A linear part (momentum and thrust: what a camera with inertia mostly is) plus a
    small MLP for the rest; fitted to the simulator's recorded camera paths
    (``engine.training.train_world.fit_camera_dynamics``). Recurrent because a world with
    inertia needs the velocity as state."""

    def __init__(self, num_actions: int, hidden: int = 64):
        super().__init__()
        self.num_actions = num_actions
        self.linear = nn.Linear(2 + num_actions, 2)
        self.mlp = nn.Sequential(
            nn.Linear(2 + num_actions, hidden), nn.SiLU(), nn.Linear(hidden, 2)
        )
        for layer in (self.linear, self.mlp[2]):  # zero at init: the camera stays put
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)

    def forward(self, vel: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """``vel (N, 2)`` float32 px/frame, ``actions (N,)`` int64 -> next velocity ``(N, 2)``."""
        hot = F.one_hot(actions, self.num_actions).to(vel.dtype)
        x = torch.cat([vel, hot], dim=-1).to(self.linear.weight.dtype)
        return vel + (self.linear(x) + self.mlp(x)).float()

    @torch.no_grad()
    def rollout(
        self, vel: torch.Tensor, actions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Displacements of a sequence: ``vel (2,)`` before it, ``actions (T,)`` ->
        ``(T, 2)`` float32 per-frame displacement (px) and the final velocity ``(2,)``."""
        out = []
        v = vel.float()[None]
        for a in actions.reshape(-1):
            v = self(v, a.reshape(1))
            out.append(v[0])
        return torch.stack(out), v[0]


class WorldDiT(ModelMixin, ConfigMixin):
    """Causal world transformer with a spatial-memory base and learned camera dynamics.

    Args (config): ``latent_channels`` (4), ``latent_size`` (32), ``patch_size`` (4), ``dim``,
    ``depth``, ``num_heads``, ``mlp_ratio``, ``num_actions`` (9), ``text_dim`` (384),
    ``chunk_frames`` (frames per chunk it was trained with), ``latent_mean``/``latent_std``
    (per-channel autoencoder latent statistics; the model sees normalised latents),
    ``image_size`` (frame side, px), ``view_box`` (side in px of the view-anchored square at
    the frame centre that is never written to memory: the player sprite; 0 = none),
    ``action_factors`` (None: ``num_actions`` independent ids; else the sizes of the factors
    an action id is made of, product ``num_actions``, each embedded separately: per-frame
    conditioning such as expression and speech, see :class:`WorldDiTActionEmbedding`),
    ``base_warp`` (None, or the name of the warp its memory bases were moved with before they
    were encoded, ``engine.worlds.catalog.BASE_WARPS``: the avatar's head pose),
    ``skip_source`` (None; else a second picture fed beside the base, and the skip becomes a
    per-pixel mix of the two, see :meth:`forward`: ``"previous"``, the clean latent of the last
    frame before the frame's chunk; ``"warped"``, the memory picture warped to the rig's pose,
    ``pose_path``'s ``apply``).

    Why ``skip_source``: the output is a residual on the memory base, and the base reaches the
    output through a direct skip, while the frames before reach it only through attention over
    16-px patches, which does not carry their detail through four layers. For a still camera
    (the avatar) the base is the character at rest, so a turning head had to be erased and
    redrawn by the residual; the model drew one turned head for every character (the eyes and
    glasses of none in particular), ghosted over the head at rest. With a second source the
    network predicts a mixing map ``m`` beside its residual, and the skip becomes ``base + m ·
    (source − base)``: where the source is right (the head moved by the warp, or as the last
    frame left it) its detail comes through as directly as the base's does, and where it is
    wrong (the neck and background a warp drags along) the base's (the gated skip of highway
    networks; zero at start, so a warm-started model begins as the model it came from).
    ``skip_prior`` (0.0) is added to the predicted map: 1.0 starts a model trusting its source
    everywhere (the network then learns where not to). Why: from zero, the avatar's map
    averaged 0.23 over a turning head (the skip mostly the head at rest under the turned one: a
    ghost); started at 1.0 with the layered head warp, the network still pulled it to ~0.3, a
    blend of two pictures that each miss by a pixel or two being the better answer under a
    squared error (assets/avatar/MODEL_CARD.md, v2.4), but its turns read better.
    ``skip_floor`` (None) bounds the map from below: a map of at least 0.8, say, draws every
    pixel mostly from the source, so the head at rest can no longer come through the skip and
    what the source misses must come from the residual (no gradient flows to the map where it
    sits at the floor). Why: the map's blend is the squared error's optimum, so no loss of that
    kind and no prior trains it away (v2.7's map over a turned head: about 0.35).

    ``pose_path`` (None, or the name in ``engine.worlds.catalog.BASE_WARPS`` of a rig whose
    pose path conditions every frame: the avatar's head yaw and pitch eased toward the held
    keys, see :meth:`forward`). Why: the head's pose is set by the keys through the rig's
    easing, and a model that must read it from its context drew, even from true context, a
    blend of the head at rest and the head turned all the way (it did not know how far
    along the turn a frame is); the landscape's camera path is given the same way.

    ``backdrop_fill`` (False): with the ``"warped"`` skip source, what a turn uncovers of the
    character's region at rest showed the scene's background plate when the model was trained
    (the rig's ``apply(..., backdrop=)``; the avatar world's plate is drawn by its simulator),
    so the engine passes a stream's backdrop to the rig; False: the rig's fill from around,
    which a model trained on it expects (a fill it was not trained on read worse). Why: the
    fill drags the neck's and hair's colours over uncovered background, and no fill can know
    a background that does not continue sideways (assets/avatar/MODEL_CARD.md).

    ``noise_correlation`` (0.0) and ``noise_scale`` (2.0 latent px): the denoising noise the
    model was trained on (``engine.models.builtin.world_noise.correlated``: a share
    ``noise_correlation`` of each pixel's variance low-passed over ``noise_scale`` pixels; 0 is
    white noise); the engine draws its initial noise the same way.
    """

    def normalize(self, z: torch.Tensor) -> torch.Tensor:
        """Autoencoder latents ``(..., C, h, w)`` -> model space (per-channel standardised)."""
        mean, std = self._stats(z)
        return (z - mean) / std

    def denormalize(self, z: torch.Tensor) -> torch.Tensor:
        mean, std = self._stats(z)
        return z * std + mean

    def _stats(self, z: torch.Tensor):
        c = self.config.latent_channels
        mean = torch.tensor(self.config.latent_mean or [0.0] * c, device=z.device)
        std = torch.tensor(self.config.latent_std or [1.0] * c, device=z.device)
        return mean[:, None, None], std[:, None, None]

    @register_to_config
    def __init__(
        self,
        latent_channels: int = 4,
        latent_size: int = 32,
        patch_size: int = 4,
        dim: int = 128,
        depth: int = 6,
        num_heads: int = 4,
        mlp_ratio: float = 3.0,
        num_actions: int = 9,
        text_dim: int = 384,
        chunk_frames: int = 1,
        latent_mean: tuple[float, ...] | None = None,
        latent_std: tuple[float, ...] | None = None,
        image_size: int = 128,
        view_box: int = 13,
        action_factors: tuple[int, ...] | None = None,
        base_warp: str | None = None,
        skip_source: str | None = None,
        pose_path: str | None = None,
        skip_prior: float = 0.0,
        noise_correlation: float = 0.0,
        noise_scale: float = 2.0,
        skip_floor: float | None = None,
        backdrop_fill: bool = False,
    ):
        # chunk_frames, latent_mean/std, image_size, view_box, base_warp, noise_correlation/
        # scale: how the model was trained (the engine reads them); latents are normalised per
        # channel as (z - mean) / std
        super().__init__()
        if not 0.0 <= noise_correlation < 1.0 or noise_scale <= 0:
            raise ValueError("noise_correlation must be in [0, 1) and noise_scale > 0 latent px, "
                             f"got {noise_correlation} and {noise_scale}")
        if skip_source not in SKIP_SOURCES:
            raise ValueError(f"skip_source must be one of {SKIP_SOURCES}, got {skip_source!r}")
        if skip_source == "warped" and pose_path is None:
            raise ValueError("skip_source 'warped' warps to a rig's pose: give pose_path")
        if skip_floor is not None and (skip_source is None or not 0.0 <= skip_floor <= 1.0):
            raise ValueError("skip_floor bounds the mixing map of a skip_source and must be in "
                             f"[0, 1], got {skip_floor} with skip_source {skip_source!r}")
        if backdrop_fill and skip_source != "warped":
            raise ValueError("backdrop_fill fills what the warped skip source uncovers: it "
                             f"needs skip_source 'warped', got {skip_source!r}")
        grid = latent_size // patch_size
        self.tokens_per_frame = grid * grid
        # 1. patch stem over [noisy latent ; base ; base σ, current, stale planes (; second
        #    skip source)] (overlapping 2p × 2p patches)
        self.stem = nn.Conv2d(
            (3 if skip_source else 2) * latent_channels + 3,
            dim,
            kernel_size=2 * patch_size,
            stride=patch_size,
            padding=patch_size // 2,
        )
        self.pos = nn.Parameter(torch.randn(1, self.tokens_per_frame, dim) * 0.02)
        # 2. per-frame conditioning: noise level + action + scene prompt
        self.sigma_mlp = nn.Sequential(nn.Linear(dim, dim), nn.SiLU(), nn.Linear(dim, dim))
        if action_factors is None:
            self.action_emb = nn.Embedding(num_actions, dim)
            self.action_tok = nn.Embedding(num_actions, dim)
        else:
            if math.prod(action_factors) != num_actions:
                raise ValueError(f"action_factors {tuple(action_factors)} must multiply to "
                                 f"num_actions ({num_actions})")
            self.action_emb = WorldDiTActionEmbedding(action_factors, dim)
            self.action_tok = WorldDiTActionEmbedding(action_factors, dim)
        self.text_proj = nn.Sequential(nn.Linear(text_dim, dim), nn.SiLU(), nn.Linear(dim, dim))
        if pose_path is not None:  # zero at start: a warm-started model begins unchanged
            self.pose_emb = WorldDiTPoseEmbedding(dim)
        # 3. transformer blocks
        self.blocks = nn.ModuleList(WorldDiTBlock(dim, num_heads, mlp_ratio) for _ in range(depth))
        # 4. output: adaLN + linear back to patches
        self.norm_out = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.ada_out = nn.Linear(dim, 2 * dim)
        self.out = nn.Linear(dim, patch_size * patch_size * latent_channels)
        nn.init.zeros_(self.ada_out.weight)
        nn.init.zeros_(self.ada_out.bias)
        if skip_source:  # the skip's mixing map, one value per latent pixel, zero at start
            self.skip_gate = nn.Linear(dim, patch_size * patch_size)
            nn.init.zeros_(self.skip_gate.weight)
            nn.init.zeros_(self.skip_gate.bias)
        # 5. where the camera goes: velocity from the previous velocity and the action
        self.camera = CameraDynamics(num_actions)

    def forward(
        self,
        latents: torch.Tensor,
        base: torch.Tensor,
        base_sigma: torch.Tensor,
        known: torch.Tensor,
        sigma: torch.Tensor,
        actions: torch.Tensor,
        text: torch.Tensor,
        positions: torch.Tensor,
        ctx: AttentionContext,
        skip: torch.Tensor | None = None,
        pose: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Predict clean latents.

        Args:
            latents: ``(B, T, C, h, w)`` noisy latents of T frames (any float dtype).
            base: ``(B, T, C, h, w)`` each frame's memory window, encoded and normalised
                (unknown pixels read as mid-grey).
            base_sigma: ``(B, T)`` noise level the base is tagged with (context noise).
            known: ``(B, T, 2, h, w)`` fraction of each latent pixel's image pixels that memory
                holds from the current prompt (channel 0) and from an earlier one (channel 1).
            sigma: ``(B, T)`` flow-matching noise level in [0, 1] of each frame.
            actions: ``(B, T)`` int64 action ids (``engine.worlds.actions``).
            text: ``(B, T, text_dim)`` scene-prompt embedding per frame (zeros = no prompt).
            positions: ``(B, T)`` int64 absolute frame indices (rotary time positions).
            ctx: attention context (dense mask or paged KV cache), see
            ``engine.models.builtin.attention``.
            skip: ``(B, T, C, h, w)`` normalised latent of each frame's second skip source
                (``skip_source``: the last frame before its chunk, or the memory picture warped
                to its pose), noised at ``base_sigma`` as the base is; required by a model
                with ``skip_source``, refused otherwise (ValueError).
            pose: ``(B, T, 2)`` float32 the rig's pose (yaw, pitch in [-1, 1]) at each frame,
                for a model with ``pose_path`` (required there, refused otherwise:
                ValueError).
        Returns:
            ``(B, T, C, h, w)`` float32 predicted x0: the skip (the base, with ``skip_source``
            mixed per pixel with ``skip`` by the predicted map; scaled by its clean fraction)
            plus the network's output.
        """
        cfg = self.config
        b, t, c, hh, ww = latents.shape
        n = self.tokens_per_frame
        # 1. patch stem
        dt = base.dtype
        plane = base_sigma.to(dt)[..., None, None, None].expand(b, t, 1, hh, ww)
        if (skip is not None) != bool(cfg.skip_source):
            raise ValueError(f"this model {'needs' if cfg.skip_source else 'takes no'} a "
                             "second skip source (skip)")
        parts = [latents.to(dt), base, plane, known.to(dt)]
        if skip is not None:
            parts.append(skip.to(dt))
        if (pose is not None) != (cfg.pose_path is not None):
            raise ValueError(f"this model {'needs' if cfg.pose_path else 'takes no'} the "
                             "rig's pose (pose)")
        x = torch.cat(parts, dim=2)
        x = x.reshape(b * t, x.shape[2], hh, ww)
        x = self.stem(x.to(self.stem.weight.dtype)).flatten(2).transpose(1, 2)  # (B*T, n, dim)
        x = x + self.pos + self.action_tok(actions).reshape(b * t, 1, -1)
        x = x.reshape(b, t, n, -1)
        # 2. conditioning, one vector per frame, broadcast over its tokens
        dtype = self.pos.dtype  # fp32 or bf16 weights (autocast or a cast model)
        cond = (
            self.sigma_mlp(_timestep_embedding(sigma, cfg.dim).to(dtype))
            + self.action_emb(actions)
            + self.text_proj(text.to(dtype))
        )
        if pose is not None:
            token, frame = self.pose_emb(pose.to(dtype))
            x = x + token[:, :, None].to(x.dtype)
            cond = cond + frame
        cond = F.silu(cond)[:, :, None]  # (B, T, 1, dim)
        rope = _rope_cos_sin(positions.repeat_interleave(n, dim=1), cfg.dim // cfg.num_heads)
        # 3. blocks
        for layer, block in enumerate(self.blocks):
            x = block(x, cond, rope, layer, ctx)
        # 4. output, residual on the base
        h = self.norm_out(x)
        shift, scale = self.ada_out(cond).chunk(2, dim=-1)
        h = h * (1 + scale) + shift
        x = self._unpatchify(self.out(h).float(), c)  # (B, T, C, h, w)
        through = base.float()
        if skip is not None:
            mix = cfg.skip_prior + self._unpatchify(self.skip_gate(h).float(), 1)  # (B,T,1,h,w)
            if cfg.skip_floor is not None:
                mix = mix.clamp_min(cfg.skip_floor)
            through = through + mix * (skip.float() - through)
        return x + (1 - base_sigma.float())[..., None, None, None] * through

    def _unpatchify(self, x: torch.Tensor, channels: int) -> torch.Tensor:
        """``(B, T, n, p*p*channels)`` per-token outputs -> ``(B, T, channels, h, w)``."""
        b, t = x.shape[:2]
        p = self.config.patch_size
        g = self.config.latent_size // p
        x = x.reshape(b, t, g, g, p, p, channels).permute(0, 1, 6, 2, 4, 3, 5)
        return x.reshape(b, t, channels, g * p, g * p)


def warm_start(model: WorldDiT, state: dict[str, torch.Tensor]) -> None:
    """Load ``state`` (a trained :class:`WorldDiT`'s ``state_dict``) into ``model``; a model
    with ``skip_source`` or ``pose_path`` warm-started from one without gets the stem's
    second-source input channels, the skip's mixing map and the pose embedding's outputs at
    zero, so it starts as exactly the trained model (as ControlNet's zero convolutions add a
    condition to a trained network); a deeper model keeps its extra blocks, after the trained
    ones, as initialised (adaLN-Zero: each adds nothing until trained, so the deeper model
    also starts as the trained one). RuntimeError or ValueError when the shapes differ
    otherwise (a shallower model included)."""
    stem = state.get("stem.weight")
    own = model.stem.weight
    if stem is not None and stem.shape != own.shape:
        extra = own.shape[1] - stem.shape[1]
        if not model.config.skip_source or extra != model.config.latent_channels:
            raise ValueError(f"stem {tuple(stem.shape)} does not fit {tuple(own.shape)}")
        pad = torch.zeros(stem.shape[0], extra, *stem.shape[2:], dtype=stem.dtype)
        state = {**state, "stem.weight": torch.cat([stem, pad], dim=1)}
    # parts the trained model has not, kept as initialised (zero outputs: no change)
    trained = {int(k.split(".")[1]) for k in state if k.startswith("blocks.")}
    blocks = [f"blocks.{i}" for i in range(len(model.blocks)) if trained and i > max(trained)]
    modules = dict(model.named_modules())
    for name in ("skip_gate", "pose_emb", *blocks):
        part = modules.get(name)
        if part is not None and not any(k.startswith(f"{name}.") for k in state):
            state = {**state, **{f"{name}.{k}": v.clone() for k, v in part.state_dict().items()}}
    model.load_state_dict(state)
