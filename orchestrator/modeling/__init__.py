"""Model parts that pretraining, fine-tuning and evaluation share (torch, transformers): bottleneck
adapters, the encoder loader."""
