"""instances stage."""
