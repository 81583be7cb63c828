"""formats stage."""
