"""Queue semantics on real shards: leases, exactly-once results, backoff, the claim's plan."""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter

import pytest

from krea2.infra.errors import UserError
from krea2.krablet import Job, Table, Warehouse


def items(lease_s: float = 60.0, backoff_s: float = 5.0) -> Table:
    return Table(
        "items",
        key="id",
        key_type="bigint",
        columns={"url": "text", "contains_text": "boolean", "embedding": "text", "pad": "text"},
        jobs=[
            Job(
                "ocr", result="contains_text", inputs=["url"], lease_s=lease_s, backoff_s=backoff_s
            ),
            Job("embed", result="embedding", where="contains_text = FALSE", inputs=["url"]),
        ],
        indexes=["url"],
    )


def seed(wh: Warehouse, n: int, start: int = 0) -> None:
    with wh.funnel() as f:
        f.upsert("items", [{"id": i, "url": f"u{i}"} for i in range(start, start + n)])


def test_concurrent_claimers_write_every_result_exactly_once(cluster):
    wh = Warehouse.open(cluster, tables=[items()])
    seed(wh, 3000)
    written: list[int] = []
    claimed: list[int] = []
    lock = threading.Lock()

    def claimer(i: int) -> None:
        q = wh.queue("items", "ocr", owner=f"c{i}")
        idle = 0
        while idle < 3:
            c = q.claim(random.randrange(2), 25)
            if not c.rows:
                idle += 1
                continue
            idle = 0
            got = q.complete(c, [{"contains_text": r["id"] % 2 == 0} for r in c.rows])
            with lock:
                claimed.extend(c.keys)
                written.extend(got)

    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(written) == list(range(3000))  # every row once, no row twice
    assert Counter(claimed).most_common(1)[0][1] == 1  # no row was claimed while leased
    # the results unlocked the downstream job for exactly the rows with contains_text = FALSE
    embed = sum(wh.queue("items", "embed").stats(s)["ready"] for s in range(2))
    assert embed == 1500


def test_an_expired_lease_is_reclaimed_and_the_old_owner_loses(cluster1):
    # a 1 s lease: the check that it is live holds unless this process stalls for a second
    wh = Warehouse.open(cluster1, tables=[items(lease_s=1.0)])
    seed(wh, 5)
    a, b = wh.queue("items", "ocr", owner="a"), wh.queue("items", "ocr", owner="b")
    first = a.claim(0, 10)
    assert len(first) == 5
    assert len(b.claim(0, 10)) == 0  # lease live: nobody else gets these rows
    time.sleep(1.1)  # past the lease (wall-clock semantics), longer on a slow machine too
    second = b.claim(0, 10)
    assert sorted(second.keys) == sorted(first.keys)
    assert set(second.attempts.values()) == {2}
    assert a.complete(first, [{"contains_text": True}] * 5) == []  # stale token: rejected
    assert sorted(b.complete(second, [{"contains_text": False}] * 5)) == list(range(5))


def test_heartbeat_keeps_the_lease_alive(cluster1):
    wh = Warehouse.open(cluster1, tables=[items(lease_s=1.0)])
    seed(wh, 3)
    a, b = wh.queue("items", "ocr", owner="a"), wh.queue("items", "ocr", owner="b")
    c = a.claim(0, 10)
    for _ in range(4):  # 1.2 s in all, past the lease; a beat every 0.3 s, 0.7 s to spare
        time.sleep(0.3)
        assert sorted(a.heartbeat(c)) == [0, 1, 2]
        assert len(b.claim(0, 10)) == 0
    assert len(a.complete(c, {k: {"contains_text": True} for k in c.keys})) == 3


def test_release_gives_rows_back_without_counting_an_attempt(cluster1):
    wh = Warehouse.open(cluster1, tables=[items()])
    seed(wh, 4)
    q = wh.queue("items", "ocr")
    c = q.claim(0, 2)
    assert sorted(q.release(c)) == sorted(c.keys)
    again = q.claim(0, 10)
    assert len(again) == 4 and set(again.attempts.values()) == {1}


