"""Model parts that pretraining and fine-tuning share (torch, transformers): bottleneck adapters."""
