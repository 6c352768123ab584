"""Tests of the compiler room (csrun.compiler)."""
