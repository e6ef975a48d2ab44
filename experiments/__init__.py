"""The experiment harness: trained cells, their cache, reports and the results page.

Run each experiment from the repository root as a module, e.g. ``python -m experiments.plane_evidence``.
"""
