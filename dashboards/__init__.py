"""Pages a person opens to compare runs, built from MLflow and results documents alone.

They read; they never import a training stage (an import-linter contract). The BLUE report itself
is ``orchestrator.report`` (``jobs/report.py`` rebuilds it from MLflow). ``experiment_page`` is the
experiment comparison page: one static HTML file per experiment (arms and their status, the seed
000 table, paired differences against the baseline arm with bootstrap intervals and p-values,
pretraining loss curves of all arms on one plot, fine-tuning curves), written by
``jobs/blue_sweep.py`` to ``<run_dir>/report/experiment.html`` and by
``python dashboards/experiment_page.py --tracking-uri ... --out ...`` for any store. It renders
what ``experiment_data`` reads from MLflow; ``svg`` draws its plots.
"""
