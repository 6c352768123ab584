"""``csrun.torch.core``: where the legacy ``cerebras.framework.torch.core`` lived; see :mod:`.cb_model`."""
