"""Per-op dispatchers and backend classes; importing a family registers its backends."""
