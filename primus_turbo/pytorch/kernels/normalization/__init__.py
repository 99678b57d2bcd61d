"""Normalization families (RMSNorm)."""
