"""The link to a ``cs_emulator`` server: both ends.

- client side: :mod:`~csrun.emulator.remote.client` (:class:`RemoteDevice`, the
  :class:`~csrun.emulator.device.Device` over the link), :mod:`~csrun.emulator.remote.connect`
  (TCP with retries, TLS, the hello), :mod:`~csrun.emulator.remote.keepalive`;
- server side: :mod:`~csrun.emulator.remote.server` (one authenticated client at a time, a queue for the rest),
  :mod:`~csrun.emulator.remote.session` (one client's requests on a fresh embedded device),
  :mod:`~csrun.emulator.remote.guard` (connection limits), :mod:`~csrun.emulator.remote.server_warmup`;
- shared: :mod:`~csrun.emulator.remote.wire` (frames), :mod:`~csrun.emulator.remote.handshake`
  (HMAC challenge-response), :mod:`~csrun.emulator.remote.auth_token`,
  :mod:`~csrun.emulator.remote.tls`, :mod:`~csrun.emulator.remote.program` (programs as bytes,
  read as data), :mod:`~csrun.emulator.remote.errors`.

The command that serves it is :mod:`csrun.cli.cs_emulator`.
"""
