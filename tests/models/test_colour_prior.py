"""The landscape's colour prior: the shrunk reference, its file, its fit, its command."""

import json

import numpy as np
import pytest

from worldstream.app import cli
from worldstream.engine.models.builtin.colour_prior import FILENAME, ColourPrior
from worldstream.engine.models.builtin.loading import BUILTIN_DIR
from worldstream.engine.training.colour_prior import fit_colour_prior
from worldstream.engine.worlds.recorder import HumanLikePolicy
from worldstream.engine.worlds.simulator import WorldSimulator


def test_reference_shrinks_the_view_toward_the_scene_hand_worked():
    prior = ColourPrior({"meadow": (80.0, 140.0, 90.0)}, view_weight=0.25)
    np.testing.assert_allclose(prior.reference(np.array([100.0, 100.0, 90.0]), "meadow"),
                               [85.0, 130.0, 90.0])
    # a scene the prior does not know: the view's own colour
    np.testing.assert_allclose(prior.reference(np.array([1.0, 2.0, 3.0]), "desert"),
                               [1.0, 2.0, 3.0])
    np.testing.assert_allclose(ColourPrior({"meadow": (80.0, 140.0, 90.0)}, 1.0).reference(
        np.array([1.0, 2.0, 3.0]), "meadow"), [1.0, 2.0, 3.0])


@pytest.mark.parametrize("means, weight", [
    ({"meadow": (1.0, 2.0, 3.0)}, 1.5),
    ({"meadow": (1.0, 2.0, 3.0)}, -0.1),
    ({"meadow": (1.0, 2.0)}, 0.5),
    ({"meadow": (1.0, 2.0, 300.0)}, 0.5),
    ({"meadow": (1.0, float("nan"), 3.0)}, 0.5),
    ({"meadow": "123"}, 0.5),
    ({"medow": (1.0, 2.0, 3.0)}, 0.5),
    ({"meadow": (1.0, 2.0, 3.0)}, True),
])
def test_a_prior_outside_its_ranges_is_refused(means, weight):
    with pytest.raises(ValueError):
        ColourPrior(means, weight)


def test_the_file_round_trips_and_a_bad_one_names_itself(tmp_path):
    prior = ColourPrior({"meadow": (80.5, 140.25, 90.0), "night": (30.0, 40.0, 64.0)}, 0.2,
                        "by hand")
    prior.save(tmp_path / FILENAME)
    back = ColourPrior.load(tmp_path / FILENAME)
    assert back == prior and back.source == "by hand"
    for text in ("{", '{"scene_means": {"meadow": [1, 2]}, "view_weight": 0.2}',
                 '{"view_weight": 0.2}', "[]", '{"scene_means": {"meadow": "123"}, '
                 '"view_weight": 0.2}', '{"scene_means": {}, "view_weight": "0.2"}'):
        (tmp_path / "bad.json").write_text(text)
        with pytest.raises(ValueError, match="bad.json"):
            ColourPrior.load(tmp_path / "bad.json")
    (tmp_path / "bad.json").write_bytes(b"\xff\xfe{")
    with pytest.raises(ValueError, match="bad.json"):
        ColourPrior.load(tmp_path / "bad.json")
    with pytest.raises(FileNotFoundError):
        ColourPrior.load(tmp_path / "missing.json")


def test_the_fit_is_the_scene_mean_and_the_least_squares_slope():
    """Recomputed here from the simulator walked by the same policy: each scene's mean is the
    mean over seeds of frames ``skip``.. of a walk; the view weight the slope (through the
    origin, pooled over scenes, seeds and channels) of the last ``far`` frames' colour on
    frame 0's, both less the scene's mean, clipped to [0, 1]."""
    seeds, length, far, skip, scenes = [3, 4, 5], 30, 8, 6, ("meadow", "night")
    prior = fit_colour_prior(seeds, length, far, skip, scenes)
    xs, ys = [], []
    for scene in scenes:
        walks = []
        for seed in seeds:
            sim = WorldSimulator(seed, scene)
            policy = HumanLikePolicy(np.random.default_rng([seed, 5]))
            frames = np.stack([sim.step(policy()) for _ in range(length)]).astype(np.float64)
            walks.append((frames[0].mean(axis=(0, 1)), frames[-far:].mean(axis=(0, 1, 2)),
                          frames[skip:].mean(axis=(0, 1, 2))))
        mean = np.mean([w[2] for w in walks], axis=0)
        np.testing.assert_allclose(prior.scene_means[scene], mean, rtol=1e-9)
        xs += [w[0] - mean for w in walks]
        ys += [w[1] - mean for w in walks]
    x, y = np.ravel(xs), np.ravel(ys)
    slope = np.linalg.lstsq(x[:, None], y, rcond=None)[0][0]
    assert prior.view_weight == pytest.approx(float(np.clip(slope, 0, 1)), abs=1e-9)
    with pytest.raises(ValueError):
        fit_colour_prior([], length, far, skip, scenes)
    with pytest.raises(ValueError):
        fit_colour_prior(seeds, length, far=length + 1, skip=skip, scenes=scenes)


def test_the_command_writes_a_loadable_prior(tmp_path, capsys, monkeypatch):
    from worldstream.engine.training import colour_prior

    # the shipped prior's walks (20 worlds x 3,000 frames) shrunk to one short walk per scene
    for name, value in (("WORLDS", 1), ("LENGTH", 12), ("FAR", 4), ("SKIP", 6)):
        monkeypatch.setattr(colour_prior, name, value)
    out = tmp_path / FILENAME
    assert cli.main(["fit-colour-prior", "--out", str(out)]) == 0
    prior = ColourPrior.load(out)
    assert set(prior.scene_means) == {"meadow", "desert", "snow", "night"}
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["out"] == str(out)
    assert "seeds 0-0" in prior.source and "walks of 12 frames" in prior.source


def test_the_constants_are_the_shipped_priors():
    """The shipped prior was fitted with the module's constants (its recorded source)."""
    from worldstream.engine.training import colour_prior

    source = ColourPrior.load(BUILTIN_DIR / FILENAME).source
    assert source == (f"fit_colour_prior: {colour_prior.WORLDS} training worlds per scene (seeds "
                      f"0-{colour_prior.WORLDS - 1}), human-like walks of {colour_prior.LENGTH} "
                      f"frames, far ground the last {colour_prior.FAR}, scene means from frame "
                      f"{colour_prior.SKIP}")


def test_the_shipped_prior_loads_with_the_model():
    from worldstream.engine.backends.builtin import load_builtin_backend

    shipped = ColourPrior.load(BUILTIN_DIR / FILENAME)
    assert 0.0 <= shipped.view_weight < 0.5  # a view says little of ground far away
    assert load_builtin_backend().config.colour_prior == shipped
    assert load_builtin_backend(colour_prior=None).config.colour_prior is None


def test_a_model_folder_without_a_prior_takes_the_shipped_one(tmp_path):
    """The prior is the simulator's, not the weights': a retrained model's folder without
    one gets the shipped prior; one with its own gets that."""
    import shutil

    from worldstream.engine.backends.builtin import load_builtin_backend

    for part in ("transformer", "vae"):
        shutil.copytree(BUILTIN_DIR / part, tmp_path / part)
    shipped = ColourPrior.load(BUILTIN_DIR / FILENAME)
    assert load_builtin_backend(tmp_path).config.colour_prior == shipped
    own = ColourPrior({"meadow": (1.0, 2.0, 3.0)}, 0.5)
    own.save(tmp_path / FILENAME)
    assert load_builtin_backend(tmp_path).config.colour_prior == own
