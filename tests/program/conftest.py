"""The emulator tests' ``server`` fixture, for the archive tests that send programs to a server."""

from tests.emulator.conftest import server  # noqa: F401 - the fixture
