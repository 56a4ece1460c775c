"""dtype-doctor inside other tools: a transformers Trainer callback and a pytest plugin.

Neither is imported by the package itself; each imports its host library when used.
"""
