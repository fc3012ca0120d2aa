"""What a run here says about Trainium (docs/fidelity.md).

- ``fit``: peak device memory per logical core of a training step, and the smallest layout;
- ``compile_audit``: the graphs the neuron backend compiled, and bucket advice;
- ``projection``: projected step time on a chip model;
- ``ls``, ``top``: the topology, and the memory of running processes;
- ``html_report``: the HTML pages of fit and projection.
"""
