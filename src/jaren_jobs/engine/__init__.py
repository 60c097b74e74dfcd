"""The engine: ``store.jobs``'s shells over the seam, the operator's calls, checkpoints,
waiting, the shared hub and group commit (DESIGN.md)."""
