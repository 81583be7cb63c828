"""Encoder evaluation without fine-tuning: cross-lingual retrieval of parallel text (seed 002, Table 6).

``config`` (settings, light), ``metrics`` (cosine nearest neighbours and precision@k, numpy),
``embed`` (mean of the last layer over sub-tokens, torch), ``table`` (Table 6's layout) and
``stage`` (Ray tasks, the output directory, MLflow; ``orchestrator.workflows.retrieval`` (the job) and
experiments run it).
"""