def test_poison_rows_back_off_and_do_not_block_the_rest(cluster1):
    wh = Warehouse.open(cluster1, tables=[items(backoff_s=30)])
    seed(wh, 500)
    poison = set(range(0, 500, 50))  # 10 rows that always fail, spread through the queue
    q = wh.queue("items", "ocr")
    rounds = 0
    while True:
        c = q.claim(0, 50)
        if not c.rows:
            break
        rounds += 1
        bad = {k: f"cannot decode {k}" for k in c.keys if k in poison}
        q.fail(c, bad)
        q.complete(c, {k: {"contains_text": True} for k in c.keys if k not in poison})
    assert rounds == 10  # 500 rows / 50: poison rows were never claimed a second time
    errors = q.errors(0)
    assert {e["key"] for e in errors} == poison
    assert all(e["attempts"] == 1 and e["last_error"].startswith("cannot decode") for e in errors)
    st = q.stats(0)
    assert st["ready"] == 0 and st["backing_off"] == 10


def test_backoff_grows_with_attempts(cluster1):
    wh = Warehouse.open(cluster1, tables=[items(backoff_s=0.05)])
    seed(wh, 1)
    q = wh.queue("items", "ocr")
    delays = []
    for _ in range(4):
        deadline = time.monotonic() + 5
        while not (c := q.claim(0, 1)).rows:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        with cluster1.connect(0) as conn:
            q.fail(c, "boom")
            delays.append(
                conn.execute(
                    'SELECT extract(epoch FROM next_try_at - now()) FROM "_kq_items_ocr"'
                ).fetchone()[0]
            )
    assert delays[3] > delays[0] * 3  # 2^3 = 8x nominal, with ±25% jitter


def test_claim_skips_rows_whose_predicate_no_longer_holds(cluster1):
    wh = Warehouse.open(cluster1, tables=[items()])
    seed(wh, 3)
    with cluster1.connect(0) as conn:
        conn.execute("ALTER TABLE items DISABLE TRIGGER USER")
        conn.execute("UPDATE items SET contains_text = true WHERE id = 1")
        conn.execute("ALTER TABLE items ENABLE TRIGGER USER")
    c = wh.queue("items", "ocr").claim(0, 10)
    assert sorted(c.keys) == [0, 2]
    with cluster1.connect(0) as conn:
        assert conn.execute('SELECT count(*) FROM "_kq_items_ocr"').fetchone()[0] == 2


def test_complete_refuses_unknown_columns_and_null_done_marker(cluster1):
    wh = Warehouse.open(cluster1, tables=[items()])
    seed(wh, 1)
    q = wh.queue("items", "ocr")
    c = q.claim(0, 1)
    with pytest.raises(UserError, match="not its results"):
        q.complete(c, [{"contains_text": True, "url": "x"}])
    with pytest.raises(UserError, match="NULL"):
        q.complete(c, [{"contains_text": None}])


def _claim_plan(conn, q, n: int) -> dict:
    query = q.statements["claim"].as_string(conn)
    with conn.transaction():
        cur = conn.execute(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + query,
            {"n": n, "lease": 60.0, "owner": "plan", "token": 1},
        )
        plan = cur.fetchone()[0]
        conn.execute("ROLLBACK")
    return plan[0]["Plan"] if isinstance(plan, list) else json.loads(plan)[0]["Plan"]


def _nodes(plan: dict):
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def _ready_scan(plan: dict) -> dict:
    scans = [p for p in _nodes(plan) if p.get("Index Name") == "_kq_items_ocr_ready"]
    assert len(scans) == 1, "the claim must pick ready rows through the queue's ready index"
    return scans[0]


