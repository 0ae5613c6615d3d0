"""The Matrix-Game 2.0 configurations: the causal DiT and its action modules as published
(``configs/distilled_model/<variant>/config.json`` of SkyworkAI/Matrix-Game, folder
``Matrix-Game-2``), and the three distilled variants with their keys, windows and timesteps.

A variant's wire keys (what an ``action`` message holds) and the browser keys the page maps to
them are this project's choice; which model input each key drives follows the upstream
interactive demo (universal: W/S/A/D move, camera by mouse or I/K/J/L; GTA: W/S drive, A/D
steer as mouse yaw; Temple Run: 7 one-hot keys, index 0 = no action).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any


@dataclass(frozen=True)
class ActionConfig:
    """The action modules' settings (``action_config`` of the published config)."""

    blocks: tuple[int, ...] = tuple(range(15))
    """Transformer blocks that hold an action module (the distilled models: 0-14)."""
    keyboard_dim_in: int = 4
    """Keys of the keyboard input (universal 4, GTA 2, Temple Run 7)."""
    enable_keyboard: bool = True
    enable_mouse: bool = True
    """Whether the mouse branch exists (Temple Run: no)."""
    mouse_dim_in: int = 2
    """Mouse input per raw frame: (pitch, yaw) velocity."""
    hidden_size: int = 128
    """Width of a raw frame's keyboard embedding."""
    img_hidden_size: int = 1536
    """Width of the transformer tokens (the model's ``dim``)."""
    keyboard_hidden_dim: int = 1024
    mouse_hidden_dim: int = 1024
    vae_time_compression_ratio: int = 4
    """Raw (video) frames per latent frame."""
    windows_size: int = 3
    """Latent frames of raw actions each latent frame sees (x ratio = 12 raw frames)."""
    heads_num: int = 16
    rope_dim_list: tuple[int, int, int] = (8, 28, 28)
    """Head channels rotated by time, height, width (only time moves: one position per frame)."""
    rope_theta: float = 256.0
    qkv_bias: bool = False
    qk_norm: bool = True

    @property
    def window(self) -> int:
        """Raw frames in one latent frame's action window (12)."""
        return self.vae_time_compression_ratio * self.windows_size


