"""Visualising: figures, the attention viewer, the 3D scene and its viser viewer, the demo's figures."""
