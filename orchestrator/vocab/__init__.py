"""vocab stage."""
