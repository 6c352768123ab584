"""One module per command; each has ``main(argv=None) -> int`` and a module docstring that is its manual."""
