"""The neural world backend: memory read -> denoise -> cache fill -> decode -> memory write,
over the paged temporal KV cache and the spatial memory.

One :class:`BuiltinBackend` holds the model, the autoencoder and one preallocated KV pool
``[num_layers, num_pages, heads, page_size, head_dim]`` shared by every session and branch; each
session's :class:`BuiltinState` owns a :class:`~engine.core.kv_cache.PageTable` (one page = the 64
tokens of one latent frame), a :class:`~engine.models.builtin.spatial_memory.SpatialMemory` (what
it has shown, in world coordinates) and its camera (position, velocity). Generating a chunk for a
batch:

1. camera: the model's learned camera dynamics turn the chunk's actions into per-frame camera
   positions (integer world pixels);
2. base: each frame's window is read from the spatial memory at its position, once, and encoded
   (with planes saying where memory holds current and stale content);
3. allocate the chunk's pages; each query chunk attends (through ``kernels.paged_attention``,
   CSR page lists) to its sink + window pages, optionally older pages picked by camera overlap
   with the current view (spatial) or top-k by key similarity, and its own pages;
4. denoise in 1-4 flow-matching steps (``engine.backends.sampler``), every step rewriting the
chunk's
   keys/values in its own pages;
5. cache fill: one more forward of the clean chunk tagged with the context noise level writes
   the keys/values later chunks attend to (Self-Forcing / CausVid);
6. decode the latents to RGB with the autoencoder, batched, and write the frames into the
   spatial memory where it held nothing of the current prompt (write-once; the centred player
   sprite excluded).

A stream starts from real simulator frames of the prompt's scene (encoded, cache-filled and
written to memory as the first chunk). A prompt switch recaches the window under the new text
embedding (LongLive) and starts a new memory epoch (remembered ground is restyled on sight).
All methods take one lock: the engine thread generates while other threads may fork or free.
"""

from __future__ import annotations

import hashlib
import logging
from collections import OrderedDict, deque
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
from diffusers.utils import logging as diffusers_logging
from scipy import ndimage

from worldstream.engine.backends.runner import (
    PagedAttentionContext,
    PagedRunner,
    RunnerState,
    StreamConfig,
)
from worldstream.engine.core.backend import ChunkJob
from worldstream.engine.models.builtin import attention
from worldstream.engine.models.builtin import text as text_encoder
from worldstream.engine.models.builtin.autoencoder import frames_to_tensor, tensor_to_frames
from worldstream.engine.models.builtin.colour_prior import ColourPrior
from worldstream.engine.models.builtin.loading import (
    BUILTIN_DIR,
    load_autoencoder,
    load_colour_prior,
    load_world_model,
)
from worldstream.engine.models.builtin.spatial_memory import (
    SpatialMemory,
    UndoRecord,
    centre_box,
    model_inputs,
    select_by_overlap,
)
from worldstream.engine.models.builtin.world_dit import WorldDiT
from worldstream.engine.models.builtin.world_noise import chunk_noise, training_noise
from worldstream.engine.training.common import cpu_has_fast_bf16
from worldstream.engine.worlds.actions import IDLE, keys_to_action
from worldstream.engine.worlds.catalog import make_base_warp
from worldstream.engine.worlds.simulator import WorldSimulator

log = logging.getLogger(__name__)


