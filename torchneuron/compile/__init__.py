"""``torch.compile(backend="neuron")`` and what it stands on.

- ``backend``: the Dynamo backend ``neuron`` (static shapes, graphs lowered to host code);
- ``rewrites``, ``native_gemm``, ``native_attention``: graph rewrites onto our own kernels;
- ``inductor_device``, ``inductor_aot``: neuron as an Inductor device (the default
  ``torch.compile``) and in AOTInductor packages;
- ``neff_cache``, ``cache_lock``, ``cache_trust``: the persistent cache of compiled graphs,
  its per-entry locks and its ownership rules;
- ``buckets``: padding to a few static shapes, so the backend compiles once per bucket.

Nothing is imported here: the NKI compiler uses the cache without loading Dynamo.
"""
