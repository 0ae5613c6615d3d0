"""Adversarial fine-tuning (engine.training.adversarial): the losses on hand-worked logits, the
discriminator's shapes and conditioning, which frames it judges, and a resumable run whose
discriminator comes to tell real latents from the model's blurred ones."""

import json

import numpy as np
import pytest
import torch

from worldstream.app import cli
from worldstream.engine.models.builtin.world_dit import WorldDiT
from worldstream.engine.training.adversarial import (
    PatchDiscriminator,
    finetune_adversarial,
    hinge_d_loss,
    hinge_g_loss,
    judged_frames,
)
from worldstream.engine.training.latents import LatentDataset
from worldstream.engine.training.train_world import WorldPrediction


def test_hinge_losses_on_hand_worked_logits():
    real = torch.tensor([2.0, 0.5, -1.0])  # relu(1 - r): 0, 0.5, 2 -> mean 2.5 / 3
    fake = torch.tensor([-3.0, 0.0])  # relu(1 + f): 0, 1 -> mean 0.5
    assert hinge_d_loss(real, fake).item() == pytest.approx(2.5 / 3 + 0.5)
    # a discriminator already past both margins has nothing left to learn
    assert hinge_d_loss(torch.full((4,), 1.5), torch.full((4,), -2.0)).item() == 0.0
    assert hinge_g_loss(fake).item() == pytest.approx(1.5)


def test_discriminator_gives_a_logit_per_patch_and_reads_the_prompt():
    torch.manual_seed(0)
    disc = PatchDiscriminator(channels=4, width=8, text_dim=16).eval()
    z = torch.randn(3, 4, 32, 32)
    txt = torch.randn(3, 16)
    out = disc(z, txt)
    assert out.shape == (3, 8, 8) and out.dtype == torch.float32
    # the projection term: another prompt moves the logits of the same latents ...
    assert not torch.allclose(out, disc(z, -txt))
    # ... and a dropped (zero) prompt leaves only the unconditional head
    h = disc.body(z)
    assert torch.allclose(disc(z, torch.zeros(3, 16)), disc.head(h)[:, 0], atol=1e-6)


def test_judged_frames_are_those_denoised_from_high_noise():
    b, f = 2, 3
    sigma = torch.tensor([[0.1, 0.5, 0.9], [0.3, 0.2, 0.25]])
    pred = torch.arange(b * f, dtype=torch.float32).view(b, f, 1, 1, 1).expand(b, f, 4, 2, 2)
    txt = torch.arange(b * f, dtype=torch.float32).view(b, f, 1).expand(b, f, 5)
    wp = WorldPrediction(pred, -pred, torch.ones(b, f, 1, 2, 2), sigma,
                         torch.zeros(b, f, 2, 2, 2), txt)
    fake, real, ftxt = judged_frames(wp, min_sigma=0.25)
    # frames (0,1), (0,2), (1,0), (1,2) have sigma >= 0.25: flat indices 1, 2, 3, 5
    assert fake[:, 0, 0, 0].tolist() == [1.0, 2.0, 3.0, 5.0]
    assert torch.equal(real, -fake) and ftxt[:, 0].tolist() == [1.0, 2.0, 3.0, 5.0]
    assert fake.shape == (4, 4, 2, 2)


def test_judged_frames_can_be_only_turned_heads_cropped_to_a_box():
    b, f = 1, 4
    sigma = torch.tensor([[0.5, 0.5, 0.5, 0.1]])
    # yaw / pitch of each frame: at rest, turned left, tilted up a little, turned but clean
    pose = torch.tensor([[[0.0, 0.0], [-0.8, 0.1], [0.2, 0.3], [0.9, 0.0]]])
    pred = torch.arange(b * f * 4 * 6 * 6, dtype=torch.float32).view(b, f, 4, 6, 6)
    txt = torch.arange(b * f, dtype=torch.float32).view(b, f, 1).expand(b, f, 5)
    wp = WorldPrediction(pred, -pred, torch.ones(b, f, 1, 6, 6), sigma,
                         torch.zeros(b, f, 2, 6, 6), txt)
    fake, real, ftxt = judged_frames(wp, 0.25, pose=pose, min_pose=0.25, box=(1, 2, 3, 4))
    # frames 1 and 2 (largest component 0.8 and 0.3 >= 0.25); frame 0 is at rest and frame 3,
    # turned, a context frame (sigma 0.1)
    assert ftxt[:, 0].tolist() == [1.0, 2.0]
    assert fake.shape == (2, 4, 3, 4)
    assert torch.equal(fake, pred[0, 1:3, :, 1:4, 2:6]) and torch.equal(real, -fake)
    with pytest.raises(ValueError, match="poses"):
        judged_frames(wp, 0.25, min_pose=0.5)
    with pytest.raises(ValueError, match="inside"):
        judged_frames(wp, 0.25, box=(4, 0, 3, 6))


