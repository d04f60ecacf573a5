"""krea2.pipeline: end-to-end recipes of the umbrella project (`krea2 demo`)."""
