"""Which graphs a run compiles on neuron, why each one, and the bucketing that would cut them.

``with torchneuron.fidelity.compile_audit.audit() as result: ...`` or
``python -m torchneuron.fidelity.compile_audit script.py args``. Each graph Dynamo hands the neuron
backend is a separate compile on Trainium (minutes each there); the audit lists them with
their input signatures and reasons, and proposes buckets for the dimensions that varied.
"""

from __future__ import annotations

from .audit import AuditResult, Graph, audit
from .buckets_advice import BucketAdvice, advise_buckets, next_bucket

__all__ = ["AuditResult", "BucketAdvice", "Graph", "advise_buckets", "audit", "next_bucket"]
