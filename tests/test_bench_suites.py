"""Built-in suites, FLOP counts and suite-file validation."""
from __future__ import annotations

import json

import pytest
import torch

from flashcore.bench.suites import (LARGE, SEED, SUITES, Shape, SuiteError, load_suite_file, parse_shapes, parse_suite,
                                   resolve_suite)


def test_builtin_suites():
    assert [(s.B, s.Hq, s.Sq, s.D, s.causal) for s in SEED] == [
        (1, 8, 512, 64, False), (1, 16, 1024, 64, False), (4, 16, 1024, 64, False), (16, 16, 2048, 64, False)]
    large = {(s.B, s.Hq, s.Sq, s.D, s.causal) for s in LARGE}
    for required in [(4, 32, 4096, 64, False), (4, 32, 4096, 128, False), (4, 32, 4096, 128, True),
                     (1, 32, 16384, 128, False), (1, 32, 16384, 128, True), (4, 32, 4096, 64, True),
                     (1, 16, 32768, 128, False), (1, 16, 32768, 128, True)]:
        assert required in large
    assert list(SUITES["all"]) == list(SEED) + list(LARGE)
    keys = [s.key for s in SUITES["all"]]
    assert len(set(keys)) == len(keys)


def _visible_pairs_brute_force(sq, sk, causal):
    i = torch.arange(sq).view(-1, 1)
    j = torch.arange(sk).view(1, -1)
    return int(((j <= i + sk - sq) if causal else torch.ones(sq, sk, dtype=torch.bool)).sum())


def test_flops_dense_and_causal_convention():
    s = Shape.dense(4, 32, 4096, 128)
    assert s.flops == 4 * 4 * 32 * 4096 * 4096 * 128
    assert Shape.dense(4, 32, 4096, 128, causal=True).flops == s.flops // 2


@pytest.mark.parametrize("sq,sk", [(5, 9), (9, 5), (1, 7), (128, 1000), (37, 37)])
def test_causal_pairs_with_sq_ne_sk_are_counted_exactly(sq, sk):
    s = Shape.dense(2, 3, sq, 16, causal=True, Sk=sk)
    expected = 2 * (_visible_pairs_brute_force(sq, sk, True) if sq != sk else sq * sk // 2)
    assert s.visible_pairs_per_head() == expected
    assert s.flops == 4 * 3 * 16 * expected


def test_io_and_score_bytes_and_keys():
    s = Shape.dense(2, 8, 100, 64, Hkv=2, Sk=300)
    assert s.io_bytes(2) == 2 * 64 * (2 * 2 * 100 * 8 + 2 * 2 * 300 * 2)
    assert s.score_bytes(2) == 2 * 2 * 8 * 100 * 300
    assert s.key == "2x8x100x64-sk300-kv2"
    assert Shape.dense(1, 8, 512, 64, causal=True).label == "1×8×512×64-causal"
    v = Shape.packed([3, 0, 5], 4, 32)
    assert (v.B, v.Sq, v.total_tokens) == (3, 5, 8)
    assert v.key != Shape.packed([5, 0, 3], 4, 32).key  # same totals, different lengths


def test_parse_suite_ok(tmp_path):
    shapes = parse_suite([{"B": 2, "Hq": 8, "Hkv": 2, "Sq": 128, "Sk": 256, "D": 64, "causal": True},
                          {"Hq": 4, "D": 128, "varlen": [10, 0, 30]},
                          {"B": 1, "Hq": 4, "Sq": 64, "D": 32}])
    assert shapes[0] == Shape(2, 8, 2, 128, 256, 64, True)
    assert shapes[1].varlen == (10, 0, 30) and shapes[1].B == 3
    assert shapes[2].Hkv == 4 and shapes[2].Sk == 64 and shapes[2].causal is False
    path = tmp_path / "suite.json"
    path.write_text(json.dumps({"shapes": [{"B": 1, "Hq": 2, "Sq": 8, "D": 16}]}))
    assert resolve_suite(str(path)) == [Shape.dense(1, 2, 8, 16)]


@pytest.mark.parametrize("entry,field", [
    ({"Hq": 8, "Sq": 128, "D": 64}, "'B'"),
    ({"B": 1, "Sq": 128, "D": 64}, "'Hq'"),
    ({"B": 1, "Hq": 8, "D": 64}, "'Sq'"),
    ({"B": "1", "Hq": 8, "Sq": 128, "D": 64}, "'B'"),
    ({"B": 1, "Hq": 8, "Sq": 0, "D": 64}, "'Sq'"),
    ({"B": 1, "Hq": 8, "Sq": 128, "D": 60}, "'D'"),
    ({"B": 1, "Hq": 8, "Hkv": 3, "Sq": 128, "D": 64}, "'Hkv'"),
    ({"B": 1, "Hq": 8, "Sq": 128, "D": 64, "causal": "yes"}, "'causal'"),
    ({"B": 1, "Hq": 8, "Sq": 128, "D": 64, "casual": True}, "'casual'"),
    ({"B": True, "Hq": 8, "Sq": 128, "D": 64}, "'B'"),
    ({"Hq": 8, "D": 64, "varlen": []}, "'varlen'"),
    ({"Hq": 8, "D": 64, "varlen": [4, -1]}, "'varlen'"),
    ({"Hq": 8, "D": 64, "varlen": [0, 0]}, "'varlen'"),
    ({"Hq": 8, "D": 64, "varlen": [4, 5], "Sq": 5}, "'Sq'"),
    ({"B": 3, "Hq": 8, "D": 64, "varlen": [4, 5]}, "'B'"),
])
def test_parse_suite_names_the_bad_field(entry, field):
    with pytest.raises(SuiteError, match=field) as info:
        parse_suite([{"B": 1, "Hq": 2, "Sq": 8, "D": 16}, entry], "my.json")
    assert "my.json: shape #1" in str(info.value)


def test_suite_file_errors(tmp_path):
    with pytest.raises(SuiteError, match="not found"):
        load_suite_file(str(tmp_path / "missing.json"))
    bad = tmp_path / "bad.json"
    bad.write_text("[{\"B\": 1,")
    with pytest.raises(SuiteError, match="not valid JSON"):
        load_suite_file(str(bad))
    obj = tmp_path / "obj.json"
    obj.write_text(json.dumps({"B": 1}))
    with pytest.raises(SuiteError, match="list"):
        load_suite_file(str(obj))
    empty = tmp_path / "empty.json"
    empty.write_text("[]")
    with pytest.raises(SuiteError, match="empty"):
        load_suite_file(str(empty))
    with pytest.raises(SuiteError, match="unknown suite 'medium'"):
        resolve_suite("medium")


def test_parse_shapes_from_the_command_line():
    """``BxHxSxD[c],...``: how the GPU tools take shapes (a trailing c: causal)."""
    assert parse_shapes("1x16x1024x64, 4x32x4096x128c") == [Shape.dense(1, 16, 1024, 64),
                                                          Shape.dense(4, 32, 4096, 128, causal=True)]
    assert parse_shapes("1x8x512x64") == [SEED[0]]
    for bad in ("1x16x1024", "1x16x1024x64x2", "axbxcxd", "1x16x1024x64,", "0x16x1024x64", "1x16x1024x64cc"):
        with pytest.raises(SuiteError):
            parse_shapes(bad)
