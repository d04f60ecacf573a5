"""Declarations, placement and the idempotent migration on real shards."""

from __future__ import annotations

import pytest

from krea2.infra.errors import UserError
from krea2.krablet import Job, Table, Warehouse
from krea2.krablet.cluster import redact, shard_of
from krea2.krablet.migration import schema_fingerprint


def images_v1() -> Table:
    return Table(
        "images",
        key="image_key",
        columns={"uri": "text", "width": "integer", "contains_text": "boolean"},
        jobs=[Job("ocr", result="contains_text")],
        indexes=["uri"],
    )


def images_v2() -> Table:
    return Table(
        "images",
        key="image_key",
        columns={
            "uri": "text",
            "width": "integer",
            "contains_text": "boolean",
            "embedding_path": "text",
            "meta": "jsonb",
        },
        jobs=[
            Job("ocr", result="contains_text"),
            Job("embed", result="embedding_path", where="contains_text = FALSE"),
        ],
        indexes=["uri"],
    )


def test_placement_is_stable_and_spreads_keys():
    assert shard_of("a", 4) == shard_of("a", 4)
    assert shard_of(12, 3) == shard_of("12", 3)
    counts = [0] * 4
    for i in range(4000):
        counts[shard_of(f"k{i}", 4)] += 1
    assert min(counts) > 800


def test_bad_names_and_types_are_refused_with_the_fix():
    with pytest.raises(UserError, match="not a valid name"):
        Table("Images; drop", columns={})
    with pytest.raises(UserError, match="has type"):
        Table("images", columns={"x": "varchar(3)"})
    with pytest.raises(UserError, match="no column"):
        Table("images", columns={"x": "text"}, jobs=[Job("j", result="y")])
    for name in ("krablet_catalog", "krablet_pluck_maps", "krablet_pluck_ranges"):
        with pytest.raises(UserError, match="reserved"):
            Table(name, columns={})


def test_migration_is_idempotent_and_fresh_equals_migrated(cluster_factory):
    fresh, migrated = cluster_factory(3), cluster_factory(3)
    Warehouse.open(fresh, tables=[images_v2()])
    wh = Warehouse.open(migrated, tables=[images_v1()])
    with migrated.connect(0) as conn:
        conn.execute("INSERT INTO images (image_key, uri, contains_text) VALUES ('a', 'u', false)")
    wh.migrate([images_v2()])
    assert wh.migrate([images_v2()]) == []  # nothing changes the second time
    prints = []
    for c in (fresh, migrated):
        for i in range(3):
            with c.connect(i) as conn:
                prints.append(schema_fingerprint(conn))
    assert all(p == prints[0] for p in prints)
    # the new job backfilled its queue from existing rows that match its predicate
    with migrated.connect(0) as conn:
        assert conn.execute('SELECT key FROM "_kq_images_embed"').fetchall() == [("a",)]


def test_type_change_is_an_error_not_a_rewrite(cluster):
    Warehouse.open(cluster, tables=[images_v1()])
    bad = Table("images", key="image_key", columns={"uri": "bigint"})
    with pytest.raises(UserError, match="never rewrites"):
        Warehouse.open(cluster, tables=[bad])


def test_catalog_lets_tools_open_without_declarations(cluster):
    Warehouse.open(cluster, tables=[images_v2()])
    wh = Warehouse.open(cluster)
    assert wh.table("images").job("embed").where == "contains_text = FALSE"
    st = wh.status()
    assert st["schema_consistent"]
    assert st["shards"][1]["tables"]["images"]["jobs"]["ocr"]["ready"] == 0


def test_redact_hides_passwords():
    assert "hunter2" not in redact("postgresql://u:hunter2@h/db")
    assert "hunter2" not in redact("host=h password=hunter2 dbname=x")
    quoted = redact("host=h password='hunter2 and\\' more' dbname=x")
    assert "hunter2" not in quoted and "more" not in quoted and quoted.endswith(" dbname=x")
