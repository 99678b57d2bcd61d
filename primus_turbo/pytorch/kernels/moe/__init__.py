"""MoE permute/unpermute: launchers and custom ops."""
