"""Training pipeline for the embedded target + DFlash drafter pair (dev only)."""