def test_claim_plan_uses_the_ready_index_and_scales_with_batch_not_backlog(cluster1):
    wh = Warehouse.open(cluster1, tables=[items()])
    q = wh.queue("items", "ocr")
    with cluster1.connect(0) as conn:
        conn.execute(
            "INSERT INTO items (id, url, pad) SELECT g, 'u' || g, repeat('x', 200) "
            "FROM generate_series(1, 5000) g"
        )
        conn.execute("ANALYZE items; ANALYZE _kq_items_ocr")
        small = _claim_plan(conn, q, 50)
        conn.execute(
            "INSERT INTO items (id, url, pad) SELECT g, 'u' || g, repeat('x', 200) "
            "FROM generate_series(5001, 60000) g"
        )
        conn.execute("ANALYZE items; ANALYZE _kq_items_ocr")
        plans = {n: _claim_plan(conn, q, n) for n in (10, 50, 200)}
    for n, plan in plans.items():
        scan = _ready_scan(plan)
        assert scan["Actual Rows"] <= n * 1.2 + 2  # rows touched track the batch size
        seq = [p for p in _nodes(plan) if p["Node Type"] == "Seq Scan"]
        assert not seq, "no sequential scan of the queue or the wide table"
    # work per claimed row is constant: buffers grow with the batch, not with the 60k backlog
    assert _blocks(plans[200]) < 30 * 200
    assert _blocks(plans[50]) <= 1.5 * _blocks(small)
    assert _ready_scan(plans[50])["Actual Rows"] <= _ready_scan(small)["Actual Rows"] * 1.2 + 2


def _blocks(plan: dict) -> int:
    return plan["Shared Hit Blocks"] + plan.get("Shared Read Blocks", 0)


def test_claims_heartbeats_and_failures_never_rewrite_the_wide_row(cluster1):
    wh = Warehouse.open(cluster1, tables=[items()])
    seed(wh, 20)
    with cluster1.connect(0) as conn:
        before = conn.execute("SELECT id, xmin::text, ctid::text FROM items ORDER BY id").fetchall()
    q = wh.queue("items", "ocr")
    c = q.claim(0, 20)
    q.heartbeat(c)
    q.fail(c, "transient")
    with cluster1.connect(0) as conn:
        after = conn.execute("SELECT id, xmin::text, ctid::text FROM items ORDER BY id").fetchall()
    assert after == before  # queue churn stays in the narrow queue table


def test_an_expired_lease_goes_behind_the_ready_backlog(cluster1):
    """Retry-at-end: a killed worker's rows are claimed again only after the rows that were
    ready before their lease expired (no dead-letter queue; the lease length is the knob)."""
    wh = Warehouse.open(cluster1, tables=[items()])
    seed(wh, 10)
    q = wh.queue("items", "ocr")
    killed = q.claim(0, 3, lease_s=0.2)  # its worker dies: nobody completes or releases
    time.sleep(0.5)  # past the lease (wall-clock semantics); longer is as good
    assert sorted(q.claim(0, 7).keys) == sorted(set(range(10)) - set(killed.keys))
    again = q.claim(0, 10)
    assert sorted(again.keys) == sorted(killed.keys)
    assert set(again.attempts.values()) == {2}


def test_reset_job_redoes_rows_whose_inputs_changed_and_voids_their_leases(cluster1):
    wh = Warehouse.open(cluster1, tables=[items()])
    seed(wh, 10)
    ocr, embed = wh.queue("items", "ocr"), wh.queue("items", "embed")
    first = ocr.claim(0, 10)
    ocr.complete(first, [{"contains_text": False} for _ in first.rows])  # all ready to embed
    held = embed.claim(0, 10)  # a worker holds every row
    embed.complete(held, {k: {"embedding": "old"} for k in (0, 1, 2)})
    embed.fail(held, {4: "OSError: gone"})
    with wh.funnel() as f:  # rows 1 and 5 no longer match embed's contains_text = FALSE
        f.patch("items", [{"id": 1, "contains_text": True}, {"id": 5, "contains_text": True}])

    assert wh.reset_job("items", "embed", [0, 1, 3, 4, 5, 99]) == [0, 1, 3, 4, 5]  # no 99
    assert embed.complete(held, {3: {"embedding": "x"}, 5: {"embedding": "x"}}) == []  # voided
    rows = wh.reader().get("items", list(range(6)), columns=["embedding"])
    assert [rows[k]["embedding"] for k in range(6)] == [None, None, "old", None, None, None]
    assert embed.errors(0) == []  # row 4 starts over: no error
    assert embed.stats(0)["leased"] == 4  # rows 6-9 are still the first worker's
    again = embed.claim(0, 10)
    assert again.keys == [0, 3, 4] and set(again.attempts.values()) == {1}  # attempts reset
    assert embed.stats(0)["ready"] == 0  # rows 1 and 5 were cleared but left the queue
