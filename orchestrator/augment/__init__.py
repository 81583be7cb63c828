"""Filtered-BERT data augmentation for token classification (seed 001, Kang et al. 2021).

Words of a training sentence are masked, an MLM proposes replacements, and a replacement is
kept only when its fastText cosine similarity to the original word lies in a configured range;
otherwise the next-ranked proposal is tried. ``filtered`` holds the algorithm (Ray-free),
``similarity`` the fastText vectors, ``pipeline`` the Ray Data stage (``jobs/augment.py`` runs it
through ``orchestrator.workflows.augment``).
"""
