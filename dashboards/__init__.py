"""Pages a person opens to compare runs, built from MLflow and results documents alone.

They read; they never import a training stage (an import-linter contract). The BLUE report itself
is ``orchestrator.report`` (``jobs/report.py`` rebuilds it from MLflow); the experiment comparison
page (arms side by side, paired differences, loss curves) is to live here.
"""
