"""Every shipped weight's model card gives the command chain that makes it ("Training
procedure": the first ``bash`` block). Each chain is checked twice: statically, every input a
step reads (``--data`` of a trained step, ``--vae``, ``init_from``, a preset's ``init_from``)
must be what an earlier step wrote (or a shipped file); then the chain runs as written, in a
fresh folder, at a tiny scale (a few steps, a few frames of data: ``--set``/flag overrides
appended, the recorders cut to one short episode), and its result loads as ``play
--model-path`` would load it."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from worldstream.app import cli
from worldstream.engine.worlds.catalog import ASSETS

CARDS = {"landscape": ASSETS / "builtin", "avatar": ASSETS / "avatar",
         "pong": ASSETS / "pong", "breakout": ASSETS / "breakout"}

#: appended to each command of a chain: the tiny scale (argparse and --set: the last wins)
TINY = {
    "train-ae": ["--set", "steps=2", "--set", "batch=2", "--set", "eval_every=2"],
    "train-world": [a for kv in ("steps=2", "batch=2", "frames=2", "dim=16", "depth=1",
                                 "num_heads=2", "warmup=0", "camera_steps=2", "ckpt_every=1",
                                 "export_every=1", "pool_episodes=1", "rollout_batch=1",
                                 "rollout_steps=1")
                    for a in ("--set", kv)],
    "train": [a for kv in ("steps=2", "batch=2", "channels=[8,8]", "record_frames=40",
                           "workers=1", "threads=1", "checkpoint_every=1")
              for a in ("--set", kv)],
    "record": ["--frames", "40", "--workers", "1"],
    "fit-colour-prior": [],
}


def card_chain(folder: Path) -> list[list[str]]:
    """The commands (argv after ``worldstream``) of the first ``bash`` block of the card's
    "Training procedure" section."""
    text = (folder / "MODEL_CARD.md").read_text()
    section = text.split("## Training procedure", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, f"{folder}/MODEL_CARD.md: no ```bash block under Training procedure"
    lines = [line.strip() for line in block.group(1).splitlines()]
    lines = [line for line in lines if line and not line.startswith("#")]
    assert lines and all(line.startswith("worldstream ") for line in lines), lines
    return [shlex.split(line)[1:] for line in lines]


def _options(argv: list[str]) -> tuple[dict[str, str], dict[str, str]]:
    """``(--flag values, --set values)`` of one command."""
    flags, sets = {}, {}
    for flag, value in zip(argv, argv[1:]):
        if flag == "--set":
            name, _, v = value.partition("=")
            sets[name] = v
        elif flag.startswith("--"):
            flags[flag] = value
    return flags, sets


def chain_inputs_and_outputs(argv: list[str]) -> tuple[list[str], list[str]]:
    """``(paths the command reads, paths it writes)``, as the chain spells them."""
    from worldstream.engine.training.config import PRESETS
    from worldstream.engine.worlds.catalog import world

    command, flags, sets = argv[0], *_options(argv[1:])
    reads, writes = [], []
    if "init_from" in sets and sets["init_from"] not in ("null", ""):
        reads.append(sets["init_from"])
    if command == "train-world":
        preset = PRESETS[flags.get("--preset", flags.get("--world", "landscape"))]
        if "init_from" not in sets and preset.init_from:
            reads.append(preset.init_from)
        reads.append(flags.get("--data", str(world(preset.world).data)))
        reads.append(flags.get("--vae", str(world(preset.world).assets / "vae")))
        out = flags.get("--out", f"runs/{preset.world}/transformer")
        writes += [out, str(Path(out).parent)]  # the model folder play --model-path takes
    elif command == "train-ae":
        spec = world(flags.get("--world", "landscape"))
        writes += [flags.get("--data", str(spec.data)), flags.get("--out", f"runs/{spec.name}/vae")]
    elif command == "train":
        if "--data" in flags:
            reads.append(flags["--data"])
        writes.append(flags["--out"])
    elif command == "record":
        writes.append(flags["--out"])
    elif command == "fit-colour-prior":
        writes.append(flags.get("--out", "runs/landscape/colour_prior.json"))
    else:
        raise AssertionError(f"a chain step the test does not know: {command}")
    return reads, writes


def check_chain(chain: list[list[str]]) -> None:
    """AssertionError naming the step whose input is neither an earlier step's output nor a
    shipped file."""
    made: set[str] = set()
    for k, argv in enumerate(chain, 1):
        reads, writes = chain_inputs_and_outputs(argv)
        for path in reads:
            norm = str(Path(path))
            shipped = norm.startswith("assets/") and (ASSETS.parent / norm).exists()
            assert norm in made or shipped, (
                f"step {k} ({' '.join(argv[:1])}) reads {path}, which no earlier step wrote")
        made.update(str(Path(p)) for p in writes)


@pytest.mark.parametrize("name", CARDS)
def test_each_cards_chain_reads_only_what_it_wrote(name):
    check_chain(card_chain(CARDS[name]))


def test_the_check_catches_a_step_reading_what_no_step_wrote():
    chain = card_chain(CARDS["landscape"])
    broken = [[a.replace("runs/ae2/vae", "runs/ae2/vae_joint_final") if i and a.startswith(
        "runs/ae2/vae") and argv[0] == "train-world" else a for i, a in enumerate(argv)]
        for argv in chain]
    with pytest.raises(AssertionError, match="vae_joint_final, which no earlier step wrote"):
        check_chain(broken)
    with pytest.raises(AssertionError, match="no earlier step wrote"):
        # a game's train reading a recording that no record step wrote
        check_chain([["train", "--env", "ALE/Pong-v5", "--data", "data/pong-60k", "--out",
                      "runs/pong"]])


def _tiny_recorders(monkeypatch) -> None:
    """The simulators' datasets cut to one training shard of one 9-frame episode (and the
    held-out one); the colour prior's walks to one short walk."""
    import functools

    from worldstream.engine.training import avatar_data, colour_prior, data

    for module in (data, avatar_data):
        real = module.record_shard
        monkeypatch.setattr(module, "record_shard",
                            lambda d, seeds, frames, *rest, real=real:
                            real(d, seeds[:1], min(frames, 9), *rest))
        monkeypatch.setattr(module, "ensure_dataset",
                            functools.partial(module.ensure_dataset, num_shards=1))
    for name, value in (("WORLDS", 1), ("LENGTH", 24), ("FAR", 4), ("SKIP", 4)):
        monkeypatch.setattr(colour_prior, name, value)


@pytest.mark.slow
@pytest.mark.parametrize("name", CARDS)
def test_each_cards_chain_runs_as_written_at_a_tiny_scale(name, tmp_path, monkeypatch):
    import torch

    chain = card_chain(CARDS[name])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny ops: a second thread only waits (10x slower on a busy CPU)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "assets").symlink_to(ASSETS)  # the clone's shipped files, read only
    _tiny_recorders(monkeypatch)
    try:
        for argv in chain:
            assert cli.main([*argv, *TINY[argv[0]]]) == 0, argv
    finally:
        torch.set_num_threads(threads)
    # what the chain made plays (play --model-path loads it the same way)
    last_out = Path(_options(chain[-1][1:])[0]["--out"])
    if name in ("pong", "breakout"):
        from worldstream.engine.models.game.world import load_world

        assert load_world(last_out).env_id == _options(chain[-1][1:])[0]["--env"]
    else:
        from worldstream.engine.backends.avatar.backend import load_avatar_backend
        from worldstream.engine.backends.builtin import load_builtin_backend

        load = load_avatar_backend if name == "avatar" else load_builtin_backend
        folder = Path("runs", name)
        assert (folder / "transformer").is_dir() and (folder / "vae").is_dir()
        assert load(folder).width == 128