def _tiny_model(path):
    torch.manual_seed(0)
    WorldDiT(dim=32, depth=1, num_heads=1, latent_mean=(0.0,) * 4,
             latent_std=(1.0,) * 4).save_pretrained(path)


def _tiny_data():
    """Real latents with structure (large smooth blobs, what a discriminator can tell from a
    blur of them) and their bases."""
    g = torch.Generator().manual_seed(0)
    coarse = torch.randn(4, 12, 4, 4, 4, generator=g)
    lat = torch.nn.functional.interpolate(coarse.view(-1, 4, 4, 4), size=32, mode="nearest")
    lat = (3 * lat).view(4, 12, 4, 32, 32).half()
    return LatentDataset(
        lat,
        lat.clone(),
        torch.zeros(4, 12, 2, 32, 32, dtype=torch.uint8),  # memory holds nothing: all new
        torch.randint(0, 9, (4, 12), generator=g),
        torch.randint(0, 2, (4, 12), generator=g),
        torch.randn(2, 384, generator=g),
        torch.zeros(4, 12, 2, dtype=torch.int64),
    )


def test_adversarial_finetune_resumes_exports_and_its_discriminator_learns(tmp_path):
    _tiny_model(tmp_path / "init")
    data = _tiny_data()
    kw = dict(batch=4, frames=4, ckpt_every=1, export_every=100, d_warmup=2, adv_weight=0.5)
    first = finetune_adversarial(data, tmp_path / "init", tmp_path / "out", tmp_path / "run",
                                 steps=2, **kw)
    assert first["steps"] == 2
    again = finetune_adversarial(data, tmp_path / "init", tmp_path / "out", tmp_path / "run",
                                 steps=40, **kw)
    assert again["steps"] == 40
    log = [json.loads(x) for x in (tmp_path / "run" / "adversarial_log.jsonl").read_text()
           .splitlines()]
    assert [r["step"] for r in log] == list(range(1, 41))  # resumed, not restarted
    assert all(r["g_adv"] == 0.0 for r in log[:2]) and log[-1]["g_adv"] != 0.0  # d_warmup
    # the discriminator separates the true latents from the tiny model's predictions
    late = log[-10:]
    assert np.mean([r["d_real"] - r["d_fake"] for r in late]) > 0.5
    assert np.mean([r["d_loss"] for r in late]) < np.mean([r["d_loss"] for r in log[:5]])
    model = WorldDiT.from_pretrained(tmp_path / "out")
    init = WorldDiT.from_pretrained(tmp_path / "init")
    assert any(not torch.equal(a, b) for a, b in zip(model.parameters(), init.parameters()))
    assert torch.equal(model.camera.linear.weight, init.camera.linear.weight)  # frozen


def test_adversarial_finetune_rejects_a_negative_weight(tmp_path):
    with pytest.raises(ValueError, match="adv_weight"):
        finetune_adversarial(_tiny_data(), tmp_path / "init", tmp_path / "out",
                             tmp_path / "run", steps=1, adv_weight=-1.0)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("extra", [[], ["--init-from", "x", "--onpolicy"],
                                   ["--init-from", "x", "--adversarial", "-1"],
                                   ["--init-from", "x", "--adversarial-min-pose", "0.5"],
                                   ["--init-from", "x", "--adversarial", "0.1",
                                    "--adversarial-min-pose", "1.5"]])
def test_train_world_cli_refuses_bad_adversarial_settings_before_any_work(tmp_path, capsys,
                                                                          extra):
    argv = ["train-world", "--data", str(tmp_path / "data"), "--run-dir", str(tmp_path / "run")]
    chosen = "--adversarial" in extra or "--adversarial-min-pose" in extra
    argv += extra if chosen else ["--adversarial", "0.1", *extra]
    assert cli.main(argv) == 2
    assert "--adversarial" in capsys.readouterr().err
    assert not (tmp_path / "data").exists() and not (tmp_path / "run").exists()
