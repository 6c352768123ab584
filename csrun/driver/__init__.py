"""The device driver: decides the run path, compiles the step, loads the program, runs it on the device.

Layering: the driver may import :mod:`csrun.cluster`, :mod:`csrun.address`,
:mod:`csrun.stream`, :mod:`csrun.compiler`, :mod:`csrun.emulator` and the program contract;
:mod:`csrun.torch` (the user API) imports it, never the reverse. Nothing is imported here:
import the module you need.

Modules:

- :mod:`~csrun.driver.run_path`: :func:`~csrun.driver.run_path.decide`, the one decision
  of the run path (CPU / embedded / remote / compile_only / validate_only) from the flags
  and :class:`~csrun.cluster.ClusterInfo`;
- :mod:`~csrun.driver.options`: :class:`~csrun.driver.options.DeviceOptions`, the path
  plus compile and device settings;
- :mod:`~csrun.driver.driver`: :class:`~csrun.driver.driver.DeviceDriver`, the one object
  that owns compile -> program -> device -> step execution;
- :mod:`~csrun.driver.steps`: step-tensor handles and the step-order checks;
- :mod:`~csrun.driver.closures`: step closures and how the device resolves them;
- :mod:`~csrun.driver.legacy_state`: the legacy checkpoint state to and from the device;
- :mod:`~csrun.driver.compile_info`: a compile's figures for ``performance.json``.
"""
