"""Evaluating a model: image metrics, held-out evaluation, the paper's protocols, plane accuracy and the
attention probe."""
