"""CPU checks of the GPU scripts' pure parts (the GPU parts run only on the device)."""
import importlib.util
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_script(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "scripts", f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("attrs", [["fast_sum_mma"], ["fast_sum_mma", "causal_pairs"],
                                   ["softmax_turns", "serial_pv", "tree_reductions"],
                                   ["softmax_turns", "sum_tiles"]])  # the same initials
def test_gluon_ab_variants_are_distinct(attrs):
    """Every on/off combination of the switches gets its own variant name (two switches with the same first
    letter once collided, and one combination silently went unmeasured)."""
    ab = load_script("gluon_ab")
    ab.set_variants(attrs)
    n = 2 ** len(attrs)
    assert len(ab.VARIANTS) == 2 * n
    assert len(ab.names("auto")) == n and len(ab.names("gluon")) == n
    combos = {tuple(sorted(ons.items())) for cfg, ons in ab.VARIANTS.values() if cfg is None}
    assert len(combos) == n
    assert ab.VARIANTS["auto_-"][1] == {a: False for a in attrs}


def test_gluon_ab_integer_settings(monkeypatch):
    """``name=v1,v2`` compares an integer setting at those values; a boolean switch keeps off/on; a name that is
    neither, or values of the wrong type, is refused."""
    ab = load_script("gluon_ab")
    monkeypatch.setattr(ab.hopper_fwd.GluonLaunch, "probe_depth", 0, raising=False)
    assert ab.parse_attr("probe_depth=0,1,2") == ("probe_depth", (0, 1, 2))
    assert ab.parse_attr("fast_sum_mma") == ("fast_sum_mma", (False, True))
    for bad in ("probe_depth", "probe_depth=a", "fast_sum_mma=1", "no_such_switch", "no_such=1"):
        with pytest.raises(ValueError):
            ab.parse_attr(bad)
    ab.set_variants([ab.parse_attr("probe_depth=0,2"), ab.parse_attr("fast_sum_mma")])
    assert list(ab.VARIANTS)[:4] == ["auto_pd0", "auto_pd0.fsm", "auto_pd2", "auto_pd2.fsm"]
    assert ab.VARIANTS["auto_pd2.fsm"][1] == {"probe_depth": 2, "fast_sum_mma": True}
    assert ab.resolve("gluon") == "gluon_pd2.fsm"


def test_ncu_compare_parses_sweep_config_names():
    nc = load_script("ncu_compare")
    assert nc.parse_config("auto") is None
    cfg = nc.parse_config("gluon_ws_192x128s3")
    assert (cfg.block_m, cfg.block_n, cfg.num_stages, cfg.kernel) == (192, 128, 3, "gluon_ws")
    cfg = nc.parse_config("64x128w4s3_r168")
    assert (cfg.block_m, cfg.num_warps, cfg.maxnreg, cfg.kernel) == (64, 4, 168, "triton")
    with pytest.raises(SystemExit):
        nc.parse_config("nonsense")


@pytest.mark.parametrize("text", ["auto", "gluon_ws_64x128s3", "gluon_ws_192x128s3", "128x64w8s3", "64x128w4s2_r168",
                                  "128x64w8s3_inloop", "128x64w8s3_tma"])
def test_config_names_round_trip(text):
    from flashcore.kernels.configs import config_name, parse_config_name

    assert config_name(parse_config_name(text)) == text


def test_gluon_ab_config_families():
    """--config adds a family per config; with no switches each family is one variant, named by its config."""
    ab = load_script("gluon_ab")
    ab.set_variants([], ["gluon_ws_64x128s3", "gluon_ws_64x128s2"])
    assert list(ab.VARIANTS) == ["auto_-", "gluon_-", "gluon_ws_64x128s3_-", "gluon_ws_64x128s2_-"]
    cfg, ons = ab.VARIANTS["gluon_ws_64x128s3_-"]
    assert (cfg.block_m, cfg.num_stages, cfg.kernel, ons) == (64, 3, "gluon_ws", {})
    with pytest.raises(ValueError):
        ab.set_variants([], ["no_such_config"])


def test_gluon_ab_parses_shapes_and_maps_config_families_to_variants():
    ab = load_script("gluon_ab")
    assert ab.parse_shapes("1x16x1024x64,4x16x1024x64c") == [((1, 16, 1024, 64), False), ((4, 16, 1024, 64), True)]
    with pytest.raises(ValueError, match="BxHxSxD"):
        ab.parse_shapes("1x16x1024")
    ab.set_variants([], ["gluon_ws_64x128s2"])
    # a family name (what the checks pass) resolves to its variant, not a KeyError (a device run once failed so)
    assert ab.resolve("gluon_ws_64x128s2") == "gluon_ws_64x128s2_-"
    ab.set_variants(["fast_sum_mma"], ["gluon_ws_64x128s2"])
    assert ab.resolve("gluon_ws_64x128s2") == "gluon_ws_64x128s2_fsm" and ab.resolve("auto") == "auto_fsm"


def test_cost_fit_series_vary_one_count_each(monkeypatch):
    """cost_fit.py fits time against x per series, so x must be the count that series varies and everything else
    fixed: key tiles per 128-row item at 4 items per program (132 SMs), or items per program at 8 key tiles each."""
    mod = load_script("cost_fit")
    keys = [s for s in mod.SERIES if s[0] == "keys"]
    items = [s for s in mod.SERIES if s[0] == "items"]
    assert len(keys) >= 3 and len(items) >= 3
    for _, x, B, H, Sq, Sk in keys:
        assert x == Sk // 128 and B * H * (Sq // 128) == 4 * 132
    for _, x, B, H, Sq, Sk in items:
        assert Sq == Sk == 1024 and B * H * (Sq // 128) == x * 132
    monkeypatch.setattr(mod.torch.cuda, "is_available", lambda: False)
    for argv, message in ((["--config", "bogus"], "--config: cannot parse"), (["--rounds", "0"], "--rounds must be"),
                          ([], "needs a CUDA device")):
        monkeypatch.setattr("sys.argv", ["cost_fit.py", *argv])
        with pytest.raises(SystemExit, match=message):
            mod.main()
