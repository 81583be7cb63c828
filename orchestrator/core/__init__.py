"""Core: configs, registry, manifests and atomic outputs, runtime (Ray, seeds, device), errors."""
