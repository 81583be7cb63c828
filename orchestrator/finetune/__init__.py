"""finetune stage."""