@dataclass
class BuiltinConfig(StreamConfig):
    """Streaming settings of the built-in model (the shared ones: :class:`StreamConfig`).

    ``topk_pages``: older pages attended per query chunk, picked by key similarity (0 = off).
    ``spatial_pages``: older pages attended per query chunk, picked by how much of the current
    view their frame's camera window covers (0 = off; the spatial top-k beside the recency
    window). ``dtype``: compute dtype. ``cpu_threads``: torch intra-op threads on CPU
    (process-wide; None = leave as is). ``memory_tiles``: spatial-memory tiles (64 px) kept per
    state (LRU beyond). ``memory_settle_px``: how far inside a frame (px from its border) a
    generated pixel must have been seen before it is final in memory (``SpatialMemory``'s
    ``settle_px``; the training replay keeps its 16): new ground is rewritten by every frame
    until then, each time as memory plus the model's change, so it carries the detail of every
    frame that rewrote it. The landscape's 24: at 16 a camera moving ``v`` px a frame
    settled neighbouring bands of ``v/2`` columns after different numbers of rewrites, each
    band's edge a seam of one frame's detail (the moving night's vertical lines every 6 px),
    and new ground came out softer than the simulator's (snow 0.53-0.59 of its sharpness at
    the worst 40 frames); 24 spreads each seam over more rewrites and lifts that to 0.62-0.71.
    The price: a loop on generated ground comes back to 1.2 dB more change, as more of the
    ground near the border is still being rewritten when the camera returns
    (assets/builtin/MODEL_CARD.md, "How far in new ground settles").
    ``pixel_residual``: where memory holds current content, show the
    remembered pixels plus the model's change to them (``memory + decode(x0) - decode(base)``)
    instead of ``decode(x0)``: remembered ground keeps its full sharpness instead of the
    autoencoder's, and the model's changes (water, clouds, creatures) still show; costs one
    more decode per frame. ``residual_deadzone``: with the pixel residual, the model's change
    to a remembered pixel is soft-thresholded by this many levels (of 255, on the largest of
    its three channels; 0 = off): ``c · max(|c| - τ, 0) / |c|`` (wavelet shrinkage, Donoho &
    Johnstone, "Ideal spatial adaptation by wavelet shrinkage", 1994). A few-step sample
    leaves a low-amplitude texture on what should stay as remembered (the avatar's still
    background and face, from the first generated frame on); changes larger than it (a head
    turn, a mouth) still show, less ``τ``. ``residual_gate``: with the pixel residual, ``(t1,
    t2)`` levels: where the model's change to a remembered pixel (its largest channel, averaged
    over the :data:`GATE_WINDOW` px square around it) exceeds ``t1``, the frame fades from
    memory plus change to the model's own decode, fully at ``t2`` (None = off). Memory plus
    change keeps the memory's fine detail, which the decode of its base lacks, wherever the
    model changes a pixel: right where the model moves content away (a turned head) it kept
    the outlines of what was there (the avatar's head at rest: eyes and glasses under the
    turned face, assets/avatar/MODEL_CARD.md). ``window_pose_tolerance``: with a model
    conditioned on a rig's pose (``pose_path``), a window frame whose pose differs from the
    new chunk's first frame's by more than this (the larger of the yaw and pitch differences,
    pose units, [-1, 1] a full turn) is left out of the chunk's attention (None = off): right
    after a head-direction key the frames before show the head where it was, and the model,
    trained on context one small step of the rig's easing away, copies it under the turned
    head; without them it draws the head from the memory base, the pose-warped second source
    and the pose, as at a stream's first frame (trained too: a clip's first frame has no
    context). ``decode_refining``: with the pixel residual, show
    the model's decode instead of memory plus change where the frame rewrites memory's pixel
    (new ground still being refined on its way in from the border, ``MemoryRead.refining``):
    without it each such pixel carries the sum of the changes of up to ``settle_px`` frames
    (speckle and streaks along the motion); with it, the model's last view of it (softer).
    ``world_noise``: each frame's initial denoising noise is read from a Gaussian field fixed
    in world coordinates at the frame's camera window (``engine.models.builtin.world_noise``;
    the field's seed is the stream's seed, or a job's ``seed``), instead of drawn afresh: the
    frames that generate the same new ground on its way in from the border start from the same
    noise there and refine one sample of it, instead of each drawing its own and memory
    keeping their mix. ``world_noise_period``: frames *at rest* over which that field drifts
    halfway to an independent one (independent two periods apart; 0: fixed in time), once the
    camera has rested longer than ``world_noise_hold`` frames in a row: a camera resting for
    minutes gets the same noise every frame, so the model's bias there cannot average out,
    while a moving camera, and one pausing for less than the hold, keeps the field fixed (a
    revisit reads the noise of the way out; drifting in stream time instead lost that and
    collapsed one moving world). Off by default: night worlds idle for 3,000 frames brightened
    +11 to +14 levels with the fixed field and +5 to +6 drifting on an AVX-512 Xeon (bf16
    autoencoder, three worlds), but +1.5 to +8.2 fixed against +1.8 to +12.1 drifting on an
    AVX2 EPYC (fp32, six worlds; assets/builtin/MODEL_CARD.md). ``restyle_chunks``: after a
    prompt switch, this many chunks each start a new memory epoch, so everything in view reads
    as stale and is restyled again (at least 1: the switch itself); the model restyles in one
    frame what the simulator cross-fades over 12, and a second or third pass finishes what the
    first left half done.
    ``guidance``: classifier-free guidance scale on the prompt (Ho & Salimans, "Classifier-Free
    Diffusion Guidance", 2022: ``u + guidance * (c - u)`` from the denoiser's predictions
    without and with the text embedding, which training drops 10 % of the time; 1 = off),
    applied in the ``guidance_chunks`` chunks from a prompt switch (None: every chunk). Each
    guided step runs the model twice, so it is spent where the prompt must win over the
    picture in memory: a restyle. ``steady_guidance_sigma``: outside those chunks, the prompt
    is still guided at the denoising steps whose noise level σ is at least this (None: off),
    in every chunk: the high-noise steps set a frame's colours and layout, so guiding only
    them keeps new ground in the prompt's scene at one or two extra forwards a chunk instead
    of one a step (guidance limited to an interval of noise levels: Kynkäänniemi et al.,
    "Applying Guidance in a Limited Interval Improves Sample and Distribution Quality in
    Diffusion Models", 2024). The landscape's default, 0.6, guides the first two of four
    steps (σ = 1, 0.75; the first of two): on the full evaluation's four moving worlds the
    worst 40-frame luma error of frames 0-600 fell from +134 to +20 levels (night) and
    -51 to -37 (snow), at 1.28x a 4-step chunk, 1.1x a 2-step one, run one forward after
    the other (assets/builtin/MODEL_CARD.md; ``StreamConfig.batched_guidance`` batches them).
    ``action_guidance``: the same guidance on the action, with
    ``neutral_action`` (the world's id for no key, no expression, silence) as the negative
    condition, for chunks that ask any other action (1 = off): the action's effect is
    amplified where the model is too timid to leave its memory base (the avatar's
    expressions). ``kept_factors``: for a model with factored action ids
    (``WorldDiT.config.action_factors``), the factors the negative condition keeps as asked, so
    that only the others are amplified (the avatar keeps its head direction: guiding head turns
    broke the head apart). With both, the two guidance terms are summed (Liu et al., "Compositional
    Visual Generation with Composable Diffusion Models", 2022). ``autoencoder_dtype``: the
    autoencoder's compute dtype (None: bf16 on CUDA and on CPUs with native bf16, where it
    halves encode + decode time — 35 -> 19 ms a frame measured on an AVX-512-BF16 EPYC core
    — else ``dtype``). ``compile``: run the world model through ``torch.compile`` (inductor,
    ``dynamic=True`` so that batches of any size share one graph; the paged attention runs
    eagerly as one opaque op inside it, see ``engine.models.builtin.attention.attend``): the
    model's many small ops are fused: on an AVX-512 Xeon core, in alternating rounds
    (``python -m bench baselines``: ``compiled_vs_eager``; then with a graph break at each
    layer's attention) a 4-step chunk of the landscape model took 72 instead of 98 ms,
    of the avatar model 39.5 instead of 40.9; through the engine (``python -m bench quick``)
    the avatar streamed 0.92-1.27x the frames in three pairs (assets/*/MODEL_CARD.md). The
    backend compiles at construction (warm-up chunks of one and two streams, ~15-30 s on this
    CPU; inductor's cache on disk makes a later start faster) and stays eager, with a
    warning, where compiling fails (no C++ compiler).
    ``last_step_cache_sigma`` (:class:`StreamConfig`): 0.3 here, the built-in recipe's largest
    context noise (``train-world --ctx-sigma-max``): at 4 steps a chunk's cache entry is its
    last step's keys/values (σ = 0.25) and the cache fill's forward is skipped; at 2 steps it
    still runs. One process alternating the two settings (the landscape, compiled, one thread,
    6 rounds of 50 chunks with keys held, AVX-512-BF16 EPYC, load 0.8): 1.14x the chunks per
    second (1.02-1.27x by round); the moving worlds' frames read the same (assets/builtin/
    MODEL_CARD.md, "The last step's keys/values as the cache").
    ``first_step_from_memory``: in chunks of at least this many denoising steps (None: off),
    the first step (σ = 1) takes the chunk's memory base as its prediction instead of
    running the model, so the second level starts from the base noised to it (SDEdit's
    start from a noised guide, Meng et al. 2022; ``sampler.denoise``'s ``first_x0``): one
    forward less a chunk — at the landscape's 4 steps and steady guidance, the forward with
    the guided row. Chunks within a prompt switch's guided chunks (``guidance_chunks``), and chunks
    whose view holds ground remembered under an earlier prompt (stale), keep the full
    schedule: there the base shows the old scene. The landscape's 4
    (assets/builtin/MODEL_CARD.md, "The first step from memory"): at 2 steps the one
    forward left from σ = 0.5 drew new ground too soft (quick evaluation: worst sharpness
    segment 0.32 -> 0.23 of the simulator's). Off for the avatar, whose 2-step head turns
    read worse from it (six scripted held-out episodes: 0.886 against 0.907 at the full
    gate, 0.549 against 0.775 at 0.6 of it).
    ``refining_detail_cap``: with the pixel residual, the remembered detail a frame carries
    onto ground still being refined (memory's pixels less the decode of their base, on
    ``MemoryRead.refining`` pixels) is scaled, frame by frame, so that its RMS is at most
    this many times the RMS of what the autoencoder loses on the stream's real frames (its
    start frames or picture, observed frames; after a prompt switch, the simulator frames a
    stream of the new prompt would start from at the same world seed — the start view in the
    new scene's colours; ``BuiltinState.detail_reference``; None: off). Each rewrite of
    new ground on its way in from the border adds its sample's detail to what memory held
    (``memory + decode(x0) - decode(base)``), so a pixel settled after up to ``settle_px``
    rewrites carries the summed detail of as many samples: what gives the day scenes their
    sharpness and the smooth night its busy texture and streaks (on the night's real
    frames the autoencoder loses 4 levels RMS, 8-12 by day, while the carried detail is
    12-15 in every scene). The landscape's 2: on four moving held-out worlds (seeds
    950,301-950,307, frames 0-600) the night's worst 40-frame sharpness 4.7 -> 2.6 times
    the simulator's and its anisotropy 0.11 -> 0.08, the day scenes within 0.02 of before
    (assets/builtin/MODEL_CARD.md, "Real frames are final, and the detail limit on new
    ground"). A per-stream
    reference, not a constant: the same detail is too much for a night and too little for
    a meadow; a cap of 1 softened the day scenes to 0.49-0.55 of the simulator's sharpness.
    ``refining_detail_shading``: with the pixel residual, the remembered detail carried onto
    ground still being refined (as for ``refining_detail_cap``, before its limit) keeps only
    its shading of the decoded colour under it (:func:`shading_detail`: each pixel's detail
    projected onto its decoded RGB, the rest dropped), so a rewrite can brighten or darken
    new ground but not give it a colour of its own. Why: the detail a pixel carries sums
    what several samples drew there, and their colour differences add up to colours the
    scene does not have — the moving desert's new ground turned magenta and pale green by
    frame 160 (49% of its pixels off the scene's palette over frames 0-400, 20% with it;
    ``rollout_off_palette`` in ``engine.evaluation.run``; assets/builtin/MODEL_CARD.md,
    "Detail as shading"). The simulator's own texture is shading of the same kind (each
    class's colour times a brightness, ``engine/worlds/simulator.py``): the intrinsic-image
    split of a picture into reflectance and shading (Barrow and Tenenbaum 1978).
    ``colour_anchor``: a tolerance (levels; None: off): the running mean colour of the ground
    the model generates (new ground and ground still being refined, the sprite excluded;
    an exponential average over frames, :data:`ANCHOR_DECAY`) is compared, channel by
    channel, with the mean colour of the same reference frames as the detail limit's
    (``BuiltinState.colour_reference``; with ``colour_prior``, that mean shrunk toward the
    stream's scene's mean colour), and every frame brings that ground's channels back
    into the tolerance band around it (:func:`anchor_colour`: darkened by a gain, lifted by a
    shift), before it is shown and remembered. Real frames restart the running mean at the
    reference; a prompt switch at the mean of the first generated frame after it, so the new
    scene's colours hold from that frame on (restarted at the reference instead, the mean
    took ~100 frames to see a night restyled as a white field). The colour coherence of
    autoregressive image-to-video tools (Deforum's "match frame 0" colour matching), with a
    dead zone, on generated ground only and averaged over seconds so that a lake or a
    clearing passing by does not pull it. Why: new ground is generated next to
    the model's own earlier output, so a colour bias compounds in space — the moving night
    world turned into a white field after ~2,500 frames (+132 levels), the snowy one
    darkened (-48). The landscape's 2 with its colour prior (8 before it: the dead zone
    let the model's own bias through, the moving meadow +7 levels above its start view;
    assets/builtin/MODEL_CARD.md, "The colour anchor", "The colour prior").
    ``colour_prior``: the landscape's per-scene mean colours and the weight a view keeps
    (:class:`ColourPrior`, fitted on training worlds; None: the reference is the frames' own
    mean colour; the landscape's streaming settings take the shipped one,
    ``engine.models.builtin.loading.load_colour_prior``, as :func:`load_builtin_backend`, the
    on-policy pool and the bench harness do). A view's mean is a poor guess at the colour of
    ground thousands of frames away (a start view by a lake is darker than the world it opens
    onto): with it the moving meadow's generated ground stayed at its bright start view's
    colour while the world grew darker (assets/builtin/MODEL_CARD.md, "The colour prior").
    NOTE: one thread is the default because this model's ops are small: with two OpenMP
    threads on a 2-core machine that also runs the video encoder and the event loop, every op
    waits at a barrier for a descheduled thread — measured 140 ms vs 5.9 s per 4-step chunk
    under load.
    """

    topk_pages: int = 0
    spatial_pages: int = 0
    memory_tiles: int = 256
    memory_settle_px: int = 24
    pixel_residual: bool = True
    residual_deadzone: float = 0.0
    residual_gate: tuple[float, float] | None = None
    window_pose_tolerance: float | None = None
    decode_refining: bool = False
    world_noise: bool = True
    world_noise_period: int = 0
    world_noise_hold: int = 64
    restyle_chunks: int = 3
    guidance: float = 2.0
    guidance_chunks: int | None = 30
    steady_guidance_sigma: float | None = 0.6
    last_step_cache_sigma: float | None = 0.3
    first_step_from_memory: int | None = 4
    refining_detail_cap: float | None = 2.0
    refining_detail_shading: bool = True
    colour_anchor: float | None = 2.0
    colour_prior: ColourPrior | None = None
    action_guidance: float = 1.0
    neutral_action: int | None = None
    kept_factors: tuple[int, ...] = ()
    dtype: torch.dtype = torch.float32
    autoencoder_dtype: torch.dtype | None = None
    device: str = "cpu"
    cpu_threads: int | None = 1
    compile: bool = False

    def __post_init__(self):
        super().__post_init__()
        if self.topk_pages < 0 or self.spatial_pages < 0:
            raise ValueError("topk_pages and spatial_pages must be >= 0")
        if self.memory_tiles < 1 or self.restyle_chunks < 1 or self.memory_settle_px < 1:
            raise ValueError("memory_tiles, memory_settle_px and restyle_chunks must be >= 1")
        if self.guidance < 0 or (self.guidance_chunks is not None and self.guidance_chunks < 0):
            raise ValueError("guidance and guidance_chunks must be >= 0")
        if self.steady_guidance_sigma is not None and not 0 < self.steady_guidance_sigma <= 1:
            raise ValueError("steady_guidance_sigma must be in (0, 1] or None, got "
                             f"{self.steady_guidance_sigma}")
        if self.action_guidance < 0:
            raise ValueError("action_guidance must be >= 0")
        if self.colour_anchor is not None and not self.colour_anchor >= 0:
            raise ValueError(f"colour_anchor must be >= 0 levels or None, got "
                             f"{self.colour_anchor}")
        if self.refining_detail_cap is not None and not self.refining_detail_cap > 0:
            raise ValueError("refining_detail_cap must be > 0 or None, got "
                             f"{self.refining_detail_cap}")
        if self.first_step_from_memory is not None and self.first_step_from_memory < 2:
            raise ValueError("first_step_from_memory must be >= 2 steps or None, got "
                             f"{self.first_step_from_memory}")
        if self.world_noise_period < 0 or self.world_noise_hold < 0:
            raise ValueError("world_noise_period and world_noise_hold must be >= 0 frames, got "
                             f"{self.world_noise_period}, {self.world_noise_hold}")
        gate = self.residual_gate
        if gate is not None and not (len(gate) == 2 and 0 <= gate[0] < gate[1]):
            raise ValueError(f"residual_gate must be (t1, t2) levels with 0 <= t1 < t2, got "
                             f"{gate}")
        if self.window_pose_tolerance is not None and self.window_pose_tolerance < 0:
            raise ValueError("window_pose_tolerance must be >= 0 or None, got "
                             f"{self.window_pose_tolerance}")
        if not 0 <= self.residual_deadzone < 255:
            raise ValueError(f"residual_deadzone must be in [0, 255), got {self.residual_deadzone}")
        if self.action_guidance != 1 and self.neutral_action is None:
            raise ValueError("action_guidance needs the world's neutral_action id")


