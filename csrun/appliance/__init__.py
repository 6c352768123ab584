"""``cerebras.appliance``: the few names of the system's appliance client a 2.x script imports.

On the system this package was the client of the appliance (the cluster's management service,
its log settings, its debug arguments). csrun has no appliance: the device is the embedded
emulator or a ``cs_emulator``, the job is a Slurm job. Under ``--legacy-imports``
``cerebras.appliance`` *is* this package (:mod:`csrun.module_alias`), and it gives the names
the Model Zoo's 2.x flow imports and calls on every run their meaning here:

=================================  ============================================================
:mod:`~csrun.appliance.log`        the ``wsc`` logger and its level names
:mod:`~csrun.appliance.run_utils`  :class:`DebugArgs` (empty: csrun takes none), reading and
                                   writing it, ``set_ini`` (refused)
:mod:`~csrun.appliance.errors`     :class:`ApplianceNanError` (a NaN or inf loss)
:mod:`~csrun.appliance.utils`      ``file.create_symlink``, ``units.convert_byte_unit``
:mod:`~csrun.appliance.environment` ``appliance_environ``: the job's environment
=================================  ============================================================

A name whose meaning is the appliance's own raises one :class:`ApplianceError` line when it is
used, never at import.
"""

from __future__ import annotations

from csrun.appliance.errors import ApplianceError, ApplianceNanError

__all__ = ["ApplianceError", "ApplianceNanError"]
