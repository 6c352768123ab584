"""Legacy import shim: ``cerebras.pb`` (the system's protobuf messages; one enum value is named)."""