@dataclass
class _ChunkRecord:
    """What a retained chunk was computed from (for recache and rewind)."""

    latents: torch.Tensor | None  # (F, C, h, w) model-space clean latents
    base: torch.Tensor  # (F, C, h, w) model-space memory bases as fed (context noise included)
    known: torch.Tensor  # (F, 2, h, w) current/stale fractions of the bases
    actions: list[int]
    position: int  # time index of its first frame
    origins: np.ndarray  # (F, 2) int64 camera windows' top-left corners, world px
    camera: tuple[np.ndarray, torch.Tensor]  # (position, velocity) after its last frame
    context: torch.Tensor | None = None  # (F, C, h, w) what the cache fill consumed
    undo: list[UndoRecord] = field(default_factory=list)  # memory writes, oldest first
    guided: bool = False  # denoised with classifier-free guidance on the prompt
    # (F,) int64 each frame's time in the world noise field: frames so far that rested longer
    # than world_noise_hold in a row (the field stands still while the camera moves); set by
    # _plan (every record is planned) or a save point, never left empty
    field_times: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    rest_run: int = 0  # frames in a row, up to its last, whose window did not move
    # (2,) float64 the base warp's pose after its last frame (a model with ``base_warp``)
    pose: np.ndarray = field(default_factory=lambda: np.zeros(2))
    # (F, C, h, w) model-space latents of the second skip source, as fed (context noise
    # included): a model with ``skip_source`` (the frame before the chunk, repeated per frame,
    # or each frame's memory picture warped to its pose); None otherwise
    skip: torch.Tensor | None = None
    # (F, 2) float64 the rig's pose at each frame: a model with ``pose_path``; None otherwise
    poses: np.ndarray | None = None
    # (3,) float64 the colour anchor's running mean colour (RGB levels) of generated ground
    # after its last frame (None where the stream has no colour reference, or no generated
    # ground was seen since a prompt switch), and the reference (3,) float64 it was kept against
    colour_mean: np.ndarray | None = None
    colour_reference: np.ndarray | None = None

    @property
    def num_frames(self) -> int:
        return len(self.actions)


@dataclass
class _MemoryViews:
    """What memory showed the frames of a chunk being generated, flattened over the batch:
    ``pictures (N, H, W, 3)`` uint8, ``current (N, H, W)`` bool (where the pixel residual
    shows them: current content, less what is being refined with ``decode_refining``),
    ``refining`` what is being refined,
    ``base (N, C, h, w)`` their
    clean model-space latents, ``keys`` their content hashes (the base cache's keys)."""

    pictures: np.ndarray
    current: np.ndarray
    base: torch.Tensor
    keys: list[bytes]
    refining: np.ndarray  # (N, H, W) bool current pixels the frame rewrites (MemoryRead)
    # with a base warp: per frame None (the picture as read) or (key, picture, pose, plate) of
    # the picture it was warped from (plate: the backdrop the warp showed, or None). NOTE: the
    # pixel residual subtracts that picture's decoded base, warped, rather than decoding each
    # warped base: one decode a stream instead of one a frame while the head moves (an avatar
    # stream turning its head: 1.26x the time a chunk with both decodes and encodes), and the
    # dead zone drops what the two differ by
    sources: list | None = None


