"""The workflows: one module per job, ``jobs/X.py -> orchestrator/workflows/X.py``.

A job script parses its command line and calls its workflow; a workflow module holds the job's
config class, its ``run`` and its ``plan`` (the dry run), and wires stages from the stage packages.
``runner`` is the one place that builds arms' stages and runs the sweep.
"""
