"""Compile directories (``cs_<hash>/``), the cache over them, and safe program files."""
