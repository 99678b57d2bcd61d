"""Gated activations (SwiGLU/GeGLU, optionally with router probs): launchers and custom ops."""
