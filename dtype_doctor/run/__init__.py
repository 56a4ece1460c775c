"""`dtype-doctor run -- python SCRIPT.py ARGS`: the user's own script, unmodified, traced in-process.

command → launch (runpy, argv/__main__/cwd as python gives them) → session (the first
top-level model call arms the recorder, N steps are traced, the script is stopped) → Report.
"""