@dataclass(frozen=True)
class MatrixGameConfig:
    """The causal DiT (``CausalWanModel`` of the published config; Wan2.1-1.3B sizes)."""

    dim: int = 1536
    ffn_dim: int = 8960
    freq_dim: int = 256
    in_dim: int = 36
    """16 noise + 4 mask + 16 image-latent channels."""
    out_dim: int = 16
    num_heads: int = 12
    num_layers: int = 30
    local_attn_size: int = 6
    """Latent frames a chunk's queries attend, its own included (6: own 3 + 3 before)."""
    sink_size: int = 0
    patch_size: tuple[int, int, int] = (1, 2, 2)
    eps: float = 1e-6
    image_dim: int = 1280
    """Width of the CLIP image tokens (the cross-attention context before ``img_emb``)."""
    action: ActionConfig = field(default_factory=ActionConfig)

    def __post_init__(self):
        if self.dim % self.num_heads or (self.dim // self.num_heads) % 2:
            raise ValueError(f"dim {self.dim} must split into {self.num_heads} even heads")
        if self.local_attn_size < 1 or self.sink_size:
            raise ValueError("need a local window (local_attn_size >= 1) and no sink")
        if self.action.img_hidden_size != self.dim:
            raise ValueError("action.img_hidden_size must equal dim")
        if any(not 0 <= b < self.num_layers for b in self.action.blocks):
            raise ValueError(f"action blocks {self.action.blocks} outside {self.num_layers} "
                             "layers")

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> MatrixGameConfig:
        """The config of a published ``config.json`` (unknown keys ignored: ``model_type``,
        ``text_len``, diffusers' bookkeeping). ValueError for a value that does not fit."""
        names = {f.name for f in fields(cls)} - {"action", "patch_size"}
        kwargs: dict[str, Any] = {k: v for k, v in data.items() if k in names}
        if "patch_size" in data:
            kwargs["patch_size"] = tuple(data["patch_size"])
        act = dict(data.get("action_config") or {})
        act_names = {f.name for f in fields(ActionConfig)}
        act = {k: tuple(v) if isinstance(v, list) else v for k, v in act.items()
               if k in act_names}
        return cls(**kwargs, action=ActionConfig(**act))


@dataclass(frozen=True)
class Variant:
    """One distilled Matrix-Game 2.0 model and how the page plays it."""

    name: str
    folder: str
    """Its folder in the published layout (``DIR/<folder>/*.safetensors``)."""
    local_attn_size: int
    keyboard_dim: int
    model_mouse: bool
    """Whether the model has a mouse input (GTA's is steered by A/D)."""
    pointer: bool
    """Whether the page's mouse (pointer lock) steers it."""
    timesteps: tuple[int, ...]
    """The distilled denoising steps (``denoising_step_list``), warped by the shift."""
    keys: tuple[str, ...]
    """Wire key names, in the order of the engine's multi-hot vector."""
    codes: dict[str, str]
    """Browser ``KeyboardEvent.code`` -> wire key."""
    meanings: dict[str, str]
    """Wire key -> what it does (the page's Controls list)."""

    def config(self, base: MatrixGameConfig | None = None) -> MatrixGameConfig:
        """The published model config of this variant (``base``'s sizes: the full size by
        default, a tiny one in tests)."""
        base = base or MatrixGameConfig()
        action = replace(base.action, keyboard_dim_in=self.keyboard_dim,
                         enable_mouse=self.model_mouse)
        return replace(base, local_attn_size=self.local_attn_size, action=action)


_ARROWS = {"ArrowUp": "up", "ArrowDown": "down", "ArrowLeft": "left", "ArrowRight": "right"}

VARIANTS: dict[str, Variant] = {
    "universal": Variant(
        "universal", "base_distilled_model", local_attn_size=6, keyboard_dim=4,
        model_mouse=True, pointer=True, timesteps=(1000, 666, 333),
        keys=("forward", "back", "left", "right", "look_up", "look_down", "look_left",
              "look_right"),
        codes={"KeyW": "forward", "KeyS": "back", "KeyA": "left", "KeyD": "right",
               **{code: f"look_{d}" for code, d in _ARROWS.items()}},
        meanings={"forward": "move forward", "back": "move back", "left": "strafe left",
                  "right": "strafe right", "look_up": "look up", "look_down": "look down",
                  "look_left": "look left", "look_right": "look right"}),
    "gta_drive": Variant(
        "gta_drive", "gta_distilled_model", local_attn_size=4, keyboard_dim=2,
        model_mouse=True, pointer=False, timesteps=(1000, 666, 333),
        keys=("forward", "back", "left", "right"),
        codes={"KeyW": "forward", "KeyS": "back", "KeyA": "left", "KeyD": "right",
               **{code: {"up": "forward", "down": "back"}.get(d, d)
                  for code, d in _ARROWS.items()}},
        meanings={"forward": "accelerate", "back": "brake / reverse", "left": "steer left",
                  "right": "steer right"}),
    "templerun": Variant(
        "templerun", "templerun_distilled_model", local_attn_size=6, keyboard_dim=7,
        model_mouse=False, pointer=False, timesteps=(1000, 750, 500, 250),
        keys=("jump", "slide", "turn_left", "turn_right", "left", "right"),
        codes={"KeyW": "jump", "ArrowUp": "jump", "KeyS": "slide", "ArrowDown": "slide",
               "KeyZ": "turn_left", "KeyC": "turn_right", "KeyA": "left",
               "ArrowLeft": "left", "KeyD": "right", "ArrowRight": "right"},
        meanings={"jump": "jump", "slide": "slide", "turn_left": "turn left",
                  "turn_right": "turn right", "left": "move to the left side",
                  "right": "move to the right side"}),
}

#: camera speed of a held look or steering key, model units per raw frame (the value the
#: upstream interactive demo gives its camera keys)
CAMERA_KEY_SPEED = 0.1


def get_variant(name: str) -> Variant:
    """ValueError naming the variants for an unknown ``name``."""
    if name not in VARIANTS:
        raise ValueError(f"unknown Matrix-Game 2.0 variant {name!r}; there are "
                         f"{', '.join(VARIANTS)}")
    return VARIANTS[name]
