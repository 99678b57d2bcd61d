"""Normalization kernels (RMSNorm)."""
