"""The user's Python source, read without running it (analysis.py: one LibCST analysis that the
lineage's source lines and the fix codemods share). No torch import."""
