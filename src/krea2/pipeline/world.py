"""The demo's ShapesWorld lives in ``krea2.curate.shapes`` (the names the demo uses from here)."""

from __future__ import annotations

from krea2.curate.shapes import eval_prompt, one_object_scenes, split_concepts

__all__ = ["eval_prompt", "one_object_scenes", "split_concepts"]
