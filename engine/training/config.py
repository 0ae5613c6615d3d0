"""Training settings as validated dataclasses: the world model's (:class:`TrainConfig`, the
shipped recipes as presets) and the autoencoder's (:class:`AEConfig`).

A run writes its config as ``train_config.json`` beside the weights it exported;
``worldstream train-world --preset NAME --set field=value`` and ``worldstream train-ae --set
field=value`` build one, ``--set help`` lists the fields.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, fields
from pathlib import Path

#: the file a run's settings are written to, beside its exported weights
CONFIG_FILE = "train_config.json"


class _RunSettings:
    """What the training settings share: ``--set`` items applied, written beside the weights,
    read back."""

    def with_sets(self, sets: list[str]):
        """A copy with ``field=value`` items applied (values as JSON, else text: ``null`` for
        None); ValueError naming an unknown field or a bad value."""
        from worldstream.engine.backends.settings import parse_overrides

        return dataclasses.replace(self, **parse_overrides(type(self), sets))

    def write(self, folder: Path) -> Path:
        """Write ``folder/train_config.json``; its path."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / CONFIG_FILE
        path.write_text(json.dumps(dataclasses.asdict(self), indent=2) + "\n")
        return path

    @classmethod
    def read(cls, path: Path):
        """The config a run wrote (:meth:`write`); ValueError for an unknown field."""
        raw = json.loads(Path(path).read_text())
        unknown = set(raw) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"{path}: unknown {cls.__name__} fields {sorted(unknown)}")
        return cls(**raw)


@dataclass(frozen=True)
class TrainConfig(_RunSettings):
    """Settings of one ``train-world`` run (the line under each field is its doc)."""

    world: str = "landscape"
    """World trained on (``engine.worlds.catalog.WORLDS``)."""
    steps: int = 6000
    """Optimizer steps the run goes to (a resumed run continues to this), >= 1."""
    batch: int = 16
    """Clips per batch, >= 1."""
    frames: int = 8
    """Frames per training clip, a multiple of chunk_frames."""
    chunk_frames: int = 1
    """Frames the model generates per chunk, >= 1."""
    dim: int = 128
    """Transformer width, a multiple of num_heads."""
    depth: int = 6
    """Transformer blocks, >= 1."""
    num_heads: int = 4
    """Attention heads, >= 1."""
    lr: float = 3e-4
    """AdamW learning rate, > 0."""
    warmup: int = 200
    """Learning-rate warmup, steps >= 0."""
    ctx_sigma_max: float = 0.3
    """Largest noise level of the noise-augmented context and bases, in [0, 1)."""
    p_context: float = 0.9
    """Fraction of recipe rows whose earlier chunks are clean-ish context, in [0, 1]."""
    change_weight: float = 0.0
    """Extra loss weight where a frame differs from its memory base, >= 0."""
    seed: int = 0
    """Seed of the initialisation and the batch order."""
    ckpt_every: int = 100
    """Steps between resume checkpoints, >= 1."""
    export_every: int = 500
    """Steps between EMA weight exports, >= 1."""
    camera_steps: int = 300
    """L-BFGS iterations of the camera-dynamics fit of a fresh model, >= 1."""
    init_from: str | None = None
    """Saved model folder a fresh run warm-starts from (None: a new model)."""
    skip_source: str | None = None
    """Second skip source: None, or "warped" (the memory picture moved by the pose_path rig)."""
    pose_path: str | None = None
    """Rig whose pose conditions each frame: None or "head_rig_fit" (avatar only)."""
    skip_prior: float = 0.0
    """Offset of the skip source's mixing map (1.0 starts trusting it), needs skip_source."""
    p_onpolicy: float = 0.0
    """Fraction of each batch drawn from the model's own rollouts, in [0, 1] (> 0 needs init_from
    and keeps that model's shape and inputs)."""
    refresh_every: int = 0
    """Steps between rebuilding the rollout pool with the current weights (0: never), >= 0."""
    pool_episodes: int = 96
    """Recorded episodes rolled out per pool, >= 1."""
    rollout_steps: int = 4
    """Denoising steps of the rollouts, 1 to 4."""
    rollout_batch: int = 16
    """Episodes rolled out at once, >= 1."""

    def __post_init__(self):
        from worldstream.engine.worlds.catalog import BASE_WARPS, WORLDS

        def need(ok: bool, name: str, rule: str) -> None:
            if not ok:
                raise ValueError(f"TrainConfig.{name} must be {rule}, got "
                                 f"{getattr(self, name)!r}")

        need(self.world in WORLDS, "world", f"one of {tuple(WORLDS)}")
        for name in ("steps", "batch", "chunk_frames", "depth", "num_heads", "ckpt_every",
                     "export_every", "camera_steps", "pool_episodes", "rollout_batch"):
            need(getattr(self, name) >= 1, name, ">= 1")
        need(self.frames >= 1 and self.frames % self.chunk_frames == 0, "frames",
             f"a positive multiple of chunk_frames ({self.chunk_frames})")
        need(self.dim >= 1 and self.dim % self.num_heads == 0, "dim",
             f"a positive multiple of num_heads ({self.num_heads})")
        need(self.lr > 0, "lr", "> 0")
        need(self.warmup >= 0, "warmup", ">= 0")
        need(0.0 <= self.ctx_sigma_max < 1.0, "ctx_sigma_max", "in [0, 1)")
        need(0.0 <= self.p_context <= 1.0, "p_context", "in [0, 1]")
        need(self.change_weight >= 0, "change_weight", ">= 0")
        need(self.skip_source in (None, "warped"), "skip_source", "None or 'warped'")
        need(self.pose_path is None or self.pose_path in BASE_WARPS, "pose_path",
             f"None or one of {tuple(BASE_WARPS)}")
        need(self.skip_source is None or self.pose_path is not None, "skip_source",
             "None without a pose_path (the warped picture is moved by that rig)")
        need(self.skip_prior == 0.0 or self.skip_source is not None, "skip_prior",
             "0 without a skip_source")
        need(0.0 <= self.p_onpolicy <= 1.0, "p_onpolicy", "in [0, 1]")
        need(self.p_onpolicy == 0.0 or self.init_from is not None, "p_onpolicy",
             "0 without init_from (on-policy rows fine-tune a trained model)")
        need(self.refresh_every >= 0, "refresh_every", ">= 0")
        need(1 <= self.rollout_steps <= 4, "rollout_steps", "in [1, 4]")


