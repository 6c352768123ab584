"""The R1.6 names with their R1.6 signatures and meanings, for scripts run with ``--legacy-imports``.

The R1.x Model Zoo imports ``cerebras.framework.torch`` (cbtorch), its ``amp``, ``core.cb_model``
(cm), ``core.modes``, ``core.name_scope``, ``cerebras.pb.stack.autogen_pb2.AP_DISABLED``,
``cerebras.workflow.python.cs_perf_analyzer`` and ``torch_xla.utils.utils`` together inside one
``try/except ImportError``: one missing name and it silently runs its own CPU stub instead. The
shim folder (:mod:`csrun.torch.legacy_shim`) maps each of those modules onto a module here or onto
:mod:`csrun.torch`, so every name imports:

- :mod:`~csrun.torch.r1.framework`: ``initialize`` (R1.6 keywords), ``compile``, ``env``,
  ``optimizer`` (the wrapper R1.6 returned: ``_optimizer``, ``convert_state_dict_for_checkpoint``),
  and the ``data`` / ``optim`` / ``nn`` / ``utils`` namespaces;
- :mod:`~csrun.torch.r1.amp`: ``GradScaler(loss_scale=, initial_loss_scale=, steps_per_increase=,
  min_loss_scale=, max_loss_scale=, max_gradient_norm=, mixed_precision=)`` called on the loss,
  whose loss scaling and clipping become the compile's; ``state_dict``, ``load_state_dict``,
  ``get_init_params``;
- :mod:`~csrun.torch.r1.modes`; :mod:`~csrun.torch.r1.perf` (the perf analyzer's two names);
  :mod:`~csrun.torch.r1.xla` (``SampleGenerator``);
- :mod:`~csrun.torch.r1.settings`: the compile settings the R1.6 API conveys, handed to the
  backend (:meth:`csrun.torch.backend.Backend.apply_settings`).

The legacy ``cb_model`` is :mod:`csrun.torch.core.cb_model`. A name csrun gives no meaning still
imports; calling it raises one line naming csrun and the name (:mod:`~csrun.torch.r1.unsupported`),
never an ``ImportError`` a script's ``except`` would swallow.
"""