@dataclass
class BuiltinState(RunnerState):
    """One session's (or branch's) state: the shared ones plus the spatial memory (what it
    has shown, in world coordinates), pending start frames and the restyle countdown."""

    memory: SpatialMemory = field(default_factory=SpatialMemory)
    start_frames: np.ndarray | None = None  # (F, H, W, 3) uint8, pending prefill
    restyle_left: int = 0  # chunks that still start a new memory epoch (after a prompt switch)
    guide_left: int = 0  # chunks still denoised with prompt guidance (after a prompt switch)
    noise_seed: int = 0  # the world-anchored noise field's seed (forks read the same world)
    # RMS (levels) of what the autoencoder loses on the stream's last real frames — after a
    # prompt switch, on the frames a stream of the new prompt would start from
    # (BuiltinConfig.refining_detail_cap; None when that is off)
    detail_reference: float | None = None
    # (3,) float64 colour (RGB levels) the colour anchor holds generated ground near: the mean
    # of the same frames, shrunk toward the scene's mean colour by BuiltinConfig.colour_prior
    # (BuiltinConfig.colour_anchor; None when that is off)
    colour_reference: np.ndarray | None = None
    # the prompt whose scene the colour prior reads: the stream's, after a blended switch its
    # heavier part's (the simulator backend's cross-fade shows that part's scene)
    reference_prompt: str = ""
    # (H, W, 3) uint8 the scene behind the subject (a background plate: the avatar's), shown
    # where the rig's warp uncovers it for a model trained so (WorldDiT backdrop_fill); None:
    # the rig fills that from around
    backdrop: np.ndarray | None = None

    @property
    def camera(self) -> tuple[np.ndarray, torch.Tensor]:
        """(position ``(2,)`` float64 world px, velocity ``(2,)`` float32 px/frame) now."""
        if not self.history:
            # NOTE: half a pixel, so that a frame's window (the floor of the position) is the
            # nearest pixel of the path: started at 0.0 the first frame after a key from rest
            # (0.94 px) did not move, a frame late in every press (eval action accuracy)
            return np.full(2, 0.5), torch.zeros(2)
        return self.history[-1].camera

    def pose(self, rest: np.ndarray) -> np.ndarray:
        """The base warp's pose ``(2,)`` now (``rest`` before any chunk)."""
        return self.history[-1].pose if self.history else rest


