"""Pairs in a krablet table (a real embedded shard): provenance kept, choices recorded and
undone, a missing image named with nothing written, and the table feeding the shards."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from krea2.infra.errors import UserError
from krea2.rl.preference import (
    export_pair_shards,
    open_pairs,
    read_pairs,
    set_choice,
    write_pairs,
)

sys.path.insert(0, str(Path(__file__).parent))
from pref_helpers import toy_pairs


def test_pairs_round_trip_with_provenance_in_insertion_order(cluster_file, tmp_path):
    pairs = toy_pairs(tmp_path / "png", 5)
    pairs[2] = replace(pairs[2], scores={"winner": 0.9, "loser": 0.1, "sub": {"rubric": [1, 0]}})
    pairs[3] = replace(pairs[3], reference_uri="file:///refs/style-3.png")  # a style pair's
    with open_pairs(str(cluster_file)) as wh:
        assert write_pairs(wh, pairs) == 5
        back = read_pairs(wh)
    assert back == pairs  # every field: prompt, URIs, model step, seeds, scores, no choice


def test_choices_are_recorded_undone_and_survive_a_rewrite(cluster_file, tmp_path):
    pairs = toy_pairs(tmp_path / "png", 3)
    with open_pairs(str(cluster_file)) as wh:
        write_pairs(wh, pairs)
        set_choice(wh, pairs[0].pair_id, "loser", "ann")
        set_choice(wh, pairs[1].pair_id, "skip", "ann")
        set_choice(wh, pairs[1].pair_id, None)  # undo
        write_pairs(wh, pairs)  # regenerated pairs do not erase a person's choice
        done = read_pairs(wh, annotated=True)
        todo = read_pairs(wh, annotated=False)
        with pytest.raises(UserError, match="choice 'maybe'"):
            set_choice(wh, pairs[2].pair_id, "maybe")
        with pytest.raises(UserError, match="no pair 'nope'"):
            set_choice(wh, "nope", "winner")
        (path,) = export_pair_shards(read_pairs(wh), tmp_path / "shards", side=32)
    assert [(p.pair_id, p.choice, p.annotator) for p in done] == [
        (pairs[0].pair_id, "loser", "ann")
    ]
    assert [p.pair_id for p in todo] == [pairs[1].pair_id, pairs[2].pair_id]
    first = pq.read_table(path).to_pylist()[0]
    assert first["image"] == Path(pairs[0].loser_uri[7:]).read_bytes()  # flipped by the choice


def test_a_missing_image_names_the_pair_and_nothing_is_written(cluster_file, tmp_path):
    pairs = toy_pairs(tmp_path / "png", 3)
    Path(pairs[2].winner_uri[7:]).unlink()
    with open_pairs(str(cluster_file)) as wh:
        with pytest.raises(UserError, match=f"pair '{pairs[2].pair_id}': its winner image"):
            write_pairs(wh, pairs)
        assert read_pairs(wh) == []
        write_pairs(wh, pairs[:2])  # the others are fine on their own
        assert len(read_pairs(wh)) == 2
