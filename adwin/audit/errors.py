"""Errors of the audit math, in a module without torch: the controller service derives from them."""

from __future__ import annotations


class NonFiniteAuditError(ValueError):
    """An audit whose Gram, sketches or cosines hold NaN/Inf: refused, and the window stays.

    The controller's ``NonFiniteAudit`` (``adwin.controller.api``) derives from it, so a driver decides with
    one ``isinstance`` whether the math or the controller refused it; a ``ValueError`` of the math itself
    (bad shapes, settings) stays a plain ``ValueError``.
    """


def is_non_finite_audit(e: BaseException) -> bool:
    """An audit refused for NaN/Inf, by the controller (``NonFiniteAudit``, 422) or by the audit math itself;
    any other error (an unknown candidate, a bad shape) is a bug and must propagate."""
    return isinstance(e, NonFiniteAuditError)
