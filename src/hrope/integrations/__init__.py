"""Optional adapters of hrope encodings for third-party libraries (each needs its extra).

Import-free: ``import hrope.integrations`` loads no adapter and no third-party library. Import an
adapter by its module, e.g. ``hrope.integrations.transformers`` (``pip install
'hrope[transformers]'``, docs/integrations/transformers.md).
"""
