"""The coverage audit: what each epoch of a sampler really feeds the model, per rank and batch."""

from stateful_sampler.audit.compute import audit
from stateful_sampler.audit.packing import PackingEpoch, audit_packing
from stateful_sampler.audit.report import AuditReport
from stateful_sampler.audit.setup import AuditConfig

__all__ = ["AuditConfig", "AuditReport", "PackingEpoch", "audit", "audit_packing"]