#: the shipped weights' recipes, each one run of the model cards' command chains
#: (``assets/<world>/MODEL_CARD.md``, "How it was trained"); ``init_from`` is the run folder
#: the chain's step before it exported to
PRESETS: dict[str, TrainConfig] = {
    # landscape v2: train-world --run-dir runs/world2 --out runs/world2/transformer
    "landscape": TrainConfig(),
    # landscape v2.1: ... --init-from runs/world2/transformer --steps 3000 --change-weight 4
    "landscape-v2.1": TrainConfig(init_from="runs/world2/transformer", steps=3000,
                                  change_weight=4.0),
    # avatar v1: train-world --world avatar --steps 6000 --depth 4 --change-weight 0
    "avatar": TrainConfig(world="avatar", depth=4),
    # avatar v2.1: ... --init-from runs/avatar_world/transformer --steps 14000 --depth 4
    "avatar-v2.1": TrainConfig(world="avatar", depth=4, steps=14000, change_weight=4.0,
                               init_from="runs/avatar_world/transformer"),
    # avatar v2.2: --onpolicy --init-from runs/avatar_cw/transformer --steps 2000
    # --refresh-every 700 --pool-episodes 96 --rollout-steps 2 --lr 2e-4
    "avatar-v2.2": TrainConfig(world="avatar", depth=4, steps=2000, lr=2e-4, warmup=50,
                               export_every=200, change_weight=4.0, p_onpolicy=0.5,
                               refresh_every=700, pool_episodes=96, rollout_steps=2,
                               init_from="runs/avatar_cw/transformer"),
    # avatar v2.7: --skip-source warped --pose-path head_rig_fit --skip-prior 1
    # --init-from <v2.6> --steps 3000 --depth 4 --lr 2e-4
    "avatar-v2.7": TrainConfig(world="avatar", depth=4, steps=3000, lr=2e-4, change_weight=4.0,
                               skip_source="warped", pose_path="head_rig_fit", skip_prior=1.0,
                               init_from="runs/s45_rig/transformer"),
}


#: the autoencoder's reconstruction losses (mse: the objective PSNR measures)
AE_LOSSES = ("l1+mse", "mse")


@dataclass(frozen=True)
class AEConfig(_RunSettings):
    """Settings of one ``train-ae`` run (the line under each field is its doc)."""

    steps: int = 2400
    """Optimizer steps the run goes to (a resumed run continues to this), >= 1."""
    batch: int = 16
    """Frames per batch, >= 1."""
    lr: float = 1e-3
    """AdamW peak learning rate (100 warmup steps, then cosine decay), > 0."""
    seed: int = 0
    """Seed of the initialisation and the batch order."""
    decoder_only: bool = False
    """Tune only the decoder (latents stay valid) of ``init_from``'s weights, else of those
    already in the output folder."""
    init_from: str | None = None
    """Saved autoencoder folder a fresh run starts from (None: a new autoencoder)."""
    loss: str = "l1+mse"
    """Reconstruction loss: "l1+mse" or "mse" (the objective PSNR measures)."""
    ema_decay: float | None = None
    """Decay of an EMA of the weights, in (0, 1), evaluated and saved instead (None: off)."""
    eval_every: int = 250
    """Steps between held-out evaluations (the best weights are saved), >= 1."""

    def __post_init__(self):
        def need(ok: bool, name: str, rule: str) -> None:
            if not ok:
                raise ValueError(f"AEConfig.{name} must be {rule}, got "
                                 f"{getattr(self, name)!r}")

        for name in ("steps", "batch", "eval_every"):
            need(getattr(self, name) >= 1, name, ">= 1")
        need(self.lr > 0, "lr", "> 0")
        need(self.loss in AE_LOSSES, "loss", f"one of {AE_LOSSES}")
        need(self.ema_decay is None or 0.0 < self.ema_decay < 1.0, "ema_decay",
             "None or in (0, 1)")