def _to(module: torch.nn.Module, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    module = module.to(device).eval()
    # diffusers warns on any dtype cast, even a no-op one (and names no module to keep in fp32
    # for these): cast only when it changes something, quietly
    if dtype == torch.float32:
        return module
    verbosity = diffusers_logging.get_verbosity()
    diffusers_logging.set_verbosity_error()
    try:
        return module.to(dtype=dtype)
    finally:
        diffusers_logging.set_verbosity(verbosity)


class BuiltinBackend(PagedRunner):
    """``engine.core.backend.WorldBackend`` for a trained :class:`WorldDiT` + autoencoder: the
    shared :class:`~engine.backends.runner.PagedRunner` plus the camera, the spatial memory and
    the pixel residual."""

    name = "builtin"
    default_fps = 15
    #: ``new_state`` takes ``start_frames`` (a start from a picture, engine.studio.worldio)
    starts_from_frames = True
    plan_stage = "memory_read"
    negative_forwards = 2  # prompt and action guidance

    def __init__(self, model: WorldDiT, autoencoder, config: BuiltinConfig | None = None):
        cfg = config or BuiltinConfig()
        device = torch.device(cfg.device)
        if device.type == "cpu" and cfg.cpu_threads:
            torch.set_num_threads(cfg.cpu_threads)
        mc = model.config
        super().__init__(
            cfg,
            pages_per_chunk=mc.chunk_frames,
            pool_shape=(mc.depth, mc.num_heads, model.tokens_per_frame, mc.dim // mc.num_heads),
            dtype=cfg.dtype,
            device=device,
            topk_pages=cfg.topk_pages,
        )
        if cfg.kept_factors and (mc.action_factors is None or not all(
                0 <= i < len(mc.action_factors) for i in cfg.kept_factors)):
            raise ValueError(f"kept_factors {cfg.kept_factors} name no factors of this model's "
                             f"actions (action_factors {mc.action_factors})")
        self.config: BuiltinConfig = cfg
        self.model = _to(model, device, cfg.dtype)
        self.ae_dtype = cfg.autoencoder_dtype or (
            torch.bfloat16
            if device.type == "cuda" or (device.type == "cpu" and cpu_has_fast_bf16())
            else cfg.dtype
        )
        # NOTE: channels-last (NHWC) weights let oneDNN run the convolutions without reordering
        # every activation: on an AVX-512-BF16 core a bf16 decode took 12 instead of 25 ms and an
        # encode 6 instead of 10, with bit-identical output (fp32: 1.3x, within 2e-5);
        # `python -m bench baselines` measures it (channels_last_vs_nchw)
        self.ae = _to(autoencoder, device, self.ae_dtype).to(memory_format=torch.channels_last)
        self.chunk_frames = mc.chunk_frames
        self.width = self.height = mc.image_size
        self.downsample = mc.image_size // mc.latent_size
        self._exclude = centre_box(mc.image_size, mc.view_box)
        # the warp the model's memory bases were moved with in training (the avatar's head
        # pose), applied to each memory picture before it is encoded
        self.base_warp = (make_base_warp(mc.base_warp, mc.image_size) if mc.base_warp
                          else None)
        # the rig whose pose path conditions each frame (the model's ``pose_path``); the base
        # warp's, when the model has one, follows the same path
        self.pose_rig = (make_base_warp(mc.pose_path, mc.image_size) if mc.pose_path
                         else None)
        # memory pictures already encoded (and decoded, for the pixel residual), by content:
        # a still camera reads the same picture frame after frame
        self._base_cache: OrderedDict[bytes, tuple[torch.Tensor, np.ndarray | None]] = (
            OrderedDict())
        self._net: torch.nn.Module = self.model  # what _forward calls (or its compiled form)
        if cfg.compile:
            self._compile()

    def _compile(self) -> None:
        """Compile the model and run warm-up chunks of one and of two streams (a batch of one
        gets a graph of its own: dynamo specialises sizes of 1), so that no stream waits for
        the compiler; on failure log it and stay eager."""
        self._net = torch.compile(self.model, dynamic=True)
        cfg = self.config
        # NOTE: the two streams run as one batch even where jobs run one by one
        # (batch_invariant): the graph for forwards of several rows — a guided step's stacked
        # negative rows (batched_guidance) — must be compiled here, not at a stream's first
        # expression or prompt switch (the avatar's first smile took 6.6 s, measured)
        invariant, cfg.batch_invariant = cfg.batch_invariant, False
        try:
            states = [self.new_state("warm-up", i) for i in range(min(2, self.max_states))]
            try:
                for n in range(1, len(states) + 1):
                    self.generate([ChunkJob(s, [IDLE] * self.chunk_frames, 1)
                                   for s in states[:n]])
                    self.finish()
            finally:
                for s in states:
                    self.free(s)
        except Exception as exc:  # inductor needs a C++ compiler; a failure must not stop play
            log.warning("torch.compile failed, running the model eagerly: %s", exc)
            self._net = self.model
        finally:
            cfg.batch_invariant = invariant

    # -- keys and prompts -----------------------------------------------------------------
    def key_action(self, keys: frozenset[str]) -> int:
        """The built-in world's action id (``engine.worlds.actions``) for held direction keys;
        ValueError naming an unknown key."""
        return keys_to_action(keys)

    def _embed(self, text: str, blend_text: str | None, weight: float) -> torch.Tensor:
        return torch.as_tensor(np.array(text_encoder.embed_blend(text, blend_text, weight)))

    def _on_prompt(self, state: BuiltinState, blend_text: str | None, blend_weight: float
                   ) -> None:
        state.restyle_left = self.config.restyle_chunks
        state.guide_left = self.config.guidance_chunks or 0
        if self.config.refining_detail_cap is not None or self.config.colour_anchor is not None:
            # the real frames seen were of the old prompt: the references become those of the
            # frames a stream of the new prompt (its heavier part, as the simulator backend
            # cross-fades to) would start from at this world seed — the start view restyled,
            # no more of the world than the stream was given
            state.reference_prompt = (blend_text if blend_text is not None
                                      and blend_weight > 0.5 else state.prompt)
            self._set_references(state, self._simulated_start(state.reference_prompt,
                                                              state.noise_seed))

    # -- state lifecycle ------------------------------------------------------------------
    def new_state(
        self, prompt: str, seed: int, start_frames: np.ndarray | None = None
    ) -> BuiltinState:
        """A stream that starts from ``start_frames`` (``(chunk_frames, H, W, 3)`` uint8), by
        default simulator frames of the prompt's nearest scene at world ``seed``. ValueError
        for a bad prompt or start frames."""
        shape = (self.chunk_frames, self.height, self.width, 3)
        if start_frames is not None and start_frames.shape != shape:
            raise ValueError(f"start_frames must be {shape} uint8, got {start_frames.shape}")
        if start_frames is None:
            start_frames = self._simulated_start(prompt, seed)
        return super().new_state(prompt, seed, start_frames=start_frames)

    def set_backdrop(self, state: BuiltinState, picture: np.ndarray | None) -> None:
        """The scene behind the subject of ``state``'s stream from its next chunk on:
        ``picture (H, W, 3)`` uint8, a background plate (the avatar's, drawn by its
        simulator), or None. A model trained with ``backdrop_fill`` sees it where its rig's
        warp uncovers the scene; other models ignore it. ValueError for another shape or
        dtype, nothing changed."""
        if picture is not None and (picture.shape != (self.height, self.width, 3)
                                    or picture.dtype != np.uint8):
            raise ValueError(f"a backdrop must be ({self.height}, {self.width}, 3) uint8, got "
                             f"{picture.shape} {picture.dtype}")
        with self._settled():
            state.backdrop = None if picture is None else picture.copy()

    def _simulated_start(self, prompt: str, seed: int) -> np.ndarray:
        """Simulator frames ``(chunk_frames, H, W, 3)`` uint8 of the prompt's nearest scene at
        world ``seed``, the camera at rest: a stream's default start."""
        sim = WorldSimulator(seed, text_encoder.scene_for_prompt(prompt))
        return np.stack([sim.step(IDLE) for _ in range(self.chunk_frames)])

    def _make_state(self, table, prompt, text, rng, start_frames=None) -> BuiltinState:
        return BuiltinState(table, prompt, text, rng,
                            memory=SpatialMemory(max_tiles=self.config.memory_tiles,
                                                settle_px=self.config.memory_settle_px),
                            start_frames=start_frames, noise_seed=rng.initial_seed(),
                            reference_prompt=prompt)

    def _fork_state(self, state: BuiltinState, table, rng) -> BuiltinState:
        return BuiltinState(
            table, state.prompt, state.text, rng,
            deque(replace(r, undo=list(r.undo)) for r in state.history),
            state.needs_recache, memory=state.memory.fork(), start_frames=state.start_frames,
            restyle_left=state.restyle_left, guide_left=state.guide_left,
            noise_seed=state.noise_seed, detail_reference=state.detail_reference,
            colour_reference=state.colour_reference, reference_prompt=state.reference_prompt,
            backdrop=state.backdrop,
        )

    def _undo_extra(self, state: BuiltinState, record: _ChunkRecord) -> None:
        for undo in reversed(record.undo):
            state.memory.undo(undo)

    @torch.no_grad()
    def observe(self, state: BuiltinState, frames: np.ndarray, actions: list[int]) -> None:
        """Append real frames (``(chunk_frames, H, W, 3)`` uint8, with the actions that
        produced them) to the state's context and memory instead of generating them: teacher
        forcing, and restoring a session from its recent frames. The camera follows the
        actions through the model's camera dynamics."""
        with self._settled():
            self._prefill(state)
            if state.needs_recache:
                self._recache(state)
            self._append_frames(state, frames, list(actions), move=True)

    def _prefill(self, state: BuiltinState) -> None:
        if state.start_frames is not None:
            frames, state.start_frames = state.start_frames, None
            # the start frames are given, not stepped: the camera stays at the origin
            self._append_frames(state, frames, [IDLE] * len(frames), move=False)

    def _append_frames(self, state: BuiltinState, frames: np.ndarray, actions: list[int],
                       move: bool) -> None:
        rec = self._plan([state], [actions], move=move)[0][0]
        rec.latents = self.encode_frames(frames)
        self._set_references(state, frames, rec.latents)
        # the colour anchor's running mean starts at the new reference
        rec.colour_mean = rec.colour_reference = state.colour_reference
        self._append(state, [rec])
        self._commit_extra(state, rec, frames, settled=True)
        self._trim_history(state)

    def _set_references(self, state: BuiltinState, frames: np.ndarray,
                        latents: torch.Tensor | None = None) -> None:
        """The stream's detail and colour references (``BuiltinConfig.refining_detail_cap``,
        ``colour_anchor``; those switched off stay None) from real frames ``(F, H, W, 3)``
        uint8 (their mean colour shrunk by the ``colour_prior`` toward the scene of
        ``state.reference_prompt``), ``latents`` their encoding when the caller has it."""
        if self.config.refining_detail_cap is not None:
            if latents is None:
                latents = self.encode_frames(frames)
            lost = frames.astype(np.float32) - self.decode_latents(latents)
            state.detail_reference = float(np.sqrt(np.mean(np.square(lost))))
        if self.config.colour_anchor is not None:
            view = frames.reshape(-1, 3).mean(axis=0, dtype=np.float64)
            prior = self.config.colour_prior
            state.colour_reference = (view if prior is None else prior.reference(
                view, text_encoder.scene_for_prompt(state.reference_prompt)))

    # -- a chunk ----------------------------------------------------------------------------
    def _validate_job(self, job: ChunkJob) -> None:
        if any(not 0 <= a < self.model.config.num_actions for a in job.actions):
            raise ValueError(f"action ids must be in [0, {self.model.config.num_actions})")

    def _noise(self, generator: torch.Generator) -> torch.Tensor:
        """Fresh noise ``(F, C, h, w)`` float32 as the model was trained on
        (``WorldDiT.config.noise_correlation``/``noise_scale``: white, or partly low-passed)."""
        mc = self.model.config
        return training_noise((self.chunk_frames, mc.latent_channels, mc.latent_size,
                               mc.latent_size), generator, mc.noise_correlation, mc.noise_scale)

    def _chunk_noise(self, job: ChunkJob, state: BuiltinState, record: _ChunkRecord
                     ) -> torch.Tensor:
        """With ``world_noise``: the field of ``job.seed`` (else the stream's) read at each
        frame's camera window and field time (``_field_clock``), ``(F, C, h, w)`` float32,
        partly low-passed as the model was trained (``WorldDiT``'s ``noise_correlation``);
        else fresh noise (:meth:`_noise`)."""
        if not self.config.world_noise:
            return super()._chunk_noise(job, state, record)
        mc = self.model.config
        seed = job.seed if job.seed is not None else state.noise_seed
        return chunk_noise(seed, record.origins, record.field_times, self.downsample,
                           mc.latent_channels, mc.latent_size, self.config.world_noise_period,
                           mc.noise_correlation, mc.noise_scale)

    def _plan(
        self, states: list[BuiltinState], actions: list[list[int]], move: bool = True
    ) -> tuple[list[_ChunkRecord], _MemoryViews]:
        """Each state's next chunk up to its latents: the camera path of its actions (the
        model's camera dynamics), each frame's memory base read at that path and encoded.
        Also returns what memory showed each frame (for the pixel residual)."""
        cfg = self.config
        size = self.width
        records, pictures, current, refining, sources = [], [], [], [], []
        warped_pictures: list[np.ndarray] = []  # a "warped" skip source: each memory picture posed
        for state, acts in zip(states, actions):
            if move and state.restyle_left > 0:
                state.memory.new_epoch()  # what was shown before now reads as stale
                state.restyle_left -= 1
            guided = move and cfg.guidance != 1 and (cfg.guidance_chunks is None
                                                     or state.guide_left > 0)
            if move and state.guide_left > 0:
                state.guide_left -= 1
            pos, vel = state.camera
            if move:
                disp, vel = self.model.camera.rollout(
                    vel.to(self.device), torch.tensor(acts, device=self.device)
                )
                path = pos + np.cumsum(disp.cpu().double().numpy(), axis=0)
            else:
                path = np.repeat(pos[None], len(acts), axis=0)
            origins = np.floor(path).astype(np.int64)
            field_times, rest_run = self._field_clock(state, origins)
            warp = self.base_warp
            rig = warp or self.pose_rig
            poses = None
            if rig is not None:
                pose = state.pose(rig.rest)
                poses = rig.path(pose, acts) if move else np.repeat(pose[None], len(acts), 0)
            plate = state.backdrop if self.model.config.backdrop_fill else None
            known = []
            for i, (x0, y0) in enumerate(origins):
                read = state.memory.read(x0, y0, size)
                rgb, planes = model_inputs(read, self.downsample)
                # the skip's source and a base warp's base are one picture (a base warp is the
                # rig): warped once
                skip_warped = self.model.config.skip_source == "warped"
                moved = (rig.apply(rgb, poses[i], backdrop=plate)
                         if skip_warped or warp is not None else None)
                if skip_warped:
                    warped_pictures.append(moved)
                if warp is not None:
                    sources.append(None if moved is rgb else (_key(rgb), rgb, poses[i], plate))
                    rgb = moved
                pictures.append(rgb)
                current.append(read.current & ~read.refining if cfg.decode_refining
                               else read.current)
                refining.append(read.refining)
                known.append(torch.as_tensor(planes))
            records.append(
                _ChunkRecord(
                    None,
                    None,
                    torch.stack(known),
                    list(acts),
                    state.position,
                    origins,
                    (path[-1], vel.float().cpu()),
                    guided=guided,
                    field_times=field_times,
                    rest_run=rest_run,
                    pose=np.zeros(2) if poses is None else poses[-1],
                    poses=poses if self.pose_rig is not None else None,
                )
            )
        keys = [_key(p) for p in pictures]
        base = self._encode_bases(pictures, keys)
        warped = (self._encode_bases(warped_pictures, [_key(p) for p in warped_pictures])
                  if warped_pictures else None)
        views = _MemoryViews(np.stack(pictures), np.stack(current), base, keys,
                             np.stack(refining), sources if self.base_warp is not None else None)
        f = len(actions[0])
        for n, (state, rec) in enumerate(zip(states, records)):
            rec.base = base[n * f : (n + 1) * f]
            if self.model.config.skip_source == "previous":
                rec.skip = self._previous(state, rec.base).expand(f, -1, -1, -1)
            elif warped is not None:
                rec.skip = warped[n * f : (n + 1) * f]
            if cfg.ctx_noise and cfg.ctx_sigma > 0:
                eps = torch.randn(rec.base.shape, generator=state.rng)
                rec.base = (1 - cfg.ctx_sigma) * rec.base + cfg.ctx_sigma * eps
                if rec.skip is not None:
                    eps = torch.randn(rec.skip.shape, generator=state.rng)
                    rec.skip = (1 - cfg.ctx_sigma) * rec.skip + cfg.ctx_sigma * eps
        return records, views

    @staticmethod
    def _previous(state: BuiltinState, base: torch.Tensor) -> torch.Tensor:
        """``(1, C, h, w)`` the clean latent of the state's last frame (a ``"previous"`` skip
        source); a stream's very first frame has none and gets its own memory base."""
        if state.history and state.history[-1].latents is not None:
            return state.history[-1].latents[-1:].float().cpu()
        return base[:1]

    def _field_clock(self, state: BuiltinState, origins: np.ndarray) -> tuple[np.ndarray, int]:
        """The world noise field's time ``(F,)`` int64 at each of a chunk's frames (windows at
        ``origins``, ``(F, 2)``) after the state's last chunk, and the frames in a row at rest
        up to its last: a frame rests when its window is the previous frame's; the field's
        time advances one frame for each resting frame beyond ``world_noise_hold`` in a row."""
        hold = self.config.world_noise_hold
        if state.history:
            last = state.history[-1]
            prev, run = last.origins[-1], last.rest_run
            clock = int(last.field_times[-1])
        else:
            prev, run, clock = None, 0, 0
        times = np.empty(len(origins), np.int64)
        for i, origin in enumerate(origins):
            run = run + 1 if prev is not None and np.array_equal(origin, prev) else 0
            clock += run > hold
            times[i], prev = clock, origin
        return times, run

    def _commit_extra(self, state: BuiltinState, rec: _ChunkRecord, frames: np.ndarray,
                      settled: bool = False) -> None:
        """Write a chunk's frames ``(F, H, W, 3)`` uint8 into the state's spatial memory;
        ``settled`` for real frames (start frames, observed ones: final up to their border,
        ``SpatialMemory.write``)."""
        for (x0, y0), rgb in zip(rec.origins, frames):
            rec.undo.append(state.memory.write(x0, y0, rgb, self._exclude, settled=settled))

    def _conditioning(self, states: list[BuiltinState], records: list[_ChunkRecord]) -> tuple:
        """Conditioning tensors for a batch of chunks (one record per state): memory bases,
        their noise level, current/stale planes, actions, text, frame positions, which
        rows are guided (``(B,)`` bool), the second skip source (None for a model without
        ``skip_source``) and the rig's poses ``(B, F, 2)`` (None without ``pose_path``)."""
        f = self.chunk_frames
        dev, dt = self.device, self.config.dtype
        base = torch.stack([r.base for r in records]).to(dev, dt)
        known = torch.stack([r.known for r in records]).to(dev, dt)
        base_sigma = torch.full((len(records), f), self.config.ctx_sigma, device=dev)
        actions = torch.tensor([r.actions for r in records], device=dev)
        txt = torch.stack([s.text for s in states]).to(dev)[:, None].expand(-1, f, -1)
        pos = torch.tensor([[r.position + i for i in range(f)] for r in records], device=dev)
        guided = torch.tensor([r.guided for r in records], device=dev)
        skip = (torch.stack([r.skip for r in records]).to(dev, dt)
                if self.model.config.skip_source else None)
        pose = (torch.as_tensor(np.stack([r.poses for r in records]), dtype=torch.float32,
                                device=dev)
                if self.pose_rig is not None else None)
        return base, base_sigma, known, actions, txt, pos, guided, skip, pose

    def _forward(self, x, sigma: float, cond: tuple, ctx: PagedAttentionContext) -> torch.Tensor:
        base, base_sigma, known, actions, txt, pos, _, skip, pose = cond
        sig = torch.full(actions.shape, sigma, device=self.device)
        # NOTE: fresh contiguous inputs: a compiled graph guards on its inputs' strides and on
        # whether each is a view of a larger tensor, and the stacked rows of a guided step or
        # a batch of streams come in other layouts than the warm-up's (a chunk of one frame's
        # text, expanded from the stacked prompts, is a view; a guided step's rows, stacked,
        # are not): each would compile a graph of its own mid-stream
        x, base, base_sigma, known, actions, txt, pos, skip, pose = (
            None if t is None else t.clone(memory_format=torch.contiguous_format)
            for t in (x.to(self.config.dtype), base, base_sigma, known, actions, txt, pos,
                      skip, pose))
        with attention.bound(ctx):  # what a compiled model attends through
            return self._net(x, base, base_sigma, known, sig, actions, txt, pos, ctx,
                             skip=skip, pose=pose)

    def _denoise_forward(self, x, sigma: float, cond: tuple,
                         ctx: PagedAttentionContext) -> torch.Tensor:
        """Classifier-free guidance on the prompt (guided rows) and on the action (rows asking
        a non-neutral action), see :class:`BuiltinConfig`; the negative forwards run beside
        the conditional one (:meth:`PagedRunner._forwards`)."""
        base, base_sigma, known, actions, txt, pos, guided, skip, pose = cond
        cfg = self.config
        if cfg.steady_guidance_sigma is not None and sigma >= cfg.steady_guidance_sigma - 1e-6:
            guided = torch.ones_like(guided)
        terms = []  # (per-row scale - 1, negative condition)
        if cfg.guidance != 1 and bool(guided.any()):
            terms.append((torch.where(guided, cfg.guidance - 1.0, 0.0),
                          (base, base_sigma, known, actions, torch.zeros_like(txt), pos, guided,
                           skip, pose)))
        if cfg.action_guidance != 1:
            neutral = self._neutral_actions(actions)
            asked = (actions != neutral).any(dim=1)
            if bool(asked.any()):
                terms.append((torch.where(asked, cfg.action_guidance - 1.0, 0.0),
                               (base, base_sigma, known, neutral, txt, pos, guided, skip,
                                pose)))
        *negatives, out = self._forwards(x, sigma, [neg for _, neg in terms] + [cond], ctx)
        guided_out = out
        for (scale, _), negative in zip(terms, negatives):
            scale = scale.to(out.dtype).view(-1, *([1] * (out.dim() - 1)))
            guided_out = guided_out + scale * (out - negative)
        return guided_out

    def _neutral_actions(self, actions: torch.Tensor) -> torch.Tensor:
        """The negative condition of action guidance for int64 ids ``actions (B, F)``: the
        neutral action, with the ``kept_factors`` of each id as asked (factored ids
        ``a_0 + f_0 * (a_1 + f_1 * ...)``, as ``WorldDiTActionEmbedding`` reads them)."""
        cfg = self.config
        neutral = torch.full_like(actions, cfg.neutral_action)
        if not cfg.kept_factors:
            return neutral
        out = torch.zeros_like(actions)
        asked, rest, scale = actions, neutral, 1
        for i, size in enumerate(self.model.config.action_factors):
            digit = asked % size if i in cfg.kept_factors else rest % size
            out = out + scale * digit
            asked, rest, scale = asked // size, rest // size, scale * size
        return out

    def _attended(self, state: BuiltinState, record: _ChunkRecord) -> list[int]:
        """The sink and window pages, less the window frames posed too far from the new
        chunk's first frame (``window_pose_tolerance``; a model with ``pose_path``)."""
        pages = state.table.attended_pages()
        tol = self.config.window_pose_tolerance
        if tol is None or record.poses is None:
            return pages
        f = self.pages_per_chunk
        window = state.table.window_pages()
        chunks = len(window) // f
        # the table and the history hold the same chunks, newest last
        recs = list(state.history)[-chunks:] if chunks else []
        far = {p for n, rec in enumerate(recs)
               if rec.poses is not None
               and np.abs(rec.poses - record.poses[0]).max() > tol + 1e-9
               for p in window[n * f:(n + 1) * f]}
        return [p for p in pages if p not in far]

    def _extra_context(self, state: BuiltinState, record: _ChunkRecord) -> list[int]:
        """Older pages whose frame's camera window overlaps the new chunk's view most (up to
        ``spatial_pages``, overlap > 0), oldest first: revisited places come back into the
        attention context even when they left the recency window long ago."""
        return self._spatial_pages(state, record.origins)

    def _spatial_pages(self, state: BuiltinState, origins: np.ndarray) -> list[int]:
        k = self.config.spatial_pages
        older = state.table.older_pages()
        if not k or not older:
            return []
        f = self.chunk_frames
        # the table and the history hold the same chunks, newest last; older pages are the
        # chunks before the window
        recs = list(state.history)[-(len(older) // f + state.table.window_chunks) :]
        page_origins = [o for rec in recs[: len(older) // f] for o in rec.origins]
        return select_by_overlap(older, page_origins, origins[-1], self.width, k)

    def encode_frames(self, frames: np.ndarray) -> torch.Tensor:
        """``(N, H, W, 3)`` uint8 frames -> ``(N, C, h, w)`` float32 model-space latents."""
        with torch.no_grad():
            x = frames_to_tensor(frames).to(self.device, self.ae_dtype)
            return self.model.normalize(self.ae.encoder(x).float())

    def decode_latents(self, latents: torch.Tensor) -> np.ndarray:
        """Model-space latents ``(N, C, h, w)`` -> ``(N, H, W, 3)`` uint8 frames."""
        with torch.no_grad():
            flat = self.model.denormalize(latents.to(self.device).float())
            return (
                tensor_to_frames(self.ae.decoder(flat.to(self.ae_dtype)).float().clamp(-1, 1))
                .cpu()
                .numpy()
            )

    def _encode_bases(self, pictures: list[np.ndarray], keys: list[bytes]) -> torch.Tensor:
        """Model-space latents ``(N, C, h, w)`` of memory pictures ``(H, W, 3)`` uint8 (``keys``
        their content hashes), each encoded once while it stays in the cache (the last 64
        distinct pictures).

        NOTE: encoding is deterministic, so a cached latent is the latent; the avatar's still
        camera reads one picture for the whole stream, and the encode and the base's decode
        (:meth:`_decoded_bases`) were 25 of its ~50 ms a frame."""
        missing = list(dict.fromkeys(k for k in keys if k not in self._base_cache))
        if missing:
            index = {k: i for i, k in enumerate(keys)}
            fresh = self.encode_frames(np.stack([pictures[index[k]] for k in missing])).cpu()
            for k, z in zip(missing, fresh):
                self._base_cache[k] = (z, None)
        for k in keys:
            self._base_cache.move_to_end(k)
        while len(self._base_cache) > 64:
            self._base_cache.popitem(last=False)
        return torch.stack([self._base_cache[k][0] for k in keys])

    def _decoded_bases(self, views: _MemoryViews) -> np.ndarray:
        """The decoded bases ``(N, H, W, 3)`` uint8 of ``views``, each decoded once while its
        picture stays in the cache (one evicted meanwhile is decoded again). A warped base is
        its source picture's decoded base, warped (see ``_MemoryViews.sources``)."""
        out = []
        for i, (k, z) in enumerate(zip(views.keys, views.base)):
            source = views.sources[i] if views.sources is not None else None
            if source is None:
                out.append(self._decoded(k, z))
                continue
            key, picture, pose, plate = source
            z_source = self._encode_bases([picture], [key])[0]
            out.append(self.base_warp.apply(self._decoded(key, z_source), pose, backdrop=plate))
        return np.stack(out)

    def _decoded(self, key: bytes, z: torch.Tensor) -> np.ndarray:
        """The decoded base ``(H, W, 3)`` uint8 of the picture ``key`` (latent ``z``), cached."""
        entry = self._base_cache.get(key)
        if entry is not None and entry[1] is not None:
            return entry[1]
        rgb = self.decode_latents(z[None])[0]
        self._base_cache[key] = (z, rgb)
        while len(self._base_cache) > 64:
            self._base_cache.popitem(last=False)
        return rgb

    def _first_step_skipped(self, steps: int) -> bool:
        least = self.config.first_step_from_memory
        return least is not None and steps >= least

    def _first_x0(self, records: list[_ChunkRecord], cond: tuple,
                  steps: int) -> torch.Tensor | None:
        """The chunks' memory bases ``(B, F, C, h, w)`` (with their context noise, as the
        model reads them) as the first step's prediction, in chunks of at least
        ``first_step_from_memory`` steps outside a prompt switch's guided chunks whose views
        hold nothing stale (remembered under an earlier prompt); else None (one such chunk
        runs its whole batch on the full schedule: the batch shares its steps)."""
        if not self._first_step_skipped(steps) or any(
                r.guided or bool(r.known[:, 1].any()) for r in records):
            return None
        return cond[0]

    def _show(self, states, records, x0: torch.Tensor, views: _MemoryViews) -> list[np.ndarray]:
        """Each state's frames ``(F, H, W, 3)`` uint8 for its generated latents: decoded, or
        with ``pixel_residual`` the remembered pixels plus the model's change to them where
        memory holds current content (see :class:`BuiltinConfig`)."""
        flat = x0.reshape(-1, *x0.shape[2:])
        if not self.config.pixel_residual:
            rgb = self.decode_latents(flat)
        else:
            model = self.decode_latents(flat.float().cpu()).astype(np.int16)
            decoded = self._decoded_bases(views)
            change = model - decoded
            pictures = views.pictures
            if self.config.refining_detail_shading or self.config.refining_detail_cap is not None:
                pictures = self._refining_detail(states, views, decoded)
            gate = self.config.residual_gate
            weight = residual_weight(change, *gate) if gate is not None else None
            if self.config.residual_deadzone > 0:
                change = shrink_change(change, self.config.residual_deadzone)
            shown = np.clip(pictures + change, 0, 255)
            if weight is not None:
                shown = np.rint(weight * shown + (1 - weight) * model)
            rgb = np.where(views.current[..., None], shown.astype(np.uint8),
                           model.astype(np.uint8))
        if self.config.colour_anchor is not None:
            self._anchor_colours(states, records, rgb, views)
        return list(rgb.reshape(len(states), self.chunk_frames, self.height, self.width, 3))

    def _anchor_colours(self, states, records, rgb: np.ndarray, views: _MemoryViews) -> None:
        """Correct the generated ground of the frames ``rgb (N, H, W, 3)`` uint8, in place, by
        :func:`anchor_colour` against the stream's reference with ``BuiltinConfig.colour_anchor``
        levels of tolerance; each record keeps the running mean after its last frame and the
        reference it was kept against (a rewind takes both back with the record)."""
        tolerance = self.config.colour_anchor
        generated = (~views.current | views.refining) & ~self._exclude
        f = self.chunk_frames
        for n, (state, rec) in enumerate(zip(states, records)):
            reference = state.colour_reference
            if reference is None:
                continue
            last = state.history[-1] if state.history else None
            mean = last.colour_mean if last is not None else None
            if last is not None and not np.array_equal(last.colour_reference, reference):
                # a prompt switch (or a rewind to chunks kept against another reference): the
                # running mean restarts at the first generated frame, so that the new scene's
                # colours are held from it on; after real frames it starts at their mean
                mean = None
            for i in range(n * f, (n + 1) * f):
                ground = generated[i]
                if ground.sum() < ANCHOR_MIN_PIXELS:
                    continue
                pixels = rgb[i][ground].astype(np.float64)
                now = pixels.mean(axis=0)
                mean = now if mean is None else ANCHOR_DECAY * mean + (1 - ANCHOR_DECAY) * now
                rgb[i][ground] = np.clip(np.rint(anchor_colour(pixels, mean, reference,
                                                               tolerance)), 0, 255)
            # (a chunk without generated ground after a switch leaves the mean unset: the
            # restart waits for the first frame that has some)
            rec.colour_mean, rec.colour_reference = mean, reference

    def _refining_detail(self, states, views: _MemoryViews, decoded: np.ndarray) -> np.ndarray:
        """The memory pictures ``(N, H, W, 3)`` int16 with the detail on each frame's refining
        pixels (picture less its decoded base ``decoded``) kept as shading of the decoded
        colour (:func:`shading_detail`, ``BuiltinConfig.refining_detail_shading``), then
        scaled by :func:`detail_gain` against its state's ``detail_reference``
        (``BuiltinConfig.refining_detail_cap``)."""
        pictures = views.pictures.astype(np.int16)
        cap, shading = self.config.refining_detail_cap, self.config.refining_detail_shading
        f = self.chunk_frames
        for n, state in enumerate(states):
            limit = cap is not None and state.detail_reference is not None
            if not (limit or shading):
                continue
            for i in range(n * f, (n + 1) * f):
                refining = views.refining[i]
                under = decoded[i][refining]
                detail = (pictures[i][refining] - under).astype(np.float64)
                if shading:
                    detail = shading_detail(detail, under)
                gain = detail_gain(detail, state.detail_reference, cap) if limit else 1.0
                pictures[i][refining] = under + np.rint(gain * detail).astype(np.int16)
        return pictures


#: the colour anchor's running mean keeps this much of itself a frame (~100 frames: the
#: ground of a few seconds of moving, not one lake passing by)
ANCHOR_DECAY = 0.99
#: generated pixels a frame needs for its colour to count (a frame at rest shows none)
ANCHOR_MIN_PIXELS = 64


def anchor_colour(pixels: np.ndarray, mean: np.ndarray, reference: np.ndarray,
                  tolerance: float) -> np.ndarray:
    """The colour anchor's correction of generated ground ``pixels (P, 3)`` float64 (RGB
    levels) whose running mean colour is ``mean (3,)``, against ``reference (3,)`` with
    ``tolerance`` levels, channel by channel: a channel whose mean lies above ``reference +
    tolerance`` is scaled down to it (a gain: contrast falls with brightness, and dark pixels
    stay above black where a shift clipped them into black blotches), one below ``reference
    - tolerance`` is lifted to it by a shift (a gain above 1 would also raise the contrast of
    the blobs it lifts); within the band nothing changes. Returns ``(P, 3)`` float64,
    unclipped."""
    target = np.clip(mean, reference - tolerance, reference + tolerance)
    gain = np.where(target < mean, target / np.maximum(mean, 1e-6), 1.0)
    lift = np.where(target > mean, target - mean, 0.0)
    return pixels * gain + lift


def shading_detail(detail: np.ndarray, colour: np.ndarray) -> np.ndarray:
    """The part of each pixel's ``detail`` ``(..., 3)`` (levels) along its ``colour``
    ``(..., 3)`` (0-255 RGB; one level added, so that black has a direction): ``(d·c / c·c) c``,
    float64. Added to ``colour`` it scales it (shading: the same hue, brighter or darker);
    what is dropped is the detail's own colour."""
    c = colour.astype(np.float64) + 1.0
    return np.sum(detail * c, axis=-1, keepdims=True) / np.sum(c * c, axis=-1, keepdims=True) * c


def detail_gain(detail: np.ndarray, reference: float, cap: float) -> float:
    """The factor in (0, 1] that brings the RMS of ``detail`` (``(..., 3)`` int levels) down to
    at most ``cap * reference`` levels (1 when it is already, or when ``detail`` is empty)."""
    if detail.size == 0:
        return 1.0
    rms = float(np.sqrt(np.mean(np.square(detail, dtype=np.float64))))
    return min(1.0, cap * reference / rms) if rms > 0 else 1.0


def _key(picture: np.ndarray) -> bytes:
    """A memory picture's content hash (the base cache's key)."""
    return hashlib.blake2b(picture.tobytes(), digest_size=16).digest()


def shrink_change(change: np.ndarray, tau: float) -> np.ndarray:
    """Soft-threshold a change to pictures, ``(..., 3)`` int16 levels, by ``tau`` levels on
    each pixel's largest channel, keeping its hue: ``c · max(|c| - τ, 0) / |c|``, rounded
    (see ``BuiltinConfig.residual_deadzone``)."""
    mag = np.abs(change).max(axis=-1, keepdims=True).astype(np.float32)
    scale = np.maximum(mag - tau, 0.0) / np.maximum(mag, 1.0)
    return np.rint(change * scale).astype(np.int16)


#: side (px) of the square over which ``residual_gate`` averages the change's magnitude: a
#: few pixels, so that one noisy pixel does not switch alone (a switch pixel by pixel would
#: leave a speckle of memory and decode)
GATE_WINDOW = 5


def residual_weight(change: np.ndarray, t1: float, t2: float) -> np.ndarray:
    """The weight ``(N, H, W, 1)`` float32 in [0, 1] of memory plus change against the
    model's decode for changes ``change (N, H, W, 3)`` int16 levels (``BuiltinConfig.
    residual_gate``): each pixel's largest channel's magnitude, averaged over the
    :data:`GATE_WINDOW` square around it (``scipy.ndimage.uniform_filter``, edges reflected),
    mapped 1 at or under ``t1`` to 0 at or over ``t2``, linearly between."""
    magnitude = np.abs(change).max(axis=-1).astype(np.float32)
    magnitude = ndimage.uniform_filter(magnitude, size=(1, GATE_WINDOW, GATE_WINDOW),
                                       mode="reflect")
    return np.clip((t2 - magnitude) / (t2 - t1), 0.0, 1.0)[..., None]


def load_builtin_backend(path: str | Path = BUILTIN_DIR, **kwargs) -> BuiltinBackend:
    """The shipped built-in model (``assets/builtin/{transformer,vae}``) as a backend, with
    the colour prior of ``path/colour_prior.json``, or the shipped one where the folder has
    none (the prior is the simulator's, not the weights': a retrained model keeps it).
    ``kwargs`` go to :class:`BuiltinConfig` (``colour_prior=None`` leaves the prior out).
    FileNotFoundError names a missing weights file, ValueError a corrupt weights or prior
    file."""
    path = Path(path)
    if "colour_prior" not in kwargs:
        kwargs["colour_prior"] = load_colour_prior(path)
    return BuiltinBackend(
        load_world_model(path / "transformer"),
        load_autoencoder(path / "vae"),
        BuiltinConfig(**kwargs),
    )
