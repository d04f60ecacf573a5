"""Preference pairs: ranking samples into pairs, shards of whole pairs, missing images."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from krea2.infra.errors import UserError
from krea2.rl.preference import Pair, export_pair_shards, high_frequency_energy, rank_pairs

sys.path.insert(0, str(Path(__file__).parent))
from pref_helpers import square, toy_pairs


def test_best_and_worst_sample_of_each_prompt_become_a_pair_with_provenance():
    scores = np.array([[0.2, 0.9, 0.5], [0.4, 0.4, 0.4]])
    uris = [["a0", "a1", "a2"], ["b0", "b1", "b2"]]
    pairs = rank_pairs(["p", "q"], scores, uris, [10, 11, 12], model_step=7)
    assert len(pairs) == 1  # q's samples tie: no pair
    p = pairs[0]
    assert (p.winner_uri, p.loser_uri, p.winner_seed, p.loser_seed) == ("a1", "a0", 11, 10)
    assert p.model_step == 7 and p.source == "on-policy"
    assert p.scores["winner"] == pytest.approx(0.9) and p.scores["loser"] == pytest.approx(0.2)


def test_min_gap_drops_pairs_the_reward_barely_separates():
    scores = np.array([[0.50, 0.52]])
    assert rank_pairs(["p"], scores, [["a", "b"]], [0, 1], 0, min_gap=0.05) == []


def test_shards_hold_whole_pairs_winner_first_and_honour_human_choices(tmp_path):
    pairs = toy_pairs(tmp_path / "png", 4)
    pairs[1] = Pair(**{**pairs[1].to_row(), "choice": "loser"})  # flipped by a person
    pairs[2] = Pair(**{**pairs[2].to_row(), "choice": "skip"})
    (path,) = export_pair_shards(pairs, tmp_path / "shards", side=32, pairs_per_batch=2)
    rows = pq.read_table(path).to_pylist()
    assert len(rows) == 6  # the skipped pair is left out
    assert [r["key"].split("/")[1] for r in rows] == ["winner", "loser"] * 3
    flipped = [r for r in rows if r["key"].startswith(pairs[1].pair_id)]
    assert flipped[0]["image"] == Path(pairs[1].loser_uri[7:]).read_bytes()
    assert rows[0]["captions"] == [{"format": "medium", "text": pairs[0].prompt}]


def test_a_missing_image_names_the_pair_and_the_file_and_writes_nothing(tmp_path):
    pairs = toy_pairs(tmp_path / "png", 3)
    Path(pairs[1].loser_uri[7:]).unlink()
    with pytest.raises(UserError, match=f"pair '{pairs[1].pair_id}': its loser image"):
        export_pair_shards(pairs, tmp_path / "shards", side=32)
    assert not (tmp_path / "shards").exists() or not list((tmp_path / "shards").iterdir())


def test_high_frequency_energy_rises_with_speckle():
    clean = np.stack([square((230, 40, 40), c) for c in range(4)])
    rng = np.random.default_rng(0)
    noisy = np.clip(clean + rng.normal(0, 30, clean.shape), 0, 255).astype(np.uint8)
    assert high_frequency_energy(noisy) > 2 * high_frequency_energy(clean)


def test_several_pairs_per_prompt_match_the_kth_best_with_the_kth_worst():
    scores = np.array([[0.1, 0.9, 0.5, 0.7, 0.3, 0.5]])
    uris = [[f"u{i}" for i in range(6)]]
    pairs = rank_pairs(["p"], scores, uris, list(range(6)), 3, pairs_per_prompt=3)
    got = [(p.winner_seed, p.loser_seed) for p in pairs]
    assert got == [(1, 0), (3, 4)]  # the third pair (two 0.5s) ties: left out
    assert len({p.pair_id for p in pairs}) == 2
    with pytest.raises(UserError, match=r"pairs_per_prompt=4 must be in 1\.\.3"):
        rank_pairs(["p"], scores, uris, list(range(6)), 3, pairs_per_prompt=4)
