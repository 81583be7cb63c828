"""sweep stage."""
