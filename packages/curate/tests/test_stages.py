"""The DAG's declaration: the table, the claims, the reasons and the dispatch derive from it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from krea2 import curate
from krea2.curate.image_analysis import ImageAnalysis
from krea2.curate.in_memory import Verdict
from krea2.curate.stages import COLUMNS, STAGES_BY_NAME, StageKind, images_table, reject_columns
from krea2.infra.errors import UserError


def test_claim_predicates_are_the_dag_edges():
    table = images_table()
    claims = {j.name: j.where for j in table.jobs}
    assert claims == {
        "analyze": None,
        "ocr": "dup_keep = TRUE",
        "tags": "text_reject = ''",
        "captions": "text_reject = ''",
        "embed": "dup_keep = TRUE",
        "classify": "embedding IS NOT NULL",
    }
    passes = [s.name for s in curate.STAGES if s.kind is StageKind.PASS]
    assert passes == [
        "dedup", "concepts", "caption_check", "semantic", "sae", "review", "coverage", "balance",
        "vectors",
    ]  # fmt: skip
    for job in table.jobs:
        assert job.handler.startswith("krea2.curate.handlers:")
        assert "shapes" not in job.handler.lower()


def test_table_columns_are_ingest_plus_every_stage_result():
    table = images_table()
    assert table.columns == COLUMNS
    for s in curate.STAGES:
        assert all(COLUMNS[c] == t for c, t in s.columns.items())
    assert COLUMNS["meta"] == "jsonb" and COLUMNS["captions"] == "jsonb"
    assert reject_columns() == [
        "reject",
        "dup_kind",
        "text_reject",
        "concept_keep",
        "caption_reject",
        "sem_kind",
        "sae_reject",
        "cluster_reject",
        "sample_keep",
    ]


def test_final_reason_reads_reject_columns_in_dag_order():
    row = {"reject": None, "dup_kind": "", "text_reject": "", "concept_keep": True}
    assert curate.final_reason(row) is None
    assert curate.final_reason(row | {"concept_keep": False}) == "overrepresented"
    assert curate.final_reason(row | {"text_reject": "text_density", "concept_keep": False}) == (
        "text_density"
    )
    assert curate.final_reason(row | {"dup_kind": "near_duplicate"}) == "near_duplicate"
    assert curate.final_reason({"reject": "border", "dup_kind": "exact_duplicate"}) == "border"
    assert curate.final_reason({}) is None  # nothing run yet


def test_verdict_reason_is_final_reason_of_its_columns():
    from krea2.curate.concepts import ConceptVerdict
    from krea2.curate.filters import FilterResult

    clean = ImageAnalysis(md5="x", filters=[FilterResult("border", 0.0, True)])
    assert Verdict("k", clean).reason is None
    assert Verdict("k", clean, duplicate="exact_duplicate").reason == "exact_duplicate"
    text = [FilterResult("text_density", 0.5, False)]
    assert Verdict("k", clean, text=text).reason == "text_density"
    dropped = ConceptVerdict(0.5, True, False)
    assert Verdict("k", clean, concept=dropped).reason == "overrepresented"
    assert Verdict("k", ImageAnalysis(md5="x", decode_error="truncated")).reason == "truncated"


def test_progress_counts_the_claimed_rows_and_the_done_ones():
    todo, done = STAGES_BY_NAME["ocr"].progress_filters()
    assert todo == [["dup_keep", "=", True]]
    assert done == [["dup_keep", "=", True], ["text_area", "is not", None]]
    assert STAGES_BY_NAME["analyze"].progress_filters() == ([], [["md5", "is not", None]])


def test_unknown_stages_and_plugins_are_user_errors():
    with pytest.raises(UserError, match="unknown stage"):
        curate.run_stages(None, ["analyse"])  # type: ignore[arg-type]
    with pytest.raises(UserError, match="the tags stage needs a tagger"):
        curate.run_stages(None, ["tags"])  # type: ignore[arg-type]
    with pytest.raises(UserError, match="registered captioners are"):
        curate.run_stages(None, ["captions"], captioner="blip")  # type: ignore[arg-type]


def test_a_registered_tagger_runs_in_the_tags_stage(tmp_path, monkeypatch):
    import numpy as np

    from krea2.curate.handlers import TagHandler, configured
    from krea2.curate.plugins import REGISTRIES
    from krea2.curate.shapes import encode, render, sample_scene

    monkeypatch.setitem(REGISTRIES, "tagger", dict(REGISTRIES["tagger"]))
    curate.register_tagger("everything", lambda pixels: frozenset({"thing"}))
    handler = configured(TagHandler, curate.CurateConfig(), plugin="everything")()
    handler.setup()
    path = tmp_path / "scene.png"
    path.write_bytes(encode(render(sample_scene(np.random.default_rng(0)), 64, 64), "png"))
    assert handler([{"uri": str(path)}]) == [{"tags": ["thing"]}]


def test_the_shapes_captioner_writes_the_scene_captions_and_fails_a_row_without_one():
    import numpy as np

    from krea2.curate.handlers import CaptionHandler, configured
    from krea2.curate.shapes import captions, sample_scene

    scene = sample_scene(np.random.default_rng(1))
    handler = configured(CaptionHandler, curate.CurateConfig(), plugin="shapes")()
    handler.setup()
    out = handler(
        [{"uri": "file:///a.png", "meta": {"scene": scene.to_dict()}}, {"uri": "x", "meta": None}]
    )
    assert out[0]["captions"] == [{"format": f, "text": t} for f, t in captions(scene).items()]
    # not done with no caption (a done row is never claimed again): failed with the reason
    assert isinstance(out[1], curate.NoCaption)  # skipped, with the reason:
    assert "captioner 'shapes' on x: no caption" in str(out[1])


def test_every_public_name_resolves_and_the_root_import_is_cheap():
    for name in curate.__all__:
        assert getattr(curate, name) is not None, name
    for name in curate.shapes.__all__:
        assert getattr(curate.shapes, name) is not None, name
    code = (
        "import sys, krea2.curate, krea2.curate.cli; "
        "heavy = [m for m in ('numba', 'cv2', 'psycopg', 'pyarrow') if m in sys.modules]; "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
