"""Every statement krablet sends, built by named functions, one module per concern.

``ddl`` (tables, queues, triggers, the catalog), ``queue`` (claim, complete, fail, heartbeat,
release, counts), ``writes`` (the funnel's upserts and patches), ``reads`` (get, scan,
aggregate, estimates, shard health), ``pluck`` (ranges of a pluck map) and ``arrays`` (many
rows per statement through ``unnest``). Other modules call these builders and never format SQL.
"""
